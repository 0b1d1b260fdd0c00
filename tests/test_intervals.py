"""Interval maths checked against a brute-force count on a fine integer grid."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from offload_lab.record.intervals import busy_within, merge, overlap_with_union, union_length

ivs = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=12)


def _cover(pairs):
    grid = np.zeros(61, bool)
    for s, e in pairs:
        grid[s:e] = True  # unit cells [k, k+1)
    return grid


@settings(max_examples=200, deadline=None)
@given(ivs)
def test_union_length_matches_grid(pairs):
    s = [p[0] for p in pairs]
    e = [p[1] for p in pairs]
    assert union_length(s, e) == _cover(pairs).sum()
    ms, me = merge(s, e)
    assert np.all(me > ms) and np.all(ms[1:] > me[:-1])


@settings(max_examples=200, deadline=None)
@given(ivs, ivs)
def test_overlap_with_union_matches_grid(q, ref):
    cover = _cover(ref)
    got = overlap_with_union([p[0] for p in q], [p[1] for p in q], [p[0] for p in ref], [p[1] for p in ref])
    want = [cover[s:e].sum() if e > s else 0 for s, e in q]
    assert got.tolist() == want


@settings(max_examples=200, deadline=None)
@given(ivs, st.integers(0, 60), st.integers(0, 60))
def test_busy_within_matches_grid(ref, lo, hi):
    want = _cover(ref)[lo:hi].sum() if hi > lo else 0
    assert busy_within([p[0] for p in ref], [p[1] for p in ref], lo, hi) == want


def test_mismatched_lengths_are_refused():
    import pytest

    with pytest.raises(ValueError, match="same length"):
        union_length([0.0, 1.0], [2.0])
