"""The recorded data: :class:`Run` (frames + meta), how its summary frames are derived, save/load.

Every producer — the cuda and cpu backends, the simulator, trace import, observer mode — emits
interval events plus step boundaries and calls :meth:`Run.build`; every consumer (analysis,
figures, report) reads the frames. Column sets are the contract (``docs/frames.md``).
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

EVENT_COLUMNS = ["run", "step", "group", "layer", "kind", "stream", "tier", "bytes", "start_s", "end_s", "dur_s"]
LAYER_COLUMNS = ["group", "layer", "tier", "bytes", "mapped_bytes", "streamed", "pin_rank",
                 "copy_s", "compute_s", "stall_s", "gbps"]
STEP_COLUMNS = ["step", "wall_s", "compute_s", "copy_s", "stall_s", "exposed_copy_s", "overlap", "bytes_moved"]
MEMORY_COLUMNS = ["t_s", "device_bytes", "pinned_bytes", "anon_bytes", "mapped_bytes"]

KINDS = ("copy", "compute", "wait", "host_block")
STREAMS = ("copy", "compute", "host")
TIERS = ("resident", "pinned", "pageable", "mapped", "unknown")
FORMAT = "offload-lab/run"


class RunFormatError(ValueError):
    """A file that is not a saved offload-lab run, or frames that break the contract."""


def empty_events() -> pd.DataFrame:
    return _events_frame([])


_EVENT_DTYPES = {
    "run": "string", "step": "int64", "group": "string", "layer": "int64", "kind": "string",
    "stream": "string", "tier": "string", "bytes": "int64",
    "start_s": "float64", "end_s": "float64", "dur_s": "float64",
}


def _events_frame(rows: list[dict] | pd.DataFrame) -> pd.DataFrame:
    if (isinstance(rows, pd.DataFrame) and list(rows.columns) == EVENT_COLUMNS
            and all(str(rows[c].dtype) == t for c, t in _EVENT_DTYPES.items())):
        return rows  # already in contract form (Run.build made it)
    df = pd.DataFrame(rows, columns=EVENT_COLUMNS) if not isinstance(rows, pd.DataFrame) else rows
    df = df.reindex(columns=EVENT_COLUMNS)
    df["dur_s"] = df["end_s"] - df["start_s"]
    return df.astype(_EVENT_DTYPES).reset_index(drop=True)


def _union(s, e):
    """Length of the union of intervals [s, e) (numpy arrays)."""
    if len(s) == 0:
        return 0.0
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    reach = np.maximum.accumulate(e)
    brk = np.empty(len(s), dtype=bool)
    brk[0] = True
    brk[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(brk)
    return float((np.maximum.reduceat(e, idx) - s[idx]).sum())



def summarize_steps(events: pd.DataFrame, bounds: pd.DataFrame) -> pd.DataFrame:
    """One row per step from the events and the step boundaries (``step, start_s, end_s``).

    Vectorised over steps (the simulator builds Runs of thousands of events on every slider
    move): interval unions are taken for all steps at once, by sorting on (step, start).
    """
    bstep = bounds["step"].to_numpy(dtype="int64")
    ub, inv = np.unique(bstep, return_inverse=True)
    nu = len(ub)
    step = events["step"].to_numpy(dtype="int64")
    pos = np.searchsorted(ub, step)
    found = pos < nu
    found[found] = ub[pos[found]] == step[found]
    import pyarrow as pa
    import pyarrow.compute as pc

    # one pass over the strings: each row's index in KINDS (-1: none)
    kind = pc.index_in(pa.array(events["kind"].array), value_set=pa.array(KINDS)).fill_null(-1).to_numpy()
    s = events["start_s"].to_numpy(dtype="float64")
    e = events["end_s"].to_numpy(dtype="float64")
    d = e - s
    c, k, w = (np.flatnonzero(found & (kind == KINDS.index(name))) for name in ("compute", "copy", "wait"))

    def union_by(ix: np.ndarray) -> np.ndarray:
        """Per step, the length of the union of the intervals ``ix``."""
        if not len(ix):
            return np.zeros(nu)
        p, ss, ee = pos[ix], s[ix], e[ix]
        o = np.argsort(ss, kind="stable")
        o = o[np.argsort(p[o], kind="stable")]  # by (step, start), as np.lexsort((ss, p)) but cheaper
        p, ss, ee = p[o], ss[o], ee[o]
        n = len(p)
        # running maximum of the ends within each step, exactly: on integer ranks of the ends
        # offset per step (a float offset would round)
        by_end = np.argsort(ee, kind="stable")
        rank = np.empty(n, dtype="int64")
        rank[by_end] = np.arange(n)
        reach = ee[by_end][np.maximum.accumulate(rank + p * n) - p * n]
        brk = np.ones(n, dtype=bool)
        brk[1:] = (p[1:] != p[:-1]) | (ss[1:] > reach[:-1])
        first = np.flatnonzero(brk)
        last = np.append(first[1:] - 1, n - 1)
        return np.bincount(p[first], weights=reach[last] - ss[first], minlength=nu).astype("float64")

    cu, ku = union_by(c), union_by(k)
    both = union_by(np.concatenate([c, k]))
    has_c = np.bincount(pos[c], minlength=nu) > 0
    has_k = np.bincount(pos[k], minlength=nu) > 0
    overlap = np.where(has_c & has_k, cu + ku - both, 0.0)
    # (np.bincount of nothing counts in ints: hence the casts)
    sums = {name: np.bincount(pos[ix], weights=d[ix], minlength=nu).astype("float64")
            for name, ix in (("compute_s", c), ("copy_s", k), ("stall_s", w))}
    # float sums of byte counts are exact below 2**53 bytes (9 PB) a step
    moved = np.bincount(pos[k], weights=events["bytes"].to_numpy(dtype="int64")[k], minlength=nu).astype("int64")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ku > 0, overlap / np.where(ku > 0, ku, 1.0), np.nan)
    return pd.DataFrame({
        "step": bstep,
        "wall_s": bounds["end_s"].to_numpy(dtype="float64") - bounds["start_s"].to_numpy(dtype="float64"),
        "compute_s": sums["compute_s"][inv], "copy_s": sums["copy_s"][inv], "stall_s": sums["stall_s"][inv],
        "exposed_copy_s": np.maximum(0.0, ku - overlap)[inv],
        "overlap": ratio[inv].astype("float64"),
        "bytes_moved": moved[inv],
    }, columns=STEP_COLUMNS)



def summarize_layers(events: pd.DataFrame, plan_layers: pd.DataFrame) -> pd.DataFrame:
    """One row per planned layer: the plan's placement plus medians over steps of its intervals.

    Vectorised: per (layer, step) sums by one sort of the events, then medians per layer on
    the sorted cells (the mean of the two middle values, as pandas' median takes it).
    """
    n_base = len(plan_layers)

    def planned(name: str, dtype: str) -> Any:
        """A column of the plan in its contract dtype (missing: all NA, as a reindex gives)."""
        col = plan_layers[name] if name in plan_layers.columns else pd.Series(np.nan, index=plan_layers.index)
        return col.array if col.dtype == dtype else col.astype(dtype).array

    base = {"group": planned("group", "string"), "layer": planned("layer", "int64")}
    vals = {name: np.zeros(n_base) for name in ("copy_s", "compute_s", "stall_s")}
    vals["gbps"] = np.full(n_base, np.nan)
    if len(events) and n_base:
        import pyarrow as pa
        import pyarrow.compute as pc

        gnames = list(dict.fromkeys(base["group"].tolist()))
        # one pass over the strings: each row's index in the list given (-1: none)
        gcode = pc.index_in(pa.array(events["group"].array), value_set=pa.array(gnames)).fill_null(-1).to_numpy()
        kind = pc.index_in(pa.array(events["kind"].array), value_set=pa.array(KINDS)).fill_null(-1).to_numpy()
        layer = events["layer"].to_numpy(dtype="int64")
        span = int(max(layer.max(initial=0), base["layer"].max(), 0) + 1)
        lkey = np.where(gcode >= 0, gcode * span + layer, -1)
        step = events["step"].to_numpy(dtype="int64")
        smin = int(step.min())
        cells, cell_of = np.unique(lkey * (int(step.max()) - smin + 1) + (step - smin), return_inverse=True)
        cell_key = cells // (int(step.max()) - smin + 1)
        d = events["dur_s"].to_numpy(dtype="float64")
        ncell = len(cells)
        per = {}
        for name, kd in (("copy_s", "copy"), ("compute_s", "compute"), ("stall_s", "wait")):
            sel = kind == KINDS.index(kd)
            per[name] = np.bincount(cell_of[sel], weights=d[sel], minlength=ncell).astype("float64")
            if kd == "copy":  # byte sums are exact in float below 2**53
                cb = np.bincount(cell_of[sel], weights=events["bytes"].to_numpy(dtype="int64")[sel],
                                 minlength=ncell)
        with np.errstate(divide="ignore", invalid="ignore"):
            per["gbps"] = np.where(per["copy_s"] > 0, cb / np.where(per["copy_s"] > 0, per["copy_s"], 1.0),
                                   np.nan) / 1e9
        keys, first, key_of = np.unique(cell_key, return_index=True, return_inverse=True)
        # cells are sorted by key: lay each key's cells out in a row (NaN-padded) and sort rows
        rank = np.arange(ncell) - first[key_of]
        width = int(rank.max()) + 1
        rows = np.arange(len(keys))

        def median_by(v: np.ndarray) -> np.ndarray:
            """Per key, the median of its cells' values that are not NaN (NaN when none)."""
            grid = np.full((len(keys), width), np.nan)
            grid[key_of, rank] = v
            grid.sort(axis=1)  # NaN sorts last
            n = (~np.isnan(grid)).sum(axis=1)
            out = (grid[rows, np.maximum(n - 1, 0) // 2] + grid[rows, n // 2 - (n == 0)]) / 2
            return np.where(n > 0, out, np.nan)

        base_key = (np.array([gnames.index(g) for g in base["group"].tolist()], dtype="int64") * span
                    + np.asarray(base["layer"], dtype="int64"))
        at = np.searchsorted(keys, base_key)
        hit = at < len(keys)
        hit[hit] = keys[at[hit]] == base_key[hit]
        for name in vals:
            vals[name][hit] = median_by(per[name])[at[hit]]
        for name in ("copy_s", "compute_s", "stall_s"):
            vals[name] = np.nan_to_num(vals[name], nan=0.0)
    return pd.DataFrame({
        **base, "tier": planned("tier", "string"), "bytes": planned("bytes", "int64"),
        "mapped_bytes": planned("mapped_bytes", "int64"), "streamed": planned("streamed", "bool"),
        "pin_rank": planned("pin_rank", "Int64"), **vals,
    }, columns=LAYER_COLUMNS)


def _jsonable(obj: Any) -> Any:
    """Meta must be plain JSON: convert numpy scalars, paths, tuples; refuse anything else."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, Path):
        return str(obj)
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"run meta value {obj!r} of type {type(obj).__name__} is not JSON data")


class Run:
    """One execution of N steps under one plan: measured (``cuda``/``cpu``) or simulated (``sim``).

    Frames: ``events``, ``layers``, ``steps``, ``memory``; plus ``meta``.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> run = offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)
    >>> run.simulated, list(run.steps.columns)[:3]
    (True, ['step', 'wall_s', 'compute_s'])
    """

    def __init__(self, events: pd.DataFrame, layers: pd.DataFrame, steps: pd.DataFrame,
                 memory: pd.DataFrame, meta: dict[str, Any]):
        self.events = _events_frame(events)
        self.layers = layers.reindex(columns=LAYER_COLUMNS)
        self.steps = steps.reindex(columns=STEP_COLUMNS)
        self.memory = memory.reindex(columns=MEMORY_COLUMNS).astype(
            {"t_s": "float64", "device_bytes": "int64", "pinned_bytes": "int64",
             "anon_bytes": "int64", "mapped_bytes": "int64"})
        self.meta = _jsonable(dict(meta))
        self.meta.setdefault("simulated", self.meta.get("backend") == "sim")

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def build(cls, events: list[dict] | pd.DataFrame, bounds: list[dict] | pd.DataFrame,
              plan_layers: pd.DataFrame, memory: list[dict] | pd.DataFrame | None = None,
              meta: dict[str, Any] | None = None, warmup: int = 0) -> Run:
        """Derive the summary frames from raw intervals.

        ``bounds`` holds one row per step (``step, start_s, end_s``). The first ``warmup`` steps
        are dropped from every frame (and ``meta['warmup_dropped']`` says so); events labelled
        with a step that never ran (prefetch that wrapped past the last step) are dropped too.
        """
        meta = dict(meta or {})
        bounds = pd.DataFrame(bounds, columns=["step", "start_s", "end_s"])
        if not bounds["step"].is_monotonic_increasing:
            bounds = bounds.sort_values("step")
        ev = _events_frame(events if isinstance(events, pd.DataFrame) else list(events))
        kept = bounds["step"].to_numpy()[warmup:]
        if warmup:
            bounds = bounds[bounds["step"].isin(kept)]
        bounds = bounds.reset_index(drop=True)
        # keep the steps that ran, in (start, end) order; the simulator hands its rows over
        # already sorted, so the order is checked before any row is moved
        rows = np.flatnonzero(np.isin(ev["step"].to_numpy(), kept))
        s, e = ev["start_s"].to_numpy()[rows], ev["end_s"].to_numpy()[rows]
        tie = s[1:] == s[:-1]
        if (s[1:] < s[:-1]).any() or (e[1:][tie] < e[:-1][tie]).any():
            rows = rows[np.lexsort((e, s))]
        ev = ev.take(rows) if len(rows) != len(ev) or (rows != np.arange(len(ev))).any() else ev.copy(deep=False)
        ev.index = pd.RangeIndex(len(ev))
        if "run" in meta:
            import pyarrow as pa
            import pyarrow.compute as pc

            run = pa.scalar(str(meta["run"]), type=pa.large_string())
            if not pc.all(pc.equal(pa.array(ev["run"].array), run), skip_nulls=False).as_py():
                ev["run"] = pd.arrays.ArrowStringArray(pa.repeat(run, len(ev)))
        if not (isinstance(memory, pd.DataFrame) and list(memory.columns) == MEMORY_COLUMNS):
            memory = pd.DataFrame(memory if memory is not None else [], columns=MEMORY_COLUMNS)
        mem = memory
        meta["warmup_dropped"] = int(warmup)
        meta.setdefault("created", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        meta["steps_measured"] = len(bounds)
        return cls(ev, summarize_layers(ev, plan_layers), summarize_steps(ev, bounds), mem, meta)

    # -- views -------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return str(self.meta.get("label") or self.meta.get("run") or "run")

    @property
    def simulated(self) -> bool:
        return bool(self.meta.get("simulated", False))

    @property
    def backend(self) -> str:
        return str(self.meta.get("backend", "unknown"))

    @property
    def step_time(self) -> float:
        """Median wall time of a measured step, in seconds."""
        return float(self.steps["wall_s"].median()) if len(self.steps) else float("nan")

    def __repr__(self) -> str:
        kind = "simulated" if self.simulated else "measured"
        st = self.step_time
        st_s = f"{st:.4g} s/step" if not math.isnan(st) else "no steps"
        return f"<Run {self.label!r} {kind} ({self.backend}), {len(self.steps)} steps, {st_s}>"

    def _repr_html_(self) -> str:
        from offload_lab.analysis.summary import compare

        return compare([self]).to_html(index=False, escape=True)

    # -- save / load -------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write one zip file of parquet frames and ``meta.json`` (data, never pickle).

        ``.zip`` is appended when ``path`` lacks it; the written path is returned.
        """
        path = Path(path)
        if path.suffix != ".zip":
            path = path.with_name(path.name + ".zip")
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._write(tmp)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise OSError(f"cannot write run {str(path)!r}: {e.strerror or e}") from None
        os.replace(tmp, path)
        return path

    def _write(self, tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("meta.json", json.dumps({"format": FORMAT, "version": 1, "meta": self.meta}, indent=1))
            for name in ("events", "layers", "steps", "memory"):
                buf = io.BytesIO()
                getattr(self, name).to_parquet(buf, engine="pyarrow", index=False)
                z.writestr(f"{name}.parquet", buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Run:
        """Read a run written by :meth:`save`."""
        path = Path(path)
        try:
            with zipfile.ZipFile(path) as z:
                names = set(z.namelist())
                need = {"meta.json", "events.parquet", "layers.parquet", "steps.parquet", "memory.parquet"}
                if not need <= names:
                    raise RunFormatError(f"{str(path)!r} is not an offload-lab run: missing {sorted(need - names)}")
                head = json.loads(z.read("meta.json"))
                if head.get("format") != FORMAT:
                    raise RunFormatError(f"{str(path)!r} is not an offload-lab run (format {head.get('format')!r})")
                frames = {n: pd.read_parquet(io.BytesIO(z.read(f"{n}.parquet")), engine="pyarrow")
                          for n in ("events", "layers", "steps", "memory")}
        except (zipfile.BadZipFile, OSError, json.JSONDecodeError) as e:
            raise RunFormatError(f"cannot read run {str(path)!r}: {e}") from None
        run = cls.__new__(cls)
        run.events, run.layers, run.steps, run.memory = (frames[n] for n in ("events", "layers", "steps", "memory"))
        run.meta = head["meta"]
        return run

    def equals(self, other: Run) -> bool:
        """Frames and meta equal (dtypes included)."""
        return self.meta == other.meta and all(
            getattr(self, n).equals(getattr(other, n)) for n in ("events", "layers", "steps", "memory")
        )
