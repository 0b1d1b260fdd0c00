"""A :class:`~offload_lab.record.run.Run` as Chrome trace-event JSON, for Perfetto and ``chrome://tracing``.

The layout, in the trace-event format's terms:

- one **process** per rank (``pid`` = rank + 1: some viewers treat pid 0 as the idle task), named
  for the run, the rank and whether it was measured or simulated; the rank comes from the events'
  ``rank`` column where there is one, else every event is rank 0;
- one **thread** (track) per stream of that rank — ``compute``, ``copy``, ``host`` — named by
  ``M`` metadata events and sorted in that order;
- one complete (``X``) event per interval of ``Run.events``, named ``group.layer``
  (``blocks.17``), with ``cat`` = the interval's kind and ``args`` carrying tier, bytes, step
  and kind; ``ts`` and ``dur`` in microseconds from the run's origin;
- counters (``C`` events) from ``Run.memory``: ``device memory`` (device bytes) and
  ``host memory`` (pinned, anonymous and mapped bytes).

Complete events on one thread must nest; two intervals of one stream that partly overlap
(two managers' copy streams recorded as one ``copy`` stream) would be dropped or drawn wrongly
by a viewer, so such an interval goes to an extra track of that stream, ``copy stream (2)``.
Intervals without finite times are left out and counted in ``otherData``.

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
>>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
>>> run = offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=1)
>>> trace = to_chrome_trace(run)
>>> sorted({e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"})
['compute stream', 'copy stream']
>>> next(e["name"] for e in trace["traceEvents"] if e["ph"] == "X")
'blocks.0'
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from offload_lab.labels import display_label
from offload_lab.writing import atomic_write

__all__ = ["to_chrome_trace", "STREAM_ORDER", "TracedRun"]


class TracedRun(Protocol):
    """What a trace is written from: an offload_lab :class:`~offload_lab.Run`. This module sits
    below the Run (whose :meth:`~offload_lab.Run.to_chrome_trace` calls it), so it names what it
    reads instead of importing the class."""

    events: pd.DataFrame
    memory: pd.DataFrame
    meta: dict[str, Any]

    @property
    def label(self) -> str: ...

    @property
    def simulated(self) -> bool: ...

    @property
    def backend(self) -> str: ...


def _is_run(obj: Any) -> bool:
    return (all(isinstance(getattr(obj, f, None), pd.DataFrame) for f in ("events", "layers", "steps", "memory"))
            and isinstance(getattr(obj, "meta", None), dict))

#: the streams of a rank, in the order their tracks are shown (thread id = position + 1)
STREAM_ORDER = ("compute", "copy", "host")
_COUNTERS = {"device memory": ("device_bytes",),
             "host memory": ("pinned_bytes", "anon_bytes", "mapped_bytes")}
_US = 1e6


def _process_name(run: TracedRun, rank: int) -> str:
    # display_label marks a simulated run; a measured one says so here
    label = display_label(run)
    tag = "" if run.simulated or "measured" in label.lower() else " (measured)"
    return f"{label}{tag} · rank {rank} · {run.backend}"


def _lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lane per interval so that the intervals of one lane nest or follow each other."""
    order = np.lexsort((-ends, starts))  # by start, the longer first, so containers come first
    lane = np.zeros(len(starts), dtype=np.int64)
    stacks: list[list[float]] = []  # per lane: ends of the open intervals, outermost first
    for i in order:
        s, e = starts[i], ends[i]
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                lane[i] = k
                break
        else:
            stacks.append([e])
            lane[i] = len(stacks) - 1
    return lane


def _event_name(group: str, layer: int, kind: str) -> str:
    # rows outside every layer (trace import, observer) have group "" and layer -1
    if group == "" and layer < 0:
        return kind
    return f"{group}.{layer}" if group else f"layer {layer}"


def _metadata(pid: int, tid: int, name: str, args: dict) -> dict:
    return {"ph": "M", "ts": 0, "pid": pid, "tid": tid, "name": name, "args": args}


def _interval_events(run: TracedRun) -> tuple[list[dict], set[tuple[int, int, str, int]], int]:
    ev = run.events
    ranks = ev["rank"].to_numpy(dtype=np.int64) if "rank" in ev.columns else np.zeros(len(ev), np.int64)
    start = ev["start_s"].to_numpy(dtype="float64")
    end = ev["end_s"].to_numpy(dtype="float64")
    finite = np.isfinite(start) & np.isfinite(end)
    stream = ev["stream"].astype(object).fillna("unknown").to_numpy(dtype=object)
    out: list[dict] = []
    tracks: set[tuple[int, int, str, int]] = set()  # (pid, tid, stream, lane)
    extra = {s: i for i, s in enumerate(STREAM_ORDER)}
    cols = {c: ev[c].to_numpy(dtype=object) for c in ("group", "layer", "kind", "tier", "bytes", "step")}
    for rank in sorted(set(ranks[finite].tolist())):
        pid = int(rank) + 1
        for st in sorted(set(stream[finite & (ranks == rank)].tolist()), key=lambda s: (s not in extra, s)):
            ix = np.flatnonzero(finite & (ranks == rank) & (stream == st))
            lanes = _lanes(start[ix], end[ix])
            base = extra.setdefault(st, len(extra))
            for i, lane in zip(ix.tolist(), lanes.tolist()):
                # lane 0 is the stream's track; overflow lanes follow every stream's track
                tid = base + 1 + 10 * int(lane)
                tracks.add((pid, tid, st, int(lane)))
                group, layer, kind = str(cols["group"][i]), int(cols["layer"][i]), str(cols["kind"][i])
                tier = cols["tier"][i]
                out.append({
                    "ph": "X", "name": _event_name(group, layer, kind), "cat": kind,
                    "ts": float(start[i]) * _US, "dur": max(0.0, float(end[i] - start[i])) * _US,
                    "pid": pid, "tid": tid,
                    "args": {"group": group, "layer": layer, "kind": kind,
                             "tier": None if pd.isna(tier) else str(tier),
                             "bytes": int(cols["bytes"][i]), "step": int(cols["step"][i])},
                })
    return out, tracks, int((~finite).sum())


def _counter_events(run: TracedRun, pids: list[int]) -> list[dict]:
    mem = run.memory
    if not len(mem):
        return []
    t = mem["t_s"].to_numpy(dtype="float64")
    keep = np.isfinite(t)
    # memory is sampled per process: a rank's own samples where the frame says whose they are,
    # else the first rank's
    pid = np.full(len(mem), pids[0] if pids else 1, dtype=np.int64)
    if "rank" in mem.columns:
        pid = mem["rank"].to_numpy(dtype=np.int64) + 1
    out = []
    for name, fields in _COUNTERS.items():
        values = {f: mem[f].to_numpy(dtype="int64") for f in fields}
        for i in np.flatnonzero(keep).tolist():
            out.append({"ph": "C", "name": name, "ts": float(t[i]) * _US, "pid": int(pid[i]), "tid": 0,
                        "args": {f: int(values[f][i]) for f in fields}})
    return out


def to_chrome_trace(run: TracedRun, path: str | os.PathLike | None = None) -> dict:
    """The trace-event JSON of ``run`` (a dict); also written to ``path`` when given.

    ``path`` ending in ``.gz`` is written gzip-compressed (Perfetto opens both). The dict has
    ``traceEvents`` (metadata ``M``, complete ``X`` and counter ``C`` events),
    ``displayTimeUnit`` and ``otherData`` (the run's label, backend, device and whether it was
    simulated).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="256GiB"))
    >>> run = offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=1)
    >>> trace = to_chrome_trace(run)
    >>> trace["otherData"]["simulated"], sorted({e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"})
    (True, ['compute', 'copy', 'host_block'])
    """
    if not _is_run(run):
        raise TypeError(f"to_chrome_trace needs an offload_lab Run, got {type(run).__name__}")
    intervals, tracks, dropped = _interval_events(run)
    pids = sorted({p for p, _, _, _ in tracks}) or [1]
    meta: list[dict] = []
    for pid in pids:
        meta.append(_metadata(pid, 0, "process_name", {"name": _process_name(run, pid - 1)}))
        meta.append(_metadata(pid, 0, "process_sort_index", {"sort_index": pid}))
        meta.append(_metadata(pid, 0, "process_labels", {"labels": "simulated" if run.simulated else "measured"}))
    for pid, tid, st, lane in sorted(tracks):
        name = f"{st} stream" + (f" ({lane + 1})" if lane else "")
        meta.append(_metadata(pid, tid, "thread_name", {"name": name}))
        meta.append(_metadata(pid, tid, "thread_sort_index", {"sort_index": tid}))
    trace = {
        "traceEvents": meta + intervals + _counter_events(run, pids),
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "offload-lab", "label": run.label, "simulated": run.simulated,
            "backend": run.backend, "device_name": run.meta.get("device_name"),
            "run": run.meta.get("run"), "intervals_without_finite_times": dropped,
        },
    }
    if path is not None:
        _write(trace, Path(path))
    return trace


def _write(trace: dict, path: Path) -> None:
    text = json.dumps(trace, allow_nan=False, separators=(",", ":"), default=_plain)
    data = text.encode()
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    try:
        atomic_write(path, data, what="trace path", example="run.trace.json")
    except OSError as e:
        raise OSError(f"cannot write trace {str(path)!r}: {e.strerror or e}") from None


def _plain(obj: Any) -> Any:
    """JSON for what meta may hold besides plain data (numpy scalars)."""
    if isinstance(obj, np.generic):
        value = obj.item()
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value
    raise TypeError(f"trace value {obj!r} of type {type(obj).__name__} is not JSON data")
