"""Every prediction says what it rests on; both issue orders in view; like with like."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import offload_lab
from offload_lab import catalog
from offload_lab.analysis.comparison import compare, why_not_paired
from offload_lab.record.run import Run
from offload_lab.simulation import DeviceProfile, ProfileError, SimError, simulate
from offload_lab.simulation.evidence import both_orders, other_order, regime_table, run_regime
from offload_lab.views.report import report
from offload_lab.views.text import fmt_step

ROOT = Path(__file__).resolve().parents[1]
H200_RUNS = ROOT / "data" / "runs" / "h200-2026-12-01"
BIG_HOST = offload_lab.HostMemory(available="256GiB")


def _plan(model: str, tier: str, host=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a forced tier demoted on the default host warns
        return offload_lab.plan(catalog.load(model), tier=tier, host=host)


@pytest.fixture(scope="module")
def h200() -> DeviceProfile:
    return DeviceProfile.load("h200")


def test_after_compute_pageable_is_unconfirmed_before_compute_is_held_out(h200):
    p = _plan("wan2.1-t2v-14b", "pageable")
    after = simulate(p, h200)
    ev = after.meta["evidence"]
    assert after.meta["issue"] == "after-compute"
    assert ev["status"] == "unconfirmed" and ev["band"] is None
    assert "after-compute" in ev["basis"] and "NVIDIA H200" in ev["basis"]
    before = simulate(p, h200, issue="before-compute")
    ev = before.meta["evidence"]
    assert ev["status"] == "held-out" and 0 < ev["band"] <= 0.05
    # the basis names the runs it rests on: the measured host-blocking runs, before-compute
    assert "14B pageable p1" in ev["runs"] and "1.3B mapped p1" in ev["runs"]
    assert not any("pinned p" in r and "pageable" not in r for r in ev["runs"])


def test_all_pinned_is_held_out_in_either_order(h200):
    p = _plan("wan2.1-t2v-14b", "pinned", BIG_HOST)
    runs = [simulate(p, h200, steps=2, issue=o) for o in ("after-compute", "before-compute")]
    for r in runs:
        assert r.meta["evidence"]["status"] == "held-out", r.meta["evidence"]
        assert r.meta["evidence"]["band"] <= 0.05
        assert run_regime(r) == {"device": "h200", "issue": "any", "copies": "pinned"}
    # why a pinned regime holds for both orders: the simulator predicts the same step under each
    assert runs[0].step_time == pytest.approx(runs[1].step_time, rel=1e-9)
    assert both_orders(p, h200, steps=2)[0].meta["issue"] == "after-compute" and len(both_orders(p, h200, steps=2)) == 1


def test_staged_and_estimated_profiles_and_nodes_have_no_band(h200):
    staged = simulate(_plan("wan2.1-t2v-1.3b", "staged", BIG_HOST), h200, steps=2, issue="before-compute")
    assert staged.meta["evidence"]["status"] == "unconfirmed" and staged.meta["evidence"]["band"] is None
    rtx = simulate(_plan("wan2.1-t2v-1.3b", "pinned", BIG_HOST), "rtx4090-pcie4", steps=2)
    assert rtx.meta["evidence"]["status"] == "derived" and rtx.meta["evidence"]["band"] is None
    assert "estimated" in rtx.meta["evidence"]["basis"]
    node = simulate(_plan("wan2.1-t2v-1.3b", "pinned", BIG_HOST), h200, steps=2, ranks_per_node=2)
    assert node.meta["evidence"]["status"] == "derived" and "2 ranks" in node.meta["evidence"]["basis"]
    # the step text says so instead of a ± band
    assert "unconfirmed — no GPU run of this issue order yet" in fmt_step(staged.step_time, staged.meta)
    assert "±" not in fmt_step(rtx.step_time, rtx.meta)


def _copy_as_after_compute(src: Path, dst: Path) -> None:
    r = Run.load(src)
    meta = dict(r.meta, issue="after-compute", label=r.label + " after-compute", run=r.meta["run"] + "-ac")
    Run(r.events, r.layers, r.steps, r.memory, meta).save(dst)


def test_a_measured_run_of_a_new_regime_flips_the_status_with_no_code_change(tmp_path, h200):
    # a folder of measured runs, as data/runs holds them: the table is made from whatever is there
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    for name in ("02-1.3B_pinned_p1.zip", "03-1.3B_pageable_p1.zip", "06-1.3B_half_pin_budget_p1.zip"):
        (runs_dir / name).write_bytes((H200_RUNS / name).read_bytes())

    def profile_from(folder: Path) -> DeviceProfile:
        runs = {p.stem: Run.load(p) for p in sorted(folder.glob("*.zip"))}
        return h200.replace(regimes=regime_table(runs, source=folder.name))

    plan = _plan("wan2.1-t2v-1.3b", "pageable", BIG_HOST)
    before = simulate(plan, profile_from(runs_dir), steps=2)
    assert before.meta["evidence"]["status"] == "unconfirmed"
    _copy_as_after_compute(H200_RUNS / "03-1.3B_pageable_p1.zip", runs_dir / "12-1.3B_pageable_p1_after.zip")
    prof = profile_from(runs_dir)
    after = simulate(plan, prof, steps=2)
    ev = after.meta["evidence"]
    assert ev["status"] == "held-out" and isinstance(ev["band"], float)
    assert ev["runs"] == ["1.3B pageable p1 after-compute"]
    # the table round-trips through the profile's JSON, as the shipped profile carries it
    again = DeviceProfile.from_json(prof.to_json(tmp_path / "p.json"))
    assert simulate(plan, again, steps=2).meta["evidence"] == ev


def test_shipped_profile_regimes_cover_what_the_shipped_runs_measured(h200):
    rows = {(r["issue"], r["copies"]): r for r in h200.regimes["table"]}
    assert set(rows) == {("any", "pinned"), ("before-compute", "host-blocking")}
    assert h200.regimes["device_name"] == "NVIDIA H200"
    assert max(r["band"] for r in rows.values()) == pytest.approx(h200.step_error, abs=1e-3)


def test_bad_regimes_table_is_one_clear_error(h200):
    with pytest.raises(ProfileError, match=r"regimes row .*accepted: issue in"):
        h200.replace(regimes={"device_name": "x", "table": [{"issue": "sideways", "copies": "pinned",
                                                              "runs": ["a"], "band": 0.1}]})
    with pytest.raises(SimError, match="both_orders simulates every issue order itself"):
        both_orders(_plan("wan2.1-t2v-1.3b", "pageable", BIG_HOST), h200, issue="before-compute")


def test_no_ratio_between_devices_and_the_report_says_why(h200):
    measured = {r.label: r for r in offload_lab.shipped_runs("wan2.1-t2v-14b")}
    rtx = [simulate(_plan("wan2.1-t2v-14b", t, BIG_HOST), "rtx4090-pcie4", steps=2, label=f"rtx {t}")
           for t in ("pinned", "pageable")]
    assert why_not_paired(rtx[0], measured["14B pinned p1"]) == "device rtx4090-pcie4 (no measured run) vs NVIDIA H200"
    html = report(list(measured.values()) + rtx).to_html()
    assert "predicted vs measured" not in html
    assert "device rtx4090-pcie4 (no measured run) vs NVIDIA H200" in html
    # two predictions on different device profiles are not divided either
    h = simulate(_plan("wan2.1-t2v-14b", "pinned", BIG_HOST), h200, steps=2, label="h200 pinned")
    df = compare([h, rtx[0]])
    assert math.isnan(df["ratio"].iloc[1]) and "device h200 vs rtx4090-pcie4" in df["ratio_note"].iloc[1]


def test_predicted_vs_measured_only_in_the_same_issue_order(h200):
    measured = {r.label: r for r in offload_lab.shipped_runs("wan2.1-t2v-14b")}["14B pageable p1"]
    plan = _plan("wan2.1-t2v-14b", "pageable", BIG_HOST)
    after = simulate(plan, h200, steps=2, label="after")
    html = report([measured, after]).to_html()
    assert "predicted vs measured" not in html
    assert "issue order after-compute vs before-compute" in html
    # the report shows the prediction under the other order too, with its evidence
    assert "other issue order" in html and "before-compute order:" in html
    pair = both_orders(plan, h200, steps=2, label="14B pageable")
    html = report([measured, *pair]).to_html()
    m = re.findall(r"predicted vs measured ([+−-]\d+\.\d)%", html)
    # one pair, shown from both sides (the prediction's section and the measurement's): before-compute
    assert len(m) == 2 and len(set(m)) == 1 and abs(float(m[0])) <= 5, m
    assert "14B pageable · before-compute" in html and "14B pageable · after-compute" in html
    assert other_order(pair[0]).meta["issue"] == "before-compute"


def test_cli_simulate_prints_both_orders_with_evidence():
    r = subprocess.run([sys.executable, "-m", "offload_lab", "simulate", "wan2.1-t2v-14b", "--device", "h200",
                        "--tier", "pageable", "-n", "2"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines() if re.match(r"\s+(after|before)-compute\s", ln)}
    assert "unconfirmed — no GPU run of this issue order yet" in rows["after-compute"]
    assert "±" not in rows["after-compute"]
    assert re.search(r"held-out ± [0-4]\.\d %", rows["before-compute"]), rows


def test_simulation_imports_neither_analysis_nor_plotly_nor_torch():
    # the whole simulator, the recommender and its confirmation included: confirm imports the
    # runtime, and so torch, only when it runs; running the simulator reads no analysis
    code = ("import sys, offload_lab, offload_lab.simulation.recommend, offload_lab.simulation.confirm; "
            "from offload_lab.simulation.evidence import both_orders, other_order; "
            "assert 'torch' not in sys.modules; "
            "spec = offload_lab.catalog.load('wan2.1-t2v-1.3b'); "
            "p = offload_lab.plan(spec, tier='pageable', host=offload_lab.HostMemory(available='64GiB')); "
            "a = both_orders(p, 'h200', steps=1)[0]; other_order(a); "
            "offload_lab.simulate(p, 'h200', steps=1, ranks_per_node=2); "
            "up = sorted(m for m in sys.modules if m.startswith('offload_lab.analysis') or m == 'plotly'); "
            "assert not up, up")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
