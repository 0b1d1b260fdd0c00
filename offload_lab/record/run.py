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

    Vectorised per step (numpy slices of events sorted by step): the simulator builds Runs
    of thousands of events on every slider move.
    """
    step = events["step"].to_numpy()
    kind = events["kind"].to_numpy(dtype=object)
    s = events["start_s"].to_numpy(dtype="float64")
    e = events["end_s"].to_numpy(dtype="float64")
    d = e - s
    nb = events["bytes"].to_numpy()
    is_comp, is_copy, is_wait = kind == "compute", kind == "copy", kind == "wait"
    order = np.argsort(step, kind="stable")
    sorted_steps = step[order]
    rows = []
    for b in bounds.itertuples(index=False):
        lo, hi = np.searchsorted(sorted_steps, [b.step, b.step + 1])
        ix = order[lo:hi]
        c, k, w = ix[is_comp[ix]], ix[is_copy[ix]], ix[is_wait[ix]]
        cu, ku = _union(s[c], e[c]), _union(s[k], e[k])
        both = _union(np.concatenate([s[c], s[k]]), np.concatenate([e[c], e[k]]))
        overlap = cu + ku - both if len(c) and len(k) else 0.0
        rows.append({
            "step": int(b.step), "wall_s": float(b.end_s - b.start_s),
            "compute_s": float(d[c].sum()), "copy_s": float(d[k].sum()), "stall_s": float(d[w].sum()),
            "exposed_copy_s": max(0.0, ku - overlap),
            "overlap": (overlap / ku) if ku > 0 else float("nan"),
            "bytes_moved": int(nb[k].sum()),
        })
    df = pd.DataFrame(rows, columns=STEP_COLUMNS)
    return df.astype({"step": "int64", "bytes_moved": "int64", "wall_s": "float64", "compute_s": "float64",
                      "copy_s": "float64", "stall_s": "float64", "exposed_copy_s": "float64",
                      "overlap": "float64"})



def summarize_layers(events: pd.DataFrame, plan_layers: pd.DataFrame) -> pd.DataFrame:
    """One row per planned layer: the plan's placement plus medians over steps of its intervals."""
    base = plan_layers.reindex(columns=["group", "layer", "tier", "bytes", "mapped_bytes", "streamed", "pin_rank"])
    base = base.astype({"group": "string", "layer": "int64"})
    if len(events):
        gcode, guniq = pd.factorize(events["group"].to_numpy(dtype=object))
        kind = events["kind"].to_numpy(dtype=object)
        d = events["dur_s"].to_numpy(dtype="float64")
        df = pd.DataFrame({
            "g": gcode, "layer": events["layer"].to_numpy(), "step": events["step"].to_numpy(),
            "copy_s": np.where(kind == "copy", d, 0.0), "compute_s": np.where(kind == "compute", d, 0.0),
            "stall_s": np.where(kind == "wait", d, 0.0),
            "cb": np.where(kind == "copy", events["bytes"].to_numpy(), 0),
        })
        per = df.groupby(["g", "layer", "step"], sort=False).sum()
        per["gbps"] = per["cb"] / per["copy_s"].where(per["copy_s"] > 0) / 1e9
        med = per.drop(columns="cb").groupby(level=["g", "layer"], sort=False).median().reset_index()
        med.insert(0, "group", pd.array(np.asarray(guniq, dtype=object)[med.pop("g").to_numpy()], dtype="string"))
        med = med.astype({"layer": "int64"})
    else:
        med = pd.DataFrame({"group": pd.array([], dtype="string"), "layer": np.array([], dtype="int64"),
                            "copy_s": [], "compute_s": [], "stall_s": [], "gbps": []})
    out = base.merge(med[["group", "layer", "copy_s", "compute_s", "stall_s", "gbps"]], on=["group", "layer"], how="left")
    out[["copy_s", "compute_s", "stall_s"]] = out[["copy_s", "compute_s", "stall_s"]].astype("float64").fillna(0.0)
    out["gbps"] = out["gbps"].astype("float64")
    return out.astype({"tier": "string", "bytes": "int64", "mapped_bytes": "int64", "streamed": "bool",
                       "pin_rank": "Int64"})[LAYER_COLUMNS]


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
        bounds = pd.DataFrame(bounds, columns=["step", "start_s", "end_s"]).sort_values("step")
        ev = _events_frame(events if isinstance(events, pd.DataFrame) else list(events))
        kept = bounds["step"].tolist()[warmup:]
        bounds = bounds[bounds["step"].isin(kept)].reset_index(drop=True)
        ev = ev[ev["step"].isin(kept)].sort_values(["start_s", "end_s"], kind="stable").reset_index(drop=True)
        if "run" in meta:
            ev["run"] = str(meta["run"])
        mem = pd.DataFrame(memory if memory is not None else [], columns=MEMORY_COLUMNS)
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
