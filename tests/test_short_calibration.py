"""A profile calibrated on a short run (4 layers at full width) predicts the full-depth model.

The runs are committed cpu-backend measurements (``scripts/record_short_fixtures.py``): the
fixture model truncated to 4 blocks and at its full 30, all pinned and all pageable, in rounds
run back to back. The profile sees only the 4-block runs; the 30-block runs are the truth.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import offload_lab as ol
from offload_lab.cli.app import main
from offload_lab.simulation import DeviceProfile, plan_of_run
from offload_lab.simulation.calibration import spec_of_run

DATA = Path(__file__).resolve().parent / "data" / "short"


def _runs(plan: str) -> list[ol.Run]:
    manifest = json.loads((DATA / "manifest.json").read_text())
    return [ol.Run.load(DATA / v["file"]) for v in manifest["runs"].values() if v["plan"] == plan]


@pytest.fixture(scope="module")
def short_profile() -> DeviceProfile:
    return ol.calibrate(_runs("short-pinned"))


# Both tiers within 10 %: pageable, where the host thread copies and computes in turn, and
# pinned, where a copy thread runs the next block's copy beside the block (the after-compute
# issue order the runtime and the simulator share).
@pytest.mark.parametrize("tier", ["pageable", "pinned"])
def test_four_layers_predict_the_full_depth(tier):
    short_profile = ol.calibrate(_runs(f"short-{tier}"))
    full = _runs(f"full-{tier}")
    assert {len(r.layers) for r in full} == {30}
    assert all(len(r.layers) == 4 for r in _runs(f"short-{tier}"))
    # the full model's plan and spec, as its run recorded them; the profile never saw them
    _, plan = plan_of_run(full[0], spec=spec_of_run(full[0]))
    predicted = ol.simulate(plan, short_profile, steps=5, warmup=1).step_time
    measured = float(np.median(np.concatenate([r.steps["wall_s"].to_numpy() for r in full])))
    assert predicted == pytest.approx(measured, rel=0.10), (predicted, measured)


def test_layers_beyond_the_short_run_take_the_group_median(short_profile):
    # the short run measured blocks 0..3; block 17 exists only in the full model
    assert "blocks.17" not in short_profile.compute_s
    spec = spec_of_run(_runs("full-pinned")[0])
    typical = float(np.median([short_profile.compute_s[f"blocks.{i}"] for i in range(4)]))
    assert short_profile.compute_seconds(spec, "blocks", 17) == pytest.approx(typical)


def test_the_cli_runs_and_fits_a_profile_the_simulator_accepts(tmp_path, capsys):
    out = tmp_path / "my-cpu.json"
    args = ["calibrate", "--model", "wan2.1-t2v-1.3b", "--layers", "2", "--scale", "0.05",
            "--tokens", "16,64", "--backend", "cpu", "-n", "2", "--threads", "1", "--out", str(out)]
    assert main(args) == 0
    prof = DeviceProfile.load(str(out))
    assert prof.provenance["kind"] == "measured"
    assert prof.provenance["short_run"]["layers"] == {"blocks": 2}
    assert prof.provenance["short_run"]["full_layers"] == {"blocks": 30}
    assert {"pinned", "pageable"} <= set(prof.bandwidths)
    # two token counts: the compute curve has a launch floor and a rate
    assert set(prof.compute_curve) == {"blocks", "*"}
    # an existing output is kept without --force
    assert main(args) != 0
    assert "exists" in capsys.readouterr().err


def test_recommend_takes_the_short_run_profile_for_the_full_model(short_profile):
    # the user's own calibrated profile (cpu backend here), planning the model it never saw whole
    full = _runs("full-pinned")[0]
    spec = spec_of_run(full)
    rec = ol.recommend(spec, short_profile, host="8GiB", device_memory="1GiB")
    assert rec.fits and rec.profile is short_profile
    best = rec.tried.loc[rec.tried["best"]].iloc[0]
    # its step time is the simulator's on that profile, for that plan
    assert ol.simulate(rec.best, short_profile, steps=3, warmup=1).step_time == pytest.approx(best["step_s"], rel=0.05)
