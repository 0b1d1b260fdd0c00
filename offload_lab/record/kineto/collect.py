"""Collecting what the frames need from a trace's events, in compact raw-microsecond columns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from offload_lab.record.kineto import fast
from offload_lab.record.kineto.options import TraceImportOptions
from offload_lab.record.kineto.reader import Reader, TraceFormatError
from offload_lab.record.kineto.rows import (
    CATS,
    CPU_ANN,
    CPU_OP,
    GPU_ANN,
    GPU_KERNEL,
    GPU_MEMCPY,
    MAX_BYTES,
    MAX_INDEX,
    MAX_US,
    MEMCPY,
    MODULE,
    PY_FN,
    RUNTIME,
    Collected,
    Matcher,
    step_span,
)


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


class _Lanes:
    """(pid, tid-or-stream, is_gpu) -> a small integer lane id."""

    def __init__(self, c: Collected, name: str, here: Callable[[], int]):
        self.lanes, self.keys, self.name, self.here = c.lanes, c.lane_keys, name, here

    def __call__(self, pid: Any, tid: Any, gpu: bool) -> int:
        key = (pid, tid, gpu)
        try:
            return self.lanes[key]
        except KeyError:
            pass
        except TypeError:
            raise TraceFormatError(f"{self.name}: event {self.here()} has pid {pid!r:.40} / tid {tid!r:.40}; "
                                   f"expected numbers or strings") from None
        self.lanes[key] = len(self.keys)
        self.keys.append(key)
        return self.lanes[key]


def _corr(args: dict) -> int:
    corr = args.get("correlation", -1)
    return corr if type(corr) is int and -1 <= corr < MAX_INDEX else -1


def _header(ev: Any, c: Collected, here: Callable[[], int], name: str) -> tuple[float, float, Any] | None:
    """``(ts, dur, cat)`` of a complete event worth reading, else None (counted where skipped)."""
    if type(ev) is not dict:
        raise TraceFormatError(f"{name}: event {here()} is {type(ev).__name__} {ev!r:.60}; expected "
                               f"a JSON object")
    ph = ev.get("ph")
    if ph != "X":
        if type(ph) is not str:
            if ph is None:
                raise TraceFormatError(f"{name}: event {here()} ({ev.get('name')!r:.60}) has no 'ph'")
            raise TraceFormatError(f"{name}: event {here()} has 'ph' = {ph!r:.40}; expected a string "
                                   f"such as 'X'")
        if ph == "s" or ph == "f":  # flow arrows: never used (and not decoded in Kineto blocks)
            c.unused += 1
        else:
            c.by_ph[ph] = c.by_ph.get(ph, 0) + 1
        return None
    ts = ev.get("ts")
    if type(ts) is not float and type(ts) is not int:
        ts = _num(ev, "ts", here, name)
    dur = ev.get("dur")
    if type(dur) is not float and type(dur) is not int:
        dur = _num(ev, "dur", here, name)
    cat = ev.get("cat")
    try:
        c.by_cat[cat] += 1
    except (KeyError, TypeError):
        if cat is not None and type(cat) is not str:
            raise TraceFormatError(f"{name}: event {here()} ({ev.get('name')!r:.60}) has 'cat' = {cat!r:.40}; "
                                   f"expected a string") from None
        c.by_cat[cat] = 1
    if not (-MAX_US < ts < MAX_US and -MAX_US < dur < MAX_US):  # NaN and ±inf fail too
        c.bad_times += 1
        return None
    if dur < 0:
        c.negative_dur += 1
        return None
    return ts, dur, cat


def _named_row(c: Collected, ev: dict, kind: int, cat: Any, ts: float, dur: float, lane_of: _Lanes,
               match: Matcher, module_match: Matcher | None) -> None:
    """Copies, annotations and python frames: the rows read by name."""
    here, name = lane_of.here, lane_of.name
    nm = ev.get("name")
    if type(nm) is not str:
        raise TraceFormatError(f"{name}: event {here()} (cat {cat!r}) has 'name' = {nm!r:.60}; expected "
                               f"a string")
    if kind == GPU_MEMCPY:
        _memcpy(c, ev, nm, ts, dur, lane_of)
    elif kind == GPU_ANN:
        hit = match(nm)
        if hit is None:
            c.unmatched_annotations += 1
            return
        args = _args(ev, here, name)
        pid = args.get("device", ev.get("pid"))
        c.gpu_spans.append((lane_of(pid, args.get("stream", ev.get("tid")), True), ts, ts + dur, hit))
    elif kind == CPU_ANN or kind == PY_FN:
        if nm.startswith("ProfilerStep#"):
            step_span(c, nm, ts, dur)
            return
        if kind == PY_FN and module_match is not None:
            if nm.startswith("nn.Module: "):
                hit = module_match(nm)
                if hit is not None:
                    c.module_spans.append((lane_of(ev.get("pid"), ev.get("tid"), False), ts, ts + dur, hit))
            else:  # counted like the Kineto blocks count the python frames they skip
                c.by_cat[cat] -= 1
                c.unused += 1
            return
        hit = match(nm)
        if hit is None:
            if kind == CPU_ANN:
                c.unmatched_annotations += 1
            return
        c.cpu_spans.append((lane_of(ev.get("pid"), ev.get("tid"), False), ts, ts + dur, hit))


def _memcpy(c: Collected, ev: dict, nm: str, ts: float, dur: float, lane_of: _Lanes) -> None:
    args = _args(ev, lane_of.here, lane_of.name)
    m = MEMCPY.match(nm)
    direction = m.group(1) if m else nm
    nbytes = args.get("bytes", 0)
    if type(nbytes) is float and nbytes.is_integer():
        nbytes = int(nbytes)
    if type(nbytes) is not int:
        raise TraceFormatError(f"{lane_of.name}: event {lane_of.here()} ({nm!r:.60}) has args.bytes = "
                               f"{nbytes!r:.40}; expected an integer")
    if not 0 <= nbytes < MAX_BYTES:
        c.bad_bytes += 1
        return
    if direction != "HtoD":
        tot = c.other_copies.setdefault(direction, [0, 0])
        tot[0] += 1
        tot[1] += nbytes
        return
    src = (m.group(2) or "") if m else ""
    tier = "pinned" if src == "Pinned" else "pageable" if src == "Pageable" else "unknown"
    pid = args.get("device", ev.get("pid"))
    lane = lane_of(pid, args.get("stream", ev.get("tid")), True)
    c.copies.append((ts, dur, lane, _corr(args), nbytes, tier))


def collect_events(reader: Reader, name: str, options: TraceImportOptions) -> Collected:
    """What the frames need from every event of ``reader``, layers named by ``options.patterns``
    (and ``nn.Module`` spans when those are the default)."""
    match = Matcher(options.patterns)
    module_match = Matcher([MODULE]) if options.default_patterns else None
    # The per-event loop of the import (millions of rows): the two hot categories (kernels and
    # runtime calls) are handled inline on local names, which is why this runs past ~80 lines.
    c = Collected()
    lanes = c.lanes
    k_ts, k_dur, k_lane, k_corr = c.k_ts.append, c.k_dur.append, c.k_lane.append, c.k_corr.append
    r_corr, r_ts, r_lane = c.r_corr.append, c.r_ts.append, c.r_lane.append
    by_cat, cats = c.by_cat, CATS
    t0, t1 = c.t0, c.t1
    j = 0

    def here() -> int:
        return reader.index(j)

    lane_of = _Lanes(c, name, here)

    span = {"t0": t0, "t1": t1}
    if not reader.decode_all and fast.available():
        read_py = module_match is None

        def block(evs: list, first: int) -> bool:
            nonlocal t0, t1
            span["t0"], span["t1"] = t0, t1
            if not fast.collect_block(c, evs, first, span, name, match, module_match, read_py):
                return False
            t0, t1 = span["t0"], span["t1"]
            return True

        reader.fast = block
    for pairs, n_events, cpu_marks in reader.events():
        cpu_before = by_cat.get("cpu_op", 0)
        for j, (ev, _) in enumerate(pairs):  # noqa: B007 - `here` reads j to name a bad event
            head = _header(ev, c, here, name)
            if head is None:
                continue
            ts, dur, cat = head
            kind = cats.get(cat)
            if kind != CPU_OP and kind != PY_FN:
                # the origin and the end of the trace come from the rows that are always decoded,
                # so that both ways of reading a file give the same times
                if ts < t0:
                    t0 = ts
                if ts + dur > t1:
                    t1 = ts + dur
            if kind is None:
                continue
            if kind == CPU_OP:
                # torch < 1.11 wrote ProfilerStep#N as a cpu_op
                nm = ev.get("name")
                if type(nm) is str and nm.startswith("ProfilerStep#"):
                    step_span(c, nm, ts, dur)
                continue
            if kind == GPU_KERNEL:
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
                except (KeyError, TypeError):
                    lane = lane_of(pid, tid, True)
                k_ts(ts)
                k_dur(dur)
                k_lane(lane)
                k_corr(_corr(args))
                continue
            if kind == RUNTIME:  # the kernel branch's shape again, inline on purpose (hot path)
                args = ev.get("args")
                if type(args) is not dict:
                    args = _args(ev, here, name)
                corr = _corr(args)
                pid, tid = ev.get("pid"), ev.get("tid")
                try:
                    lane = lanes[(pid, tid, False)]
                except (KeyError, TypeError):
                    lane = lane_of(pid, tid, False)
                r_corr(corr)
                r_ts(ts)
                r_lane(lane)
                nm = ev.get("name")
                if type(nm) is str and (nm.startswith("cudaMemcpy") or nm.startswith("cuMemcpy")):
                    c.memcpy_calls.append((nm, ts, dur, lane, corr))
                continue
            _named_row(c, ev, kind, cat, ts, dur, lane_of, match, module_match)
        if cpu_marks is not None:  # a Kineto block: rows framed but never decoded
            decoded_cpu = by_cat.get("cpu_op", 0) - cpu_before
            if cpu_marks:
                by_cat["cpu_op"] = cpu_before + cpu_marks
            # a block without ops (the GPU rows, after the CPU ones) has its skipped flows too
            c.unused += n_events - len(pairs) - max(cpu_marks - decoded_cpu, 0)
    c.t0, c.t1 = t0, t1
    _count_devices(c)
    return c


def _count_devices(c: Collected) -> None:
    """Rows per device, from the GPU lanes of kernels and copies."""
    lane_keys = c.lane_keys
    per_lane = np.bincount(np.frombuffer(c.k_lane, dtype=np.int32), minlength=len(lane_keys)) \
        if len(c.k_lane) else np.zeros(len(lane_keys), np.int64)
    for x in c.copies:
        per_lane[x[2]] += 1
    for lane, n in enumerate(per_lane.tolist()):
        if n and lane_keys[lane][2]:
            c.devices[lane_keys[lane][0]] = c.devices.get(lane_keys[lane][0], 0) + n
