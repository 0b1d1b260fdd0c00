"""The shipped H200 profile is measured, and predicts the measured H200 runs it was not fitted to."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import offload_lab
from offload_lab import HostMemory, catalog
from offload_lab.record.run import display_label
from offload_lab.simulation import DeviceProfile

ROOT = Path(__file__).resolve().parents[1]
# every measured run the package ships, read through the package, as a user gets them
RUNS = {r.label: r for r in offload_lab.shipped_runs() if str(r.meta.get("device_name", "")).startswith("NVIDIA H200")}


def test_profile_is_measured_and_matches_the_runs(h200_main_held_out, capsys):
    prof = DeviceProfile.load("h200")
    assert prof.provenance["kind"] == "measured"
    assert "H200" in prof.provenance["machine"]
    # the script's own --check, in this process: it refits every field of the shipped profile
    # from the runs and fails on any difference. The leave-one-out table it would compute (the
    # slow part: step_error and the regimes' bands) is the session's, from the same function
    # over the same runs, so a change of the simulator or of the fit still fails here
    spec = importlib.util.spec_from_file_location("calibrate_h200", ROOT / "scripts" / "calibrate_h200.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    code = script.main(["--check"], loo=h200_main_held_out)
    assert code == 0, capsys.readouterr().out


@pytest.mark.parametrize("model,tier,label,tol", [
    # the compute rate came from '14B pinned p1'; the pageable step time was never fitted
    ("wan2.1-t2v-14b", "pageable", "14B pageable p1", 0.05),
    ("wan2.1-t2v-1.3b", "pinned", "1.3B pinned p1", 0.15),
    ("wan2.1-t2v-1.3b", "pageable", "1.3B pageable p1", 0.10),
])
def test_simulated_full_size_models_predict_measured_h200_runs(model, tier, label, tol):
    spec = catalog.load(model)
    plan = offload_lab.plan(spec, tier=tier, prefetch=1, host=HostMemory(available="256GiB"))
    sim = offload_lab.simulate(plan, "h200", steps=2, tokens=32760, issue="before-compute")
    measured = RUNS[label]
    assert sim.simulated and "simulated" in display_label(sim)
    assert measured.backend == "cuda" and not measured.simulated
    assert sim.step_time == pytest.approx(measured.step_time, rel=tol)


def test_measured_pinned_vs_pageable_ratio_on_14b():
    ratio = RUNS["14B pageable p1"].step_time / RUNS["14B pinned p1"].step_time
    # the reference figure from real Wan2.1 runs is 1.90 / 1.03 = 1.84
    assert 1.6 < ratio < 2.2
