"""ExplorerState: the explorer's logic without widgets — controls → plan → simulate / run /
recommend → what a view shows."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import plotly.graph_objects as go
import pytest
import torch

import offload_lab
from offload_lab import catalog, synthetic
from offload_lab.notebook.state import CONTROL_NAMES, Controls, ExplorerError, ExplorerState
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.planner import PlanWarning

GIB = 2**30


@pytest.fixture(scope="module")
def wan14() -> offload_lab.ModelSpec:
    return catalog.load("wan2.1-t2v-14b")


@pytest.fixture()
def st(wan14) -> ExplorerState:
    return ExplorerState(wan14, host="64GiB", live=False)


def direct_plan(st: ExplorerState, **overrides) -> offload_lab.Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        return offload_lab.plan(st.spec, host=st.host, device_memory=st.device_memory_bytes(),
                                **{**st.plan_kwargs(), **overrides})


def test_controls_are_one_field_each_and_set_replans_once(st):
    assert CONTROL_NAMES == tuple(f for f in vars(Controls()) if not f.startswith("_"))
    assert st.pin_budget() is None and st.plan.tier_counts["pinned"] == 40
    plan = st.set(budget=8.0, resident=4, residency="strided", order="reverse", prefetch=2, tier="pageable")
    assert plan is st.plan
    p = st.plan.params
    assert (p["pin_budget"], p["resident"], p["residency"], p["order"], p["prefetch"], p["tier"]) == (
        8 * GIB, 4, "strided", "reverse", 2, "pageable")
    assert st.plan.layers.equals(direct_plan(st).layers)
    with pytest.raises(ExplorerError, match="control 'colour' is not one of host, budget"):
        st.set(colour="red")
    with pytest.raises(ExplorerError, match="host 'huge' is not one of"):
        st.set(host="huge")


def test_host_moves_the_budget_range_and_keeps_a_chosen_budget(st):
    st.set(host="16GiB")
    spend = HostMemory(available="16GiB").spendable
    assert st.budget_max * GIB >= spend > (st.budget_max - st.budget_step) * GIB
    assert st.controls.budget == st.budget_max and st.pin_budget() is None
    assert st.plan.ledger["spendable"] == spend
    st.set(budget=4.0)
    st.set(host="128GiB")
    assert st.controls.budget == 4.0 and st.pin_budget() == 4 * GIB
    assert "host can spend" in st.budget_note()


def test_a_refused_combination_keeps_the_plan_and_the_status_says_why(st):
    st.set(tier="pinned")
    good = st.plan
    assert st.set(budget=0.0) is None and st.plan is good
    assert "PlanError" in st.error and "error" in st.status_html()
    st.guard(st.simulate)  # the stale plan on display is not simulated
    assert st.last_run is None and "no valid plan" in st.error
    st.set(budget=8.0)
    assert st.error is None and st.plan is not good


def test_simulate_compare_clear_and_what_is_shown(st):
    st.set(budget=8.0)
    run = st.simulate()
    assert run.simulated and run.layers["tier"].tolist() == st.plan.layers["tier"].tolist()
    assert len(run.steps) == st.controls.steps
    assert isinstance(st.figures["timeline"], go.Figure) and isinstance(st.figures["tier_map"], go.Figure)
    assert "SIMULATED" in st.figures["timeline"].layout.title.text
    assert "simulated on h200" in st.message and "12 pinned" in st.status_html()
    assert "spendable" in st.ledger_html() and "pinned: rank 1" in st.reasons_html()
    assert "No runs kept yet" in st.comparison_html
    st.add_to_comparison()
    st.add_to_comparison()  # the same run is kept once
    pinned, pageable = st.compare_tiers()
    assert len(st.runs) == 3 and set(pinned.layers["tier"]) == {"pinned"}
    assert pageable.step_time >= pinned.step_time * (1 - 1e-12)
    assert st.controls.tier == "auto"  # the forced tier was only for the comparison
    assert all("simulated" in y for y in st.figures["step_times"].data[0].y)
    assert "pageable" in st.comparison_html
    st.clear_comparison()
    assert st.runs == [] and "step_times" not in st.figures and st.comparison_html == "<i>No runs kept.</i>"


def test_live_mode_and_the_profile_brings_its_memory(wan14):
    st = ExplorerState(wan14, host="64GiB", profile="rtx4090-pcie4", live=True)
    first = st.last_run
    assert first is not None and st.device_memory_bytes() == 24 * GIB
    st.set(tier="pageable")
    assert st.last_run is not first and set(st.last_run.layers["tier"]) == {"pageable"}
    st.set(profile="h200")
    assert st.device_memory_bytes() > 24 * GIB and st.last_run.meta["profile"]["name"] == "h200"
    st.set(live=False, report_path="x.html")  # neither replans nor simulates
    assert st.last_run.meta["profile"]["name"] == "h200"


def test_recommend_loads_the_best_plan_and_a_tried_one(wan14):
    st = ExplorerState(wan14, profile="rtx4090-pcie4", host="64GiB", live=False)
    rec = st.recommend()
    assert list(st.plan.layers["tier"]) == list(rec.best.layers["tier"])
    assert st.front_choice == int(rec.best_row["id"]) and st.front_options
    assert isinstance(st.figures["recommend_front"], go.Figure) and "recommended" in st.message
    other = next(int(i) for i in rec.front["id"] if int(i) != st.front_choice)
    st.load_tried(other)
    row = rec.tried.loc[other]
    assert st.controls.resident == row["resident"] and st.controls.prefetch == row["prefetch"]
    assert st.front_choice == other
    st.set(device_memory=2.0)
    assert st.recommend().best is None and "No plan fits" in st.message


def test_export_report_writes_a_link(st, tmp_path):
    st.simulate()
    path = st.export_report(tmp_path / "state.html")
    assert "SIMULATED" in path.read_text(encoding="utf-8")
    assert f"<a href='{path}'" in st.status_html()  # the link is HTML, not escaped text


def test_run_profiles_the_real_model_and_reports_progress():
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=3)
    inputs = synthetic.example_inputs(model, tokens=32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    st = ExplorerState(model, fn=lambda: model(**inputs), live=False, steps=2, warmup=1, backend="cpu")
    seen = []
    st.on_progress = lambda k, n: seen.append((k, n))
    st.set(tier="pageable")
    run = st.run()
    assert not run.simulated and "measured on cpu" in run.label and len(run.steps) == 2
    assert seen[0] == (0, 3) and seen[-1][0] == 3
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    calibrated = [k for k in st.profiles if k.startswith("calibrated")]
    assert calibrated
    st.set(profile=calibrated[0])
    assert st.simulate().simulated


def test_bad_arguments_name_the_value():
    with pytest.raises(ExplorerError, match="model_or_spec 42"):
        ExplorerState(42)
    with pytest.raises(ExplorerError, match="fn"):
        ExplorerState("wan2.1-t2v-1.3b", host="64GiB", live=False).run()


def test_state_runs_without_ipywidgets():
    """The state and everything it imports work where ipywidgets cannot be imported."""
    code = textwrap.dedent("""
        import sys
        sys.modules["ipywidgets"] = None  # import ipywidgets now raises ImportError
        from offload_lab.notebook.state import ExplorerState
        st = ExplorerState("wan2.1-t2v-14b", host="64GiB", live=False)
        st.set(budget=8.0)
        assert st.plan.tier_counts["pinned"] == 12, st.plan.tier_counts
        st.set(order="reverse", prefetch=2)
        st.set(host="32GiB")
        run = st.simulate()
        st.add_to_comparison()
        st.compare_tiers()
        assert run.simulated and len(st.runs) == 3, st.runs
        assert "timeline" in st.figures and "step_times" in st.figures
        assert "simulated" in st.status_html()
        assert "ipywidgets" not in {m for m, v in sys.modules.items() if v is not None}
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")


# -- what each prediction rests on: issue order, calls per step, evidence ----------------------------
def test_issue_and_calls_controls_reach_the_simulation(st):
    st.set(tier="pageable")
    after = st.simulate()
    assert after.meta["issue"] == "after-compute" and int(after.meta.get("passes", 1)) == 1
    st.set(issue="before-compute", passes=2)
    before = st.simulate()
    assert before.meta["issue"] == "before-compute" and int(before.meta["passes"]) == 2
    # two calls per step take about twice one call's time (the second call's prefetch overlaps)
    one = offload_lab.simulate(st.plan, "h200", steps=3, issue="before-compute")
    assert before.step_time == pytest.approx(2 * one.step_time, rel=0.01)
    with pytest.raises(ExplorerError, match="issue 'sideways'.*after-compute"):
        st.set(issue="sideways")
    with pytest.raises(ExplorerError, match="passes 3"):
        st.set(passes=3)


def test_status_says_unconfirmed_and_shows_the_other_order(st):
    st.set(tier="pageable", passes=2)
    run = st.simulate()
    assert run.meta["evidence"]["status"] == "unconfirmed"
    lines = {k: t for k, t, _ in st.status_lines() if t}
    assert "unconfirmed — no GPU run of this issue order yet" in lines["message"]
    assert "±" not in lines["message"]  # no band where no measured run backs the prediction
    assert "per call × 2 calls = " in lines["message"] and "per step" in lines["message"]
    # the other order's prediction, with its own evidence (before-compute pageable is held out)
    assert lines["other order"].startswith("before-compute order:") and "±" in lines["other order"]
    other = st.other_order_run()
    assert other.meta["issue"] == "before-compute" and other.meta["evidence"]["status"] == "held-out"
    assert "before-compute" in st.status_html() and "unconfirmed" in st.status_html()


def test_all_pinned_plan_shows_a_band_and_no_other_order(st):
    st.simulate()  # 64 GiB host: every layer pinned, both orders predict the same timeline
    lines = {k: t for k, t, _ in st.status_lines() if t}
    assert "±" in lines["message"] and "other order" not in lines
    assert st.other_order_run() is None


def test_plan_warnings_reach_the_status(st):
    st.set(tier="pinned", budget=3.0)
    assert st.plan.warnings and st.plan.tier_counts["pageable"] > 0
    lines = {k: t for k, t, _ in st.status_lines() if t}
    assert "tier 'pinned' forced" in lines["warning"]
    assert "<b>warning</b>" in st.status_html()


def test_status_budget_reads_as_the_slider():
    st = ExplorerState("wan2.1-t2v-14b", host="32GiB", live=False)
    slider = f"{st.controls.budget:.{st.budget_digits}f} GiB"
    assert f"of budget {slider}" in st.plan_line()  # the top of the slider, as it reads
    st.set(budget=3.0)
    assert "of budget 3.0 GiB" in st.plan_line()


def test_only_what_changed_is_recomputed(st):
    st.set(tier="pageable")
    run, tier_map = st.simulate(), st.figures["tier_map"]
    st.set(issue="before-compute")   # a simulator option: the plan and its figure stay
    assert st.figures["tier_map"] is tier_map
    st.set(issue="after-compute")    # back: the cached run and its figure, not new ones
    assert st.simulate() is run and st.figures["tier_map"] is tier_map
    st.set(budget=3.0)
    st.set(budget=st.budget_max)     # a plan made again from the same controls is the same plan
    assert st.figures["tier_map"] is tier_map


def test_recommend_uses_the_calls_control(st):
    st.set(passes=2)
    rec = st.recommend()
    assert rec.calls_per_step == 2 and "per call × 2 calls" in st.message


def test_a_result_for_older_controls_says_so(st):
    st.set(tier="pageable")
    st.simulate()
    assert "press Simulate" not in st.status_html()
    st.set(passes=2)  # not live: the result on display is for one call per step
    assert "for the controls before the last change: press Simulate" in st.status_html()
    other = st.other_order_run()  # the other order of the run on display, not of the new controls
    assert int(other.meta.get("passes", 1)) == 1


def test_a_pipeline_spec_is_explored_as_its_components_side_by_side(tiny_pipe):
    spec = offload_lab.spec_of(tiny_pipe)
    st = ExplorerState(spec, host="64GiB", tokens=64, live=False)
    assert st.spec.group_names == spec.group_names
    assert {"transformer.blocks", "vae.decoder.up_blocks"} <= set(st.plan.table()["group"])
    run = st.simulate()
    assert run.simulated and set(run.layers["group"]) == set(spec.group_names)
    with pytest.raises(ExplorerError, match=r"spec_of\(pipe\)"):
        ExplorerState(tiny_pipe)


def test_engines_frame_is_made_when_asked_for_the_controls():
    """compare_engines(): engines.compare() on the selected profile, host, device memory and
    calls; kept per controls (pressed again with nothing changed, no new simulation)."""
    st = ExplorerState("wan2.1-t2v-1.3b", host="64GiB", live=False)
    assert st.engines_frame is None and st.engines_stale()
    frame = st.compare_engines()
    want = offload_lab.engines.compare(st.spec, "h200", host=HostMemory(available="64GiB"),
                                       device_memory=st.device_memory_bytes())
    assert frame[["engine", "settings", "fits"]].equals(want[["engine", "settings", "fits"]])
    assert frame["step_s"].tolist() == pytest.approx(want["step_s"].tolist())
    assert isinstance(st.figures["engines"], go.Figure) and not st.engines_stale()
    assert st.compare_engines() is frame
    st.set(passes=2)
    assert st.engines_stale() and "controls changed" in st.engines_view_html()
    two = st.compare_engines()
    assert (two["step_s"] > frame["step_s"]).all()  # two forwards a step
