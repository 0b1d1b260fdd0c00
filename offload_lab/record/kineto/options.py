"""What governs one trace import, validated once: :class:`TraceImportOptions`.

This module is the bottom of :mod:`offload_lab.record.kineto`: the reader, the collector and
the builder all take the one options object, so none of them reads a loose keyword or a
module constant of its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from offload_lab.checks import check_int
from offload_lab.errors import OffloadLabError
from offload_lab.reading import MAX_TRACE_BYTES

__all__ = ["TraceImportOptions", "TraceImportError", "compile_patterns", "DEFAULT_LAYER_PATTERN",
           "MAX_VALUE_CHARS", "MIN_VALUE_CHARS", "DEFAULT_OPTIONS"]

#: ``<group>.<idx>`` anywhere in a label: ``blocks.17``, ``token_refiner.blocks.3.attn``.
DEFAULT_LAYER_PATTERN = r"(?<![\w.])(?P<group>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\.(?P<layer>\d+)(?![\w])"
#: the largest single JSON value (one event, one top-level entry) the reader holds: a trace's
#: events are a few hundred bytes; a longer value is not waited for to its end
MAX_VALUE_CHARS = 64 << 20
#: a value is measured when the reader has to read on (1 MiB at a time) to finish it, so a
#: smaller cap would not be kept to
MIN_VALUE_CHARS = 1 << 20

_DEFAULT = (re.compile(DEFAULT_LAYER_PATTERN),)


class TraceImportError(OffloadLabError, ValueError):
    """A bad argument to :func:`from_torch_profiler` (input type, layer pattern, profiler state)."""


def compile_patterns(layer_pattern: Any) -> tuple[list[re.Pattern], bool]:
    """Returns the patterns and whether they are the default (which enables the nn.Module fallback)."""
    if layer_pattern is None:
        return list(_DEFAULT), True
    if isinstance(layer_pattern, (str, re.Pattern)):
        items = [layer_pattern]
    elif isinstance(layer_pattern, (list, tuple)):
        items = list(layer_pattern)
    else:
        items = [layer_pattern]  # refused just below, with what is accepted
    out = []
    for p in items:
        if not isinstance(p, (str, re.Pattern)):
            raise TraceImportError(f"layer_pattern {p!r} is not a regular expression: pass a str or "
                                   f"re.Pattern (or a list of them) with named groups 'layer' and "
                                   f"optionally 'group'")
        try:
            rx = re.compile(p) if isinstance(p, str) else p
        except re.error as e:
            raise TraceImportError(f"layer_pattern {p!r} is not a valid regular expression: {e}") from None
        if "layer" not in rx.groupindex:
            raise TraceImportError(f"layer_pattern {rx.pattern!r} has no named group 'layer': write e.g. "
                                   f"r'(?P<group>blocks)\\.(?P<layer>\\d+)'")
        out.append(rx)
    if not out:
        raise TraceImportError("layer_pattern is an empty list: pass at least one regular expression")
    return out, False


@dataclass(frozen=True)
class TraceImportOptions:
    """Everything :func:`~offload_lab.from_torch_profiler` can be told, checked when built.

    - ``label`` — the run's label; ``None``: the file name without ``.json[.gz]`` (a directory:
      ``"<dir> · N ranks"``; a live profiler: ``"torch.profiler"``).
    - ``layer_pattern`` — a regex (str or compiled) or a list of them tried in order, each with
      a named group ``layer`` and optionally ``group``; ``None``: the default
      (:data:`DEFAULT_LAYER_PATTERN`, with the ``nn.Module: <Class>_<idx>`` fallback). Compiled
      and checked here, kept as a tuple of compiled patterns.
    - ``max_bytes`` — the largest trace file read (16 GiB).
    - ``max_decompressed_bytes`` — the most JSON text a gzipped trace may decompress to (16 GiB).
    - ``max_value_chars`` — the longest single JSON value (one event, one top-level entry), at
      least 1 MiB (64 MiB); it is measured when the reader reads on to finish a value, so it
      holds to within the 1 MiB the reader reads at a time.

    A value outside what is accepted is a one-line :class:`TraceImportError`:

    >>> opts = TraceImportOptions(layer_pattern=r"(?P<group>blocks)\\.(?P<layer>\\d+)", max_value_chars=1 << 20)
    >>> [p.pattern for p in opts.patterns], opts.max_bytes == 16 << 30
    (['(?P<group>blocks)\\\\.(?P<layer>\\\\d+)'], True)
    >>> TraceImportOptions(max_value_chars=True)
    Traceback (most recent call last):
        ...
    offload_lab.record.kineto.options.TraceImportError: max_value_chars = True; accepted: an int ≥ 1048576 (1 MiB, what the reader reads at a time)
    >>> TraceImportOptions(layer_pattern=r"blocks\\.\\d+")
    Traceback (most recent call last):
        ...
    offload_lab.record.kineto.options.TraceImportError: layer_pattern 'blocks\\\\.\\\\d+' has no named group 'layer': write e.g. r'(?P<group>blocks)\\.(?P<layer>\\d+)'
    """

    label: str | None = None
    layer_pattern: str | re.Pattern | Sequence[str | re.Pattern] | None = None
    max_bytes: int = MAX_TRACE_BYTES
    max_decompressed_bytes: int = MAX_TRACE_BYTES
    max_value_chars: int = MAX_VALUE_CHARS
    #: the compiled patterns (the default one when ``layer_pattern`` is None)
    patterns: tuple[re.Pattern, ...] = field(init=False, repr=False, compare=False)
    #: whether ``patterns`` is the default (which enables the ``nn.Module`` fallback)
    default_patterns: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.label is not None and not isinstance(self.label, str):
            raise TraceImportError(f"label = {self.label!r:.80}; accepted: a str or None")
        patterns, default = compile_patterns(self.layer_pattern)
        # frozen: set through object.__setattr__, once, here
        object.__setattr__(self, "layer_pattern", None if default else tuple(patterns))
        object.__setattr__(self, "patterns", tuple(patterns))
        object.__setattr__(self, "default_patterns", default)
        for name in ("max_bytes", "max_decompressed_bytes"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum=1, error=TraceImportError))
        object.__setattr__(self, "max_value_chars", check_int(
            "max_value_chars", self.max_value_chars, minimum=MIN_VALUE_CHARS, error=TraceImportError,
            note="1 MiB, what the reader reads at a time"))

    def text_cap(self, gz: bool) -> int:
        """The most text read from a trace: its decompressed size when gzipped, else its file size."""
        return self.max_decompressed_bytes if gz else self.max_bytes


#: the options of a plain ``from_torch_profiler(path)``
DEFAULT_OPTIONS = TraceImportOptions()
