"""The recorded data: :class:`Run` (frames + meta), how its summary frames are derived, save/load.

Every producer — the cuda and cpu backends, the simulator, trace import, observer mode — emits
interval events plus step boundaries and calls :meth:`Run.build`; every consumer (analysis,
figures, report) reads the frames. Column sets are the contract (``docs/frames.md``).
"""

from __future__ import annotations

import datetime as _dt
import html
import io
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from offload_lab.checks import is_int
from offload_lab.labels import SIM_SUFFIX, display_label
from offload_lab.reading import MAX_RUN_FILE_BYTES, InputFileError, open_binary
from offload_lab.record.chrome_trace import to_chrome_trace
from offload_lab.record.schema import (
    EVENT_COLUMNS,
    EVENT_DTYPES,
    KINDS,
    LAYER_COLUMNS,
    LAYER_DTYPES,
    MEMORY_COLUMNS,
    MEMORY_DTYPES,
    STEP_COLUMNS,
    STEP_DTYPES,
    STREAMS,
    TIERS,
    RunFormatError,
    check_meta,
    check_numbers,
    check_values,
    conform,
)
from offload_lab.writing import atomic_write

__all__ = ["Run", "display_label", "RunFormatError", "EVENT_COLUMNS", "LAYER_COLUMNS", "STEP_COLUMNS", "MEMORY_COLUMNS",
           "KINDS", "STREAMS", "TIERS", "FORMAT", "MAX_MEMBER_BYTES", "MAX_FRAME_ROWS", "MAX_FRAME_BYTES",
           "summarize_steps", "summarize_layers", "empty_events", "read_run_head", "read_run_frame"]

FORMAT = "offload-lab/run"
FORMAT_VERSION = 1
FRAMES = ("events", "layers", "steps", "memory")
#: the largest member a saved run may hold, uncompressed; bigger ones are refused unread
MAX_MEMBER_BYTES = 128 << 20
#: the most rows a saved frame may decode to (a 14B run holds ~10^4-10^5 events): read from the
#: parquet footer before any column is decoded, since a constant column run-length encodes
#: 3×10^8 rows in a few MB
MAX_FRAME_ROWS = 20_000_000
#: the most a saved frame may decode to: parquet's own uncompressed size, and rows × columns ×
#: 8 bytes (what the frame takes in memory), whichever is larger
MAX_FRAME_BYTES = 2 << 30


def empty_events() -> pd.DataFrame:
    """An events frame with no rows, in contract form.

    >>> list(empty_events().columns) == EVENT_COLUMNS
    True
    """
    return _events_frame([])


def _events_frame(rows: list[dict] | pd.DataFrame) -> pd.DataFrame:
    if not isinstance(rows, pd.DataFrame):
        rows = pd.DataFrame(rows, columns=EVENT_COLUMNS)
    return conform("events", rows, EVENT_DTYPES, derive_dur=True)


class _EventColumns:
    """The events' columns the summaries read, each taken from the frame once, as numpy.

    A column read costs tens of µs in pandas and the simulator builds a Run on every slider
    move; :meth:`Run.build` hands over the columns it has already read (``given``).
    """

    def __init__(self, events: pd.DataFrame, given: dict[str, np.ndarray] | None = None):
        self.frame = events
        self.n = len(events)
        self.names = set(events.columns)
        self.got: dict[Any, np.ndarray] = dict(given or {})

    def num(self, name: str, dtype: str) -> np.ndarray:
        v = self.got.get(name)
        if v is None or v.dtype != dtype:
            v = self.got[name] = self.frame[name].to_numpy(dtype=dtype) if v is None else v.astype(dtype)
        return v

    def codes(self, name: str, values: list) -> np.ndarray:
        """Each row's index in ``values`` (-1: none), in one pass over the strings."""
        key = (name, tuple(values))
        v = self.got.get(key)
        if v is None:
            arrow = self.got.get(name)
            if arrow is None:
                arrow = self.got[name] = pa.array(self.frame[name].array)
            v = self.got[key] = pc.index_in(arrow, value_set=pa.array(values)).fill_null(-1).to_numpy()
        return v


def _bounds_arrays(bounds: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (bounds["step"].to_numpy(dtype="int64"), bounds["start_s"].to_numpy(dtype="float64"),
            bounds["end_s"].to_numpy(dtype="float64"))


def summarize_steps(events: pd.DataFrame, bounds: pd.DataFrame) -> pd.DataFrame:
    """One row per step from the events and the step boundaries (``step, start_s, end_s``).

    Vectorised over steps (the simulator builds Runs of thousands of events on every slider
    move): interval unions are taken for all steps at once, by sorting on (step, start).
    """
    return _steps_summary(_EventColumns(events), *_bounds_arrays(bounds))


def _steps_summary(cols: _EventColumns, bstep: np.ndarray, bstart: np.ndarray, bend: np.ndarray) -> pd.DataFrame:
    ub, inv = np.unique(bstep, return_inverse=True)
    nu = len(ub)
    step = cols.num("step", "int64")
    pos = np.searchsorted(ub, step)
    found = pos < nu
    found[found] = ub[pos[found]] == step[found]
    kind = cols.codes("kind", list(KINDS))
    s = cols.num("start_s", "float64")
    e = cols.num("end_s", "float64")
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
    moved = np.bincount(pos[k], weights=cols.num("bytes", "int64")[k], minlength=nu).astype("int64")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ku > 0, overlap / np.where(ku > 0, ku, 1.0), np.nan)
    # forwards per step: the highest call number seen in the step, plus one (1 with no rows)
    calls = np.ones(nu, dtype="int64")
    if "call" in cols.names and cols.n:
        call = cols.num("call", "int64")
        np.maximum.at(calls, pos[found], call[found] + 1)
    # the keys in STEP_COLUMNS order: a ``columns=`` argument would double the construction's cost
    return pd.DataFrame({
        "step": bstep,
        "calls": calls[inv],
        "wall_s": bend - bstart,
        "compute_s": sums["compute_s"][inv], "copy_s": sums["copy_s"][inv], "stall_s": sums["stall_s"][inv],
        "exposed_copy_s": np.maximum(0.0, ku - overlap)[inv],
        "overlap": ratio[inv].astype("float64"),
        "bytes_moved": moved[inv],
        "rank": np.zeros(len(bstep), dtype="int64"),
    }, copy=False)


def summarize_layers(events: pd.DataFrame, plan_layers: pd.DataFrame) -> pd.DataFrame:
    """One row per planned layer: the plan's placement plus medians over steps of its intervals.

    Vectorised: per (layer, step) sums by one sort of the events, then medians per layer on
    the sorted cells (the mean of the two middle values, as pandas' median takes it).
    """
    return _layers_summary(_EventColumns(events), plan_layers)


def _planned_strings(col: pd.Series) -> Any:
    """A plan's text column as a ``string`` array, the one ``astype("string")`` gives.

    The plan holds Python strings (object dtype); on Arrow storage they are handed to Arrow
    directly, which is what the cast does at a twentieth of its overhead.
    """
    if col.dtype == "string":
        return col.array
    if col.dtype == object and pd.StringDtype().storage == "pyarrow":
        values = col.to_numpy()
        if all(type(v) is str for v in values):
            return pd.arrays.ArrowStringArray(pa.array(values, type=pa.large_string()))
    return col.astype("string").array


def _layers_summary(cols: _EventColumns, plan_layers: pd.DataFrame) -> pd.DataFrame:
    n_base = len(plan_layers)

    def planned(name: str, dtype: str) -> Any:
        """A column of the plan in its contract dtype (missing: all NA, as a reindex gives)."""
        col = plan_layers[name] if name in plan_layers.columns else pd.Series(np.nan, index=plan_layers.index)
        if dtype == "string":
            return _planned_strings(col)
        return col.array if col.dtype == dtype else col.astype(dtype).array

    base = {"group": planned("group", "string"), "layer": planned("layer", "int64")}
    vals = {name: np.zeros(n_base) for name in ("copy_s", "compute_s", "stall_s")}
    vals["gbps"] = np.full(n_base, np.nan)
    if cols.n and n_base:
        gnames = list(dict.fromkeys(base["group"].tolist()))
        gcode = cols.codes("group", gnames)
        kind = cols.codes("kind", list(KINDS))
        layer = cols.num("layer", "int64")
        span = int(max(layer.max(initial=0), base["layer"].max(), 0) + 1)
        lkey = np.where(gcode >= 0, gcode * span + layer, -1)
        step = cols.num("step", "int64")
        smin = int(step.min())
        cells, cell_of = np.unique(lkey * (int(step.max()) - smin + 1) + (step - smin), return_inverse=True)
        cell_key = cells // (int(step.max()) - smin + 1)
        d = cols.num("dur_s", "float64")
        ncell = len(cells)
        per = {}
        for name, kd in (("copy_s", "copy"), ("compute_s", "compute"), ("stall_s", "wait")):
            sel = kind == KINDS.index(kd)
            per[name] = np.bincount(cell_of[sel], weights=d[sel], minlength=ncell).astype("float64")
            if kd == "copy":  # byte sums are exact in float below 2**53
                cb = np.bincount(cell_of[sel], weights=cols.num("bytes", "int64")[sel], minlength=ncell)
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
    # the keys in LAYER_COLUMNS order: a ``columns=`` argument would double the construction's cost
    return pd.DataFrame({
        **base, "tier": planned("tier", "string"), "bytes": planned("bytes", "int64"),
        "mapped_bytes": planned("mapped_bytes", "int64"), "streamed": planned("streamed", "bool"),
        "pin_rank": planned("pin_rank", "Int64"), **vals, "rank": np.zeros(n_base, dtype="int64"),
    }, copy=False)


class Run:
    """One execution of N steps under one plan: measured (``cuda``/``cpu``) or simulated (``sim``).

    Frames: ``events``, ``layers``, ``steps``, ``memory``; plus ``meta``.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> run = offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)
    >>> run.simulated, list(run.steps.columns)[:3]
    (True, ['step', 'calls', 'wall_s'])

    Construction checks the contract (columns, dtypes, ``kind`` and ``stream`` values, meta
    as JSON data), whoever builds the frames, a file included:

    >>> Run(run.events.assign(kind="teleport"), run.layers, run.steps, run.memory, run.meta)
    Traceback (most recent call last):
    ...
    offload_lab.record.schema.RunFormatError: events column 'kind' holds 'teleport' (160 row(s)); accepted: ['copy', 'compute', 'wait', 'host_block', 'stage']
    """

    def __init__(self, events: pd.DataFrame, layers: pd.DataFrame, steps: pd.DataFrame,
                 memory: pd.DataFrame, meta: dict[str, Any]):
        self.events = _events_frame(events)
        check_values(self.events)
        self.layers = conform("layers", layers, LAYER_DTYPES)
        self.steps = conform("steps", steps, STEP_DTYPES)
        self.memory = conform("memory", memory, MEMORY_DTYPES)
        for name in FRAMES:
            check_numbers(name, getattr(self, name))
        self.meta = _normalised(check_meta(meta))
        self.meta.setdefault("simulated", self.meta.get("backend") == "sim")

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_trusted_frames(cls, events: pd.DataFrame, layers: pd.DataFrame, steps: pd.DataFrame,
                            memory: pd.DataFrame, meta: dict[str, Any]) -> Run:
        """A Run of frames this package just built in contract form, without re-typing or
        re-checking their values (the meta is still checked: it is small).

        Only package code that builds every column in its final dtype calls this (the
        simulator, through ``Run.build(..., trusted=True)``): checking and re-typing its frames
        cost more than simulating them. Frames from anywhere else go through ``Run(...)``,
        which conforms and checks them.
        """
        run = cls.__new__(cls)
        run.events, run.layers, run.steps, run.memory = events, layers, steps, memory
        run.meta = check_meta(meta)
        run.meta.setdefault("simulated", run.meta.get("backend") == "sim")
        return run

    @classmethod
    def build(cls, events: list[dict] | pd.DataFrame, bounds: list[dict] | pd.DataFrame,
              plan_layers: pd.DataFrame, memory: list[dict] | pd.DataFrame | None = None,
              meta: dict[str, Any] | None = None, warmup: int = 0, trusted: bool = False) -> Run:
        """Derive the summary frames from raw intervals.

        ``bounds`` holds one row per step (``step, start_s, end_s``). The first ``warmup`` steps
        are dropped from every frame (and ``meta['warmup_dropped']`` says so); events labelled
        with a step that never ran (prefetch that wrapped past the last step) are dropped too.

        ``trusted=True`` is for package code only (the simulator): ``events`` and ``memory``
        are already frames with exactly the contract's columns and dtypes and values within
        its rules, so they are neither re-typed nor re-checked (:meth:`from_trusted_frames`).
        """
        meta = dict(meta or {})
        if not (isinstance(bounds, pd.DataFrame) and list(bounds.columns) == ["step", "start_s", "end_s"]):
            bounds = pd.DataFrame(bounds, columns=["step", "start_s", "end_s"])
        if not bounds["step"].is_monotonic_increasing:
            bounds = bounds.sort_values("step")
        ev = events if trusted else _events_frame(events if isinstance(events, pd.DataFrame) else list(events))
        kept = bounds["step"].to_numpy()
        bstep, bstart, bend = (kept if kept.dtype == "int64" else bounds["step"].to_numpy(dtype="int64"),
                               bounds["start_s"].to_numpy(dtype="float64"), bounds["end_s"].to_numpy(dtype="float64"))
        kept = kept[warmup:]
        if warmup:
            keep = np.isin(bstep, kept)
            bstep, bstart, bend = bstep[keep], bstart[keep], bend[keep]
        # keep the steps that ran, in (start, end) order; the simulator hands its rows over
        # already sorted, so the order is checked before any row is moved
        step_all, s_all, e_all = ev["step"].to_numpy(), ev["start_s"].to_numpy(), ev["end_s"].to_numpy()
        rows = np.flatnonzero(np.isin(step_all, kept))
        s, e = s_all[rows], e_all[rows]
        tie = s[1:] == s[:-1]
        if (s[1:] < s[:-1]).any() or (e[1:][tie] < e[:-1][tie]).any():
            rows = rows[np.lexsort((e, s))]
        if len(rows) != len(ev) or (rows != np.arange(len(ev))).any():
            ev = ev.take(rows)
            step_all, s_all, e_all = step_all[rows], s_all[rows], e_all[rows]
        else:
            ev = ev.copy(deep=False)
        ev.index = pd.RangeIndex(len(ev))
        # the summaries read these columns again: handed over, not read twice
        cols = _EventColumns(ev, {"step": step_all, "start_s": s_all, "end_s": e_all})
        if "run" in meta:
            run = pa.scalar(str(meta["run"]), type=pa.large_string())
            if not pc.all(pc.equal(pa.array(ev["run"].array), run), skip_nulls=False).as_py():
                ev["run"] = pd.arrays.ArrowStringArray(pa.repeat(run, len(ev)))
        if not (isinstance(memory, pd.DataFrame) and list(memory.columns) == MEMORY_COLUMNS):
            memory = pd.DataFrame(memory if memory is not None else [], columns=MEMORY_COLUMNS)
        mem = memory
        meta["warmup_dropped"] = int(warmup)
        meta.setdefault("created", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        meta["steps_measured"] = len(bstep)
        layers, steps = _layers_summary(cols, plan_layers), _steps_summary(cols, bstep, bstart, bend)
        rank = meta.get("rank")
        if is_int(rank) and rank > 0:
            # one rank's own run of a torch.distributed job: its rows carry its rank
            ev, layers, steps = ev.assign(rank=rank), layers.assign(rank=rank), steps.assign(rank=rank)
            mem = pd.DataFrame(mem, columns=MEMORY_COLUMNS).assign(rank=rank)
        if trusted:
            return cls.from_trusted_frames(ev, layers, steps, mem, meta)
        return cls(ev, layers, steps, mem, meta)

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
        """A one-table summary for notebooks; every string from the run is escaped."""
        st = self.step_time
        moved = float(self.steps["bytes_moved"].median()) if len(self.steps) else float("nan")
        overlap = float(self.steps["overlap"].median()) if len(self.steps) else float("nan")
        rows = [
            ("run", self.label),
            ("kind", "simulated" if self.simulated else "measured"),
            ("backend", self.backend),
            ("model", str(self.meta.get("model", ""))),
            ("device", str(self.meta.get("device_name") or "")),
            ("steps", str(len(self.steps))),
            ("step time", "—" if math.isnan(st) else f"{st * 1e3:.4g} ms"),
            ("bytes moved / step", "—" if math.isnan(moved) else f"{moved / 2**20:.4g} MiB"),
            ("copy overlapped", "—" if math.isnan(overlap) else f"{overlap:.0%}"),
        ]
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                       for k, v in rows)
        return f"<table class='offload-lab-run'>{body}</table>"

    # -- save / load -------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write one zip file of parquet frames and ``meta.json`` (data, never pickle).

        ``.zip`` is appended when ``path`` lacks it (``load`` finds it again from the same
        ``path``); the written path is returned. A failed save leaves nothing behind. The
        target must be a regular file or a new path (:mod:`offload_lab.writing`): a device,
        FIFO, socket or directory raises :class:`~offload_lab.writing.OutputError`.

        >>> import tempfile, offload_lab
        >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
        >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
        >>> run = offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=1)
        >>> where = Path(tempfile.mkdtemp()) / "sim"
        >>> run.save(where).name, Run.load(where).equals(run)
        ('sim.zip', True)
        """
        try:
            return atomic_write(path, self._write, suffix=".zip", what="run path", example="run.zip")
        except OSError as e:
            raise OSError(f"cannot write run {str(_zip_path(Path(path)))!r}: {e.strerror or e}") from None

    def _write(self, tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("meta.json", json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "meta": self.meta},
                                               indent=1))
            for name in FRAMES:
                buf = io.BytesIO()
                getattr(self, name).to_parquet(buf, engine="pyarrow", index=False)
                z.writestr(f"{name}.parquet", buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Run:
        """Read a run written by :meth:`save` (``path`` with or without its ``.zip``).

        Anything that is not such a run raises :class:`RunFormatError` naming the file and what
        is wrong with it: a path that is no regular file (a FIFO, a device, a directory) or is
        over 2 GiB, members over :data:`MAX_MEMBER_BYTES`, frames whose parquet footer says
        they decode past :data:`MAX_FRAME_ROWS` rows or :data:`MAX_FRAME_BYTES` (all refused
        without being read), and frames whose values break the contract (see
        :func:`~offload_lab.record.schema.check_numbers`).
        """
        path = Path(path)
        if not path.exists() and _zip_path(path).is_file():
            path = _zip_path(path)
        where = str(path)
        try:
            fh = open_binary(path, "saved run", MAX_RUN_FILE_BYTES,
                             accepted=f"a run .zip written by Run.save, of at most {MAX_RUN_FILE_BYTES >> 30} GiB")
        except InputFileError as e:
            raise RunFormatError(str(e)) from None
        try:
            with fh, zipfile.ZipFile(fh) as z:
                missing = sorted({"meta.json", *(f"{n}.parquet" for n in FRAMES)} - set(z.namelist()))
                if missing:
                    raise RunFormatError(f"{where!r} is not an offload-lab run: missing {missing}")
                head = read_run_head(z, where)
                frames = {n: read_run_frame(z, n, where) for n in FRAMES}
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as e:
            raise RunFormatError(f"cannot read run {where!r}: {e}") from None
        try:
            return cls(**frames, meta=head["meta"])
        except RunFormatError as e:
            raise RunFormatError(f"{where!r} is not a valid offload-lab run: {e}") from None

    def equals(self, other: Run) -> bool:
        """Frames and meta equal (dtypes included)."""
        return self.meta == other.meta and all(
            getattr(self, n).equals(getattr(other, n)) for n in ("events", "layers", "steps", "memory")
        )

    def to_chrome_trace(self, path: str | os.PathLike | None = None) -> dict:
        """The run as Chrome trace-event JSON for Perfetto (see :mod:`offload_lab.record.chrome_trace`)."""
        return to_chrome_trace(self, path)


def _normalised(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with "simulated" said once, in ``meta["simulated"]``.

    Runs saved before that carried a ``" (simulated)"`` suffix in ``label`` and ``device_name``
    as well; it is taken off here, so old files show the same as new ones (views add it back
    through :func:`display_label`).
    """
    meta.setdefault("simulated", meta.get("backend") == "sim")
    if meta["simulated"]:
        for key in ("label", "device_name"):
            v = meta.get(key)
            if isinstance(v, str) and v.endswith(SIM_SUFFIX) and len(v) > len(SIM_SUFFIX):
                meta[key] = v[: -len(SIM_SUFFIX)]
    return meta




def _zip_path(path: Path) -> Path:
    return path if path.suffix == ".zip" else path.with_name(path.name + ".zip")


def _member(z: zipfile.ZipFile, name: str, where: str) -> bytes:
    """A member's bytes, read no further than :data:`MAX_MEMBER_BYTES` whatever its header claims."""
    try:
        info = z.getinfo(name)
    except KeyError:
        raise RunFormatError(f"{where!r} is not an offload-lab run: it has no {name!r}") from None
    limit = MAX_MEMBER_BYTES
    if info.file_size > limit:
        raise RunFormatError(f"{where!r}: member {name!r} is {info.file_size} bytes; a run member may hold "
                             f"at most {limit} bytes ({limit >> 20} MiB)")
    with z.open(info) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise RunFormatError(f"{where!r}: member {name!r} holds more than {limit} bytes ({limit >> 20} MiB), "
                             f"the most a run member may hold")
    return data


def read_run_head(z: zipfile.ZipFile, where: str) -> dict:
    raw = _member(z, "meta.json", where)
    try:
        head = json.loads(raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise RunFormatError(f"{where!r}: meta.json is not JSON ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(head, dict):
        raise RunFormatError(f"{where!r}: meta.json holds a {type(head).__name__}; expected an object with "
                             f"'format', 'version' and 'meta'")
    if head.get("format") != FORMAT:
        raise RunFormatError(f"{where!r} is not an offload-lab run (format {head.get('format')!r:.60}, "
                             f"expected {FORMAT!r})")
    version = head.get("version")
    if not is_int(version) or not 1 <= version <= FORMAT_VERSION:
        raise RunFormatError(f"{where!r}: run format version {version!r:.30} is not one this offload-lab "
                             f"reads (1 to {FORMAT_VERSION})")
    if "meta" not in head:
        raise RunFormatError(f"{where!r}: meta.json has no 'meta' entry")
    return head


def _check_decoded_size(raw: bytes, name: str, where: str) -> None:
    """Refuse a parquet member that decodes past :data:`MAX_FRAME_ROWS` rows or
    :data:`MAX_FRAME_BYTES`, before its frame is decoded.

    Run-length and dictionary encoding let a few MB hold 3×10^8 rows, or one long string
    repeated a million times, so the compressed size says nothing: the footer's row count,
    schema and sizes are checked first, then the text columns are read with their
    dictionaries kept (small) one row group at a time, to add up what they would decode to.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    member = f"{where!r}: member {name}.parquet"
    pf = pq.ParquetFile(io.BytesIO(raw))
    md = pf.metadata
    groups = [md.row_group(i) for i in range(md.num_row_groups)]
    rows = max(md.num_rows, sum(g.num_rows for g in groups))
    if rows > MAX_FRAME_ROWS:
        raise RunFormatError(f"{member} holds {rows:,} rows; a saved frame may hold at most "
                             f"{MAX_FRAME_ROWS:,} (refused before decoding)")
    schema = pf.schema_arrow
    nested = [f.name for f in schema if pa.types.is_nested(f.type)]
    if nested:  # a list column holds any number of values per row: the row count bounds nothing
        raise RunFormatError(f"{member} has nested column(s) {nested[:5]}; a run frame holds flat columns "
                             f"(numbers, booleans, text)")
    values = max((g.column(j).num_values for g in groups for j in range(g.num_columns)), default=0)
    stored = sum(g.total_byte_size for g in groups)
    estimate = max(stored, rows * max(md.num_columns, 1) * 8, values * 8)
    if estimate > MAX_FRAME_BYTES:
        raise RunFormatError(f"{member} decodes to {estimate:,} bytes ({rows:,} rows × {md.num_columns} "
                             f"columns); a saved frame may decode to at most {MAX_FRAME_BYTES:,} bytes "
                             f"({MAX_FRAME_BYTES >> 30} GiB)")
    def is_text(t: pa.DataType) -> bool:
        if pa.types.is_dictionary(t):
            return is_text(t.value_type)
        return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t)

    text = [f.name for f in schema if is_text(f.type)]
    if not text:
        return
    pf = pq.ParquetFile(io.BytesIO(raw), read_dictionary=text)
    total = rows * max(md.num_columns, 1) * 8
    for i in range(md.num_row_groups):
        for col in pf.read_row_group(i, columns=text).columns:
            for chunk in col.chunks:
                if pa.types.is_dictionary(chunk.type):
                    lengths = pc.binary_length(chunk.dictionary).cast(pa.int64())
                    total += (pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0) + chunk.nbytes
                else:
                    total += chunk.nbytes
        if total > MAX_FRAME_BYTES:
            raise RunFormatError(f"{member}: its text columns decode to more than {MAX_FRAME_BYTES:,} bytes "
                                 f"({MAX_FRAME_BYTES >> 30} GiB), the most a saved frame may decode to")


def read_run_frame(z: zipfile.ZipFile, name: str, where: str) -> pd.DataFrame:
    raw = _member(z, f"{name}.parquet", where)
    try:
        _check_decoded_size(raw, name, where)
        return pd.read_parquet(io.BytesIO(raw), engine="pyarrow")
    except RunFormatError:
        raise
    except Exception as e:  # pyarrow raises many types (ArrowInvalid, ArrowTypeError, OSError, ...)
        raise RunFormatError(f"{where!r}: {name}.parquet is not a readable parquet table "
                             f"({type(e).__name__}: {str(e)[:80]})") from None
