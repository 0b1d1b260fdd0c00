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

EVENT_COLUMNS = ["run", "step", "call", "group", "layer", "kind", "stream", "tier", "bytes", "start_s",
                 "end_s", "dur_s", "rank"]
LAYER_COLUMNS = ["group", "layer", "tier", "bytes", "mapped_bytes", "streamed", "pin_rank",
                 "copy_s", "compute_s", "stall_s", "gbps", "rank"]
STEP_COLUMNS = ["step", "calls", "wall_s", "compute_s", "copy_s", "stall_s", "exposed_copy_s", "overlap",
                "bytes_moved", "rank"]
MEMORY_COLUMNS = ["t_s", "device_bytes", "pinned_bytes", "anon_bytes", "mapped_bytes", "rank"]

#: ``stage``: a host memcpy of a layer into a pinned staging buffer (on the ``host_copy`` stream)
KINDS = ("copy", "compute", "wait", "host_block", "stage")
STREAMS = ("copy", "compute", "host", "host_copy")
TIERS = ("resident", "pinned", "pageable", "mapped", "staged", "unknown")

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


class RunFormatError(ValueError):
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
