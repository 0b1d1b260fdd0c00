"""The GPU block effects: a block runs faster after the compute stream idled before it
(``idle_speedup``, ``idle_tau_s``) and slower with a copy beside it (``copy_slowdown``).

Truths used: the parameters a simulated run was generated with (calibrate must find them
again), and the shipped H200 runs, where a 14B block measured 74.4 ms after the idle gap of a
pageable copy and 81.4 ms back to back; a profile fitted without the pageable run must predict
its blocks, not the pinned run's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import offload_lab as ol
from offload_lab.simulation import DeviceProfile, ProfileError, SimError, plan_of_run
from offload_lab.simulation.calibration import spec_of_run, tokens_of

H200 = Path(__file__).resolve().parent.parent / "data" / "runs" / "h200-2026-12-01"
SPEC = ol.catalog.load("wan2.1-t2v-1.3b")
HOST = ol.HostMemory(available="64GiB")


def _device(pageable_gbps: float, **kw) -> DeviceProfile:
    return DeviceProfile("effects", {"pinned": 50.0, "pageable": pageable_gbps}, hook_s=2e-5,
                         compute_curve={"*": [0.0, 450.0]}, tokens=32760, **kw)


def _blocks(run: ol.Run) -> np.ndarray:
    ev = run.events
    return ev[ev["kind"] == "compute"]["dur_s"].to_numpy(dtype="float64")


def test_a_block_after_an_idle_gap_is_faster_by_the_profile_and_back_to_back_is_not():
    from offload_lab.simulation import gpu_effects

    plain, fx = _device(8.8), _device(8.8, idle_speedup=0.08, idle_tau_s=0.01)
    for tier, faster in (("pinned", False), ("pageable", True)):
        plan = ol.plan(SPEC, tier=tier, host=HOST)
        # before-compute: each pageable copy waits for the block before and idles the stream
        a_run = ol.simulate(plan, plain, steps=3, issue="before-compute")
        b_run = ol.simulate(plan, fx, steps=3, issue="before-compute")
        a, b = np.median(_blocks(a_run)), np.median(_blocks(b_run))
        idle = float(np.nanmedian(gpu_effects.observe(b_run)["idle"]))
        if faster:
            assert idle > 0.005
            assert b == pytest.approx(a * (1 - 0.08 * (1 - np.exp(-idle / 0.01))), rel=0.005)
        else:
            assert idle < 1e-4
            assert b == pytest.approx(a, rel=1e-9)


def test_a_launch_bound_block_keeps_its_floor():
    # every block is its floor: nothing above it for the clocks to speed up
    floor_only = DeviceProfile("floor", {"pinned": 50.0, "pageable": 8.8}, compute_curve={"*": [0.002, 1e9]},
                               idle_speedup=0.2)
    run = ol.simulate(ol.plan(SPEC, tier="pageable", host=HOST), floor_only, steps=2)
    assert np.allclose(_blocks(run), 0.002, rtol=1e-6)


def test_calibrate_finds_the_effects_a_run_was_made_with():
    truth = dict(idle_speedup=0.08, idle_tau_s=0.01)
    runs = [ol.simulate(ol.plan(SPEC, tier=tier, host=HOST), _device(bw, **truth), steps=4, issue="before-compute")
            for tier, bw in (("pinned", 8.8), ("pageable", 8.8), ("pageable", 30.0), ("pageable", 4.0))]
    fitted = ol.calibrate(runs[:1], effects_from=runs)
    # the regression is on log(1 - a x) ~ -a x (1 + a x / 2) and a grid of time constants: close
    assert fitted.idle_speedup == pytest.approx(0.08, rel=0.15)
    assert fitted.idle_tau_s == pytest.approx(0.01, rel=0.35)
    assert fitted.copy_slowdown == 0.0
    assert "idle before" in fitted.provenance["gpu_effects"]
    # the per-layer seconds are the back-to-back ones the runs were generated from
    back_to_back = np.median(_blocks(runs[0]))
    assert fitted.compute_s["blocks"] == pytest.approx(back_to_back, rel=0.01)


def test_runs_that_cannot_tell_the_effects_apart_fit_neither():
    # only all pinned (no idle) and all pageable (idle, no copy beside): the two vary together
    runs = [ol.simulate(ol.plan(SPEC, tier=t, host=HOST), _device(8.8, idle_speedup=0.08), steps=3,
                        issue="before-compute") for t in ("pinned", "pageable")]
    fitted = ol.calibrate(runs)
    assert (fitted.idle_speedup, fitted.copy_slowdown) == (0.0, 0.0) or "prior" in fitted.provenance["gpu_effects"]


@pytest.mark.parametrize("kw,needle", [
    ({"idle_speedup": 0.7}, "idle_speedup = 0.7"),
    ({"idle_speedup": float("nan")}, "idle_speedup = nan"),
    ({"copy_slowdown": -0.1}, "copy_slowdown = -0.1"),
    ({"idle_tau_s": 0.0}, "idle_tau_s = 0.0"),
    ({"idle_speedup": 0.05, "compute_mode": "sync"}, "modelled for 'async'"),
])
def test_bad_effect_values_are_named(kw, needle):
    with pytest.raises(ProfileError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        DeviceProfile("x", {"pinned": 1.0}, **kw)


def test_effects_from_must_be_runs_of_the_same_backend():
    run = ol.simulate(ol.plan(SPEC, tier="pinned", host=HOST), _device(8.8), steps=2)
    with pytest.raises(SimError, match="effects_from"):
        ol.calibrate(run, effects_from="runs")
    with pytest.raises(SimError, match="backend"):
        cpu = ol.Run.load(next((Path(__file__).parent / "data" / "short").glob("short-pinned-r1*.zip")))
        ol.calibrate(run, effects_from=[cpu])


def test_held_out_14b_pageable_blocks_follow_the_idle_gap(h200_main_runs, h200_loo_profiles):
    runs = dict(h200_main_runs)  # the numbered runs ([01]*.zip)
    target = runs.pop("11-14B_pageable_p1")
    # heldout.fit over the ten other runs, fitted once for the session (conftest.py)
    prof = h200_loo_profiles["11-14B_pageable_p1"]
    _, plan = plan_of_run(target, spec=spec_of_run(target))
    predicted = float(np.median(_blocks(ol.simulate(plan, prof, steps=3, tokens=tokens_of(target)))))
    measured = float(np.median(_blocks(target)))
    back_to_back = float(np.median(_blocks(runs["10-14B_pinned_p1"])))
    assert measured < 0.95 * back_to_back  # the effect is in the data: 74.4 ms vs 81.4 ms
    assert predicted == pytest.approx(measured, rel=0.03), (predicted, measured, back_to_back)
