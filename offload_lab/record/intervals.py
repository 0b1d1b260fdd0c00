"""Interval maths on half-open intervals ``[start, end)`` given as numpy arrays.

One home for the union arithmetic that step summaries, trace import and the simulator's
calibration all need. Every function is vectorised: sorting plus cumulative sums, no Python
loop over intervals.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["merge", "union_length", "overlap_with_union", "busy_within"]


def _arrays(starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(starts, dtype="float64").reshape(-1)
    e = np.asarray(ends, dtype="float64").reshape(-1)
    if s.shape != e.shape:
        raise ValueError(f"starts ({len(s)}) and ends ({len(e)}) must have the same length")
    keep = e > s  # empty or reversed intervals cover nothing
    return s[keep], e[keep]


def merge(starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint ``(starts, ends)``; touching intervals join.

    >>> s, e = merge([0.0, 1.0, 5.0], [2.0, 3.0, 6.0])
    >>> s.tolist(), e.tolist()
    ([0.0, 5.0], [3.0, 6.0])
    """
    s, e = _arrays(starts, ends)
    if not len(s):
        return s, e
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    reach = np.maximum.accumulate(e)
    brk = np.empty(len(s), dtype=bool)
    brk[0] = True
    brk[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(brk)
    return s[idx], np.maximum.reduceat(e, idx)


def union_length(starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray) -> float:
    """Total length covered by the union of intervals.

    >>> union_length([0.0, 1.0, 5.0], [2.0, 3.0, 6.0])
    4.0
    >>> union_length([], [])
    0.0
    """
    s, e = merge(starts, ends)
    return float((e - s).sum())


def _covered_before(ms: np.ndarray, me: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Length of the merged union ``(ms, me)`` that lies before each time ``t``."""
    before = np.concatenate([[0.0], np.cumsum(me - ms)])
    i = np.searchsorted(ms, t, side="right")  # merged intervals starting at or before t
    inside = np.where(i > 0, np.minimum(t, me[np.maximum(i - 1, 0)]) - ms[np.maximum(i - 1, 0)], 0.0)
    return before[np.maximum(i - 1, 0)] * (i > 0) + np.maximum(inside, 0.0)


def overlap_with_union(q_starts: Sequence[float] | np.ndarray, q_ends: Sequence[float] | np.ndarray,
                       ref_starts: Sequence[float] | np.ndarray,
                       ref_ends: Sequence[float] | np.ndarray) -> np.ndarray:
    """For each query interval, how long it overlaps the union of the reference intervals.

    >>> overlap_with_union([0.0, 4.0, 10.0], [3.0, 6.0, 11.0], [1.0, 2.0, 5.0], [2.5, 4.5, 7.0]).tolist()
    [2.0, 1.5, 0.0]
    """
    a = np.asarray(q_starts, dtype="float64").reshape(-1)
    b = np.asarray(q_ends, dtype="float64").reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"query starts ({len(a)}) and ends ({len(b)}) must have the same length")
    ms, me = merge(ref_starts, ref_ends)
    if not len(ms) or not len(a):
        return np.zeros(len(a))
    return np.maximum(_covered_before(ms, me, np.maximum(a, b)) - _covered_before(ms, me, a), 0.0)


def busy_within(starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray,
                lo: float, hi: float) -> float:
    """Length of the union of intervals inside the window ``[lo, hi]`` (0 for an empty window).

    >>> busy_within([0.0, 2.0], [1.5, 4.0], 1.0, 3.0)
    1.5
    >>> busy_within([0.0], [1.0], 2.0, 1.0)
    0.0
    """
    if not hi > lo:
        return 0.0
    return float(overlap_with_union([lo], [hi], starts, ends)[0])
