"""The frames contract: the columns, dtypes and values every :class:`~offload_lab.record.run.Run` holds.

The checks here are what :class:`Run` applies to every frame and its meta, whether a producer
just built them or they were read from a file: a run that breaks the contract is refused with
one line naming the frame, the column and what is accepted, never accepted to fail later.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from offload_lab import vocabulary
from offload_lab.errors import OffloadLabError

EVENT_COLUMNS = ["run", "step", "call", "group", "layer", "kind", "stream", "tier", "bytes", "start_s",
                 "end_s", "dur_s", "rank"]
LAYER_COLUMNS = ["group", "layer", "tier", "bytes", "mapped_bytes", "streamed", "pin_rank",
                 "copy_s", "compute_s", "stall_s", "gbps", "rank"]
STEP_COLUMNS = ["step", "calls", "wall_s", "compute_s", "copy_s", "stall_s", "exposed_copy_s", "overlap",
                "bytes_moved", "rank"]
MEMORY_COLUMNS = ["t_s", "device_bytes", "pinned_bytes", "anon_bytes", "mapped_bytes", "rank"]

#: the values of the events' ``kind`` and ``stream`` columns and of the ``tier`` columns
#: (:mod:`offload_lab.vocabulary`; ``stage`` is a host memcpy into a pinned staging buffer)
KINDS = vocabulary.EVENT_KINDS
STREAMS = vocabulary.STREAMS
TIERS = vocabulary.OBSERVED_TIERS

EVENT_DTYPES = {
    "run": "string", "step": "int64", "call": "int64", "group": "string", "layer": "int64", "kind": "string",
    "stream": "string", "tier": "string", "bytes": "int64",
    "start_s": "float64", "end_s": "float64", "dur_s": "float64", "rank": "int64",
}
LAYER_DTYPES = {
    "group": "string", "layer": "int64", "tier": "string", "bytes": "int64", "mapped_bytes": "int64",
    "streamed": "bool", "pin_rank": "Int64", "copy_s": "float64", "compute_s": "float64",
    "stall_s": "float64", "gbps": "float64", "rank": "int64",
}
STEP_DTYPES = {
    "step": "int64", "calls": "int64", "wall_s": "float64", "compute_s": "float64", "copy_s": "float64",
    "stall_s": "float64", "exposed_copy_s": "float64", "overlap": "float64", "bytes_moved": "int64",
    "rank": "int64",
}
MEMORY_DTYPES = {"t_s": "float64", "device_bytes": "int64", "pinned_bytes": "int64",
                 "anon_bytes": "int64", "mapped_bytes": "int64", "rank": "int64"}
#: columns a producer (or an older saved run) may leave out, and the value they then hold:
#: ``call`` numbers the forwards of a module within a step (0, 1, … under classifier-free
#: guidance), ``calls`` counts them; runs saved before calls were recorded made one per step.
#: ``rank`` is the ``torch.distributed`` rank that recorded a row: 0 in a single-process run
#: (and in runs saved before ranks were recorded); a gathered multi-rank run holds them all
DEFAULTS = {"events": {"run": None, "call": 0, "rank": 0}, "steps": {"calls": 1, "rank": 0},
            "layers": {"rank": 0}, "memory": {"rank": 0}}

#: meta entries every view reads, and the JSON types they may have (None: may be null)
META_TYPES: dict[str, tuple] = {
    "run": (str,), "label": (str, type(None)), "backend": (str,), "simulated": (bool,),
    "model": (str, type(None)), "device_name": (str, type(None)), "created": (str,),
    "warmup_dropped": (int,), "steps_measured": (int,), "prefetch": (int,),
    "plan": (dict,), "host": (dict,),
}
#: how deep meta may nest (a run's own meta is a few levels deep)
MAX_META_DEPTH = 32
#: step, call, layer and rank numbers are below this (a real run has tens of steps and layers)
MAX_INDEX = 10**9
#: byte counts are below this (8 PiB): sums of them in float64 stay exact
MAX_BYTES = 2**53
#: ``layer`` of rows outside every layer (trace import): the one negative layer number
NO_LAYER = -1
#: how far a share (``overlap``) may stray outside [0, 1] by rounding
_SHARE_SLACK = 1e-6
#: how far an event's stored ``dur_s`` may differ from ``end_s - start_s`` (rounding), seconds
_DUR_SLACK = 1e-6

#: per frame, the value rules of its numeric columns: ``(column, rule)``; rules:
#: ``time`` finite and ≥ 0, ``duration`` the same, ``index`` an integer in [0, MAX_INDEX),
#: ``layer`` the same or NO_LAYER, ``bytes`` in [0, MAX_BYTES), ``wall`` finite and > 0,
#: ``share`` NaN (no copies) or in [0, 1], ``rate`` NaN (never copied) or finite and ≥ 0,
#: ``rank_opt`` <NA> or an index
VALUE_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "events": (("step", "index"), ("call", "index"), ("layer", "layer"), ("bytes", "bytes"),
               ("start_s", "time"), ("end_s", "time"), ("dur_s", "duration"), ("rank", "index")),
    "layers": (("layer", "layer"), ("bytes", "bytes"), ("mapped_bytes", "bytes"), ("pin_rank", "rank_opt"),
               ("copy_s", "duration"), ("compute_s", "duration"), ("stall_s", "duration"), ("gbps", "rate"),
               ("rank", "index")),
    "steps": (("step", "index"), ("calls", "index"), ("wall_s", "wall"), ("compute_s", "duration"),
              ("copy_s", "duration"), ("stall_s", "duration"), ("exposed_copy_s", "duration"),
              ("overlap", "share"), ("bytes_moved", "bytes"), ("rank", "index")),
    "memory": (("t_s", "time"), ("device_bytes", "bytes"), ("pinned_bytes", "bytes"),
               ("anon_bytes", "bytes"), ("mapped_bytes", "bytes"), ("rank", "index")),
}
_RULE_TEXT = {
    "time": "finite seconds ≥ 0", "duration": "finite seconds ≥ 0",
    "index": f"integers from 0 to {MAX_INDEX - 1}", "layer": f"integers from 0 to {MAX_INDEX - 1}, or {NO_LAYER} "
    f"for rows outside every layer", "bytes": "integers from 0 to 2**53 - 1",
    "wall": "finite seconds > 0", "share": "a share from 0 to 1, or NaN (no copies)",
    "rate": "finite GB/s ≥ 0, or NaN (never copied)", "rank_opt": f"<NA> or integers from 0 to {MAX_INDEX - 1}",
}


class RunFormatError(OffloadLabError, ValueError):
    """A file that is not a saved offload-lab run, or frames that break the contract."""


def _dtype_name(t: Any) -> str:
    return {"string": "text", "int64": "integers", "Int64": "integers or <NA>", "float64": "numbers",
            "bool": "booleans"}.get(t, t)


def conform(name: str, df: Any, dtypes: dict[str, str], derive_dur: bool = False) -> pd.DataFrame:
    """``df`` with exactly the contract's columns and dtypes, or :class:`RunFormatError`.

    >>> conform("memory", pd.DataFrame({"t_s": [0.5], "device_bytes": [1], "pinned_bytes": [0],
    ...         "anon_bytes": [2], "mapped_bytes": [0]}), MEMORY_DTYPES).dtypes.tolist()[:2]
    [dtype('float64'), dtype('int64')]
    """
    if not isinstance(df, pd.DataFrame):
        raise RunFormatError(f"{name} frame is a {type(df).__name__}; expected a pandas DataFrame")
    defaults = DEFAULTS.get(name, {})
    need = [c for c in dtypes if not (derive_dur and c == "dur_s") and c not in defaults]
    missing = [c for c in need if c not in df.columns]
    if missing and len(df):
        raise RunFormatError(f"{name} frame lacks column(s) {missing}; required: {list(dtypes)}")
    if list(df.columns) == list(dtypes) and all(str(df[c].dtype) == t for c, t in dtypes.items()):
        out = df
    else:
        out = df.reindex(columns=list(dtypes))
        for col, value in defaults.items():
            if value is not None:
                # absent, or left empty by a producer that builds rows as dicts
                out[col] = value if col not in df.columns else out[col].fillna(value)
        if derive_dur:
            out["dur_s"] = out["end_s"] - out["start_s"]
        for col, t in dtypes.items():
            try:
                out[col] = out[col].astype(t)
            except (ValueError, TypeError, OverflowError) as e:
                raise RunFormatError(f"{name} column {col!r} cannot hold {_dtype_name(t)} "
                                     f"({type(e).__name__}: {str(e)[:80]})") from None
    return out.reset_index(drop=True) if not isinstance(out.index, pd.RangeIndex) else out


def check_values(events: pd.DataFrame) -> None:
    """Refuse events whose ``kind`` or ``stream`` is not one of the contract's values."""
    for col, ok in (("kind", KINDS), ("stream", STREAMS)):
        vals = events[col]
        bad = vals[~vals.isin(ok)]
        if len(bad):
            raise RunFormatError(f"events column {col!r} holds {str(bad.iloc[0])!r} "
                                 f"({len(bad)} row(s)); accepted: {list(ok)}")


def _bad_rows(v: np.ndarray, rule: str) -> np.ndarray:
    """Mask of the values of ``v`` (float64, NaN for <NA>) that break ``rule``."""
    with np.errstate(invalid="ignore"):
        if rule in ("time", "duration"):
            return ~(np.isfinite(v) & (v >= 0))
        if rule == "wall":
            return ~(np.isfinite(v) & (v > 0))
        if rule == "share":
            return ~np.isnan(v) & ~((v >= -_SHARE_SLACK) & (v <= 1 + _SHARE_SLACK))
        if rule == "rate":
            return ~np.isnan(v) & ~(np.isfinite(v) & (v >= 0))
        if rule == "bytes":
            return ~((v >= 0) & (v < MAX_BYTES))
        lo = NO_LAYER if rule == "layer" else 0
        ok = (v >= lo) & (v < MAX_INDEX)
        return ~(ok | np.isnan(v)) if rule == "rank_opt" else ~ok


def check_numbers(name: str, df: pd.DataFrame) -> None:
    """Refuse a conformed frame whose numbers cannot be what their column says.

    Times and durations are finite and ≥ 0, a step's ``wall_s`` > 0, byte counts in
    [0, 2**53), step, call, layer and rank numbers in [0, 10**9) (``layer`` may be -1: rows
    outside every layer), ``overlap`` in [0, 1] or NaN, ``gbps`` ≥ 0 or NaN; an event ends no
    earlier than it starts. The message names the frame, the column and the first bad value.

    >>> check_numbers("steps", pd.DataFrame({"wall_s": [0.5, float("nan")]}))
    Traceback (most recent call last):
    ...
    offload_lab.record.schema.RunFormatError: steps column 'wall_s' holds nan (1 row(s), first at row 1); accepted: finite seconds > 0
    """
    if name == "events" and len(df):
        start, end, dur = (df[c].to_numpy(dtype="float64") for c in ("start_s", "end_s", "dur_s"))
        _relation(end < start, "ends before it starts", start, end, dur)
    for col, rule in VALUE_RULES.get(name, ()):
        if col not in df.columns or not len(df):
            continue
        s = df[col]
        v = s.to_numpy(dtype="float64", na_value=np.nan) if s.dtype != "float64" else s.to_numpy()
        bad = _bad_rows(v, rule)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise RunFormatError(f"{name} column {col!r} holds {_show(s.iloc[first])} ({int(bad.sum())} row(s), "
                                 f"first at row {first}); accepted: {_RULE_TEXT[rule]}")
    if name == "events" and len(df):
        _relation(np.abs(dur - (end - start)) > _DUR_SLACK, "has a dur_s other than end_s - start_s", start, end, dur)


def _relation(bad: np.ndarray, why: str, start: np.ndarray, end: np.ndarray, dur: np.ndarray) -> None:
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise RunFormatError(f"events row {i} {why} (start_s {_show(start[i])}, end_s {_show(end[i])}, "
                             f"dur_s {_show(dur[i])}; {int(bad.sum())} row(s)); accepted: "
                             f"start_s ≤ end_s, dur_s = end_s - start_s")


def _show(x: Any) -> str:
    """A value as the message shows it: ``nan``, ``-inf``, ``1e+18``, ``-5``."""
    if x is pd.NA or x is None:
        return "<NA>"
    if isinstance(x, (bool, np.bool_)):
        return repr(bool(x))
    if isinstance(x, (int, np.integer)):
        return repr(int(x))
    if isinstance(x, (float, np.floating)):
        return repr(float(x))
    return repr(x)


def plain_meta(obj: Any, depth: int = 0) -> Any:
    """Meta as plain JSON data: numpy scalars, paths and tuples converted, anything else refused.

    >>> plain_meta({"n": np.int64(3), "p": Path("a"), "t": (1, 2.5)})
    {'n': 3, 'p': 'a', 't': [1, 2.5]}
    """
    if depth > MAX_META_DEPTH:
        raise RunFormatError(f"run meta nests deeper than {MAX_META_DEPTH} levels")
    if isinstance(obj, dict):
        return {str(k): plain_meta(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_meta(v, depth + 1) for v in obj]
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise RunFormatError(f"run meta value {obj!r:.60} of type {type(obj).__name__} is not JSON data "
                         f"(accepted: dicts, lists, strings, numbers, booleans, null)")


def check_meta(meta: Any) -> dict[str, Any]:
    """``meta`` as a dict of JSON data whose well-known entries have their expected types."""
    if not isinstance(meta, dict):
        raise RunFormatError(f"run meta is a {type(meta).__name__}; expected a dict of JSON data")
    out = plain_meta(meta)
    for key, types in META_TYPES.items():
        v = out.get(key)
        if key in out and not (isinstance(v, types) and not (bool not in types and isinstance(v, bool))):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise RunFormatError(f"run meta {key!r} is {v!r:.60} ({type(v).__name__}); expected {names}")
        if isinstance(v, float) and not math.isfinite(v):
            raise RunFormatError(f"run meta {key!r} is {v!r}; expected a finite number")
    return out
