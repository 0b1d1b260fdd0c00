"""The shipped simulated stand-ins for unmeasured GPU stages: labelled, kept apart, reproducible."""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import pytest

import offload_lab as ol
from offload_lab.record.run import display_label
from offload_lab.shipped import KINDS, data_dir
from offload_lab.simulation.heldout import held_out

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "data" / "simulated" / "h200"
MEASURED = ROOT / "data" / "runs" / "h200-2026-12-01"
sys.path.insert(0, str(ROOT / "scripts"))

import simulate_evidence as se  # noqa: E402


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((SIM / "manifest.json").read_text())


@pytest.fixture(scope="module")
def runs(manifest) -> dict[str, ol.Run]:
    return {e["file"]: ol.Run.load(SIM / e["file"]) for e in manifest["runs"]}


def test_manifest_lists_exactly_the_shipped_files(manifest):
    assert manifest["format"] == se.MANIFEST_FORMAT and manifest["simulated"] is True
    assert sorted(e["file"] for e in manifest["runs"]) == sorted(p.name for p in SIM.glob("*.zip"))
    prof = ol.DeviceProfile.load(manifest["profile"])
    assert manifest["step_error"] == prof.step_error is not None
    assert "scripts/simulate_evidence.py" in manifest["command"]


def test_every_file_is_a_labelled_simulated_run_matching_its_manifest(manifest, runs):
    for e in manifest["runs"]:
        run = runs[e["file"]]
        assert run.simulated and run.meta["simulated"] is True and run.backend == "sim", e["file"]
        # "simulated" is stored once, in meta; old files' label suffix is taken off at load
        assert "simulated" not in run.label and "simulated" not in run.meta["device_name"], run.label
        assert display_label(run) == e["label"] and e["label"].endswith("(simulated)"), run.label
        assert run.meta["stands_in_for"] == e["stage"] and run.meta["tokens"] == e["tokens"]
        assert run.meta["model"] == e["model"] and run.meta["passes"] == e["passes"]
        assert run.meta["profile"]["name"] == manifest["profile"]
        assert list(run.steps["wall_s"]) == pytest.approx(e["step_s"], rel=1e-12)
        assert run.layers.groupby("tier").size().to_dict() == e["tiers"]
        # the frames are whole: every measured step (warm-up dropped) runs every layer of every pass
        comp = run.events[run.events["kind"] == "compute"]
        assert len(run.steps) == e["steps"] and run.meta["warmup_dropped"] == e["warmup"]
        assert len(comp) == len(run.layers) * e["passes"] * e["steps"], e["file"]


def test_the_cases_the_brief_of_each_stage_names_are_there(manifest):
    by = {(e["stage"], e["model"], e["tokens"], e["passes"]): e for e in manifest["runs"]}
    for n in (1024, 4096, 16384, 32760, 75600):
        assert by[("tokens", "wan2.1-t2v-1.3b", n, 1)]["plan"] == {"tier": "pinned", "prefetch": 1}
    assert ("tokens", "wan2.1-t2v-14b", 1024, 1) in by
    assert by[("cfg720", "wan2.1-t2v-1.3b", 75600, 2)]["tiers"] == {"pinned": 30}
    budgets = [e for e in manifest["runs"] if e["stage"] == "budgets"]
    total = ol.catalog.load("wan2.1-t2v-14b").layers["bytes"].sum()
    assert sorted({round(e["plan"]["pin_budget"] / total, 6) for e in budgets}) == [0.25, 0.5, 0.75]
    assert {e["plan"]["order"] for e in budgets} == {"execution", "reverse", "strided", "largest"}
    assert len(budgets) == 12
    for e in budgets:  # a pin budget of share s pins s of the 40 equal blocks
        share = e["plan"]["pin_budget"] / total
        assert e["tiers"]["pinned"] == int(round(40 * share)), e["file"]
    h3 = [e for e in manifest["runs"] if e["stage"] == "h3"]
    assert h3 and all(e["tiers"]["resident"] == 35 for e in h3)
    assert any({"pinned", "mapped"} <= set(e["tiers"]) for e in h3)
    run = ol.Run.load(SIM / h3[0]["file"])
    assert set(run.events.loc[run.events["kind"] == "copy", "group"]) == {"token_refiner.blocks", "blocks"}


def test_the_host_is_what_the_measured_h200_plans_saw():
    run = ol.Run.load(MEASURED / "10-14B_pinned_p1.zip")
    assert run.meta["plan"]["ledger"]["available"] == se.H200_HOST_AVAILABLE


def test_cfg_step_is_two_forwards_of_the_one_pass_step(manifest):
    by = {e["label"]: e["median_step_s"] for e in manifest["runs"]}
    one, two = by["1.3B pinned p1 75600-tok (simulated)"], by["1.3B pinned p1 720p cfg (simulated)"]
    # compute-bound at 720p: twice the forwards, about twice the step (the step head is once per step)
    assert two == pytest.approx(2 * one, rel=0.01) and two != 2 * one


@pytest.mark.parametrize("index", [0, 5, 6, 19])  # 1.3B 1k, 14B 1k, cfg720, H3: cheap to regenerate
def test_a_regenerated_case_gives_the_shipped_step_times(manifest, runs, index):
    case, name = se._numbered(se.cases())[index]
    e = manifest["runs"][index]
    assert name == e["file"]
    again = se.simulate_case(case)
    assert list(again.steps["wall_s"]) == pytest.approx(list(runs[name].steps["wall_s"]), rel=1e-12)
    assert again.label == runs[name].label


def test_check_fails_when_a_shipped_file_differs(tmp_path, manifest, capsys):
    d = tmp_path / "h200"
    shutil.copytree(SIM, d)
    victim = manifest["runs"][3]["file"]
    run = ol.Run.load(d / victim)
    slow = ol.Run(run.events, run.layers, run.steps.assign(wall_s=run.steps["wall_s"] * 1.01), run.memory,
                  run.meta)
    (d / victim).unlink()
    slow.save(d / victim)
    assert se.check(d) == 1
    err = capsys.readouterr().err
    assert victim in err and "regenerate" in err
    assert se.check(tmp_path / "nowhere") == 1


def test_simulated_runs_never_enter_measured_listings_or_held_out_accuracy(manifest, runs):
    assert data_dir("simulated") is not None and "simulated" in KINDS
    assert not list((ROOT / "data" / "runs").glob("*/*.zip")) or not any(r.simulated for r in ol.shipped_runs())
    measured_labels = {r.label for r in ol.shipped_runs()}
    assert not measured_labels & {r.label for r in runs.values()}
    # held-out accuracy skips them with a note, and predicts the measured runs as before
    real = {p.stem: ol.Run.load(p) for p in sorted(MEASURED.glob("0[2-3]*.zip"))}
    sim = {e["file"]: runs[e["file"]] for e in manifest["runs"][:2]}
    with pytest.warns(UserWarning, match="simulated"):
        t = held_out({**real, **sim}, schemes=("loo",))
    assert sorted(t["run"]) == sorted(real)
    assert sorted(t.attrs["skipped"]) == sorted(f"{n} (simulated)" for n in sim)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bare = held_out(real, schemes=("loo",))
    assert list(bare["loo_ms"]) == pytest.approx(list(t["loo_ms"]), nan_ok=True)
    with pytest.raises(ol.simulation.SimError, match="every run given is simulated"):
        held_out(sim)
