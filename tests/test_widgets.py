"""PlanExplorer: controls → plan → simulate / run → figures, driven without a browser."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import warnings

import pytest
import torch

import offload_lab
from offload_lab import catalog, synthetic
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.planner import PlanWarning
from offload_lab.record.run import Run, display_label

W = pytest.importorskip("ipywidgets")
from offload_lab.notebook.explorer import (  # noqa: E402
    HYPOTHETICAL_HOSTS_GIB,
    RESTART_NOTICE,
    ExplorerError,
    PlanExplorer,
)

GIB = 2**30


@pytest.fixture(scope="module")
def wan14() -> offload_lab.ModelSpec:
    return catalog.load("wan2.1-t2v-14b")


@pytest.fixture()
def ex(wan14) -> PlanExplorer:
    return PlanExplorer(wan14, host="64GiB", live=False)


@pytest.fixture(scope="module")
def tiny():
    """A 3-block Wan-shaped model, its inputs, and a copy of its weights to check restore."""
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=3)
    inputs = synthetic.example_inputs(model, tokens=32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    return model, inputs, before


def direct_plan(ex: PlanExplorer, **overrides) -> offload_lab.Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        return offload_lab.plan(ex.spec, host=ex.host, **{**ex.plan_kwargs(), **overrides})


# -- controls → plan ------------------------------------------------------------------------------
def test_budget_slider_top_means_everything_the_host_can_spend(ex):
    assert ex.host_choice.value == "given"
    assert ex.pin_budget() is None
    assert ex.plan.tier_counts["pinned"] == 40
    # the slider ends at the model's layer bytes: more budget could not change the plan
    assert ex.budget.max * GIB >= ex.spec.layer_bytes > (ex.budget.max - ex.budget.step) * GIB


def test_budget_slider_sets_the_pin_budget(ex):
    ex.budget.value = 8.0
    assert ex.pin_budget() == 8 * GIB
    assert ex.plan.tier_counts == {"resident": 0, "pinned": 12, "staged": 0, "pageable": 28, "mapped": 0}
    assert ex.plan.layers.equals(direct_plan(ex).layers)
    assert ex.plan.ledger["budget"] == 8 * GIB


def test_every_control_reaches_the_plan(ex):
    ex.budget.value = 8.0
    ex.resident.value = 4
    ex.residency.value = "strided"
    ex.order.value = "reverse"
    ex.prefetch.value = 2
    ex.tier.value = "pageable"
    params = ex.plan.params
    assert (params["resident"], params["residency"], params["order"], params["prefetch"],
            params["tier"]) == (4, "strided", "reverse", 2, "pageable")
    assert ex.plan.tier_counts["resident"] == 4
    assert ex.plan.resident_layers("blocks") != [0, 1, 2, 3]  # strided, not leading
    assert ex.plan.layers.equals(direct_plan(ex).layers)
    ex.tier.value = "auto"
    assert ex.plan.params["tier"] is None


def test_order_decides_who_gets_the_pins(ex):
    ex.budget.value = 8.0
    ex.order.value = "reverse"
    pinned = ex.plan.layers.loc[ex.plan.layers["tier"] == "pinned", "layer"].tolist()
    assert pinned == list(range(28, 40))


def test_host_choice_moves_the_slider_range(ex, wan14):
    hosts = dict((v, k) for k, v in ex.host_choice.options)
    assert {"probe", *(f"{g}GiB" for g in HYPOTHETICAL_HOSTS_GIB)} <= set(hosts)
    ex.host_choice.value = "16GiB"
    spend = HostMemory(available="16GiB").spendable
    assert ex.budget.max * GIB >= spend > (ex.budget.max - ex.budget.step) * GIB
    assert ex.budget.value == ex.budget.max  # "everything" stays "everything"
    assert ex.plan.ledger["spendable"] == spend
    assert ex.plan.ledger["pinned_bytes"] <= spend
    ex.budget.value = 4.0
    ex.host_choice.value = "128GiB"
    assert ex.budget.value == 4.0  # a chosen budget survives a larger host
    assert ex.pin_budget() == 4 * GIB


def test_default_host_for_a_spec_can_pin_all_of_it(wan14):
    ex = PlanExplorer(wan14, live=False)
    assert ex.host_choice.value != "probe"
    assert ex.host.spendable >= ex.spec.layer_bytes
    assert ex.plan.tier_counts["pinned"] == 40


def test_a_refused_combination_keeps_the_plan_and_says_why(ex):
    ex.tier.value = "pinned"
    good = ex.plan
    ex.budget.value = 0.0
    assert ex.plan is good
    assert "PlanError" in ex.error and "pin budget" in ex.error
    assert "error" in ex.status.value
    ex.simulate_button.click()  # the stale plan on display is not simulated
    assert ex.last_run is None and "no valid plan" in ex.error
    ex.budget.value = 8.0
    assert ex.error is None and ex.plan is not good
    ex.simulate_button.click()
    assert ex.error is None and ex.last_run is not None


def test_ledger_and_reasons_are_shown(ex):
    ex.budget.value = 8.0
    assert "spendable" in ex.ledger_html.value and "powers of two" in ex.ledger_html.value
    assert "pinned: rank 1" in ex.reasons_html.value
    assert "12 pinned" in ex.status.value


# -- plan → runs → figures --------------------------------------------------------------------
def test_simulate_button_makes_a_labelled_simulated_run_and_timeline(ex):
    ex.budget.value = 8.0
    ex.simulate_button.click()
    assert ex.error is None
    run = ex.last_run
    assert isinstance(run, Run) and run.simulated and run.backend == "sim"
    assert "(simulated)" in display_label(run) and len(run.steps) == ex.steps.value
    assert run.layers["tier"].tolist() == ex.plan.layers["tier"].tolist()
    assert "SIMULATED" in ex.figures["timeline"].layout.title.text
    assert not ex.add_button.disabled


def test_live_mode_simulates_on_every_change(wan14):
    ex = PlanExplorer(wan14, host="64GiB", profile="rtx4090-pcie4", live=True)
    first = ex.last_run
    assert first is not None and first.simulated
    ex.tier.value = "pageable"
    assert ex.last_run is not first
    assert set(ex.last_run.layers["tier"]) == {"pageable"}
    assert ex.last_run.meta["profile"]["name"] == "rtx4090-pcie4"


def test_profile_dropdown_picks_the_device(ex):
    ex.profile_choice.value = "rtx4090-pcie4"
    ex.simulate_button.click()
    slow = ex.last_run.step_time
    ex.profile_choice.value = "h200"
    ex.simulate_button.click()
    assert ex.last_run.step_time < slow


def test_comparison_pinned_vs_pageable(ex):
    ex.simulate_button.click()
    ex.add_button.click()
    ex.add_button.click()  # the same run is kept once
    assert len(ex.runs) == 1
    ex.tiers_button.click()
    assert ex.error is None
    assert len(ex.runs) == 3
    pinned, pageable = ex.runs[1:]
    assert set(pinned.layers["tier"]) == {"pinned"} and set(pageable.layers["tier"]) == {"pageable"}
    # the default after-compute issue order can hide pageable copies: never faster than pinned
    assert pageable.step_time >= pinned.step_time * (1 - 1e-12)
    assert ex.tier.value == "auto"  # the forced tier was only for the comparison
    bars = ex.figures["step_times"].data[0]
    assert len(bars.x) == 3 and all("simulated" in y for y in bars.y)
    assert "pageable" in ex.comparison_html.value
    ex.clear_button.click()
    assert ex.runs == [] and "step_times" not in ex.figures


def test_export_report(ex, tmp_path):
    ex.simulate_button.click()
    ex.add_to_comparison()
    ex.report_path.value = str(tmp_path / "explorer.html")
    ex.export_button.click()
    assert ex.error is None
    text = ex.report_file.read_text(encoding="utf-8")
    assert "SIMULATED" in text and "plotly-graph-div" in text
    assert str(ex.report_file) in ex.status.value


def test_add_without_a_run_is_an_error_not_a_crash(ex):
    ex.add_button.click()
    assert ex.runs == []
    assert "Simulate or Run" in ex.error


def test_run_button_profiles_the_real_model_and_restores_it(tiny):
    model, inputs, before = tiny
    calls = []

    def step():
        calls.append(1)
        return model(**inputs)

    ex = PlanExplorer(model, fn=step, live=False, steps=2, warmup=1, backend="cpu")
    assert ex.host_choice.value == "probe" and not ex.run_button.disabled
    ex.tier.value = "pageable"
    ex.run_button.click()
    assert ex.error is None, ex.error
    run = ex.last_run
    assert not run.simulated and run.backend == "cpu"
    assert "measured on cpu" in run.label
    assert set(run.layers["tier"]) == {"pageable"} and len(run.steps) == 2
    assert len(calls) == 3
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # the measured run is offered as a calibrated device profile
    calibrated = [k for k in ex.profile_choice.options if k.startswith("calibrated")]
    assert calibrated
    ex.profile_choice.value = calibrated[0]
    ex.simulate_button.click()
    assert ex.error is None and ex.last_run.simulated


def test_run_needs_fn(wan14, tiny):
    ex = PlanExplorer(wan14, host="64GiB", live=False)
    assert ex.run_button.disabled
    with pytest.raises(ExplorerError, match="fn"):
        ex.run()
    model, _, _ = tiny
    assert PlanExplorer(model, live=False).run_button.disabled


@pytest.mark.parametrize("kwargs, match", [
    ({"model_or_spec": 42}, "model_or_spec 42"),
    ({"model_or_spec": "not-a-model"}, "not-a-model"),
    ({"model_or_spec": "wan2.1-t2v-1.3b", "fn": lambda: None}, "spec"),
    ({"model_or_spec": "wan2.1-t2v-1.3b", "profile": "tpu-v9"}, "tpu-v9"),
    ({"model_or_spec": "wan2.1-t2v-1.3b", "host": "lots"}, "lots"),
    ({"model_or_spec": "wan2.1-t2v-1.3b", "steps": 0}, "steps = 0"),
    ({"model_or_spec": "wan2.1-t2v-1.3b", "backend": "tpu"}, "tpu"),
])
def test_bad_arguments_name_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PlanExplorer(live=False, **kwargs)


def test_given_device_profile_is_offered_first(wan14):
    prof = offload_lab.DeviceProfile.load("h200").replace(name="my-box")
    ex = PlanExplorer(wan14, profile=prof, host="64GiB", live=False)
    assert ex.profile_choice.value == "my-box"
    ex.simulate_button.click()
    assert ex.last_run.meta["profile"]["name"] == "my-box"


def test_two_groups_show_startup_peaks():
    ex = PlanExplorer("minimax-h3", host="64GiB", live=False)
    ex.resident.value, ex.residency.value = 35, "strided"
    assert ex.plan.streamed_layers("blocks")[:3] == [1, 5, 8]
    assert "startup_peaks" in ex.figures
    assert "naive" in ex.ledger_html.value


def test_displays_as_a_widget(ex):
    bundle = ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("<PlanExplorer 'wan2.1-t2v-14b'")


def test_a_notice_to_rerun_the_cell_is_an_output_of_its_own(ex):
    """After a kernel restart the widget's views are gone; a plain HTML output before them stays."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()
    with capture_output() as shown:
        ex._ipython_display_()
    first, second = shown.outputs
    assert first.data["text/html"] == RESTART_NOTICE and "run this cell again" in RESTART_NOTICE
    assert "application/vnd.jupyter.widget-view+json" not in first.data
    assert "application/vnd.jupyter.widget-view+json" in second.data
    assert second.data["text/plain"].startswith("<PlanExplorer 'wan2.1-t2v-14b'")
    # the widget's own title no longer carries the note: it is said once, where it survives
    assert "run this cell again" not in ex.title.value


def test_figures_for_export_carry_html():
    """The outputs' figures carry text/html too: plotly >= 6.1's mimetype alone is lost by nbconvert."""
    from offload_lab.notebook.display import figure_bundle

    ex = PlanExplorer("wan2.1-t2v-1.3b", host="64GiB", live=False)
    bundle = figure_bundle(ex.figures["tier_map"])
    assert "application/vnd.plotly.v1+json" in bundle
    assert "plotly-graph-div" in bundle["text/html"]


def test_import_offload_lab_stays_light():
    code = ("import sys, offload_lab; heavy = [m for m in ('ipywidgets', 'plotly', 'IPython') "
            "if m in sys.modules]; print(heavy); assert not heavy, heavy; "
            "assert offload_lab.PlanExplorer.__name__ == 'PlanExplorer'; "
            "assert 'ipywidgets' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_outputs_hold_figures_in_a_kernel(monkeypatch, wan14):
    """In a kernel the figures go into the Output widgets' outputs, html included."""
    monkeypatch.setattr("offload_lab.notebook.display._in_kernel", lambda: True)
    ex = PlanExplorer(wan14, host="64GiB", live=False)
    ex.simulate_button.click()
    ex.tiers_button.click()
    for out, n in ((ex.tier_map_out, 1), (ex.timeline_out, 1), (ex.comparison_out, 2)):
        assert len(out.outputs) == n
        data = out.outputs[0]["data"]
        # a FigureWidget (with anywidget installed) or the plotly mimetype, and the HTML for export
        assert ("application/vnd.jupyter.widget-view+json" in data or "application/vnd.plotly.v1+json" in data)
        assert "plotly-graph-div" in data["text/html"]
    ex.clear_button.click()
    assert ex.comparison_out.outputs == ()


def test_figures_drawn_by_a_page_are_updated_in_place(monkeypatch, wan14):
    """Once a page has drawn a figure's view, a new timeline reaches it in place: the output is
    not sent again, and the view holds the new figure; without a page, figures are sent whole."""
    pytest.importorskip("anywidget")
    from offload_lab.notebook.plot_view import PlotView

    monkeypatch.setattr("offload_lab.notebook.display._in_kernel", lambda: True)
    ex = PlanExplorer(wan14, host="64GiB", live=True)
    first = ex.timeline_out.outputs
    ex.tier.value = "pageable"  # no page drew the widget: a new one, whole, HTML included
    assert ex.timeline_out.outputs is not first and "plotly-graph-div" in ex.timeline_out.outputs[0]["data"]["text/html"]
    model = ex.timeline_out.outputs[0]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the registry of live widgets, by model id
        widget = W.Widget.widgets[model]
    assert isinstance(widget, PlotView)
    sent = widget.figure_json
    # what the page's view says once it has drawn the figure
    widget.set_state({"drawn": 1})
    shown = ex.timeline_out.outputs
    ex.issue.value = "before-compute"
    assert ex.timeline_out.outputs is shown  # nothing re-sent: the view was given the new figure
    new = ex.figures["timeline"]
    assert widget.figure is new and widget.figure_json != sent
    assert json.loads(widget.figure_json)["layout"]["title"]["text"] == new.layout.title.text
    assert [t["name"] for t in json.loads(widget.figure_json)["data"]] == [t.name for t in new.data]


def _from_page(widget, content: dict) -> None:
    """Deliver a custom message to ``widget`` as the kernel does one from the page's view."""
    widget.comm.handle_msg({"content": {"comm_id": widget.comm.comm_id,
                                        "data": {"method": "custom", "content": content}}, "buffers": []})


def test_views_share_one_plotly_and_a_click_on_the_front_loads_its_plan(monkeypatch):
    """Every figure view refers to one plotly.js holder (the saved state keeps it once), and a
    click the page reports on a point of the front loads that point's plan; a click naming no
    point on display is ignored."""
    pytest.importorskip("anywidget")
    from offload_lab.notebook import plot_view

    monkeypatch.setattr("offload_lab.notebook.display._in_kernel", lambda: True)
    ex = PlanExplorer("wan2.1-t2v-14b", profile="rtx4090-pcie4", host="64GiB", live=True)
    ex.recommend_button.click()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the registry of live widgets, by model id
        views = [W.Widget.widgets[o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]]
                 for out in (ex.timeline_out, ex.tier_map_out, ex.recommend_out) for o in out.outputs]
    assert len(views) == 3 and all(isinstance(v, plot_view.PlotView) for v in views)
    assert len({id(v.library) for v in views}) == 1
    assert views[0].library.source.encode("utf-8") == plot_view.plotly_js()
    front = views[2]
    curve = next(i for i, t in enumerate(front.data) if t.name == "front")
    trace = front.data[curve]
    target = next(k for k, i in enumerate(trace.customdata) if int(i) != int(ex.recommendation.best_row["id"]))
    pid = int(trace.customdata[target])
    _from_page(front, {"kind": "click", "points": [{"curve": 99, "index": 0}, {"curve": curve, "index": "x"}]})
    assert ex.front_choice.value == int(ex.recommendation.best_row["id"]) and ex.error is None
    _from_page(front, {"kind": "click", "points": [{"curve": curve, "index": target}]})
    row = ex.recommendation.tried.loc[pid]
    assert ex.front_choice.value == pid
    assert ex.resident.value == row["resident"] and ex.prefetch.value == row["prefetch"]


# -- pinned vs pageable: the pinned arm is all pinned, whatever the budget control says ------------
def test_pinned_arm_ignores_the_pin_budget(ex):
    ex.budget.value = 0.0  # a zero budget used to make the pinned arm fail with a PlanError
    assert ex.plan.tier_counts["pinned"] == 0
    assert not ex.tiers_button.disabled
    ex.tiers_button.click()
    assert ex.error is None, ex.error
    pinned, pageable = ex.runs
    assert set(pinned.layers["tier"]) == {"pinned"}
    assert set(pageable.layers["tier"]) == {"pageable"}


def test_pinned_arm_says_when_the_host_cannot_pin_everything(wan14):
    # 16 GiB available: 14 GiB spendable, the 40 blocks need 26 GiB
    ex = PlanExplorer(wan14, host="16GiB", live=False)
    pinned, _ = ex.compare_tiers()
    counts = pinned.layers["tier"].value_counts()
    assert 0 < counts.get("pinned", 0) < 40
    assert "not all pinned" in ex.message and "can spend" in ex.message


def test_tiers_button_is_disabled_with_a_reason_when_nothing_can_be_pinned(wan14):
    # 2 GiB available is all reserve: not one 670 MiB block can be pinned
    ex = PlanExplorer(wan14, host="2GiB", live=False)
    assert ex.tiers_button.disabled
    assert "not possible" in ex.tiers_button.tooltip and "can spend 0 B" in ex.tiers_button.tooltip
    with pytest.raises(ExplorerError, match="all-pinned run is not possible"):
        ex.compare_tiers()
    ex.host_choice.value = "64GiB"
    assert not ex.tiers_button.disabled
    ex.resident.value = ex.resident.max  # all resident: nothing streamed to compare
    assert ex.tiers_button.disabled and "nothing is streamed" in ex.tiers_button.tooltip


# -- the resident slider applies per group ---------------------------------------------------------
def test_resident_slider_says_it_applies_per_group():
    ex = PlanExplorer("minimax-h3", host="256GiB", live=False)
    assert "per group" in ex.resident.description
    ex.resident.value = 35
    # 35 of the 50 blocks and both of the 2 refiner blocks
    assert ex.plan.tier_counts["resident"] == 37
    note = ex.resident_note.value
    assert "35 per group" in note and "37 resident" in note and "token_refiner.blocks 2" in note


def test_single_group_slider_reads_resident_layers(ex):
    assert ex.resident.description == "resident layers" and ex.resident_note.value == ""


def test_tokens_and_steps_are_bounded_like_the_cli(wan14):
    with pytest.raises(ExplorerError, match="tokens .* out of range"):
        PlanExplorer(wan14, host="64GiB", tokens=10**23, live=False)
    with pytest.raises(ExplorerError, match=r"steps = 100000000; accepted: an int in \[1, 1000\]"):
        PlanExplorer(wan14, host="64GiB", steps=10**8, live=False)
    with pytest.raises(ExplorerError, match="too large"):
        PlanExplorer(wan14, host="1e400", live=False)
    assert PlanExplorer(wan14, host="64GiB", tokens="480p", live=False).tokens == "480p"


def test_every_html_widget_escapes_strings_from_the_spec(wan14, tmp_path):
    """A spec named by a checkpoint directory or a shared plan reaches the dashboard's HTML widgets
    only escaped: the name of a hostile spec never appears there as markup."""
    payload = "<img src=x onerror=alert(1)>"
    spec = copy.deepcopy(wan14)
    spec.name = payload
    ex = PlanExplorer(spec, host="64GiB", live=False)
    ex.simulate_button.click()
    ex.add_button.click()
    html_values = []

    def walk(w):
        if isinstance(w, W.HTML):
            html_values.append(w.value)
        for child in getattr(w, "children", ()):
            walk(child)

    walk(ex.widget)
    assert html_values and any("&lt;img src=x onerror=alert(1)&gt;" in v for v in html_values)
    assert not any(payload in v for v in html_values)


# -- issue order, calls per step, evidence; a run in progress; a layout that cuts nothing -----------
def test_issue_and_calls_controls_drive_the_simulation_and_the_status(ex):
    ex.tier.value = "pageable"
    ex.passes.value = 2
    ex.simulate_button.click()
    run = ex.last_run
    assert ex.issue.value == "after-compute" and run.meta["issue"] == "after-compute"
    assert int(run.meta["passes"]) == 2
    assert "unconfirmed — no GPU run of this issue order yet" in ex.status.value
    assert "per call × 2 calls = " in ex.status.value
    assert "<b>other order</b>: before-compute order" in ex.status.value
    ex.issue.value = "before-compute"
    ex.simulate_button.click()
    assert ex.last_run.meta["issue"] == "before-compute"
    assert "<b>other order</b>: after-compute order" in ex.status.value


def test_live_simulation_follows_every_control():
    ex = PlanExplorer("wan2.1-t2v-14b", host="64GiB", live=True)
    ex.tier.value = "pageable"
    first = ex.last_run.step_time
    ex.issue.value = "before-compute"
    assert ex.last_run.meta["issue"] == "before-compute" and ex.last_run.step_time != first


def test_run_disables_its_button_and_says_running(tiny):
    model, inputs, _ = tiny
    seen = []
    ex = None

    def step():
        seen.append((ex.run_button.disabled, "running…" in ex.status.value,
                     ex.progress.layout.visibility))
        return model(**inputs)

    ex = PlanExplorer(model, fn=step, live=False, steps=2, warmup=1, backend="cpu")
    ex.simulate_button.click()
    assert "simulated on" in ex.status.value
    ex.run_button.click()
    assert seen and all(off and running for off, running, _ in seen), seen
    assert seen[-1][2] == "visible"
    assert not ex.run_button.disabled and "running…" not in ex.status.value
    assert ex.progress.layout.visibility == "hidden"
    # the cpu backend has no device memory: no "measured device peak" for it
    assert "device peak predicted" not in ex.message and "no device peak on the cpu backend" in ex.message
    # the progress bar sits beside the Run button, in its row
    row = next(c for c in ex.widget.children if isinstance(c, W.HBox) and ex.run_button in c.children)
    assert ex.progress in row.children


def test_plan_warnings_are_in_the_status(ex):
    ex.tier.value = "pinned"
    ex.budget.value = 3.0
    assert "<b>warning</b>: tier &#x27;pinned&#x27; forced" in ex.status.value  # escaped HTML


def test_layout_gives_labels_and_tabs_room():
    ex = PlanExplorer("minimax-h3", host="64GiB", live=False)
    assert ex.resident.description == "resident per group"
    for w in ex.controls.values():
        desc = getattr(w, "description", "")
        width = w.style.description_width if hasattr(w.style, "description_width") else ""
        if desc and width.endswith("px"):
            # about 7 px a character at the widgets' 13 px font
            assert int(width[:-2]) >= 7 * len(desc), (desc, width)
        if w.layout.width:
            assert w.layout.min_width == w.layout.width  # a row never squeezes a control
    titles = [ex.tabs.get_title(i) for i in range(len(ex.tabs.children))]
    assert titles == ["Timeline", "Tier map", "Plan", "Comparison", "Recommend", "Engines"]
    assert max(map(len, titles)) <= 12


def test_only_changed_figures_are_sent_again(monkeypatch, wan14):
    """A simulator option (issue order) leaves the tier map's output as it is: it is not re-sent."""
    monkeypatch.setattr("offload_lab.notebook.display._in_kernel", lambda: True)
    ex = PlanExplorer(wan14, host="64GiB", live=True)
    ex.tier.value = "pageable"
    tier_map, timeline = ex.tier_map_out.outputs, ex.timeline_out.outputs
    ex.issue.value = "before-compute"
    assert ex.tier_map_out.outputs is tier_map and ex.timeline_out.outputs is not timeline


# -- the Engines tab: other engines' settings, simulated when asked ----------------------------------
def test_engines_tab_compares_on_demand_and_escapes(monkeypatch, wan14):
    """The tab exists; nothing is simulated for it until Compare engines is pressed (a control
    change leaves it alone, and says it is stale); then its table and figure are shown."""
    monkeypatch.setattr("offload_lab.notebook.display._in_kernel", lambda: True)
    spec = copy.deepcopy(catalog.load("wan2.1-t2v-1.3b"))
    spec.name = "<img src=x onerror=alert(1)>"
    ex = PlanExplorer(spec, host="64GiB", live=False)
    titles = [ex.tabs.get_title(i) for i in range(len(ex.tabs.children))]
    assert titles[-1] == "Engines" and ex.engines_button in ex.tabs.children[-1].children
    assert ex.state.engines_frame is None and "engines" not in ex.figures
    assert "Press Compare engines" in ex.engines_html.value and ex.engines_out.outputs == ()
    ex.prefetch.value = 2
    assert ex.state.engines_frame is None  # a control change simulates no engine
    ex.engines_button.click()
    frame = ex.state.engines_frame
    assert len(frame) == len(offload_lab.engines.grid()) and "engines" in ex.figures
    table = ex.engines_html.value
    assert "diffusers-group" in table and "sglang-layerwise" in table and "pinned (locked)" in table
    assert "&lt;img src=x onerror=alert(1)&gt;" in table and spec.name not in table
    assert len(ex.engines_out.outputs) == 1
    # in a kernel the figure is a FigureWidget view, with its static HTML for an exported notebook
    shown = ex.engines_out.outputs[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in shown and "plotly-graph-div" in shown["text/html"]
    assert ex.message.startswith("engines compared (simulated)")
    ex.passes.value = 2
    assert ex.state.engines_frame is frame and "controls changed" in ex.engines_html.value
