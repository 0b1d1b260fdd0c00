"""Import a torch.profiler / Kineto chrome trace as a :class:`~offload_lab.record.run.Run`.

>>> from offload_lab.record.kineto import from_torch_profiler
>>> run = from_torch_profiler("tests/data/traces/gpu_two_steps.json")  # doctest: +SKIP
>>> run.events.groupby(["kind", "tier"])["bytes"].sum()                # doctest: +SKIP

**Reading.** The file is streamed, never ``json.load``-ed: text is read in 1 MiB chunks (gzip
detected by content, decompressed incrementally) and the ``traceEvents`` array is decoded one
event object at a time; only the fields the frames need are kept, in compact arrays. Where
the file is laid out as torch writes it, the rows the import never uses (``cpu_op``, flow
arrows, Python frames: most of a trace) are framed by the newlines between events but not
decoded (:meth:`_Reader._array`); every row that is used is decoded and checked. A 1 M-event
trace loads in a few seconds with memory bounded by the kernels and copies it holds
(``benchmarks/trace_import.py``). Malformed or truncated files raise :class:`TraceFormatError`
naming the problem and where (event index in ``traceEvents``, byte offset).

**Mapping** onto the frames:

- **copies** — ``gpu_memcpy`` rows named ``Memcpy HtoD (<src> -> Device)`` become ``copy``
  events on the ``copy`` stream, one per memcpy, ``bytes`` from ``args["bytes"]``; the source
  names the tier: ``Pinned`` → ``pinned``, ``Pageable`` → ``pageable``, anything else →
  ``unknown`` (a mapped checkpoint view is copied as pageable memory and shows as
  ``pageable``: the trace cannot tell). DtoH, DtoD, PtoP and HtoH copies load no weights: they
  are left out of the events (so out of ``bytes_moved`` and overlap), with their count and
  bytes in ``meta["skipped"]["memcpy_not_htod"]``. The CUDA streams that carried HtoD copies
  are ``meta["streams"]["copy"]`` (``[device, stream]`` pairs).
- **compute** — ``kernel`` rows. Kernels inside a layer become one ``compute`` event per use of
  the layer and CUDA stream (first kernel start to last kernel end, as the runtime brackets a
  layer by events in its hooks); kernels outside every layer stay one event each. Their streams
  are ``meta["streams"]["compute"]``. A trace without kernels (a CPU-only profile) takes each
  layer's outermost annotation span as its compute.
- **host_block** — host-side ``cudaMemcpy*`` runtime calls whose device copy is an HtoD copy
  from pageable memory, and synchronous ``cudaMemcpy`` calls, blocked the CPU thread for their
  duration: one ``host_block`` row each on the ``host`` stream, with the copy's tier and bytes.
- **layers** — annotation names are matched against ``layer_pattern`` (named groups ``layer``
  and optionally ``group``; without one the group is :data:`UNNAMED_GROUP`). The default finds
  ``<group>.<idx>`` anywhere in a ``record_function`` label (``blocks.17``,
  ``token_refiner.blocks.3``, ``prefetch blocks.4``). A GPU row belongs to the innermost
  matching ``gpu_user_annotation`` on its stream, else (through its ``correlation`` id) to the
  innermost matching CPU annotation around its launch. Only when no label matches at all,
  ``nn.Module: <Class>_<idx>`` spans (``with_stack=True``) are used: the outermost of those
  whose class has two or more instances (``Block_3``, not the ``Linear_0`` inside it nor the
  single root module), group = class name. Rows outside every layer carry group
  :data:`NO_GROUP` (``""``) and layer :data:`NO_LAYER` (``-1``): they are in ``Run.events``
  but have no row in ``Run.layers``.
- **steps** — ``ProfilerStep#N`` spans give step ``N``; a GPU row belongs to the step in which
  it was launched (a gap between two steps belongs to the earlier one); step bounds are the
  span widened to the rows it holds. A copy attributed to a layer is labelled with the step
  that *uses* it: the step of that layer's first compute that ends after the copy ends (a
  prefetch issued at the end of step n for step n+1 carries n+1); a copy with no later use in
  the trace (the prefetch for a step that was not recorded) is dropped and counted in
  ``meta["skipped"]["copies_without_a_later_use"]``. Without ``ProfilerStep`` spans the whole
  trace is step 0. Rows outside every step are dropped and counted in
  ``meta["skipped"]["outside_steps"]``.
- **times** — microseconds → seconds from the first timestamp of the complete (``ph: X``) rows
  other than ``cpu_op`` and ``python_function`` (Kineto's own ``PyTorch Profiler`` span starts
  before them all), so that every way of reading a file gives the same times.
- **placement** (``Run.layers``) — per observed layer: ``tier`` from its HtoD copies (the tier
  carrying most of its bytes; layers with mixed tiers are listed in
  ``meta["mixed_tier_layers"]``), ``unknown`` when it had no HtoD copy (never guessed);
  ``bytes`` = the most HtoD bytes copied for it in one step; ``streamed`` = copied in every step
  in which it computed; ``mapped_bytes`` 0; ``pin_rank`` <NA>. ``wait`` rows are not derived:
  a trace does not record what a stream waited on.
- **meta** — ``backend`` ``"trace"``, ``simulated`` False, ``label`` (file name without
  ``.json[.gz]`` unless given), ``source``, ``device_name`` (from ``deviceProperties``; None when
  the trace has none, ``"cpu"`` without GPU rows), ``devices``, ``device_properties``,
  ``streams``, ``counts`` (events, by category and phase, kernels, HtoD copies per tier,
  steps, layer annotations), ``skipped``, ``layer_source``, ``layer_pattern``,
  ``compute_source``, ``time_origin_us``, ``trace`` (the trace's own header fields).
"""

from __future__ import annotations

import codecs
import inspect
import json
import os
import re
import tempfile
import uuid
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from offload_lab.record.run import Run

__all__ = ["from_torch_profiler", "iter_trace_events", "TraceImportError", "TraceFormatError",
           "DEFAULT_LAYER_PATTERN", "MODULE_PATTERN", "NO_GROUP", "NO_LAYER", "UNNAMED_GROUP"]

NO_GROUP = ""
NO_LAYER = -1
#: the group of layers matched by a ``layer_pattern`` without a (non-empty) ``group`` group
UNNAMED_GROUP = "layers"

#: ``<group>.<idx>`` anywhere in a label: ``blocks.17``, ``token_refiner.blocks.3.attn``.
DEFAULT_LAYER_PATTERN = r"(?<![\w.])(?P<group>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\.(?P<layer>\d+)(?![\w])"
#: ``nn.Module: Block_3`` as written by torch.profiler with ``with_stack=True``.
MODULE_PATTERN = r"^nn\.Module: (?P<group>[A-Za-z_]\w*?)_(?P<layer>\d+)$"

_CHUNK = 1 << 20
_NO_USE = -2  # step of a copy whose layer never runs again in the trace
# A JSON error this close to the end of the buffer may just be an event cut by the chunk edge.
_EDGE = 16
_WS = re.compile(r"[ \t\n\r]*")
_LOW = 1 << 16        # refill before fewer than this many characters are left
_MEMCPY = re.compile(r"Memcpy (\w+)(?: \((\w+) -> (\w+)\))?")
_STEP = re.compile(r"ProfilerStep#(\d+)$")

# category -> handler code; Kineto's spellings across torch versions
_GPU_KERNEL, _GPU_MEMCPY, _GPU_MEMSET, _GPU_ANN, _CPU_ANN, _PY_FN, _RUNTIME, _CPU_OP = range(8)
_CATS = {
    "kernel": _GPU_KERNEL, "Kernel": _GPU_KERNEL,
    "gpu_memcpy": _GPU_MEMCPY, "Memcpy": _GPU_MEMCPY,
    "gpu_memset": _GPU_MEMSET, "Memset": _GPU_MEMSET,
    "gpu_user_annotation": _GPU_ANN,
    "user_annotation": _CPU_ANN,
    "python_function": _PY_FN,
    "cuda_runtime": _RUNTIME, "cuda_driver": _RUNTIME, "Runtime": _RUNTIME,
    "cpu_op": _CPU_OP, "Operator": _CPU_OP,
}


class TraceImportError(ValueError):
    """A bad argument to :func:`from_torch_profiler` (input type, layer pattern, profiler state)."""


class TraceFormatError(TraceImportError):
    """A file that is not a readable chrome trace; the message says what is wrong and where.

    >>> str(TraceFormatError("trace.json: event 12 has no 'ts'"))
    "trace.json: event 12 has no 'ts'"
    """


# ------------------------------------------------------------------------------------------
# streaming JSON
# ------------------------------------------------------------------------------------------

class _Text:
    """Decoded text of a (possibly gzipped) file, read chunk by chunk, with byte offsets."""

    def __init__(self, fh: Any, name: str, gz: bool):
        self.fh, self.name, self.gz = fh, name, gz
        self.dec = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.base = 0          # byte offset (of the decompressed stream) of buf[0]
        self.eof = False
        self.cut_gzip = False  # the gzip stream ended before its end-of-stream marker

    def refill(self, pos: int) -> int:
        """Drop ``buf[:pos]``, append one more chunk; returns the new ``pos`` (0)."""
        if self.eof:
            return pos
        try:
            data = self.fh.read(_CHUNK)
        except EOFError:
            data, self.cut_gzip = b"", True
        except (OSError, zlib.error) as e:  # BadGzipFile, CRC errors
            raise TraceFormatError(
                f"{self.name}: corrupt gzip data near byte {self.offset(len(self.buf))} of the "
                f"decompressed stream ({e})") from None
        try:
            text = self.dec.decode(data, final=not data)
        except UnicodeDecodeError as e:
            raise TraceFormatError(
                f"{self.name}: not UTF-8 text near byte {self.offset(len(self.buf)) + e.start}") from None
        if not data:
            self.eof = True
        self.base = self.offset(pos)
        self.buf = self.buf[pos:] + text
        return 0

    def offset(self, pos: int) -> int:
        """Byte offset of ``buf[pos]`` (characters are bytes in ASCII text, the usual case)."""
        head = self.buf[:pos]
        return self.base + (len(head) if head.isascii() else len(head.encode("utf-8")))

    def where(self, pos: int) -> str:
        return f"byte {self.offset(pos)}" + (" of the decompressed stream" if self.gz else "")


class _Reader:
    """Walks the top level of a chrome trace; :meth:`events` yields batches of its events."""

    # top-level keys whose (small) values are kept for meta
    KEEP = ("schemaVersion", "deviceProperties", "distributedInfo", "traceName", "displayTimeUnit",
            "baseTimeNanoseconds")

    def __init__(self, text: _Text, read_python_functions: bool = True, decode_all: bool = False):
        self.t = text
        self.decode_all = decode_all
        self.pos = 0
        self.header: dict[str, Any] = {}
        self.keys: list[str] = []
        self.n_events = 0
        # the batch last handed out: (its start in buf, index of its first event, event heads)
        self._batch: tuple = (None, 0, None, None)
        self._scan = json.scanner.make_scanner(json.JSONDecoder())
        self._layouts = _layouts(read_python_functions)

    # -- low level -------------------------------------------------------------------------
    def _truncated(self, what: str) -> TraceFormatError:
        t = self.t
        after = (f"after event {self.n_events - 1}" if self.n_events else "before the first event")
        why = " (the gzip stream ends before its end marker)" if t.cut_gzip else ""
        return TraceFormatError(f"{t.name}: truncated {after} at {t.where(len(t.buf))}{why}: "
                                f"the file ends inside {what}")

    def _peek(self, what: str) -> str:
        """Skip whitespace; the next character (refilling as needed)."""
        t = self.t
        while True:
            self.pos = _WS.match(t.buf, self.pos).end()
            if self.pos < len(t.buf):
                return t.buf[self.pos]
            if t.eof:
                raise self._truncated(what)
            self.pos = t.refill(self.pos)

    def _value(self, what: str) -> Any:
        """Decode one JSON value at ``pos``, reading more text while it is cut by the chunk edge."""
        t = self.t
        while True:
            buf, pos = t.buf, self.pos
            try:
                obj, end = self._scan(buf, pos)
            except StopIteration as e:
                # no value could start here; C's scanner also says so for a value nested inside,
                # with the position where it looked
                at = e.value if isinstance(e.value, int) and e.value >= pos else pos
                if len(buf) - at < _EDGE and not t.eof:
                    self.pos = t.refill(pos)
                    continue
                if _cut(buf[at:]):
                    raise self._truncated(what) from None
                raise TraceFormatError(f"{t.name}: invalid JSON in {what} at {t.where(at)}: "
                                       f"expected a value, found {buf[at:at + 20]!r}") from None
            except json.JSONDecodeError as e:
                unterminated = e.msg.startswith("Unterminated string")
                if not t.eof and (unterminated or e.pos >= len(buf) - _EDGE):
                    self.pos = t.refill(pos)
                    continue
                if unterminated or _cut(buf[e.pos:]):
                    raise self._truncated(what) from None
                raise TraceFormatError(f"{t.name}: invalid JSON in {what} at {t.where(e.pos)}: "
                                       f"{e.msg}") from None
            if end >= len(buf) and not t.eof:
                # a bare number may go on in the next chunk: decode again with more text
                self.pos = t.refill(pos)
                continue
            self.pos = end
            return obj

    # -- structure -------------------------------------------------------------------------
    def index(self, j: int) -> int:
        """Index in traceEvents of event ``j`` of the batch last handed out (counted on demand)."""
        start, base, heads, sep = self._batch
        if heads is None:
            return base + j
        # the separator before an event ends two characters into it ('{' + newline or quote)
        return base + self.t.buf.count(sep, start, heads[j] + 2)

    def events(self) -> Iterator[tuple[list, int, int]]:
        t = self.t
        self.pos = t.refill(0)
        if t.buf.startswith("\ufeff"):
            self.pos = 1
        try:
            c = self._peek("the top level")
        except TraceFormatError:
            if t.cut_gzip:
                raise
            raise TraceFormatError(f"{t.name}: not a chrome trace: the file is empty") from None
        if c == "[":  # the chrome "JSON Array Format": the file is the event array itself
            self.pos += 1
            yield from self._array()
            self.keys.append("traceEvents")
            self._end_of_file()
            return
        if c != "{":
            raise TraceFormatError(f"{t.name}: not a chrome trace: the top level is not a JSON object "
                                   f"(starts with {t.buf[self.pos:self.pos + 20]!r} at {t.where(self.pos)})")
        self.pos += 1
        first = True
        while True:
            c = self._peek("the top-level object")
            if c == "}":
                self.pos += 1
                break
            if not first:
                if c != ",":
                    raise TraceFormatError(f"{t.name}: invalid JSON at {t.where(self.pos)}: expected ',' "
                                           f"or '}}' between top-level keys, found {c!r}")
                self.pos += 1
                self._peek("the top-level object")
            first = False
            at = self.pos
            key = self._value("a top-level key")
            if not isinstance(key, str):
                raise TraceFormatError(f"{t.name}: invalid JSON at {t.where(at)}: a top-level key must "
                                       f"be a string, found {key!r}")
            if self._peek(f"the value of {key!r}") != ":":
                raise TraceFormatError(f"{t.name}: invalid JSON at {t.where(self.pos)}: expected ':' "
                                       f"after top-level key {key!r}")
            self.pos += 1
            self.keys.append(key)
            if key == "traceEvents":
                c = self._peek("traceEvents")
                if c != "[":
                    raise TraceFormatError(f"{t.name}: not a chrome trace: traceEvents at "
                                           f"{t.where(self.pos)} is not an array (starts with {c!r})")
                self.pos += 1
                yield from self._array()
            else:
                self._peek(f"the value of top-level key {key!r}")
                value = self._value(f"the value of top-level key {key!r}")
                if key in self.KEEP:
                    self.header[key] = value
        if "traceEvents" not in self.keys:
            raise TraceFormatError(f"{t.name}: not a chrome trace: top level has no traceEvents "
                                   f"(keys: {self.keys})")
        self._end_of_file()

    def _end_of_file(self) -> None:
        t = self.t
        while True:
            self.pos = _WS.match(t.buf, self.pos).end()
            if self.pos < len(t.buf):
                raise TraceFormatError(f"{t.name}: unexpected data after the trace at {t.where(self.pos)}: "
                                       f"{t.buf[self.pos:self.pos + 20]!r}")
            if t.eof:
                if t.cut_gzip:
                    raise TraceFormatError(f"{t.name}: truncated gzip stream after the end of the trace "
                                           f"at {t.where(self.pos)}")
                return
            self.pos = t.refill(self.pos)

    def _array(self) -> Iterator[tuple[list, int, int]]:
        """The elements of traceEvents in batches ``(pairs, events, cpu_op marks)``.

        ``pairs`` holds ``(event, _)`` for the events decoded; ``events`` counts every event the
        batch covers; ``cpu_op marks`` counts the ``cpu_op`` rows in it, decoded or not.
        :meth:`index` turns a position in the last batch into an index in traceEvents.

        Rows the import never reads (``cpu_op``, flow arrows, ``python_function`` frames other
        than ``nn.Module``: most of a trace) are not decoded when the file is laid out as torch
        writes it (:func:`_layouts`): there, events are separated by newlines that JSON allows
        nowhere inside a string, so a block of whole events is framed with ``str.rfind`` and
        ``str.count`` (in C) without decoding anything; within it a regex finds the heads of the
        rows that are read, and only those are decoded (and so validated). When a block does
        not add up or decode cleanly, or the file has another layout (one line, as HTA's test
        data), every event is decoded one by one, which also pins any error to its event and
        byte.
        """
        t = self.t
        scan, ws = self._scan, _WS.match
        kineto, lines = self._layouts
        idx = 0
        fast = not self.decode_all
        pending: list = []   # events decoded one by one, not yet handed out
        missed = None        # the buffer in which no block was found
        slow_until = 0       # events up to this index are decoded one by one
        if self._peek("traceEvents") == "]":
            self.pos += 1
            return
        buf, pos = t.buf, self.pos
        low = len(buf) - _LOW
        while True:
            if pos > low and not t.eof:
                pos = t.refill(pos)
                buf = t.buf
                low = len(buf) - _LOW
            lay = (kineto if buf.startswith(kineto.start, pos) else lines if buf.startswith(lines.start, pos)
                   else None) if fast and idx >= slow_until else None
            j = -1
            if lay is not None and (t.base, len(buf)) != missed:
                j = buf.rfind(lay.sep, pos)
                if j <= pos:  # no whole block in this buffer: do not look again until it changes
                    missed = (t.base, len(buf))
            if j > pos:
                # [pos, end) holds whole events; the next one starts at j + next_off. As many
                # events as separators + 1, or the block is not what it seems (a missing comma,
                # another layout): then it is decoded event by event
                end = j + lay.end_off
                n = buf.count(lay.sep, pos, end) + 1
                ok = lay.framed(buf, pos, end, n)
                if ok:
                    heads = [m.start() for m in lay.heads.finditer(buf, pos, end)]
                    if lay.first is not None and lay.first.match(buf, pos) and heads[:1] != [pos]:
                        heads.insert(0, pos)
                    try:
                        pairs = list(map(scan, repeat(buf, len(heads)), heads))
                        ok = not pairs or pairs[-1][1] <= end
                    except (StopIteration, json.JSONDecodeError):
                        ok = False
                if ok:
                    if pending:
                        self._batch = (None, idx - len(pending), None, None)
                        yield pending, len(pending), 0
                        pending = []
                    self._batch = (pos, idx, heads, lay.sep)
                    yield pairs, n, buf.count(lay.cpu_marker, pos, end)
                    idx += n
                    self.n_events = idx
                    pos = j + lay.next_off
                    continue
                # decode this block event by event: that finds what is wrong, or gets past a
                # quirk of the layout
                slow_until = idx + n
            try:
                ev, end = scan(buf, pos)
                if end >= len(buf):
                    raise StopIteration  # may go on in the next chunk
                pos = end
            except (StopIteration, json.JSONDecodeError):
                # cut by the chunk edge (read more), or really invalid: the slow path decides
                self.pos = pos
                self.n_events = idx
                self._peek(f"event {idx}")
                ev = self._value(f"event {idx}")
                buf, pos = t.buf, self.pos
                low = len(buf) - _LOW
            idx += 1
            self.n_events = idx
            pending.append((ev, None))
            if len(pending) >= 4096:
                self._batch = (None, idx - len(pending), None, None)
                yield pending, len(pending), 0
                pending = []
            pos = ws(buf, pos).end()
            if pos >= len(buf):
                self.pos = pos
                c = self._peek(f"traceEvents (after event {idx - 1})")
                buf, pos = t.buf, self.pos
                low = len(buf) - _LOW
            else:
                c = buf[pos]
            if c == ",":
                pos = ws(buf, pos + 1).end()
                if pos >= len(buf):
                    self.pos = pos
                    self._peek(f"traceEvents (after event {idx - 1})")
                    buf, pos = t.buf, self.pos
                    low = len(buf) - _LOW
                continue
            if c == "]":
                self.pos = pos + 1
                if pending:
                    self._batch = (None, idx - len(pending), None, None)
                    yield pending, len(pending), 0
                return
            raise TraceFormatError(f"{t.name}: invalid JSON after event {idx - 1} at {t.where(pos)}: "
                                   f"expected ',' or ']' between events, found {buf[pos:pos + 20]!r}")


class _Layout:
    """How a writer lays out its events, so whole events can be framed without decoding them.

    ``sep`` separates two events (it holds the only newline(s) there: JSON has no raw newline
    inside a string); a block ends ``end_off`` characters into the last ``sep`` and the next
    event starts ``next_off`` into it. ``heads`` finds the events that must be decoded (every
    event but the rows the import ignores); ``first`` does so for a block's first event where
    ``heads`` needs the separator before it.
    """

    def __init__(self, sep: str, end_off: int, next_off: int, start: str, head: str,
                 cpu_marker: str, skip: str, first: str | None):
        self.sep, self.end_off, self.next_off, self.start = sep, end_off, next_off, start
        self.cpu_marker = cpu_marker
        self.heads = re.compile(head + "(?!" + skip + ")")
        self.first = re.compile(first + "(?!" + skip + ")") if first else None

    def framed(self, buf: str, pos: int, end: int, n: int) -> bool:
        """Whether [pos, end) is exactly ``n`` events in this layout."""
        if self.first is None:  # Kineto: one head line per event
            return buf.count(self.start, pos, end) == n
        return buf.count("\n", pos, end) == n - 1  # one event per line


def _layouts(read_python_functions: bool) -> tuple[_Layout, _Layout]:
    """Kineto's own writer (torch <= 2.x: first keys on one line; newer: one key per line) and
    torch's Python writer (``use_python_export=True``: one event per line, no spaces)."""
    s = r"\s*"
    skip = [rf'"ph":{s}"X",{s}"cat":{s}"(?:cpu_op|Operator)",{s}"name":{s}"(?!ProfilerStep#)',
            rf'"ph":{s}"[sf]",']
    if not read_python_functions:
        skip.append(rf'"ph":{s}"X",{s}"cat":{s}"python_function",{s}"name":{s}"(?!nn\.Module: )')
    skip_rx = "|".join(skip)
    kineto = _Layout("\n  },\n  {\n", 4, 8, '{\n    "', r'\{\n {4}(?=")', '"cat": "cpu_op",', skip_rx, None)
    lines = _Layout('},\n{"', 1, 3, '{"', r'(?<=\n)\{(?=")', '"cat":"cpu_op",', skip_rx, r'\{(?=")')
    return kineto, lines


_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_NUMBER_PREFIX = re.compile(r"-?\d*(?:\.\d*)?(?:[eE][-+]?\d*)?")


def _cut(rest: str) -> bool:
    """Whether the text left at the end of the file is the start of a value (a cut), not junk."""
    rest = rest.strip()
    return (not rest or any(lit.startswith(rest) for lit in _LITERALS)
            or _NUMBER_PREFIX.fullmatch(rest) is not None)


class _Gunzip:
    """gzip decompression that hands out every byte it could decompress before a cut (the
    ``gzip`` module drops the last block's output when it raises ``EOFError``)."""

    def __init__(self, fh: IO[bytes]):
        self.fh = fh
        self.d = zlib.decompressobj(wbits=31)

    def read(self, n: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < n:
            if self.d.eof:
                data = self.d.unused_data or self.fh.read(_CHUNK)
                if not data:
                    break  # the clean end of the last gzip member
                self.d = zlib.decompressobj(wbits=31)  # another member follows
            else:
                data = self.d.unconsumed_tail or self.fh.read(_CHUNK)
                if not data:
                    if got:
                        break  # hand out what there is; the next read reports the cut
                    raise EOFError("the gzip stream ends before its end marker")
            out = self.d.decompress(data, n - got)
            parts.append(out)
            got += len(out)
        return b"".join(parts)

    def __enter__(self) -> _Gunzip:
        return self

    def __exit__(self, *exc: object) -> None:
        self.fh.close()


def _open(path: Path) -> tuple[Any, bool]:
    fh = open(path, "rb")  # noqa: SIM115 - closed by the caller
    magic = fh.read(2)
    fh.seek(0)
    if magic == b"\x1f\x8b":  # by content, not by name: a .json may be gzipped and vice versa
        return _Gunzip(fh), True
    return fh, False


def iter_trace_events(path: str | os.PathLike) -> Iterator[dict]:
    """Stream the ``traceEvents`` of a chrome trace (``.json`` or gzipped), one dict at a time.

    Memory stays bounded by one chunk plus one event, whatever the size of the file.

    >>> sum(1 for e in iter_trace_events("tests/data/traces/hta-alexnet.json.gz"))  # doctest: +SKIP
    1408
    """
    path = Path(path)
    raw, gz = _open(path)
    with raw:
        reader = _Reader(_Text(raw, path.name, gz), decode_all=True)
        for pairs, _, _ in reader.events():
            for ev, _ in pairs:
                yield ev


# ------------------------------------------------------------------------------------------
# collecting what the frames need
# ------------------------------------------------------------------------------------------

class _Matcher:
    """Annotation name -> (group, layer) or None, cached (names repeat every step)."""

    def __init__(self, patterns: Sequence[re.Pattern]):
        self.patterns = patterns
        self.cache: dict[str, tuple[str, int] | None] = {}

    def __call__(self, name: str) -> tuple[str, int] | None:
        try:
            return self.cache[name]
        except KeyError:
            pass
        hit = None
        for p in self.patterns:
            m = p.search(name)
            if m:
                hit = (m.groupdict().get("group") or UNNAMED_GROUP, int(m.group("layer")))
                break
        if len(self.cache) < 1_000_000:
            self.cache[name] = hit
        return hit


def _compile_patterns(layer_pattern: Any) -> tuple[list[re.Pattern], bool]:
    """Returns the patterns and whether they are the default (which enables the nn.Module fallback)."""
    if layer_pattern is None:
        return [re.compile(DEFAULT_LAYER_PATTERN)], True
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


def _num(ev: dict, key: str, here: Callable[[], int], name: str) -> float:
    v = ev.get(key)
    if type(v) is int or type(v) is float:
        return v
    if v is None and key not in ev:
        raise TraceFormatError(f"{name}: event {here()} ({ev.get('name')!r}) has no {key!r}")
    raise TraceFormatError(f"{name}: event {here()} ({ev.get('name')!r}) has {key!r} = {v!r} "
                           f"({type(v).__name__}); expected a number (microseconds)")


def _args(ev: dict, here: Callable[[], int], name: str) -> dict:
    a = ev.get("args")
    if a is None:
        return {}
    if type(a) is not dict:
        raise TraceFormatError(f"{name}: event {here()} ({ev.get('name')!r}) has 'args' = {a!r:.60} "
                               f"({type(a).__name__}); expected an object")
    return a


class _Collected:
    """Compact columns of the rows that matter, in raw trace microseconds."""

    def __init__(self) -> None:
        self.t0 = float("inf")
        self.t1 = float("-inf")
        self.lanes: dict[tuple, int] = {}
        self.lane_keys: list[tuple] = []       # (pid, tid-or-stream, is_gpu)
        self.k_ts, self.k_dur = array("d"), array("d")
        self.k_lane, self.k_corr = array("i"), array("q")
        self.r_corr, self.r_ts, self.r_lane = array("q"), array("d"), array("i")
        self.copies: list[tuple] = []          # (ts, dur, lane, corr, bytes, tier)
        self.other_copies: dict[str, list[int]] = {}   # direction -> [count, bytes]
        self.memcpy_calls: list[tuple] = []    # (name, ts, dur, lane, corr)
        self.gpu_spans: list[tuple] = []       # (lane, ts, end, (group, layer))
        self.cpu_spans: list[tuple] = []
        self.module_spans: list[tuple] = []
        self.steps: dict[int, list[float]] = {}
        self.by_cat: dict[str, int] = {}
        self.by_ph: dict[str, int] = {}
        self.negative_dur = 0
        self.unmatched_annotations = 0
        self.unused = 0    # flow arrows and python frames other than nn.Module: never read
        self.devices: dict[int, int] = {}      # device id -> GPU rows


def _step_span(steps: dict[int, list[float]], nm: str, ts: float, dur: float) -> None:
    ms = _STEP.match(nm)
    if ms:
        n = int(ms.group(1))
        span = steps.get(n)
        if span is None:
            steps[n] = [ts, ts + dur]
        else:  # the same step seen on two threads: one span around both
            span[0], span[1] = min(span[0], ts), max(span[1], ts + dur)


def _collect(reader: _Reader, name: str, match: _Matcher, module_match: _Matcher | None) -> _Collected:
    c = _Collected()
    lanes, lane_keys = c.lanes, c.lane_keys
    k_ts, k_dur, k_lane, k_corr = c.k_ts.append, c.k_dur.append, c.k_lane.append, c.k_corr.append
    r_corr, r_ts, r_lane = c.r_corr.append, c.r_ts.append, c.r_lane.append
    by_cat, by_ph = c.by_cat, c.by_ph
    cats = _CATS
    t0, t1 = c.t0, c.t1

    def lane_of(pid: Any, tid: Any, gpu: bool) -> int:
        key = (pid, tid, gpu)
        try:
            return lanes[key]
        except KeyError:
            pass
        except TypeError:
            raise TraceFormatError(f"{name}: event {here()} has pid {pid!r} / tid {tid!r}; expected "
                                   f"numbers or strings") from None
        lanes[key] = len(lane_keys)
        lane_keys.append(key)
        return lanes[key]

    j = 0

    def here() -> int:
        return reader.index(j)

    for pairs, n_events, cpu_marks in reader.events():
        cpu_before = by_cat.get("cpu_op", 0)
        for j, (ev, _) in enumerate(pairs):  # noqa: B007 - `here` reads j to name a bad event
            if type(ev) is not dict:
                raise TraceFormatError(f"{name}: event {here()} is {type(ev).__name__} {ev!r:.60}; expected "
                                       f"a JSON object")
            ph = ev.get("ph")
            if ph != "X":
                if type(ph) is not str:
                    if ph is None:
                        raise TraceFormatError(f"{name}: event {here()} ({ev.get('name')!r}) has no 'ph'")
                    raise TraceFormatError(f"{name}: event {here()} has 'ph' = {ph!r}; expected a string "
                                           f"such as 'X'")
                if ph == "s" or ph == "f":  # flow arrows: never used (and not decoded in Kineto blocks)
                    c.unused += 1
                else:
                    by_ph[ph] = by_ph.get(ph, 0) + 1
                continue
            ts = ev.get("ts")
            if type(ts) is not float and type(ts) is not int:
                ts = _num(ev, "ts", here, name)
            dur = ev.get("dur")
            if type(dur) is not float and type(dur) is not int:
                dur = _num(ev, "dur", here, name)
            cat = ev.get("cat")
            try:
                by_cat[cat] += 1
            except (KeyError, TypeError):
                if cat is not None and type(cat) is not str:
                    raise TraceFormatError(f"{name}: event {here()} ({ev.get('name')!r}) has 'cat' = {cat!r}; "
                                           f"expected a string") from None
                by_cat[cat] = 1
            if dur < 0:
                c.negative_dur += 1
                continue
            kind = cats.get(cat)
            if kind != _CPU_OP and kind != _PY_FN:
                # the origin and the end of the trace come from the rows that are always decoded,
                # so that both ways of reading a file give the same times
                if ts < t0:
                    t0 = ts
                if ts + dur > t1:
                    t1 = ts + dur
            if kind is None:
                continue
            if kind == _CPU_OP:
                # torch < 1.11 wrote ProfilerStep#N as a cpu_op
                nm = ev.get("name")
                if type(nm) is str and nm.startswith("ProfilerStep#"):
                    _step_span(c.steps, nm, ts, dur)
                continue
            if kind == _GPU_KERNEL:  # the hot paths (kernels, runtime calls) inline what they can
                args = ev.get("args")
                if type(args) is not dict:
                    args = _args(ev, here, name)
                pid = args.get("device")
                if pid is None:
                    pid = ev.get("pid")
                tid = args.get("stream")
                if tid is None:
                    tid = ev.get("tid")
                try:
                    lane = lanes[(pid, tid, True)]
                except KeyError:
                    lane = lane_of(pid, tid, True)
                k_ts(ts)
                k_dur(dur)
                k_lane(lane)
                corr = args.get("correlation", -1)
                k_corr(corr if type(corr) is int else -1)
                continue
            if kind == _RUNTIME:
                args = ev.get("args")
                if type(args) is not dict:
                    args = _args(ev, here, name)
                corr = args.get("correlation", -1)
                corr = corr if type(corr) is int else -1
                pid, tid = ev.get("pid"), ev.get("tid")
                try:
                    lane = lanes[(pid, tid, False)]
                except KeyError:
                    lane = lane_of(pid, tid, False)
                r_corr(corr)
                r_ts(ts)
                r_lane(lane)
                nm = ev.get("name")
                if type(nm) is str and (nm.startswith("cudaMemcpy") or nm.startswith("cuMemcpy")):
                    c.memcpy_calls.append((nm, ts, dur, lane, corr))
                continue
            nm = ev.get("name")
            if type(nm) is not str:
                raise TraceFormatError(f"{name}: event {here()} (cat {cat!r}) has 'name' = {nm!r}; expected "
                                       f"a string")
            if kind == _GPU_MEMCPY:
                args = _args(ev, here, name)
                m = _MEMCPY.match(nm)
                direction = m.group(1) if m else nm
                nbytes = args.get("bytes", 0)
                if type(nbytes) is float and nbytes.is_integer():
                    nbytes = int(nbytes)
                if type(nbytes) is not int:
                    raise TraceFormatError(f"{name}: event {here()} ({nm!r}) has args.bytes = {nbytes!r}; "
                                           f"expected an integer")
                if direction != "HtoD":
                    tot = c.other_copies.setdefault(direction, [0, 0])
                    tot[0] += 1
                    tot[1] += nbytes
                    continue
                src = (m.group(2) or "") if m else ""
                tier = "pinned" if src == "Pinned" else "pageable" if src == "Pageable" else "unknown"
                pid = args.get("device", ev.get("pid"))
                lane = lane_of(pid, args.get("stream", ev.get("tid")), True)
                corr = args.get("correlation", -1)
                c.copies.append((ts, dur, lane, corr if type(corr) is int else -1, nbytes, tier))
            elif kind == _GPU_ANN:
                hit = match(nm)
                if hit is None:
                    c.unmatched_annotations += 1
                    continue
                args = _args(ev, here, name)
                pid = args.get("device", ev.get("pid"))
                c.gpu_spans.append((lane_of(pid, args.get("stream", ev.get("tid")), True),
                                    ts, ts + dur, hit))
            elif kind == _CPU_ANN or kind == _PY_FN:
                if nm.startswith("ProfilerStep#"):
                    _step_span(c.steps, nm, ts, dur)
                    continue
                if kind == _PY_FN and module_match is not None:
                    if nm.startswith("nn.Module: "):
                        hit = module_match(nm)
                        if hit is not None:
                            c.module_spans.append((lane_of(ev.get("pid"), ev.get("tid"), False),
                                                   ts, ts + dur, hit))
                    else:  # counted like the Kineto blocks count the python frames they skip
                        by_cat[cat] -= 1
                        c.unused += 1
                    continue
                hit = match(nm)
                if hit is None:
                    if kind == _CPU_ANN:
                        c.unmatched_annotations += 1
                    continue
                c.cpu_spans.append((lane_of(ev.get("pid"), ev.get("tid"), False), ts, ts + dur, hit))
        if cpu_marks:  # a Kineto block: rows framed but never decoded
            decoded_cpu = by_cat.get("cpu_op", 0) - cpu_before
            by_cat["cpu_op"] = cpu_before + cpu_marks
            c.unused += n_events - len(pairs) - (cpu_marks - decoded_cpu)
    c.t0, c.t1 = t0, t1
    # rows per device, from the GPU lanes of kernels and copies
    per_lane = np.bincount(np.frombuffer(c.k_lane, dtype=np.int32), minlength=len(lane_keys)) \
        if len(c.k_lane) else np.zeros(len(lane_keys), np.int64)
    for x in c.copies:
        per_lane[x[2]] += 1
    for lane, n in enumerate(per_lane.tolist()):
        if n and lane_keys[lane][2]:
            c.devices[lane_keys[lane][0]] = c.devices.get(lane_keys[lane][0], 0) + n
    return c


# ------------------------------------------------------------------------------------------
# intervals
# ------------------------------------------------------------------------------------------

class _Segments:
    """Disjoint elementary segments of nested spans per lane, each labelled with its innermost
    span's layer and the outermost enclosing span of the same layer (one "use" of the layer)."""

    def __init__(self, spans: list[tuple[int, float, float, int, int]]):
        # spans: (lane, start, end, layer_id, span_id)
        self.by_lane: dict[int, tuple[np.ndarray, ...]] = {}
        per_lane: dict[int, list] = {}
        for s in spans:
            per_lane.setdefault(s[0], []).append(s)
        for lane, items in per_lane.items():
            self.by_lane[lane] = _flatten(items)

    def lookup(self, lanes: np.ndarray, t: np.ndarray, layer: np.ndarray, root: np.ndarray,
               todo: np.ndarray) -> None:
        """Fill ``layer``/``root`` in place for rows in ``todo`` whose time falls inside a span."""
        for lane, (st, en, ly, rt) in self.by_lane.items():
            sel = np.flatnonzero(todo & (lanes == lane))
            if not len(sel):
                continue
            i = np.searchsorted(st, t[sel], side="right") - 1
            ok = i >= 0
            ok[ok] &= t[sel[ok]] < en[i[ok]]
            layer[sel[ok]] = ly[i[ok]]
            root[sel[ok]] = rt[i[ok]]


def _flatten(items: list[tuple]) -> tuple[np.ndarray, ...]:
    """Nested spans of one lane -> sorted disjoint segments (start, end, layer id, use id)."""
    a = np.array([s[1:] for s in items], dtype=np.float64).reshape(-1, 4)
    a = a[a[:, 1] > a[:, 0]]
    a = a[np.lexsort((-a[:, 1], a[:, 0]))]
    if np.all(a[:-1, 1] <= a[1:, 0]):  # no nesting (the usual case): the spans are the segments
        return a[:, 0].copy(), a[:, 1].copy(), a[:, 2].astype(np.int64), a[:, 3].astype(np.int64)
    items = sorted(items, key=lambda s: (s[1], -s[2]))
    st: list[float] = []
    en: list[float] = []
    ly: list[int] = []
    rt: list[int] = []
    stack: list[tuple[float, int, int]] = []   # (end, layer_id, use id)
    at = 0.0
    for _, s, e, lay, sid in items:
        while stack and stack[-1][0] <= s:
            end, top_l, top_r = stack.pop()
            if end > at:
                st.append(at), en.append(end), ly.append(top_l), rt.append(top_r)
            at = end
        if stack:
            end, top_l, top_r = stack[-1]
            if s > at:
                st.append(at), en.append(s), ly.append(top_l), rt.append(top_r)
            e = min(e, end)  # overlapping but not nested: clip to the parent
        # a span inside a span of the same layer is part of the same use of that layer
        use = stack[-1][2] if stack and stack[-1][1] == lay else sid
        stack.append((e, lay, use))
        at = s
    while stack:
        end, top_l, top_r = stack.pop()
        if end > at:
            st.append(at), en.append(end), ly.append(top_l), rt.append(top_r)
        at = end
    return (np.array(st, dtype=np.float64), np.array(en, dtype=np.float64),
            np.array(ly, dtype=np.int64), np.array(rt, dtype=np.int64))


def _outermost(spans: list[tuple]) -> list[tuple]:
    """Spans (lane, start, end, ...) not inside another span of the same lane."""
    out = []
    for items in _by_lane(spans).values():
        items.sort(key=lambda s: (s[1], -s[2]))
        end = float("-inf")
        for s in items:
            if s[1] >= end:
                out.append(s)
                end = s[2]
            elif s[2] > end:  # overlapping, not nested: keep the part outside
                out.append((s[0], end, s[2], *s[3:]))
                end = s[2]
    return out


def _by_lane(spans: list[tuple]) -> dict[int, list]:
    per: dict[int, list] = {}
    for s in spans:
        per.setdefault(s[0], []).append(s)
    return per


# ------------------------------------------------------------------------------------------
# building the Run
# ------------------------------------------------------------------------------------------

def _build(c: _Collected, reader: _Reader, source: str, label: str, patterns: list[re.Pattern],
           default_patterns: bool) -> Run:
    name = source
    if c.t0 == float("inf"):
        raise TraceFormatError(f"{name}: the trace has no complete ('ph': 'X') events with a duration "
                               f"({reader.n_events} events read)")
    t0 = c.t0

    # -- layers: which spans define them ---------------------------------------------------
    layer_source = "labels" if default_patterns else "layer_pattern"
    cpu_spans, gpu_spans = c.cpu_spans, c.gpu_spans
    if default_patterns and not cpu_spans and not gpu_spans and c.module_spans:
        per_class: dict[str, set[int]] = {}
        for s in c.module_spans:
            per_class.setdefault(s[3][0], set()).add(s[3][1])
        repeated = {k for k, v in per_class.items() if len(v) >= 2}
        cpu_spans = _outermost([s for s in c.module_spans if s[3][0] in repeated])
        layer_source = "nn.Module"
    layer_ids: dict[tuple[str, int], int] = {}
    for s in (*gpu_spans, *cpu_spans):
        layer_ids.setdefault(s[3], len(layer_ids))
    if not layer_ids:
        layer_source = "none"
    keys = list(layer_ids)
    n_gpu = len(gpu_spans)
    gpu_seg = _Segments([(s[0], s[1], s[2], layer_ids[s[3]], i) for i, s in enumerate(gpu_spans)])
    cpu_seg = _Segments([(s[0], s[1], s[2], layer_ids[s[3]], n_gpu + i) for i, s in enumerate(cpu_spans)])

    # -- launches: correlation id -> CPU time and thread -----------------------------------
    r_corr = np.frombuffer(c.r_corr, dtype=np.int64) if len(c.r_corr) else np.zeros(0, np.int64)
    r_ts = np.frombuffer(c.r_ts, dtype=np.float64) if len(c.r_ts) else np.zeros(0)
    r_lane = np.frombuffer(c.r_lane, dtype=np.int32) if len(c.r_lane) else np.zeros(0, np.int32)
    order = np.argsort(r_corr, kind="stable")
    r_corr_s = r_corr[order]

    def launches(corr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found, cpu ts, cpu lane) of the runtime call with each correlation id."""
        if not len(r_corr_s) or not len(corr):
            return np.zeros(len(corr), bool), np.zeros(len(corr)), np.full(len(corr), -1, np.int32)
        i = np.minimum(np.searchsorted(r_corr_s, corr), len(r_corr_s) - 1)
        found = (r_corr_s[i] == corr) & (corr >= 0)
        j = order[i]
        return found, np.where(found, r_ts[j], np.nan), np.where(found, r_lane[j], -1)

    def attribute(lane: np.ndarray, ts: np.ndarray, corr: np.ndarray):
        """(layer id, use id, found launch, launch ts) for GPU rows."""
        n = len(ts)
        layer = np.full(n, -1, np.int64)
        root = np.full(n, -1, np.int64)
        gpu_seg.lookup(lane, ts, layer, root, np.ones(n, bool))
        found, lts, llane = launches(corr)
        cpu_seg.lookup(llane, lts, layer, root, (layer < 0) & found)
        return layer, root, found, lts

    # -- steps -----------------------------------------------------------------------------
    step_ids = sorted(c.steps)
    if step_ids:
        sspans = sorted((c.steps[k][0], c.steps[k][1], k) for k in step_ids)
        s_start = np.array([s[0] for s in sspans])
        s_end = np.array([s[1] for s in sspans])
        s_num = np.array([s[2] for s in sspans], dtype=np.int64)
    else:
        s_start, s_end, s_num = np.array([t0]), np.array([c.t1]), np.array([0], dtype=np.int64)

    def step_of(t: np.ndarray) -> np.ndarray:
        """Step number for each time, -1 outside; a gap between steps belongs to the earlier one."""
        i = np.searchsorted(s_start, t, side="right") - 1
        ok = i >= 0
        last = len(s_start) - 1
        ok[ok] &= (i[ok] < last) | (t[ok] < s_end[np.minimum(i[ok], last)])
        if not step_ids:
            ok = np.ones(len(t), bool)
            i = np.zeros(len(t), np.int64)
        return np.where(ok, s_num[np.clip(i, 0, last)], -1)

    # -- kernels -> compute ----------------------------------------------------------------
    k_ts = np.frombuffer(c.k_ts, dtype=np.float64) if len(c.k_ts) else np.zeros(0)
    k_dur = np.frombuffer(c.k_dur, dtype=np.float64) if len(c.k_dur) else np.zeros(0)
    k_lane = np.frombuffer(c.k_lane, dtype=np.int32) if len(c.k_lane) else np.zeros(0, np.int32)
    k_corr = np.frombuffer(c.k_corr, dtype=np.int64) if len(c.k_corr) else np.zeros(0, np.int64)
    frames = []
    if len(k_ts):
        compute_source = "kernels"
        layer, root, found, lts = attribute(k_lane, k_ts, k_corr)
        step = step_of(np.where(found, lts, k_ts))
        kdf = pd.DataFrame({"step": step, "layer_id": layer, "root": root, "lane": k_lane,
                            "start": k_ts, "end": k_ts + k_dur})
        inside = kdf["layer_id"] >= 0
        uses = (kdf[inside].groupby(["root", "lane", "step", "layer_id"], sort=False)
                .agg(start=("start", "min"), end=("end", "max")).reset_index())
        frames.append(uses[["step", "layer_id", "lane", "start", "end"]])
        frames.append(kdf.loc[~inside, ["step", "layer_id", "lane", "start", "end"]])
        compute = pd.concat(frames, ignore_index=True)
    else:
        spans = _outermost([(s[0], s[1], s[2], layer_ids[s[3]]) for s in cpu_spans])
        compute_source = "cpu_annotations" if spans else "none"
        compute = pd.DataFrame({
            "layer_id": np.array([s[3] for s in spans], dtype=np.int64),
            "lane": np.array([s[0] for s in spans], dtype=np.int64),
            "start": np.array([s[1] for s in spans], dtype=np.float64),
            "end": np.array([s[2] for s in spans], dtype=np.float64)})
        compute.insert(0, "step", step_of(compute["start"].to_numpy()))
    compute["bytes"] = 0

    # -- copies ----------------------------------------------------------------------------
    cp = c.copies
    cp_ts = np.array([x[0] for x in cp], dtype=np.float64)
    cp_end = cp_ts + np.array([x[1] for x in cp], dtype=np.float64)
    cp_lane = np.array([x[2] for x in cp], dtype=np.int64)
    cp_corr = np.array([x[3] for x in cp], dtype=np.int64)
    cp_bytes = np.array([x[4] for x in cp], dtype=np.int64)
    cp_tier = np.array([x[5] for x in cp], dtype=object)
    cp_layer, _, cp_found, cp_lts = attribute(cp_lane, cp_ts, cp_corr)
    cp_step = step_of(np.where(cp_found, cp_lts, cp_ts))
    # label an attributed copy with the step that uses it: that layer's first compute ending after it
    comp_in = compute[compute["layer_id"] >= 0]
    for lid, g in comp_in.groupby("layer_id"):
        sel = np.flatnonzero(cp_layer == lid)
        if not len(sel):
            continue
        g = g.sort_values("end")
        ends, steps = g["end"].to_numpy(), g["step"].to_numpy()
        i = np.searchsorted(ends, cp_end[sel], side="left")
        ok = i < len(ends)
        cp_step[sel[ok]] = steps[i[ok]]
        # no later use in the trace: a prefetch for a step that was not recorded (dropped)
        cp_step[sel[~ok]] = _NO_USE

    # -- host blocks -----------------------------------------------------------------------
    copy_by_corr = {x[3]: k for k, x in enumerate(cp) if x[3] >= 0}
    hb = []  # (step, layer_id, lane, start, end, tier, bytes)
    hb_sync_unmatched = []
    for nm, ts, dur, lane, corr in c.memcpy_calls:
        k = copy_by_corr.get(corr)
        sync = "Async" not in nm
        if k is not None:
            if cp_tier[k] == "pageable" or sync:
                hb.append((int(cp_step[k]), int(cp_layer[k]), lane, ts, ts + dur, cp_tier[k], int(cp_bytes[k])))
        elif sync:
            hb_sync_unmatched.append((lane, ts, ts + dur))
    if hb_sync_unmatched:  # a blocking copy whose device side is not in the trace: tier unknown
        lanes = np.array([x[0] for x in hb_sync_unmatched], dtype=np.int64)
        ts_ = np.array([x[1] for x in hb_sync_unmatched])
        lay = np.full(len(ts_), -1, np.int64)
        cpu_seg.lookup(lanes, ts_, lay, np.full(len(ts_), -1, np.int64), np.ones(len(ts_), bool))
        st = step_of(ts_)
        for j, (lane, s, e) in enumerate(hb_sync_unmatched):
            hb.append((int(st[j]), int(lay[j]), lane, s, e, "unknown", 0))

    # -- placement per observed layer ------------------------------------------------------
    n_layers = len(keys)
    comp_steps: list[set[int]] = [set() for _ in range(n_layers)]
    for lid, st in zip(comp_in["layer_id"].to_numpy(), comp_in["step"].to_numpy()):
        if st >= 0:
            comp_steps[lid].add(int(st))
    tier_bytes: list[dict[str, int]] = [{} for _ in range(n_layers)]
    step_bytes: list[dict[int, int]] = [{} for _ in range(n_layers)]
    for k in np.flatnonzero((cp_layer >= 0) & (cp_step >= 0)):
        lid, t, b, st = int(cp_layer[k]), cp_tier[k], int(cp_bytes[k]), int(cp_step[k])
        tier_bytes[lid][t] = tier_bytes[lid].get(t, 0) + b
        step_bytes[lid][st] = step_bytes[lid].get(st, 0) + b
    tiers, mixed = [], []
    for lid, (g, i) in enumerate(keys):
        tb = tier_bytes[lid]
        if not tb:
            tiers.append("unknown")
            continue
        # most bytes wins; ties go to the slower tier so a mix never looks better than it was
        rank = {"pageable": 2, "unknown": 1, "pinned": 0}
        tiers.append(max(tb, key=lambda t: (tb[t], rank.get(t, 1))))
        if len(tb) > 1:
            mixed.append(f"{g}.{i}")
    order_keys = sorted(range(n_layers), key=lambda lid: (_first_seen(keys, lid), keys[lid][1]))
    plan_layers = pd.DataFrame({
        "group": pd.array([keys[lid][0] for lid in order_keys], dtype="string"),
        "layer": np.array([keys[lid][1] for lid in order_keys], dtype=np.int64),
        "tier": pd.array([tiers[lid] for lid in order_keys], dtype="string"),
        "bytes": np.array([max(step_bytes[lid].values(), default=0) for lid in order_keys], dtype=np.int64),
        "mapped_bytes": np.zeros(n_layers, dtype=np.int64),
        "streamed": np.array([bool(step_bytes[lid]) and comp_steps[lid] <= set(step_bytes[lid])
                              for lid in order_keys], dtype=bool),
        "pin_rank": pd.array([pd.NA] * n_layers, dtype="Int64"),
    })

    # -- the events frame ------------------------------------------------------------------
    layer_tier = np.array([*tiers, "unknown"], dtype=object)   # index -1 -> "unknown"
    group_of = np.array([*(k[0] for k in keys), NO_GROUP], dtype=object)
    index_of = np.array([*(k[1] for k in keys), NO_LAYER], dtype=np.int64)
    n_comp = len(compute)
    parts = {
        "step": [compute["step"].to_numpy(np.int64), cp_step,
                 np.array([h[0] for h in hb], dtype=np.int64)],
        "layer_id": [compute["layer_id"].to_numpy(np.int64), cp_layer,
                     np.array([h[1] for h in hb], dtype=np.int64)],
        "kind": [np.full(n_comp, "compute", object), np.full(len(cp), "copy", object),
                 np.full(len(hb), "host_block", object)],
        "stream": [np.full(n_comp, "compute", object), np.full(len(cp), "copy", object),
                   np.full(len(hb), "host", object)],
        "tier": [layer_tier[compute["layer_id"].to_numpy(np.int64)], cp_tier,
                 np.array([h[5] for h in hb], dtype=object)],
        "bytes": [np.zeros(n_comp, np.int64), cp_bytes, np.array([h[6] for h in hb], dtype=np.int64)],
        "start": [compute["start"].to_numpy(np.float64), cp_ts, np.array([h[3] for h in hb], dtype=np.float64)],
        "end": [compute["end"].to_numpy(np.float64), cp_end, np.array([h[4] for h in hb], dtype=np.float64)],
    }
    col = {k: np.concatenate(v) for k, v in parts.items()}
    keep = col["step"] >= 0
    outside = {"compute": int((col["step"][:n_comp] == -1).sum()),
               "copy": int((col["step"][n_comp:n_comp + len(cp)] == -1).sum()),
               "host_block": int((col["step"][n_comp + len(cp):] == -1).sum())}
    unused = {"copy": int((col["step"][n_comp:n_comp + len(cp)] == _NO_USE).sum()),
              "host_block": int((col["step"][n_comp + len(cp):] == _NO_USE).sum())}
    col = {k: v[keep] for k, v in col.items()}
    run_id = uuid.uuid4().hex[:12]
    events = pd.DataFrame({
        "run": run_id,
        "step": col["step"],
        "group": group_of[col["layer_id"]],
        "layer": index_of[col["layer_id"]],
        "kind": col["kind"],
        "stream": col["stream"],
        "tier": col["tier"],
        "bytes": col["bytes"],
        "start_s": (col["start"] - t0) / 1e6,
        "end_s": (col["end"] - t0) / 1e6,
    })

    # -- step bounds: the ProfilerStep span widened to the rows it holds -------------------
    b = pd.DataFrame({"step": s_num, "start_s": (s_start - t0) / 1e6, "end_s": (s_end - t0) / 1e6})
    if len(events):
        span = events.groupby("step").agg(lo=("start_s", "min"), hi=("end_s", "max"))
        b = b.join(span, on="step")
        b["start_s"] = np.fmin(b["start_s"], b["lo"])
        b["end_s"] = np.fmax(b["end_s"], b["hi"])
        b = b[["step", "start_s", "end_s"]]

    meta = _meta(c, reader, source, label, run_id, patterns, layer_source, compute_source,
                 mixed, outside, unused, len(step_ids))
    return Run.build(events, b, plan_layers, meta=meta)


def _first_seen(keys: list[tuple[str, int]], lid: int) -> int:
    """Order groups by first appearance, layers by index inside a group."""
    g = keys[lid][0]
    return next(i for i, k in enumerate(keys) if k[0] == g)


def _meta(c: _Collected, reader: _Reader, source: str, label: str, run_id: str,
          patterns: list[re.Pattern], layer_source: str, compute_source: str, mixed: list[str],
          outside: dict[str, int], unused: dict[str, int], n_steps: int) -> dict[str, Any]:
    h = reader.header
    props = h.get("deviceProperties")
    names: dict[Any, str] = {}
    if isinstance(props, list):
        for p in props:
            if isinstance(p, dict) and "id" in p and isinstance(p.get("name"), str):
                names[p["id"]] = p["name"]
    seen = sorted(c.devices, key=lambda d: -c.devices[d])
    if not seen:
        device_name = "cpu"
    else:
        known = [names[d] for d in seen if d in names]
        device_name = ", ".join(dict.fromkeys(known)) if known else None
    streams: dict[str, list] = {"copy": [], "compute": []}
    for lid in sorted({x[2] for x in c.copies}):
        pid, tid, _ = c.lane_keys[lid]
        streams["copy"].append([pid, tid])
    for lid in sorted(set(np.unique(np.frombuffer(c.k_lane, dtype=np.int32)).tolist()) if len(c.k_lane) else []):
        pid, tid, _ = c.lane_keys[lid]
        streams["compute"].append([pid, tid])
    htod = {"pinned": [0, 0], "pageable": [0, 0], "unknown": [0, 0]}
    for x in c.copies:
        htod[x[5]][0] += 1
        htod[x[5]][1] += x[4]
    counts = {
        "events": reader.n_events,
        "by_cat": dict(sorted(c.by_cat.items(), key=lambda kv: -kv[1])),
        "by_ph": {"X": sum(c.by_cat.values()), **c.by_ph},
        "kernels": len(c.k_ts),
        "memcpy_htod": {t: {"count": v[0], "bytes": v[1]} for t, v in htod.items()},
        "profiler_steps": n_steps,
        "layer_annotations": {"gpu": len(c.gpu_spans), "cpu": len(c.cpu_spans),
                              "nn_module": len(c.module_spans)},
    }
    skipped = {
        "memcpy_not_htod": {d: {"count": v[0], "bytes": v[1]} for d, v in sorted(c.other_copies.items())},
        "memset": sum(v for k, v in c.by_cat.items() if _CATS.get(k) == _GPU_MEMSET),
        "cpu_ops": sum(v for k, v in c.by_cat.items() if _CATS.get(k) == _CPU_OP),
        "other_categories": {k: v for k, v in c.by_cat.items() if k not in _CATS},
        "not_complete_events": dict(c.by_ph),
        "negative_dur": c.negative_dur,
        "flow_and_python_rows": c.unused,
        "annotations_without_layer": c.unmatched_annotations,
        "outside_steps": outside,
        "copies_without_a_later_use": unused,
    }
    dev_props = [{k: p.get(k) for k in ("id", "name", "totalGlobalMem", "computeMajor", "computeMinor")}
                 for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    return {
        "run": run_id,
        "label": label,
        "backend": "trace",
        "simulated": False,
        "source": source,
        "device_name": device_name,
        "devices": [{"id": d, "name": names.get(d)} for d in seen],
        "device_properties": dev_props,
        "streams": streams,
        "time_origin_us": c.t0,
        "counts": counts,
        "skipped": skipped,
        "layer_source": layer_source,
        "layer_pattern": [p.pattern for p in patterns],
        "compute_source": compute_source,
        "mixed_tier_layers": mixed,
        "trace": {k: h[k] for k in ("schemaVersion", "traceName", "distributedInfo", "baseTimeNanoseconds",
                                    "displayTimeUnit") if k in h},
        "trace_keys": reader.keys,
    }


def _import_file(path: Path, label: str | None, layer_pattern: Any, source: str | None = None) -> Run:
    patterns, default = _compile_patterns(layer_pattern)
    source = source or path.name
    raw, gz = _open(path)
    with raw:
        reader = _Reader(_Text(raw, source, gz), read_python_functions=not default)
        module_match = _Matcher([re.compile(MODULE_PATTERN)]) if default else None
        col = _collect(reader, source, _Matcher(patterns), module_match)
    if label is None:
        label = path.name.removesuffix(".gz").removesuffix(".json") or path.name
    return _build(col, reader, source, label, patterns, default)


def from_torch_profiler(trace_or_profiler: str | os.PathLike | Any, label: str | None = None,
                        layer_pattern: str | re.Pattern | Sequence[str | re.Pattern] | None = None) -> Run:
    """A :class:`Run` (backend ``trace``) from a Kineto chrome trace or a finished profiler.

    ``trace_or_profiler`` is a path to a ``.json`` / ``.json.gz`` trace (gzip is detected by
    content) or a ``torch.profiler.profile`` whose ``with`` block has ended (it is exported to a
    temporary file and read back). ``layer_pattern`` (regex, or a list tried in order) maps
    annotation names to layers through named groups ``layer`` and optionally ``group``; the
    default finds ``<group>.<idx>`` in ``record_function`` labels and falls back to
    ``nn.Module: <Class>_<idx>`` spans. The module docstring lists every mapping rule.

    >>> import torch
    >>> from torch.profiler import profile, record_function
    >>> blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
    >>> with profile() as prof:
    ...     x = torch.randn(2, 8)
    ...     for i, b in enumerate(blocks):
    ...         with record_function(f"blocks.{i}"):
    ...             x = b(x)
    >>> run = from_torch_profiler(prof, label="eager")
    >>> run.layers[["group", "layer", "tier"]].values.tolist()
    [['blocks', 0, 'unknown'], ['blocks', 1, 'unknown']]

    Raises :class:`TraceFormatError` (a ``ValueError``) for malformed or truncated files, naming
    the problem and where it is (event index and byte offset).
    """
    if isinstance(trace_or_profiler, (str, os.PathLike)):
        path = Path(trace_or_profiler)
        if not path.is_file():
            raise FileNotFoundError(f"trace {str(path)!r} does not exist (or is not a file)")
        return _import_file(path, label, layer_pattern)
    export = getattr(trace_or_profiler, "export_chrome_trace", None)
    if not callable(export):
        raise TraceImportError(
            f"cannot import {type(trace_or_profiler).__name__} {trace_or_profiler!r:.80}: pass a path to "
            f"a chrome trace (.json or .json.gz) or a torch.profiler.profile object")
    _compile_patterns(layer_pattern)  # a bad pattern fails before the export
    with tempfile.TemporaryDirectory(prefix="offload-lab-trace-") as tmp:
        path = Path(tmp) / "trace.json"
        try:
            export(str(path))
        except Exception as e:
            try:
                # Kineto saves a trace once; torch >= 2.9 can write it again from Python
                if "use_python_export" not in inspect.signature(export).parameters:
                    raise
                export(str(path), use_python_export=True)
            except Exception:
                raise TraceImportError(
                    f"cannot export the profiler's trace ({type(e).__name__}: {e}); call "
                    f"from_torch_profiler after the profiler has stopped (after its `with` block)") from e
        return _import_file(path, label if label is not None else "torch.profiler", layer_pattern,
                            source="torch.profiler (live)")
