"""Held-out accuracy: a run is predicted by profiles calibrated without it.

The measured runs are the committed cpu fixtures (``tests/data/runs``) and the shipped H200 runs
(``data/runs``), so the numbers are fixed and no timing of this machine decides anything.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import offload_lab as ol
from offload_lab.simulation import SimError
from offload_lab.simulation.heldout import held_out

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "runs"
H200 = ROOT / "data" / "runs" / "h200-2026-12-01"


def _fixture_runs() -> dict[str, ol.Run]:
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    return {n: ol.Run.load(FIXTURES / v["file"]) for n, v in manifest["runs"].items()}


def test_leave_one_out_on_the_cpu_fixtures():
    runs = _fixture_runs()
    t = held_out(runs).set_index("run")
    assert sorted(t.index) == sorted(runs)
    # every fixture plan is predicted by a profile fitted on the six others, within 15 %
    assert t["loo_err"].abs().max() <= 0.15, t[["measured_ms", "loo_ms", "loo_err"]]
    # one model at one (unknown) token count: nothing to hold out across tokens or model sizes
    assert t["tokens_err"].isna().all() and t["model_err"].isna().all()


def test_a_run_is_not_in_its_own_training_set():
    runs = _fixture_runs()
    name = "pinned-p1"
    # doubling its measured step time moves its held-out error by exactly that factor: its own
    # steps took no part in the prediction
    slow = runs[name]
    slow = ol.Run(slow.events, slow.layers, slow.steps.assign(wall_s=slow.steps["wall_s"] * 2),
                  slow.memory, slow.meta)
    a = held_out(runs).set_index("run").loc[name]
    b = held_out({**runs, name: slow}).set_index("run").loc[name]
    assert b["loo_ms"] == pytest.approx(a["loo_ms"])
    assert 1 + b["loo_err"] == pytest.approx((1 + a["loo_err"]) / 2)


def test_a_tier_no_training_run_copied_from_is_not_predicted():
    runs = _fixture_runs()
    only = {n: runs[n] for n in ("pinned-p0", "pinned-p1", "pageable-p1")}
    t = held_out(only).set_index("run")
    # the only pageable run is the one held out: no training run measured the pageable rate
    assert math.isnan(t.loc["pageable-p1", "loo_ms"])
    assert not math.isnan(t.loc["pinned-p1", "loo_ms"])


@pytest.mark.skipif(not H200.exists(), reason="the shipped H200 runs are not in this checkout")
def test_the_shipped_h200_runs_are_predicted_across_model_sizes():
    runs = {f.stem: ol.Run.load(f) for f in sorted(H200.glob("[0-9]*.zip"))}
    t = held_out(runs).set_index("run")
    # 1.3B <-> 14B at 480p: a compute rate carried over as TFLOP/s, bandwidths from the other size
    big = t.loc[["10-14B_pinned_p1", "11-14B_pageable_p1"], "model_err"]
    assert big.abs().max() <= 0.15
    assert t.loc["02-1.3B_pinned_p1", "loo_err"] == pytest.approx(0.0, abs=0.05)


def test_bad_input():
    with pytest.raises(SimError, match="non-empty dict"):
        held_out({})
