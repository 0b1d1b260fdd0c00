"""Import a torch.profiler / Kineto chrome trace as a :class:`~offload_lab.record.run.Run`.

>>> from offload_lab.record.kineto import from_torch_profiler
>>> run = from_torch_profiler("tests/data/traces/gpu_two_steps.json")  # doctest: +SKIP
>>> run.events.groupby(["kind", "tier"])["bytes"].sum()                # doctest: +SKIP

**Reading.** The file is streamed, never ``json.load``-ed: text is read in 1 MiB chunks (gzip
detected by content, decompressed incrementally, by ISA-L's inflate where ``isal`` is installed,
else zlib's) and only the fields the frames need are kept,
in compact arrays. Where the file is laid out as torch writes it, whole events are framed by
the newlines between them (:meth:`Reader._array`) and each block of them is decoded in one
C call by ``msgspec`` into structs of the few fields the import reads (every other value is
parsed, so checked as JSON, but never built), then read column-wise
(:mod:`offload_lab.record.kineto.fast`); the rows the import never uses (``cpu_op``, flow
arrows, Python frames: most of a trace) are counted and left. A block in which anything is
unusual (JSON ``msgspec`` refuses, a value of an unexpected type, a time or byte count that is
skipped) goes down the per-event path instead: its used rows decoded one at a time by the
stdlib decoder and checked (the others framed but not decoded), which gives the same Run and
names a bad event and its byte. Without ``msgspec`` installed every block takes that path. A
1 M-event trace loads in about 2 s with memory bounded by the kernels and copies it holds
(``benchmarks/trace_import.py``). The path must be a regular file (a FIFO or a device is
refused unopened) of at most 16 GiB, holding at most 16 GiB of JSON once decompressed, no
event longer than 64 MiB and no value nested deeper than Python's parser takes. Malformed or
truncated files raise :class:`TraceFormatError` naming the problem and where (event index in
``traceEvents``, byte offset). Numbers that cannot be what they claim are counted in
``meta["skipped"]`` and their rows left out, never passed into the frames: NaN, infinite or
absurd (past 10^17 µs) ``ts`` / ``dur`` (``non_finite_or_absurd_times``), negative durations
(``negative_dur``), memcpy ``bytes`` that are negative or past 2^50
(``memcpy_bytes_negative_or_absurd``), ``ProfilerStep#N`` past 10^9, the frames' bound
(``step_numbers_too_large``; a layer label past it names no layer). A trace in which no
layer, kernel or copy is found (a plain CPU profile of a model, or only ``cpu_op`` rows)
raises :class:`TraceFormatError` saying what it holds (events, complete events by category)
and how to label layers.

**Options.** The label, the layer pattern and the caps above are the fields of one frozen
:class:`TraceImportOptions`, checked when it is built (a bad pattern, a negative cap or a bool
for an int is one :class:`TraceImportError` line), and passed as ``options=`` in place of the
``label`` / ``layer_pattern`` keywords; its defaults are the caps above:

>>> from offload_lab.record.kineto import TraceImportOptions
>>> opts = TraceImportOptions(label="capped", max_value_chars=4 << 20)
>>> run = from_torch_profiler("tests/data/traces/gpu_two_steps.json", options=opts)  # doctest: +SKIP

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

import gc
import inspect
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from offload_lab.checks import is_int
from offload_lab.record.gather import merge_ranks
from offload_lab.record.kineto.build import NO_GROUP, NO_LAYER, build_run
from offload_lab.record.kineto.collect import collect_events
from offload_lab.record.kineto.fast import available as _fast_available  # noqa: F401 - msgspec at import
from offload_lab.record.kineto.options import (
    DEFAULT_LAYER_PATTERN,
    TraceImportError,
    TraceImportOptions,
)
from offload_lab.record.kineto.reader import (
    Reader,
    TraceFormatError,
    TraceText,
    iter_trace_events,
    open_trace,
)
from offload_lab.record.kineto.rows import MODULE_PATTERN, UNNAMED_GROUP
from offload_lab.record.run import Run

__all__ = ["from_torch_profiler", "iter_trace_events", "TraceImportOptions", "TraceImportError",
           "TraceFormatError", "DEFAULT_LAYER_PATTERN", "MODULE_PATTERN", "NO_GROUP", "NO_LAYER",
           "UNNAMED_GROUP"]


def _import_file(path: Path, options: TraceImportOptions, label: str | None = None,
                 source: str | None = None) -> Run:
    source = source or path.name
    # the import makes ~10^5 small objects per 10^5 events and frees them in one go: the cyclic
    # collector would walk them again and again (a fifth of the call) to find no cycle
    paused = gc.isenabled()
    gc.disable()
    try:
        raw, gz = open_trace(path, options)
        with raw:
            reader = Reader(TraceText(raw, source, gz, options), read_python_functions=not options.default_patterns)
            col = collect_events(reader, source, options)
        if label is None:
            label = path.name.removesuffix(".gz").removesuffix(".json") or path.name
        return build_run(col, reader, source, label, options)
    finally:
        if paused:
            gc.enable()


TRACE_SUFFIXES = (".json", ".json.gz")


def _import_dir(path: Path, options: TraceImportOptions) -> Run:
    """One multi-rank Run from a directory of per-rank traces (rank from ``distributedInfo``)."""
    files = sorted(f for f in path.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise TraceImportError(f"directory {str(path)!r} holds no trace files; expected one "
                               f"{' or '.join(TRACE_SUFFIXES)} file per rank")
    runs, ranks = [], []
    for f in files:
        run = _import_file(f, options)
        info = (run.meta.get("trace") or {}).get("distributedInfo")
        rank = info.get("rank") if isinstance(info, dict) else None
        if not is_int(rank) or rank < 0:
            raise TraceFormatError(f"{f.name}: no rank in its distributedInfo ({info!r:.80}); a directory "
                                   f"import needs traces recorded under torch.distributed, one per rank")
        if rank in ranks:
            raise TraceFormatError(f"{f.name}: rank {rank} is also the rank of "
                                   f"{files[ranks.index(rank)].name}; expected one trace per rank")
        run.meta.update(rank=rank, world_size=info.get("world_size"), source=f.name)
        runs.append(run)
        ranks.append(rank)
    # Kineto timestamps of one node share a clock: put every rank on the earliest rank's origin
    origins = [float(r.meta.get("time_origin_us") or 0.0) for r in runs]
    offsets = [(o - min(origins)) / 1e6 for o in origins]
    return merge_ranks(runs, ranks, label=options.label or f"{path.name} · {len(runs)} ranks", offsets_s=offsets)


def from_torch_profiler(trace_or_profiler: str | os.PathLike | Any, label: str | None = None,
                        layer_pattern: str | re.Pattern | Sequence[str | re.Pattern] | None = None, *,
                        options: TraceImportOptions | None = None) -> Run:
    """A :class:`Run` (backend ``trace``) from a Kineto chrome trace or a finished profiler.

    ``trace_or_profiler`` is a path to a ``.json`` / ``.json.gz`` trace (gzip is detected by
    content), a directory of per-rank traces of one ``torch.distributed`` job (one file per
    rank, the rank read from each trace's ``distributedInfo``; they become one multi-rank Run
    with a ``rank`` column, times on the earliest rank's origin), or a ``torch.profiler.profile``
    whose ``with`` block has ended (it is exported to a temporary file and read back). ``layer_pattern`` (regex, or a list tried in order) maps
    annotation names to layers through named groups ``layer`` and optionally ``group``; the
    default finds ``<group>.<idx>`` in ``record_function`` labels and falls back to
    ``nn.Module: <Class>_<idx>`` spans. The module docstring lists every mapping rule.
    ``options`` (a :class:`TraceImportOptions`) holds the label, the pattern and the size caps
    in one validated object, in place of the two keywords (passing both is refused).

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
    options = _options(options, label, layer_pattern)
    if isinstance(trace_or_profiler, (str, os.PathLike)):
        path = Path(trace_or_profiler)
        if path.is_dir():
            return _import_dir(path, options)
        if not path.exists():
            raise FileNotFoundError(f"trace {str(path)!r} does not exist")
        # anything but a regular file (a FIFO, a device) is refused by the reader, unopened
        return _import_file(path, options, options.label)
    export = getattr(trace_or_profiler, "export_chrome_trace", None)
    if not callable(export):
        raise TraceImportError(
            f"cannot import {type(trace_or_profiler).__name__} {trace_or_profiler!r:.80}: pass a path to "
            f"a chrome trace (.json or .json.gz) or a torch.profiler.profile object")
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
        return _import_file(path, options, options.label if options.label is not None else "torch.profiler",
                            source="torch.profiler (live)")


def _options(options: Any, label: Any, layer_pattern: Any) -> TraceImportOptions:
    """The one options object of an import, from ``options=`` or from the two keywords."""
    if options is None:
        return TraceImportOptions(label=label, layer_pattern=layer_pattern)
    if not isinstance(options, TraceImportOptions):
        raise TraceImportError(f"options = {options!r:.80}; accepted: a TraceImportOptions or None")
    given = [f"{k}={v!r:.40}" for k, v in (("label", label), ("layer_pattern", layer_pattern)) if v is not None]
    if given:
        raise TraceImportError(f"from_torch_profiler got both options= and {' and '.join(given)}: pass "
                               f"{' and '.join(k.split('=')[0] for k in given)} inside TraceImportOptions(...) "
                               f"or as keywords, not both")
    return options
