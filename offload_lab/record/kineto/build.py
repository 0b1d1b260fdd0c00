"""Building the :class:`~offload_lab.record.run.Run` from what was collected: layers, steps, frames, meta."""

from __future__ import annotations

import re
import uuid
from typing import Any

import numpy as np
import pandas as pd

from offload_lab.record.kineto.collect import _CATS, _CPU_OP, _GPU_MEMSET, _Collected
from offload_lab.record.kineto.reader import TraceFormatError, _Reader
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
