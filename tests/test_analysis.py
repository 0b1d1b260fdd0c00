"""analysis: compare / metrics / bound on real frames (cpu-backend profiles and simulator runs)."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import pandas as pd
import pytest

import offload_lab
from offload_lab import catalog, synthetic
from offload_lab.analysis import summary as analysis
from offload_lab.analysis.comparison import compare
from offload_lab.analysis.summary import AnalysisError, bound, metrics
from offload_lab.record.run import Run

HOST = offload_lab.HostMemory(available="256GiB")


@pytest.fixture(scope="module")
def measured() -> list[Run]:
    """Two cpu-backend runs of a tiny Wan-shaped model: all pinned, all pageable."""
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=3)
    inputs = synthetic.example_inputs(model, tokens=32)
    spec = offload_lab.spec_of(model)
    runs = []
    for tier in ("pinned", "pageable"):
        plan = offload_lab.plan(spec, tier=tier, host=HOST)
        runs.append(offload_lab.profile(model, lambda: model(**inputs), plan, steps=2, warmup=1,
                                        backend="cpu", label=tier))
    return runs


@pytest.fixture(scope="module")
def simulated() -> list[Run]:
    """Full-size Wan2.1-T2V-14B on the h200 profile: pinned, pageable, and a partial pin budget."""
    spec = catalog.load("wan2.1-t2v-14b")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plans = {"pinned": offload_lab.plan(spec, tier="pinned", host=HOST),
                 "pageable": offload_lab.plan(spec, tier="pageable", host=HOST),
                 "8GiB": offload_lab.plan(spec, pin_budget="8GiB", host=HOST)}
    return [offload_lab.simulate(p, "h200", steps=3, label=name, issue="before-compute") for name, p in plans.items()]


def test_compare_one_row_per_run_with_ratio_to_first(measured, simulated):
    runs = measured + simulated
    df = compare(runs)
    assert list(df.columns[:6]) == ["label", "backend", "simulated", "tiers", "step_s", "ratio"]
    assert {"stall_s", "exposed_copy_s", "overlap"} <= set(df.columns)
    assert len(df) == len(runs)
    assert list(df["backend"]) == ["cpu", "cpu", "sim", "sim", "sim"]
    assert list(df["simulated"]) == [False, False, True, True, True]
    assert df["label"].iloc[0] == "pinned"
    assert df["label"].iloc[2].endswith("(simulated)")
    assert df["ratio"].iloc[0] == 1.0
    # a ratio is to the first run of the same model, tokens and backend: the cpu runs of the
    # scaled model to the first cpu run, the full-size simulations to the first simulation
    refs = [0, 0, 2, 2, 2]
    for r, ref, (_, row) in zip(runs, refs, df.iterrows()):
        assert row["step_s"] == pytest.approx(r.steps["wall_s"].median())
        assert row["ratio"] == pytest.approx(row["step_s"] / df["step_s"].iloc[ref])
        assert row["ratio_to"] == df["label"].iloc[ref] and row["ratio_note"] == ""
        assert row["stall_s"] == pytest.approx(r.steps["stall_s"].median())


def test_tier_summaries(measured, simulated):
    df = compare(measured + simulated)
    assert df["tiers"].iloc[0] == "3 pinned"
    assert df["tiers"].iloc[1] == "3 pageable"
    assert df["tiers"].iloc[2] == "40 pinned"
    # a partial budget: some layers pinned, the rest pageable or mapped, in canonical tier order
    partial = df["tiers"].iloc[4]
    assert partial.startswith(f"{(simulated[2].layers['tier'] == 'pinned').sum()} pinned, ")
    assert sum(int(part.split()[0]) for part in partial.split(", ")) == 40


def test_pageable_simulated_is_slower_than_pinned(simulated):
    df = compare(simulated)
    assert df["ratio"].iloc[1] > 1.0


def test_metrics_bandwidth_per_tier_matches_copy_rows(measured, simulated):
    for run in measured + simulated:
        m = metrics(run)
        copies = run.events[run.events["kind"] == "copy"]
        assert set(m["gbps"]) == set(copies["tier"].unique())
        for tier, gbps in m["gbps"].items():
            rows = copies[copies["tier"] == tier]
            assert gbps == pytest.approx(rows["bytes"].sum() / rows["dur_s"].sum() / 1e9)
        assert m["simulated"] == run.simulated
        assert m["exposed_copy_s"] == pytest.approx(run.steps["exposed_copy_s"].median())
        assert 0.0 <= m["overlap"] <= 1.0 or math.isnan(m["overlap"])
        assert m["bytes_moved"] == int(run.layers.loc[run.layers["streamed"], "bytes"].sum())


def test_simulated_bandwidth_is_the_profile(simulated):
    prof = offload_lab.DeviceProfile.load("h200")
    m = metrics(simulated[0])
    # the simulator adds a fixed per-copy latency, so effective GB/s is a shade under the link
    assert m["gbps"]["pinned"] == pytest.approx(prof.bandwidths["pinned"], rel=0.01)
    assert metrics(simulated[1])["gbps"]["pageable"] == pytest.approx(prof.bandwidths["pageable"], rel=0.01)


def test_bound_defaults_and_measured_over_bound(measured, simulated):
    b = bound(measured[0])
    assert b["bandwidth_source"] == "best measured pinned"
    assert b["bandwidth_gbps"] == pytest.approx(measured[0].layers["gbps"].max())
    # pageable-only simulated run: no pinned copies, so the profile's pinned link is the bound
    b = bound(simulated[1])
    assert b["bandwidth_source"] == "device profile (pinned)"
    assert b["bandwidth_gbps"] == offload_lab.DeviceProfile.load("h200").bandwidths["pinned"]
    for run in simulated:
        b = bound(run)
        step_bytes = run.steps["bytes_moved"].median()
        expect = max(run.steps["compute_s"].median(), step_bytes / (b["bandwidth_gbps"] * 1e9))
        assert b["bound_s"] == pytest.approx(expect)
        assert b["vs_bound"] >= 1.0 - 1e-9
        assert b["limit"] in ("compute", "copy")


def test_bound_with_given_bandwidth(simulated):
    run = simulated[0]
    slow = bound(run, bandwidth=1.0)
    assert slow["limit"] == "copy"
    assert slow["bound_s"] == pytest.approx(run.steps["bytes_moved"].median() / 1e9)
    assert slow["bandwidth_source"] == "given"


@pytest.mark.parametrize("bad", [0, -3.0, float("nan"), "fast", True])
def test_bad_bandwidth_names_the_value(simulated, bad):
    with pytest.raises(AnalysisError, match="bandwidth .* GB/s") as e:
        bound(simulated[0], bandwidth=bad)
    assert repr(bad) in str(e.value)
    assert isinstance(e.value, ValueError)


def test_bad_runs_are_refused():
    with pytest.raises(AnalysisError, match="empty"):
        compare([])
    with pytest.raises(AnalysisError, match=r"runs\[0\] is int"):
        compare([3])
    with pytest.raises(AnalysisError, match="not a Run"):
        compare("pinned")
    with pytest.raises(AnalysisError, match="not an offload_lab.Run"):
        metrics(pd.DataFrame())


def test_compare_accepts_one_run_and_mappings(simulated):
    assert len(compare(simulated[0])) == 1
    assert list(compare({"a": simulated[0], "b": simulated[1]})["ratio"].round(6))[0] == 1.0


def test_saved_runs_compare_the_same(tmp_path, measured, simulated):
    runs = [measured[0], simulated[1]]
    loaded = [Run.load(r.save(tmp_path / f"r{i}.zip")) for i, r in enumerate(runs)]
    pd.testing.assert_frame_equal(compare(runs), compare(loaded))


def test_tier_summary_helpers():
    lay = pd.DataFrame({"tier": ["pinned"] * 20 + ["pageable"] * 10, "streamed": [True] * 30})
    assert analysis.tier_summary(lay) == "20 pinned, 10 pageable"
    assert analysis.dominant_tier(lay) == "pinned"
    assert analysis.tier_summary(lay.iloc[:0]) == "no layers"


def test_analysis_does_not_import_plotly():
    code = ("import sys, offload_lab, offload_lab.analysis.summary, offload_lab.analysis.comparison, "
            "offload_lab.views.text, offload_lab.views.tables, offload_lab.views.figures, offload_lab.views.report; "
            "from offload_lab.analysis.comparison import compare; "
            "assert 'plotly' not in sys.modules, 'plotly imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_all_resident_run_is_compute_bound():
    spec = catalog.load("wan2.1-t2v-14b")
    plan = offload_lab.plan(spec, resident=40, host=HOST)
    run = offload_lab.simulate(plan, "h200", steps=2, label="resident")
    assert compare(run)["tiers"].iloc[0] == "40 resident"
    m = metrics(run)
    assert m["gbps"] == {} and m["bytes_moved"] == 0
    assert m["bound"]["limit"] == "compute"
    assert m["bound_s"] == pytest.approx(run.steps["compute_s"].median())
