"""The fast path of the import: a block of whole events decoded in one C call, read column-wise.

Where :class:`~offload_lab.record.kineto.reader.Reader` frames a block of whole events (torch's
own layouts), the block is decoded by ``msgspec`` into small structs that hold only the fields
the import reads (every other field is still parsed, so checked as JSON, but never built), and
:func:`collect_block` applies the block to the :class:`~offload_lab.record.kineto.rows.Collected`
columns with a few C-level passes instead of one Python call chain per event. It gives exactly
what the per-event loop of :func:`~offload_lab.record.kineto.collect.collect_events` gives on
torch's layouts (the same rows skipped, counted and read; lanes numbered in the order rows first
use them): a block in which anything is unusual (JSON ``msgspec`` refuses, a phase outside the
chrome format, a value of an unexpected type, a time or a byte count the loop would count as
skipped or refuse) is left untouched and handed back to that loop, which raises the same error,
at the same event and byte, as without this path. Without ``msgspec`` installed, every block
takes the loop. ``tests/test_trace_fast.py`` holds the two paths to the same Runs.
"""

from __future__ import annotations

import json
from array import array
from collections import Counter
from collections.abc import Callable
from itertools import compress, repeat
from operator import attrgetter
from typing import Any, Union

import numpy as np

try:
    import msgspec
except ImportError:  # the per-event loop reads every block
    msgspec = None

from offload_lab.record.kineto import rows as kept

__all__ = ["available", "BlockDecoder", "collect_block", "UNSET"]


def available() -> bool:
    """Whether the fast path can run (``msgspec`` is importable)."""
    return msgspec is not None


#: the phases of the chrome trace format; an event of any other (or none) sends its block to the loop
PHASES = ("X", "s", "f", "t", "B", "E", "i", "I", "C", "b", "n", "e", "P", "O", "N", "D", "M", "V", "v",
          "R", "c", "(", ")")

if msgspec is not None:
    UNSET: Any = msgspec.UNSET

    class _Args(msgspec.Struct, gc=False):
        device: Any = msgspec.UNSET
        stream: Any = msgspec.UNSET
        correlation: Any = msgspec.UNSET
        bytes: Any = msgspec.UNSET

    class _Complete(msgspec.Struct, tag_field="ph", tag="X", gc=False):
        """A complete (``ph: X``) event: the one kind the import reads fields of."""

        cat: Any = msgspec.UNSET
        name: Any = msgspec.UNSET
        pid: Any = msgspec.UNSET
        tid: Any = msgspec.UNSET
        # times are kept as their JSON text and converted only for the rows that are read
        ts: msgspec.Raw = msgspec.UNSET
        dur: msgspec.Raw = msgspec.UNSET
        # an `args` that is not an object (or null) fails the decode: the loop names it
        args: _Args | None = msgspec.UNSET

    # every other phase: parsed (so checked as JSON) into a struct of no field, its type its phase
    _OTHER = {ph: msgspec.defstruct(f"_Phase{i}", [], tag_field="ph", tag=ph, gc=False)
              for i, ph in enumerate(PHASES) if ph != "X"}
    _FLOWS = {ph: _OTHER.pop(ph) for ph in ("s", "f")}
    _EVENT: Any = Union[(_Complete, *_FLOWS.values(), *_OTHER.values())]
    #: struct type -> (0 complete, 1 flow arrow, 2 other; its phase)
    _PHASE_OF = {_Complete: (0, "X"), **{t: (1, ph) for ph, t in _FLOWS.items()},
                 **{t: (2, ph) for ph, t in _OTHER.items()}}
    _ERRORS: tuple[type[BaseException], ...] = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
else:  # pragma: no cover - exercised only without msgspec
    UNSET = object()
    _ERRORS = ()
    _PHASE_OF = {}

_CODE_OF = {t: v[0] for t, v in _PHASE_OF.items()}
_CAT, _NAME = attrgetter("cat"), attrgetter("name")
_PID, _TID, _TS, _DUR, _ARGS = (attrgetter(k) for k in ("pid", "tid", "ts", "dur", "args"))
_DEVICE, _STREAM, _CORR = (attrgetter(k) for k in ("device", "stream", "correlation"))
# the loop's categories, "cpu_op" told apart from its other spelling (it counts "cpu_op" marks)
_OP_CAT = 99
_KIND = {**kept.CATS, "cpu_op": _OP_CAT}
# |ts| and |dur| past 2^53 go to the loop: there an int and its float differ, and the loop
# compares the int
_SAFE_US = float(1 << 53)
_MEMCPY_CALLS = ("cudaMemcpy", "cuMemcpy")


class _Slow(Exception):
    """The block needs the per-event loop (raised before anything is applied)."""


class BlockDecoder:
    """``decode(text)``: the events of ``text`` (whole events separated by commas), or None
    when ``msgspec`` refuses it (the caller then reads the block the slow way)."""

    def __init__(self) -> None:
        self._dec = msgspec.json.Decoder(list[_EVENT])

    def decode(self, text: str) -> list | None:
        try:
            return self._dec.decode("[" + text + "]")
        except _ERRORS:
            return None


def _numbers(raws: list) -> list:
    """JSON values kept raw -> the numbers ``json`` gives (an int stays an int); anything but
    numbers (a string, null, an array, a missing time): the loop."""
    try:
        vals = json.loads(b"[" + b",".join(raws) + b"]")
    except (TypeError, ValueError, RecursionError):  # TypeError: a time that is missing
        raise _Slow from None
    if set(map(type, vals)) - {int, float}:
        raise _Slow
    return vals


def _keys(pid: list, tid: list, gpu: bool) -> list:
    """Lane keys ``(pid, tid, gpu)``, a missing id as None (a few distinct pairs are looked at)."""
    try:
        pairs = set(zip(pid, tid))
    except TypeError:  # an unhashable id: the loop names it
        raise _Slow from None
    if any(p is UNSET or t is UNSET for p, t in pairs):
        pid, tid = _unset_none(pid), _unset_none(tid)
    return list(zip(pid, tid, repeat(gpu)))


def _kernel_keys(kern: list, args: list) -> list:
    """A kernel's lane: ``args.device`` (else its pid), ``args.stream`` (else its tid)."""
    try:
        dev, stream = list(map(_DEVICE, args)), list(map(_STREAM, args))
    except AttributeError:  # a kernel without args: row by row
        dev, stream = _arg_col(args, _DEVICE, repeat(None)), _arg_col(args, _STREAM, repeat(None))
    try:
        pairs = set(zip(dev, stream))
    except TypeError:
        raise _Slow from None
    if any(d is None or d is UNSET or t is None or t is UNSET for d, t in pairs):
        dev = _or(dev, _unset_none(list(map(_PID, kern))))
        stream = _or(stream, _unset_none(list(map(_TID, kern))))
    return list(zip(dev, stream, repeat(True)))


def _or(values: list, fallback: list) -> list:
    """``value if value is not None else fallback`` per row (UNSET counts as None)."""
    return [f if v is None or v is UNSET else v for v, f in zip(values, fallback)]


def _unset_none(values: list) -> list:
    return [None if v is UNSET else v for v in values]


def _corrs(args: list) -> np.ndarray:
    """``_corr`` of the loop for every row: an int in [-1, 2^53), else -1."""
    try:
        vals = list(map(_CORR, args))
    except AttributeError:  # a row without args: -1
        vals = [-1 if a is None or a is UNSET else a.correlation for a in args]
    if set(map(type, vals)) <= {int}:
        try:
            out = np.array(vals, dtype=np.int64)
        except OverflowError:
            out = None
        if out is not None:
            out[(out < -1) | (out >= kept.MAX_INDEX)] = -1
            return out
    return np.array([v if type(v) is int and -1 <= v < kept.MAX_INDEX else -1 for v in vals], dtype=np.int64)


def _args_list(evs: list) -> list:
    return list(map(_ARGS, evs))


def _arg_col(args: list, get: Callable, default: list) -> list:
    """``args.get(key, default)`` per row."""
    out = []
    for a, d in zip(args, default):
        if a is None or a is UNSET:
            out.append(d)
        else:
            v = get(a)
            out.append(d if v is UNSET else v)
    return out


class _Lanes:
    """Lane ids of a block's rows: the known ones, and the ones it sees first, numbered (when
    the block is applied) in the order of the rows that first use them, as the loop numbers
    them. A new lane is handed out as its key and resolved by :meth:`resolve`."""

    def __init__(self, lanes: dict):
        self.lanes = lanes
        self.first: dict[tuple, int] = {}   # new key -> first row using it

    def ids(self, keys: list, rows: list) -> list:
        try:
            return list(map(self.lanes.__getitem__, keys))
        except KeyError:
            pass
        except TypeError:  # an unhashable pid / tid: the loop names it
            raise _Slow from None
        return [self.one(k, r) for k, r in zip(keys, rows)]

    def one(self, key: tuple, row: int) -> int | tuple:
        try:
            i = self.lanes.get(key)
            if i is not None:
                return i
            if self.first.get(key, row) >= row:
                self.first[key] = row
        except TypeError:
            raise _Slow from None
        return key

    def resolve(self) -> dict[tuple, int]:
        """New key -> id, in order of first use."""
        return {k: len(self.lanes) + i for i, k in enumerate(sorted(self.first, key=self.first.__getitem__))}


def _resolved(ids: list, new: dict) -> list:
    return [x if type(x) is int else new[x] for x in ids]


def collect_block(c: kept.Collected, evs: list, first: int, state: dict, name: str, match: kept.Matcher,
                  module_match: kept.Matcher | None, read_python_functions: bool) -> bool:
    """Apply the block ``evs`` (events ``first``.. of traceEvents) to ``c``; False, with ``c``
    untouched, when the block needs the per-event loop. ``state`` holds the trace's time span
    (``t0``, ``t1``), which the loop keeps in locals."""
    try:
        plan = _plan(c, evs, match, module_match, read_python_functions)
    except (_Slow, TypeError):  # TypeError: an unhashable id met in a lookup
        return False
    plan(c, state)
    return True


def _plan(c: kept.Collected, evs: list, match: kept.Matcher, module_match: kept.Matcher | None,
          read_python_functions: bool) -> Callable[[kept.Collected, dict], None]:
    """Everything the block adds, worked out without touching ``c``; returns what applies it."""
    types = list(map(type, evs))
    code = np.fromiter(map(_CODE_OF.__getitem__, types), dtype=np.int8, count=len(evs))
    is_x, flow = code == 0, code == 1
    ph_counts = Counter(_PHASE_OF[t][1] for t in compress(types, code == 2))
    # complete events from here on
    xe = list(compress(evs, is_x))
    n = len(xe)
    cat = list(map(_CAT, xe))
    try:
        kind = np.fromiter(map(_KIND.get, cat, repeat(-1)), dtype=np.int8, count=n)
    except TypeError:  # an unhashable category: the loop names it
        raise _Slow from None
    op_cat = kind == _OP_CAT
    kind[op_cat] = kept.CPU_OP
    # the rows torch's layouts let the reader skip undecoded (Reader._array): ops that are no
    # ProfilerStep, flow arrows and, with the default patterns, Python frames but nn.Module
    op = kind == kept.CPU_OP
    py = kind == kept.PY_FN
    keep = np.zeros(n, dtype=bool)  # op / py rows that are read
    opy = op | py
    if opy.any():
        # a name that is no string is read (the loop ignores or refuses it)
        keep[op] = [type(x) is not str or x.startswith("ProfilerStep#") for x in map(_NAME, compress(xe, op))]
        if py.any():
            keep[py] = [read_python_functions or type(x) is not str or x.startswith("nn.Module: ")
                        for x in map(_NAME, compress(xe, py))]
    skip = opy & ~keep
    read = ~skip
    rows = np.flatnonzero(is_x)[read]  # in the block, for the order in which lanes are first used
    sub = list(compress(xe, read))
    k_r = kind[read]
    cat_counts = Counter(compress(cat, read))
    if any(v is not None and type(v) is not str for v in cat_counts):
        raise _Slow  # a missing or non-string category of a row that is read
    ts_raw, dur_raw = list(map(_TS, sub)), list(map(_DUR, sub))
    ts_v, dur_v = _numbers(ts_raw), _numbers(dur_raw)
    ts_f, dur_f = np.array(ts_v, dtype=np.float64), np.array(dur_v, dtype=np.float64)
    if len(sub) and not (np.all(np.abs(ts_f) < _SAFE_US) and np.all((dur_f >= 0) & (dur_f < _SAFE_US))):
        raise _Slow  # NaN, infinite, absurd or negative: the loop counts and skips them
    lanes = _Lanes(c.lanes)
    # kernels and runtime calls: the loop's two inline branches, column-wise
    is_k, is_r = k_r == kept.GPU_KERNEL, k_r == kept.RUNTIME
    kern = list(compress(sub, is_k))
    k_args = _args_list(kern)
    k_lane = lanes.ids(_kernel_keys(kern, k_args), rows[is_k].tolist())
    k_corr = _corrs(k_args)
    rt = list(compress(sub, is_r))
    r_args = _args_list(rt)
    r_lane = lanes.ids(_keys(list(map(_PID, rt)), list(map(_TID, rt)), False), rows[is_r].tolist())
    r_corr = _corrs(r_args)
    r_ts, r_dur = ts_f[is_r], dur_f[is_r]
    calls = [(x, float(r_ts[j]), float(r_dur[j]), r_lane[j], int(r_corr[j]))
             for j, x in enumerate(map(_NAME, rt)) if type(x) is str and x.startswith(_MEMCPY_CALLS)]
    # copies, annotations, frames, steps: few, each as the loop's _named_row reads it
    other = np.flatnonzero(~is_k & ~is_r & (k_r >= 0)).tolist()
    ts_l, dur_l = ts_f.tolist(), dur_f.tolist()
    copies, other_copies, gpu_spans, cpu_spans, module_spans, step_rows = [], [], [], [], [], []
    bad_bytes = unmatched = 0
    k_list = k_r.tolist()
    row_of = rows.tolist()
    memcpy_names: dict[str, tuple[str, str]] = {}
    known, hits = c.lanes, match.cache  # the Matcher's cache of names seen
    for q in other:
        ev, k = sub[q], k_list[q]
        nm = ev.name
        if k == kept.CPU_OP:  # torch < 1.11 wrote ProfilerStep#N as a cpu_op
            if type(nm) is str and nm.startswith("ProfilerStep#"):
                step_rows.append((nm, ts_l[q], dur_l[q]))
            continue
        if type(nm) is not str:
            raise _Slow  # the loop refuses it, naming the event
        ts, dur = ts_l[q], dur_l[q]
        end = ts + dur
        a = ev.args
        if a is UNSET:
            a = None
        if k == kept.GPU_MEMCPY:
            try:
                direction, tier = memcpy_names[nm]
            except KeyError:
                m = kept.MEMCPY.match(nm)
                src = (m.group(2) or "") if m else ""
                direction = m.group(1) if m else nm
                tier = "pinned" if src == "Pinned" else "pageable" if src == "Pageable" else "unknown"
                memcpy_names[nm] = direction, tier
            nbytes = 0 if a is None or a.bytes is UNSET else a.bytes
            if type(nbytes) is float and nbytes.is_integer():
                nbytes = int(nbytes)
            if type(nbytes) is not int:
                raise _Slow
            if not 0 <= nbytes < kept.MAX_BYTES:
                bad_bytes += 1
                continue
            if direction != "HtoD":
                other_copies.append((direction, nbytes))
                continue
            key = _gpu_key(a, ev)
            lane = known.get(key)
            if lane is None:
                lane = lanes.one(key, row_of[q])
            corr = -1 if a is None else a.correlation
            corr = corr if type(corr) is int and -1 <= corr < kept.MAX_INDEX else -1
            copies.append((ts, dur, lane, corr, nbytes, tier))
        elif k == kept.GPU_ANN:
            hit = hits.get(nm, _MISS)
            if hit is _MISS:
                hit = match(nm)
            if hit is None:
                unmatched += 1
                continue
            key = _gpu_key(a, ev)
            lane = known.get(key)
            if lane is None:
                lane = lanes.one(key, row_of[q])
            gpu_spans.append((lane, ts, end, hit))
        elif k == kept.CPU_ANN or k == kept.PY_FN:
            if nm.startswith("ProfilerStep#"):
                step_rows.append((nm, ts, dur))
                continue
            if k == kept.PY_FN and module_match is not None:
                # only nn.Module frames are read here (the others were skipped above)
                hit = module_match(nm)
                if hit is not None:
                    lane = lanes.one((_none(ev.pid), _none(ev.tid), False), row_of[q])
                    module_spans.append((lane, ts, end, hit))
                continue
            hit = hits.get(nm, _MISS)
            if hit is _MISS:
                hit = match(nm)
            if hit is None:
                if k == kept.CPU_ANN:
                    unmatched += 1
                continue
            key = (_none(ev.pid), _none(ev.tid), False)
            lane = known.get(key)
            if lane is None:
                lane = lanes.one(key, row_of[q])
            cpu_spans.append((lane, ts, end, hit))
    timed = np.flatnonzero((k_r != kept.CPU_OP) & (k_r != kept.PY_FN))
    lo_hi = None
    if len(timed):
        lo = int(timed[int(np.argmin(ts_f[timed]))])
        ends = ts_f[timed] + dur_f[timed]
        hi = int(timed[int(np.argmax(ends))])
        lo_hi = (float(ts_f[lo]), ts_v[lo], float(ts_f[hi] + dur_f[hi]))
    n_op = int(op_cat.sum())
    unused = int(flow.sum()) + int(skip.sum()) - int((skip & op_cat).sum())
    k_ts, k_dur = ts_f[is_k], dur_f[is_k]
    r_ts_b = r_ts
    new = lanes.resolve()
    if new:  # the lanes this block sees first
        k_lane, r_lane = _resolved(k_lane, new), _resolved(r_lane, new)
        calls = [(x[0], x[1], x[2], x[3] if type(x[3]) is int else new[x[3]], x[4]) for x in calls]
        copies = [(x[0], x[1], x[2] if type(x[2]) is int else new[x[2]], *x[3:]) for x in copies]
        gpu_spans, cpu_spans, module_spans = (
            [(x[0] if type(x[0]) is int else new[x[0]], *x[1:]) for x in spans]
            for spans in (gpu_spans, cpu_spans, module_spans))

    def apply(c: kept.Collected, state: dict) -> None:
        for key in new:
            c.lanes[key] = len(c.lane_keys)
            c.lane_keys.append(key)
        by_cat = c.by_cat
        cpu_before = by_cat.get("cpu_op", 0)
        for key, v in cat_counts.items():
            by_cat[key] = by_cat.get(key, 0) + v
        if n_op:  # as the loop counts the "cpu_op" marks of a block, read or not
            by_cat["cpu_op"] = cpu_before + n_op
        c.unused += unused
        for key, v in ph_counts.items():
            c.by_ph[key] = c.by_ph.get(key, 0) + v
        if lo_hi is not None:
            if lo_hi[0] < state["t0"]:
                state["t0"] = lo_hi[1]
            if lo_hi[2] > state["t1"]:
                state["t1"] = lo_hi[2]
        c.k_ts.frombytes(k_ts.tobytes())
        c.k_dur.frombytes(k_dur.tobytes())
        c.k_lane.extend(array("i", k_lane))
        c.k_corr.frombytes(k_corr.tobytes())
        c.r_corr.frombytes(r_corr.tobytes())
        c.r_ts.frombytes(r_ts_b.tobytes())
        c.r_lane.extend(array("i", r_lane))
        c.memcpy_calls.extend(calls)
        c.copies.extend(copies)
        for direction, nbytes in other_copies:
            tot = c.other_copies.setdefault(direction, [0, 0])
            tot[0] += 1
            tot[1] += nbytes
        c.gpu_spans.extend(gpu_spans)
        c.cpu_spans.extend(cpu_spans)
        c.module_spans.extend(module_spans)
        for nm, ts, dur in step_rows:
            kept.step_span(c, nm, ts, dur)
        c.bad_bytes += bad_bytes
        c.unmatched_annotations += unmatched

    return apply


_MISS = object()


def _gpu_key(a: Any, ev: Any) -> tuple:
    """The lane of a copy or GPU annotation: ``args.get("device", pid)``, ``args.get("stream", tid)``."""
    if a is None:
        return _none(ev.pid), _none(ev.tid), True
    d, t = a.device, a.stream
    return (_none(ev.pid) if d is UNSET else d), (_none(ev.tid) if t is UNSET else t), True


def _none(v: Any) -> Any:
    return None if v is UNSET else v


def _count(items: list) -> dict:
    out: dict = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out
