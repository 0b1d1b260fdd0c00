"""What the engine records: event rows and memory changes as columns of numbers, then frames.

The engine appends a handful of numbers per event (step, layer id, kind code, start, end) to
plain lists; the frame's string columns are built once from small dictionaries. Building the
frame from Python tuples cost as much as the simulation itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from offload_lab.simulation.layers import Layer
from offload_lab.vocabulary import EVENT_KINDS

#: kind codes, as the engine appends them, and the stream each kind runs on
COPY, COMPUTE, WAIT, HOST_BLOCK, STAGE = 0, 1, 2, 3, 4
_KINDS = EVENT_KINDS
_STREAMS = ("copy", "compute", "compute", "host", "host_copy")
_MOVES_BYTES = np.array([True, False, False, True, True])


def _strings(values: list[str], codes: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """``values[codes]`` as a pandas ``string`` array of the storage ``astype("string")`` gives
    (pandas 3: Arrow, taken there with no Python string per row; pandas 2: Python objects), so
    the frame is what a saved run reads back as, without being re-typed."""
    if pd.StringDtype().storage == "pyarrow":
        return pd.arrays.ArrowStringArray(pa.array(values, type=pa.large_string()).take(pa.array(codes)))
    return pd.arrays.StringArray(np.asarray(values, dtype=object)[codes])


class Events:
    """Event rows and memory deltas of one simulation, appended in host order."""

    def __init__(self, layers: list[Layer]):
        self.layers = layers
        # flat: step, layer id, kind code, start, end for each row; one ``extend`` per row is
        # the cheapest append Python has (the async engine extends it inline)
        self.rows: list[float] = []
        self.mem: list[float] = []  # flat: time, bytes added to the device (negative: freed)

    def add(self, step: int, lay: Layer, kind: int, start: float, end: float) -> None:
        self.rows.extend((step, lay.lid, kind, start, end))

    def frame(self, steps: int, run: str = "", passes: int = 1) -> pd.DataFrame:
        """The events frame in contract form (every column in its final dtype), sorted by (start, end) as :meth:`Run.build` keeps it.

        Rows carry the forward they serve (step × ``passes`` + pass); the frame splits it into
        ``step`` and ``call`` (the pass within the step, as the runtime numbers its calls).

        Copies labelled with a step that never ran (prefetch wrapping past the last step) are
        left out here, as :meth:`Run.build` would, before any string is made.
        """
        rows = np.array(self.rows, dtype="float64").reshape(-1, 5)
        use = rows[:, 0].astype("int64")
        step, call = use // passes, use % passes
        ran = np.flatnonzero(step < steps)
        s_all, e_all = rows[:, 3], rows[:, 4]
        o = ran[_time_order(s_all[ran], e_all[ran])]
        s, e = s_all[o], e_all[o]
        lid = rows[o, 1].astype("int64")
        kind = rows[o, 2].astype("int64")
        lays = self.layers
        groups = list(dict.fromkeys(lay.group for lay in lays))
        tiers = list(dict.fromkeys(lay.tier for lay in lays))
        g_of = np.array([groups.index(lay.group) for lay in lays], dtype="int64")
        t_of = np.array([tiers.index(lay.tier) for lay in lays], dtype="int64")
        index_of = np.array([lay.index for lay in lays], dtype="int64")
        bytes_of = np.array([lay.nbytes for lay in lays], dtype="int64")
        n = len(s)
        return pd.DataFrame({
            "run": _strings([run], np.zeros(n, dtype="int64")),
            "step": step[o],
            "call": call[o],
            "group": _strings(groups, g_of[lid]),
            "layer": index_of[lid],
            "kind": _strings(list(_KINDS), kind),
            "stream": _strings(list(_STREAMS), kind),
            "tier": _strings(tiers, t_of[lid]),
            "bytes": np.where(_MOVES_BYTES[kind], bytes_of[lid], 0),
            "start_s": s, "end_s": e, "dur_s": e - s,
            "rank": np.zeros(n, dtype="int64"),
        }, copy=False)

    def memory(self, spec: Any) -> pd.DataFrame:
        """Device bytes over time: non-layer tensors and resident layers, plus streamed layers in flight."""
        lays = self.layers
        base = int(spec.non_layer_bytes) + sum(v.nbytes for v in lays if v.tier == "resident")
        pinned = sum(v.nbytes for v in lays if v.tier == "pinned")
        mapped = sum(v.mapped_bytes for v in lays if v.tier == "mapped")
        anon = sum(v.nbytes for v in lays if v.tier in ("pageable", "staged")) + \
            sum(v.nbytes - v.mapped_bytes for v in lays if v.tier == "mapped")
        flat = np.array(self.mem, dtype="float64").reshape(-1, 2)
        t = np.concatenate([[0.0], flat[:, 0]])
        # byte counts pass through float64 here: exact for any layer below 2**53 bytes
        d = np.concatenate([[base], flat[:, 1].astype("int64")])
        order = np.argsort(t, kind="stable")
        n = len(t)
        return pd.DataFrame({
            "t_s": t[order], "device_bytes": np.cumsum(d[order]),
            "pinned_bytes": np.full(n, pinned, dtype="int64"), "anon_bytes": np.full(n, anon, dtype="int64"),
            "mapped_bytes": np.full(n, mapped, dtype="int64"), "rank": np.zeros(n, dtype="int64"),
        }, copy=False)


def _time_order(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The stable order by (start, end): ``np.lexsort((e, s))``, cheaper on the engine's rows.

    Each actor's rows start in order, so a stable sort on the start alone merges a few sorted
    runs; only rows that start together need the end to break the tie.
    """
    o = np.argsort(s, kind="stable")
    ss, es = s[o], e[o]
    tie = ss[1:] == ss[:-1]
    if tie.any() and (es[1:][tie] < es[:-1][tie]).any():
        return np.lexsort((e, s))
    return o
