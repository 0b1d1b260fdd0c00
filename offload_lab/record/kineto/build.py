"""Building the :class:`~offload_lab.record.run.Run` from what was collected: layers, steps, frames, meta."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from offload_lab.record.kineto.options import TraceImportOptions
from offload_lab.record.kineto.reader import Reader, TraceFormatError
from offload_lab.record.kineto.rows import CATS, CPU_OP, GPU_MEMSET, Collected
from offload_lab.record.run import Run

NO_GROUP = ""
NO_LAYER = -1
_NO_USE = -2  # step of a copy whose layer never runs again in the trace


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



def _layer_spans(c: Collected, default_patterns: bool) -> tuple[str, list, list]:
    """Which spans define the layers: ``(layer_source, cpu spans, gpu spans)``."""
    layer_source = "labels" if default_patterns else "layer_pattern"
    cpu_spans, gpu_spans = c.cpu_spans, c.gpu_spans
    if default_patterns and not cpu_spans and not gpu_spans and c.module_spans:
        per_class: dict[str, set[int]] = {}
        for s in c.module_spans:
            per_class.setdefault(s[3][0], set()).add(s[3][1])
        repeated = {k for k, v in per_class.items() if len(v) >= 2}
        cpu_spans = _outermost([s for s in c.module_spans if s[3][0] in repeated])
        layer_source = "nn.Module"
    if not cpu_spans and not gpu_spans:
        layer_source = "none"
    return layer_source, cpu_spans, gpu_spans


def _array(buf: Any, dtype: Any) -> np.ndarray:
    return np.frombuffer(buf, dtype=dtype) if len(buf) else np.zeros(0, dtype)


class _Trace:
    """What attribution needs: layer ids, span segments, launches by correlation id, step spans."""

    def __init__(self, c: Collected, cpu_spans: list, gpu_spans: list):
        self.t0 = c.t0
        self.layer_ids: dict[tuple[str, int], int] = {}
        for s in (*gpu_spans, *cpu_spans):
            self.layer_ids.setdefault(s[3], len(self.layer_ids))
        self.keys = list(self.layer_ids)
        ids, n_gpu = self.layer_ids, len(gpu_spans)
        self.gpu_seg = _Segments([(s[0], s[1], s[2], ids[s[3]], i) for i, s in enumerate(gpu_spans)])
        self.cpu_seg = _Segments([(s[0], s[1], s[2], ids[s[3]], n_gpu + i) for i, s in enumerate(cpu_spans)])
        self.r_corr = _array(c.r_corr, np.int64)
        self.r_ts = _array(c.r_ts, np.float64)
        self.r_lane = _array(c.r_lane, np.int32)
        self.order = np.argsort(self.r_corr, kind="stable")
        self.r_corr_s = self.r_corr[self.order]
        self.step_ids = sorted(c.steps)
        if self.step_ids:
            sspans = sorted((c.steps[k][0], c.steps[k][1], k) for k in self.step_ids)
            self.s_start = np.array([s[0] for s in sspans])
            self.s_end = np.array([s[1] for s in sspans])
            self.s_num = np.array([s[2] for s in sspans], dtype=np.int64)
        else:
            self.s_start, self.s_end = np.array([c.t0]), np.array([c.t1])
            self.s_num = np.array([0], dtype=np.int64)

    def launches(self, corr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found, cpu ts, cpu lane) of the runtime call with each correlation id."""
        if not len(self.r_corr_s) or not len(corr):
            return np.zeros(len(corr), bool), np.zeros(len(corr)), np.full(len(corr), -1, np.int32)
        i = np.minimum(np.searchsorted(self.r_corr_s, corr), len(self.r_corr_s) - 1)
        found = (self.r_corr_s[i] == corr) & (corr >= 0)
        j = self.order[i]
        return found, np.where(found, self.r_ts[j], np.nan), np.where(found, self.r_lane[j], -1)

    def attribute(self, lane: np.ndarray, ts: np.ndarray, corr: np.ndarray):
        """(layer id, use id, found launch, launch ts) for GPU rows."""
        n = len(ts)
        layer = np.full(n, -1, np.int64)
        root = np.full(n, -1, np.int64)
        self.gpu_seg.lookup(lane, ts, layer, root, np.ones(n, bool))
        found, lts, llane = self.launches(corr)
        self.cpu_seg.lookup(llane, lts, layer, root, (layer < 0) & found)
        return layer, root, found, lts

    def step_of(self, t: np.ndarray) -> np.ndarray:
        """Step number for each time, -1 outside; a gap between steps belongs to the earlier one."""
        if not self.step_ids:
            return np.zeros(len(t), np.int64)
        i = np.searchsorted(self.s_start, t, side="right") - 1
        ok = i >= 0
        last = len(self.s_start) - 1
        ok[ok] &= (i[ok] < last) | (t[ok] < self.s_end[np.minimum(i[ok], last)])
        return np.where(ok, self.s_num[np.clip(i, 0, last)], -1)


def _compute(tr: _Trace, c: Collected, cpu_spans: list) -> tuple[dict[str, np.ndarray], str]:
    """Kernels -> one compute row per layer use and stream; without kernels, CPU annotations.

    Columns ``step``, ``layer_id``, ``start``, ``end``: the uses in order of their first kernel,
    then the kernels outside every layer in trace order."""
    k_ts, k_dur = _array(c.k_ts, np.float64), _array(c.k_dur, np.float64)
    k_lane, k_corr = _array(c.k_lane, np.int32), _array(c.k_corr, np.int64)
    if len(k_ts):
        layer, root, found, lts = tr.attribute(k_lane, k_ts, k_corr)
        step = tr.step_of(np.where(found, lts, k_ts))
        end = k_ts + k_dur
        inside = np.flatnonzero(layer >= 0)
        outside = np.flatnonzero(layer < 0)
        # one use = (root span, lane, step, layer); numbered in order of first appearance
        use = _uses(root[inside], k_lane[inside], step[inside], layer[inside])
        n_use = int(use.max()) + 1 if len(use) else 0
        first = np.full(n_use, len(use), np.int64)
        np.minimum.at(first, use, np.arange(len(use)))
        lo = np.full(n_use, np.inf)
        hi = np.full(n_use, -np.inf)
        np.minimum.at(lo, use, k_ts[inside])
        np.maximum.at(hi, use, end[inside])
        head = inside[first]
        compute = {"step": np.concatenate([step[head], step[outside]]),
                   "layer_id": np.concatenate([layer[head], layer[outside]]),
                   "start": np.concatenate([lo, k_ts[outside]]),
                   "end": np.concatenate([hi, end[outside]])}
        source = "kernels"
    else:
        spans = _outermost([(s[0], s[1], s[2], tr.layer_ids[s[3]]) for s in cpu_spans])
        source = "cpu_annotations" if spans else "none"
        start = np.array([s[1] for s in spans], dtype=np.float64)
        compute = {"step": tr.step_of(start).astype(np.int64),
                   "layer_id": np.array([s[3] for s in spans], dtype=np.int64),
                   "start": start, "end": np.array([s[2] for s in spans], dtype=np.float64)}
    compute["step"] = compute["step"].astype(np.int64, copy=False)
    compute["layer_id"] = compute["layer_id"].astype(np.int64, copy=False)
    return compute, source


def _uses(*cols: np.ndarray) -> np.ndarray:
    """Ids of the distinct rows of ``cols`` (non-negative ints but ``step``, ≥ -1), numbered
    in order of first appearance; one int64 key per row when their ranges fit in 62 bits."""
    if not len(cols[0]):
        return np.zeros(0, np.intp)
    lo = [int(c.min()) for c in cols]
    span = [int(c.max()) - m + 1 for c, m in zip(cols, lo)]
    if sum(max(x - 1, 1).bit_length() for x in span) <= 62:
        key = np.zeros(len(cols[0]), np.int64)
        for c, m, x in zip(cols, lo, span):
            key = key * x + (c.astype(np.int64) - m)
        return pd.factorize(key)[0]
    return pd.factorize(pd.MultiIndex.from_arrays(list(cols)))[0]


def _copies(tr: _Trace, c: Collected, compute: pd.DataFrame) -> dict[str, np.ndarray]:
    """HtoD copies, each labelled with the step that uses it: its layer's first compute ending after it."""
    cp = c.copies
    out = {
        "start": np.array([x[0] for x in cp], dtype=np.float64),
        "lane": np.array([x[2] for x in cp], dtype=np.int64),
        "corr": np.array([x[3] for x in cp], dtype=np.int64),
        "bytes": np.array([x[4] for x in cp], dtype=np.int64),
        "tier": np.array([x[5] for x in cp], dtype=object),
    }
    out["end"] = out["start"] + np.array([x[1] for x in cp], dtype=np.float64)
    layer, _, found, lts = tr.attribute(out["lane"], out["start"], out["corr"])
    step = tr.step_of(np.where(found, lts, out["start"]))
    c_lid, c_end, c_step = compute["layer_id"], compute["end"], compute["step"]
    inside = np.flatnonzero(c_lid >= 0)
    # each layer's computes in row order (a stable sort by layer), as a groupby hands them out
    by_layer = inside[np.argsort(c_lid[inside], kind="stable")]
    lids = c_lid[by_layer]
    cut = np.flatnonzero(np.diff(lids)) + 1
    for rows in np.split(by_layer, cut) if len(by_layer) else []:
        sel = np.flatnonzero(layer == c_lid[rows[0]])
        if not len(sel):
            continue
        order = c_end[rows].argsort(kind="quicksort")  # the sort pandas' sort_values("end") makes
        ends, steps = c_end[rows][order], c_step[rows][order]
        i = np.searchsorted(ends, out["end"][sel], side="left")
        ok = i < len(ends)
        step[sel[ok]] = steps[i[ok]]
        # no later use in the trace: a prefetch for a step that was not recorded (dropped)
        step[sel[~ok]] = _NO_USE
    out["layer"], out["step"] = layer, step
    return out


def _host_blocks(tr: _Trace, c: Collected, cp: dict[str, np.ndarray]) -> list[tuple]:
    """Host-side memcpy calls that blocked the thread: ``(step, layer_id, lane, start, end, tier, bytes)``."""
    copy_by_corr = {x: k for k, x in enumerate(cp["corr"].tolist()) if x >= 0}
    tier, step, layer, nbytes = (cp["tier"].tolist(), cp["step"].tolist(), cp["layer"].tolist(),
                                 cp["bytes"].tolist())
    hb, unmatched = [], []
    for nm, ts, dur, lane, corr in c.memcpy_calls:
        k = copy_by_corr.get(corr)
        sync = "Async" not in nm
        if k is not None:
            if tier[k] == "pageable" or sync:
                hb.append((step[k], layer[k], lane, ts, ts + dur, tier[k], nbytes[k]))
        elif sync:
            unmatched.append((lane, ts, ts + dur))
    if unmatched:  # a blocking copy whose device side is not in the trace: tier unknown
        lanes = np.array([x[0] for x in unmatched], dtype=np.int64)
        ts_ = np.array([x[1] for x in unmatched])
        lay = np.full(len(ts_), -1, np.int64)
        tr.cpu_seg.lookup(lanes, ts_, lay, np.full(len(ts_), -1, np.int64), np.ones(len(ts_), bool))
        st = tr.step_of(ts_)
        for j, (lane, s, e) in enumerate(unmatched):
            hb.append((int(st[j]), int(lay[j]), lane, s, e, "unknown", 0))
    return hb


def _placement(tr: _Trace, compute: pd.DataFrame, cp: dict[str, np.ndarray]) -> tuple[pd.DataFrame, list, list]:
    """Per observed layer: tier from its copies, bytes, streamed. Returns (frame, tiers by id, mixed)."""
    keys, n_layers = tr.keys, len(tr.keys)
    c_lid, c_step = compute["layer_id"], compute["step"]
    comp_steps: list[set[int]] = [set() for _ in range(n_layers)]
    sel = (c_lid >= 0) & (c_step >= 0)
    # (layer, step) pairs, each once: a few per layer and step, whatever the number of kernels
    for lid, st in set(zip(c_lid[sel].tolist(), c_step[sel].tolist())):
        comp_steps[lid].add(st)
    tier_bytes: list[dict[str, int]] = [{} for _ in range(n_layers)]
    step_bytes: list[dict[int, int]] = [{} for _ in range(n_layers)]
    k = np.flatnonzero((cp["layer"] >= 0) & (cp["step"] >= 0))
    for lid, t, b, st in zip(cp["layer"][k].tolist(), cp["tier"][k].tolist(), cp["bytes"][k].tolist(),
                             cp["step"][k].tolist()):
        tier_bytes[lid][t] = tier_bytes[lid].get(t, 0) + b
        step_bytes[lid][st] = step_bytes[lid].get(st, 0) + b
    tiers, mixed = [], []
    # most bytes wins; ties go to the slower tier so a mix never looks better than it was
    rank = {"pageable": 2, "unknown": 1, "pinned": 0}
    for lid, (g, i) in enumerate(keys):
        tb = tier_bytes[lid]
        tiers.append(max(tb, key=lambda t: (tb[t], rank.get(t, 1))) if tb else "unknown")
        if len(tb) > 1:
            mixed.append(f"{g}.{i}")
    order = sorted(range(n_layers), key=lambda lid: (_first_seen(keys, lid), keys[lid][1]))
    plan_layers = pd.DataFrame({
        "group": pd.array([keys[lid][0] for lid in order], dtype="string"),
        "layer": np.array([keys[lid][1] for lid in order], dtype=np.int64),
        "tier": pd.array([tiers[lid] for lid in order], dtype="string"),
        "bytes": np.array([max(step_bytes[lid].values(), default=0) for lid in order], dtype=np.int64),
        "mapped_bytes": np.zeros(n_layers, dtype=np.int64),
        "streamed": np.array([bool(step_bytes[lid]) and comp_steps[lid] <= set(step_bytes[lid])
                              for lid in order], dtype=bool),
        "pin_rank": pd.array([pd.NA] * n_layers, dtype="Int64"),
    })
    return plan_layers, tiers, mixed


def _events(tr: _Trace, compute: pd.DataFrame, cp: dict[str, np.ndarray], hb: list[tuple], tiers: list,
            run_id: str) -> tuple[pd.DataFrame, dict[str, int], dict[str, int]]:
    """The events frame, and the rows dropped outside every step / without a later use."""
    layer_tier = np.array([*tiers, "unknown"], dtype=object)   # index -1 -> "unknown"
    group_of = np.array([*(k[0] for k in tr.keys), NO_GROUP], dtype=object)
    index_of = np.array([*(k[1] for k in tr.keys), NO_LAYER], dtype=np.int64)
    n_comp, n_cp, n_hb = len(compute["step"]), len(cp["start"]), len(hb)
    comp_lid = compute["layer_id"]
    col = {
        "step": np.concatenate([compute["step"], cp["step"],
                                np.array([h[0] for h in hb], dtype=np.int64)]),
        "layer_id": np.concatenate([comp_lid, cp["layer"], np.array([h[1] for h in hb], dtype=np.int64)]),
        # 0 compute, 1 copy, 2 host_block (on the host stream)
        "kind": np.repeat(np.arange(3), [n_comp, n_cp, n_hb]),
        "tier": np.concatenate([layer_tier[comp_lid], cp["tier"], np.array([h[5] for h in hb], dtype=object)]),
        "bytes": np.concatenate([np.zeros(n_comp, np.int64), cp["bytes"],
                                 np.array([h[6] for h in hb], dtype=np.int64)]),
        "start": np.concatenate([compute["start"], cp["start"],
                                 np.array([h[3] for h in hb], dtype=np.float64)]),
        "end": np.concatenate([compute["end"], cp["end"],
                               np.array([h[4] for h in hb], dtype=np.float64)]),
    }
    st = col["step"]
    parts = {"compute": st[:n_comp], "copy": st[n_comp:n_comp + n_cp], "host_block": st[n_comp + n_cp:]}
    outside = {k: int((v == -1).sum()) for k, v in parts.items()}
    unused = {k: int((parts[k] == _NO_USE).sum()) for k in ("copy", "host_block")}
    col = {k: v[st >= 0] for k, v in col.items()}
    n = len(col["step"])
    tiers_l = col["tier"].tolist()
    tier_names = list(dict.fromkeys(tiers_l))  # a few names: hashed as strs, not scanned as objects
    tier_code = np.fromiter(map({t: i for i, t in enumerate(tier_names)}.__getitem__, tiers_l), np.intp,
                            count=len(tiers_l))
    start_s, end_s = (col["start"] - tr.t0) / 1e6, (col["end"] - tr.t0) / 1e6
    # every column of the contract, in its dtype and order, so the Run takes the frame as it is
    # (and still checks its values)
    events = pd.DataFrame({
        "run": _strings([run_id], np.zeros(n, np.intp)), "step": col["step"], "call": np.zeros(n, np.int64),
        "group": _strings(group_of, col["layer_id"]),
        "layer": index_of[col["layer_id"]], "kind": _strings(["compute", "copy", "host_block"], col["kind"]),
        "stream": _strings(["compute", "copy", "host"], col["kind"]),
        "tier": _strings(tier_names, tier_code), "bytes": col["bytes"],
        "start_s": start_s, "end_s": end_s, "dur_s": end_s - start_s, "rank": np.zeros(n, np.int64),
    })
    return events, outside, unused


def _strings(values: Any, codes: np.ndarray) -> Any:
    """A ``string`` column holding ``values[codes]`` (-1: the last value), built from the few
    distinct values, not converted row by row."""
    return pd.array(list(values), dtype="string").take(codes)


def _bounds(tr: _Trace, events: pd.DataFrame) -> pd.DataFrame:
    """Step bounds: the ProfilerStep span widened to the rows it holds."""
    start, end = (tr.s_start - tr.t0) / 1e6, (tr.s_end - tr.t0) / 1e6
    if len(events):
        steps, at = np.unique(events["step"].to_numpy(), return_inverse=True)
        lo = np.full(len(steps), np.inf)
        hi = np.full(len(steps), -np.inf)
        np.minimum.at(lo, at, events["start_s"].to_numpy())
        np.maximum.at(hi, at, events["end_s"].to_numpy())
        i = np.minimum(np.searchsorted(steps, tr.s_num), len(steps) - 1)
        has = steps[i] == tr.s_num  # a step without rows keeps its span
        start = np.where(has, np.fmin(start, lo[i]), start)
        end = np.where(has, np.fmax(end, hi[i]), end)
    return pd.DataFrame({"step": tr.s_num, "start_s": start, "end_s": end})


def _nothing_to_show(c: Collected, reader: Reader, name: str) -> TraceFormatError:
    """Why a trace gives no layer and no GPU row, and how to record one that does."""
    top = ", ".join(f"{k} ×{v:,}" for k, v in sorted(c.by_cat.items(), key=lambda kv: -kv[1])[:4] if v)
    complete = sum(v for v in c.by_cat.values() if v > 0)
    skipped = c.bad_times + c.negative_dur
    return TraceFormatError(
        f"{name}: no layer found: the trace has {reader.n_events:,} events, {complete:,} of them complete "
        f"('ph': 'X': {top or 'none with a category'}"
        + (f"; {skipped:,} with a NaN, infinite, absurd or negative time skipped" if skipped else "")
        + f"), {len(c.steps)} ProfilerStep span(s), {c.unmatched_annotations} record_function label(s) that "
        f"match no layer_pattern, no kernels and no host-to-device copies; to see layers, label each "
        f"block's forward with torch.profiler.record_function('blocks.<i>'), profile with "
        f"with_stack=True so 'nn.Module: <Block>_<i>' spans are recorded, pass a layer_pattern matching "
        f"your labels, or profile under offload_lab.offload, whose copies are labelled "
        f"'offload_lab.copy <group>.<i>'")


def build_run(c: Collected, reader: Reader, source: str, label: str, options: TraceImportOptions) -> Run:
    """The Run of what was collected; ``label`` is the one resolved from ``options.label``."""
    name = source
    if c.t0 == float("inf"):
        if any(v > 0 for v in c.by_cat.values()):
            # complete rows there are, but only ones that never time a layer (cpu_op, Python
            # frames) or whose times are unusable: say what the trace holds
            raise _nothing_to_show(c, reader, name)
        raise TraceFormatError(f"{name}: the trace has no complete ('ph': 'X') events with a duration "
                               f"({reader.n_events:,} events read)")
    layer_source, cpu_spans, gpu_spans = _layer_spans(c, options.default_patterns)
    if layer_source == "none" and not len(c.k_ts) and not c.copies:
        raise _nothing_to_show(c, reader, name)
    tr = _Trace(c, cpu_spans, gpu_spans)
    compute, compute_source = _compute(tr, c, cpu_spans)
    cp = _copies(tr, c, compute)
    hb = _host_blocks(tr, c, cp)
    plan_layers, tiers, mixed = _placement(tr, compute, cp)
    run_id = uuid.uuid4().hex[:12]
    events, outside, unused = _events(tr, compute, cp, hb, tiers, run_id)
    meta = _meta(c, reader, source, label, run_id, options.patterns, layer_source, compute_source,
                 mixed, outside, unused, len(tr.step_ids))
    return Run.build(events, _bounds(tr, events), plan_layers, meta=meta)


def _first_seen(keys: list[tuple[str, int]], lid: int) -> int:
    """Order groups by first appearance, layers by index inside a group."""
    g = keys[lid][0]
    return next(i for i, k in enumerate(keys) if k[0] == g)


def _meta(c: Collected, reader: Reader, source: str, label: str, run_id: str,
          patterns: Sequence[re.Pattern], layer_source: str, compute_source: str, mixed: list[str],
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
        "memset": sum(v for k, v in c.by_cat.items() if CATS.get(k) == GPU_MEMSET),
        "cpu_ops": sum(v for k, v in c.by_cat.items() if CATS.get(k) == CPU_OP),
        "other_categories": {k: v for k, v in c.by_cat.items() if k not in CATS},
        "not_complete_events": dict(c.by_ph),
        "negative_dur": c.negative_dur,
        "non_finite_or_absurd_times": c.bad_times,
        "memcpy_bytes_negative_or_absurd": c.bad_bytes,
        "step_numbers_too_large": c.bad_steps,
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
