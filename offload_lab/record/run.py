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

from offload_lab.record.intervals import union_length as _union
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
    check_values,
    conform,
)

__all__ = ["Run", "RunFormatError", "EVENT_COLUMNS", "LAYER_COLUMNS", "STEP_COLUMNS", "MEMORY_COLUMNS",
           "KINDS", "STREAMS", "TIERS", "FORMAT", "MAX_MEMBER_BYTES", "summarize_steps", "summarize_layers",
           "empty_events"]

FORMAT = "offload-lab/run"
FORMAT_VERSION = 1
FRAMES = ("events", "layers", "steps", "memory")
#: the largest member a saved run may hold, uncompressed; bigger ones are refused unread
MAX_MEMBER_BYTES = 128 << 20


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


class Run:
    """One execution of N steps under one plan: measured (``cuda``/``cpu``) or simulated (``sim``).

    Frames: ``events``, ``layers``, ``steps``, ``memory``; plus ``meta``.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> run = offload_lab.simulate(spec, plan, offload_lab.DeviceProfile.load("h200"), steps=2)
    >>> run.simulated, list(run.steps.columns)[:3]
    (True, ['step', 'wall_s', 'compute_s'])

    Construction checks the contract (columns, dtypes, ``kind`` and ``stream`` values, meta
    as JSON data), whoever builds the frames, a file included:

    >>> Run(run.events.assign(kind="teleport"), run.layers, run.steps, run.memory, run.meta)
    Traceback (most recent call last):
    ...
    offload_lab.record.schema.RunFormatError: events column 'kind' holds 'teleport' (160 row(s)); accepted: ['copy', 'compute', 'wait', 'host_block']
    """

    def __init__(self, events: pd.DataFrame, layers: pd.DataFrame, steps: pd.DataFrame,
                 memory: pd.DataFrame, meta: dict[str, Any]):
        self.events = _events_frame(events)
        check_values(self.events)
        self.layers = conform("layers", layers, LAYER_DTYPES)
        self.steps = conform("steps", steps, STEP_DTYPES)
        self.memory = conform("memory", memory, MEMORY_DTYPES)
        self.meta = check_meta(meta)
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
        ``path``); the written path is returned. A failed save leaves nothing behind.

        >>> import tempfile, offload_lab
        >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
        >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
        >>> run = offload_lab.simulate(spec, plan, offload_lab.DeviceProfile.load("h200"), steps=1)
        >>> where = Path(tempfile.mkdtemp()) / "sim"
        >>> run.save(where).name, Run.load(where).equals(run)
        ('sim.zip', True)
        """
        path = _zip_path(Path(path))
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._write(tmp)
            os.replace(tmp, path)
        except OSError as e:
            raise OSError(f"cannot write run {str(path)!r}: {e.strerror or e}") from None
        finally:
            tmp.unlink(missing_ok=True)
        return path

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
        is wrong with it; members over :data:`MAX_MEMBER_BYTES` are refused without being read.
        """
        path = Path(path)
        if not path.exists() and _zip_path(path).is_file():
            path = _zip_path(path)
        where = str(path)
        try:
            with zipfile.ZipFile(path) as z:
                missing = sorted({"meta.json", *(f"{n}.parquet" for n in FRAMES)} - set(z.namelist()))
                if missing:
                    raise RunFormatError(f"{where!r} is not an offload-lab run: missing {missing}")
                head = _read_head(z, where)
                frames = {n: _read_frame(z, n, where) for n in FRAMES}
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
        from offload_lab.record.chrome_trace import to_chrome_trace

        return to_chrome_trace(self, path)


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


def _read_head(z: zipfile.ZipFile, where: str) -> dict:
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
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise RunFormatError(f"{where!r}: run format version {version!r:.30} is not one this offload-lab "
                             f"reads (1 to {FORMAT_VERSION})")
    if "meta" not in head:
        raise RunFormatError(f"{where!r}: meta.json has no 'meta' entry")
    return head


def _read_frame(z: zipfile.ZipFile, name: str, where: str) -> pd.DataFrame:
    raw = _member(z, f"{name}.parquet", where)
    try:
        return pd.read_parquet(io.BytesIO(raw), engine="pyarrow")
    except Exception as e:  # pyarrow raises many types (ArrowInvalid, ArrowTypeError, OSError, ...)
        raise RunFormatError(f"{where!r}: {name}.parquet is not a readable parquet table "
                             f"({type(e).__name__}: {str(e)[:80]})") from None
