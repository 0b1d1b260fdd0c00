"""viz: figures built from real frames carry the traces, lanes and labels they must."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import offload_lab
from offload_lab import catalog
from offload_lab.record.run import Run, display_label
from offload_lab.views import figures as viz
from offload_lab.views.figures import TIER_COLORS, VizError

HOST = offload_lab.HostMemory(available="256GiB")


@pytest.fixture(scope="module")
def h3_plan():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return offload_lab.plan(catalog.load("minimax-h3"), pin_budget="24GiB",
                                host=offload_lab.HostMemory(available="96GiB"))


@pytest.fixture(scope="module")
def h3_sim(h3_plan) -> Run:
    """Two groups (token_refiner.blocks + 50 blocks), pinned and pageable layers, 5 steps."""
    return offload_lab.simulate(h3_plan, "h200", steps=5)


def _bars(fig) -> int:
    return sum(len(t.x) for t in fig.data if t.type == "bar")


def test_timeline_lanes_and_traces_single_group(measured):
    pinned, pageable = measured
    fig = viz.timeline(pinned)
    names = {t.name for t in fig.data}
    assert {"compute · pinned", "copy · pinned"} <= names
    assert {y for t in fig.data for y in t.y} <= {"compute", "copy"}
    fig = viz.timeline(pageable)
    names = {t.name for t in fig.data}
    # the legend says what blocked the host in this run: a pageable copy, not a staging copy
    assert {"compute · pageable", "copy · pageable", "host blocked by a pageable copy"} <= names
    assert not any("staging" in n for n in names)
    lanes = {y for t in fig.data for y in t.y}
    assert lanes == {"compute", "copy", "host"}
    host = next(t for t in fig.data if t.name.startswith("host blocked"))
    assert set(host.y) == {"host"}
    # bars are coloured by tier, consistently across figures
    for t in fig.data:
        if t.name.endswith("· pageable"):
            assert t.marker.color == TIER_COLORS["pageable"]
    # every event is drawn, and as few traces as there are tier × kind pairs
    assert _bars(fig) == len(pageable.events)
    assert len(fig.data) <= 2 * len(TIER_COLORS) + 2


def test_timeline_two_groups_many_layers(h3_sim):
    fig = viz.timeline(h3_sim)
    lanes = [y for y in fig.layout.yaxis.categoryarray][::-1]
    assert lanes == ["compute · token_refiner.blocks", "compute · blocks",
                     "copy · token_refiner.blocks", "copy · blocks", "host"]
    names = {t.name for t in fig.data}
    assert {"copy · pinned", "copy · pageable", "compute · pinned", "compute · pageable",
            "host blocked by a pageable copy"} <= names
    assert _bars(fig) == len(h3_sim.events) > 52 * 5
    assert len(fig.data) <= 10
    # the step selector: one button per step plus "all steps", opening on the first step
    (menu,) = fig.layout.updatemenus
    labels = [b.label for b in menu.buttons]
    assert labels == [f"step {s}" for s in h3_sim.steps["step"]] + ["all steps"]
    assert list(fig.layout.xaxis.range) == list(menu.buttons[0].args[0]["xaxis.range"])
    assert "SIMULATED" in fig.layout.title.text
    # readable and small: a fixed height and compact JSON even for 52 layers × 5 steps
    assert fig.layout.height <= 480
    assert len(fig.to_json()) < 600_000


def test_timeline_hover_has_group_layer_tier_bytes_duration_gbps(h3_sim):
    fig = viz.timeline(h3_sim)
    copy = next(t for t in fig.data if t.name == "copy · pinned")
    for part in ("customdata[0]", "customdata[1]", "customdata[2]", "customdata[3]",
                 "customdata[4]", "customdata[5]"):
        assert part in copy.hovertemplate
    row = copy.customdata[0]
    assert row[0] in ("blocks", "token_refiner.blocks")
    assert row[2] == "pinned"
    assert row[3].endswith("iB") and row[5].endswith("GB/s")


def test_timeline_marks_stalls(measured, h3_sim):
    for run in measured + [h3_sim]:
        fig = viz.timeline(run)
        waits = run.events[run.events["kind"] == "wait"]
        stall = [t for t in fig.data if t.name.startswith("stall")]
        assert len(stall) == (1 if len(waits) else 0)
        if len(waits):
            assert stall[0].marker.color == viz.STALL_COLOR
            assert len(stall[0].x) == len(waits)


def test_timeline_one_step(h3_sim):
    step = int(h3_sim.steps["step"].iloc[2])
    fig = viz.timeline(h3_sim, step=step)
    assert not fig.layout.updatemenus
    assert _bars(fig) == int((h3_sim.events["step"] == step).sum())
    with pytest.raises(VizError, match=r"step 99 was not measured .* accepted: one of \[0, 1, 2, 3, 4\]"):
        viz.timeline(h3_sim, step=99)
    with pytest.raises(VizError, match="not an offload_lab.Run"):
        viz.timeline("run.zip")


def test_measured_figures_do_not_say_simulated(measured):
    fig = viz.timeline(measured[0])
    assert "SIMULATED" not in fig.layout.title.text
    assert "SIMULATED" not in viz.memory(measured[0]).layout.title.text


def test_tier_map_from_plan_has_reasons_and_pin_ranks(h3_plan):
    fig = viz.tier_map(h3_plan)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == set(h3_plan.layers["tier"])
    assert sum(len(t.y) for t in fig.data) == len(h3_plan.layers)
    pinned = by_name["pinned"]
    assert pinned.marker.color == TIER_COLORS["pinned"]
    ranks = sorted(int(x) for x in pinned.text)
    assert ranks == sorted(h3_plan.layers["pin_rank"].dropna().astype(int))
    reasons = {row[6] for t in fig.data for row in t.customdata}
    assert reasons == set(h3_plan.layers["reason"].map(viz.esc))
    # two groups, in declared order, as labelled spans of one axis
    assert [a.text for a in fig.layout.annotations] == ["<b>token_refiner.blocks</b>", "<b>blocks</b>"]
    xs = sorted(x for t in fig.data for x in t.x)
    assert xs == list(range(len(h3_plan.layers)))
    first = next(t for t in fig.data if 0 in list(t.x))
    assert first.customdata[list(first.x).index(0)][0] == "token_refiner.blocks"


def test_tier_map_from_run(h3_sim, measured):
    fig = viz.tier_map(h3_sim)
    assert "SIMULATED" in fig.layout.title.text
    assert sum(len(t.y) for t in fig.data) == len(h3_sim.layers)
    fig = viz.tier_map(measured[0])
    assert [t.name for t in fig.data] == ["pinned"]
    with pytest.raises(VizError, match="expected an offload_lab.Plan or an offload_lab.Run"):
        viz.tier_map({"tier": "pinned"})


def test_memory_has_four_series(measured, h3_sim):
    for run in (measured[0], h3_sim):
        fig = viz.memory(run)
        assert [t.name for t in fig.data] == ["device", "pinned host", "anonymous host", "mapped (file pages)"]
        assert all(len(t.x) == len(run.memory) for t in fig.data)
    assert "SIMULATED" in viz.memory(h3_sim).layout.title.text


def test_step_times_ratio_annotations_and_simulated_marks(measured, h3_sim):
    runs = measured + [h3_sim]
    fig = viz.step_times(runs)
    (bar,) = fig.data
    assert len(bar.y) == 3
    assert bar.text[0].endswith("×1.00")
    assert bar.text[1].endswith(viz.fmt_ratio(measured[1].step_time / measured[0].step_time))
    # a simulation of another model is not divided by a cpu measurement: no ratio on its bar
    assert bar.text[2] == viz.fmt_seconds(h3_sim.step_time)
    assert "no ratio" in bar.customdata[2][3] and "model" in bar.customdata[2][3]
    assert "(simulated)" in bar.y[2] and "simulated" not in bar.y[0]
    assert list(bar.marker.pattern.shape) == ["", "", viz.SIM_PATTERN]
    assert bar.marker.pattern.fillmode == "overlay"  # hatching over the colour, not instead of it
    assert "hatched = simulated (1 of 3)" in fig.layout.title.subtitle.text
    # the label that would break HTML is escaped for plotly, which shows it as text
    assert bar.y[1].startswith("&lt;/script&gt;")


def test_step_times_duplicate_labels_stay_apart(measured):
    fig = viz.step_times([measured[0], measured[0]])
    assert list(fig.data[0].y) == ["pinned", "pinned #2"]


def test_bandwidth_per_tier(measured, h3_sim):
    runs = measured + [h3_sim]
    fig = viz.bandwidth(runs)
    by_tier = {t.name: t for t in fig.data}
    assert set(by_tier) == {"pinned", "pageable"}
    sim_row = next(i for i, y in enumerate(by_tier["pinned"].y) if "simulated" in y)
    assert by_tier["pinned"].x[sim_row] == pytest.approx(
        offload_lab.analysis.summary.metrics(h3_sim)["gbps"]["pinned"], rel=1e-3)
    assert by_tier["pinned"].marker.color == TIER_COLORS["pinned"]


def test_startup_peaks_from_plan_and_runs(h3_plan, measured):
    fig = viz.startup_peaks(h3_plan)
    grouped, naive = fig.data  # one trace per strategy, one bar per prediction
    assert (grouped.name, naive.name) == ("grouped", "naive")
    assert grouped.x[0] < naive.x[0]  # grouped init never makes later groups transiently resident
    assert all("(predicted)" in t.y[0] for t in fig.data)
    fig = viz.startup_peaks(measured)
    # both cpu runs used one strategy: one trace, one bar each, no empty group for "naive"
    (bar,) = fig.data
    assert bar.name == measured[0].meta["init_strategy"] and len(bar.y) == len(measured)
    assert bar.y[1].startswith("&lt;/script&gt;") and all("measured" in c for c in bar.customdata)
    # a simulated run's peak is never labelled measured; it is drawn on the GPU panel
    sim = Run.build([], [], measured[0].layers, meta={
        "label": "predicted", "simulated": True, "startup_peak_bytes": 2**30, "init_strategy": "naive"})
    (bar,) = viz.startup_peaks([sim]).data
    assert bar.name == "naive" and list(bar.customdata) == ["simulated"]
    # cpu-backend runs (MiB) and GPU-scale bars (GiB) never share an axis
    fig = viz.startup_peaks([h3_plan, *measured])
    assert {t.xaxis for t in fig.data} == {"x", "x2"}
    assert fig.layout.xaxis.title.text == "GiB at startup" and fig.layout.xaxis2.title.text != "GiB at startup"
    # a plan of the very model the cpu runs ran sits with them, on their axis (both MiB-small)
    _spec, same = offload_lab.plan_of_run(measured[0])
    fig = viz.startup_peaks([same, *measured])
    assert {t.xaxis for t in fig.data} == {"x"} and any("(predicted)" in y for t in fig.data for y in t.y)
    assert "cpu-backend runs" in fig.layout.annotations[0].text
    with pytest.raises(VizError, match="item 0 is int"):
        viz.startup_peaks([3])
    with pytest.raises(VizError, match="expected a Plan, a Run, or a list"):
        viz.startup_peaks(3)


def test_host_ledger_and_tier_bytes(h3_plan, measured):
    led = h3_plan.ledger
    fig = viz.host_ledger(h3_plan)
    parts = {t.name: t.x[0] for t in fig.data}
    gib = 2**30
    # what the host has adds up to what is available; what the plan spends to the spendable
    assert abs((parts["reserve"] + parts["spendable"]) * gib - led["available"]) < 2**20
    assert abs(parts["pinned"] * gib - led["pinned_bytes"]) < 2**20
    spent = sum(v for k, v in parts.items() if k not in ("reserve", "spendable", "over spendable"))
    if led["net_anonymous_bytes"] <= led["spendable"]:
        assert abs(spent * gib - led["spendable"]) < 2**20
    with pytest.raises(VizError, match="expected an offload_lab.Plan"):
        viz.host_ledger(measured[0])
    fig = viz.tier_bytes([h3_plan, *measured])
    # the plan's bar is the largest, so the axis reads in GiB
    for t in fig.data:
        want = h3_plan.layers.loc[h3_plan.layers["tier"] == t.name, "bytes"].sum()
        assert abs(t.x[0] * gib - want) < 2**20, t.name
    assert list(fig.data[0].y)[0] == "plan of minimax-h3" and len(fig.data[0].y) == 1 + len(measured)
    with pytest.raises(VizError, match="item 0 is int"):
        viz.tier_bytes([3])


def test_tier_map_labels_every_pinned_rank_and_no_resident(h3_plan):
    fig = viz.tier_map(h3_plan)
    for t in fig.data:
        ranks = [x for x in t.text if x]
        if t.name == "pinned":
            assert len(ranks) == len(t.x) and t.textposition == "outside"
        else:
            assert ranks == [], t.name
    plan = offload_lab.plan(catalog.load("wan2.1-t2v-14b"), resident=3, pin_budget="16GiB", host=HOST)
    res = [t for t in viz.tier_map(plan).data if t.name == "resident"]
    assert res and all(not x for x in res[0].text)  # resident layers never stream: no rank


def test_figure_json_cannot_end_a_script_element(measured):
    figs = [viz.timeline(measured[1]), viz.step_times(measured), viz.memory(measured[1]),
            viz.tier_map(measured[1]), viz.bandwidth(measured), viz.startup_peaks(measured),
            viz.tier_bytes(measured)]
    for fig in figs:
        text = fig.to_json()
        assert "</script" not in text.lower()
        assert "<script" not in text.lower()
        json.loads(text)  # and it is still JSON


def test_tier_colours_are_distinct():
    assert len(set(TIER_COLORS.values())) == len(TIER_COLORS)
    assert viz.tier_color("nonsense") == TIER_COLORS["unknown"]


def test_formatters():
    from offload_lab.views import tables, text

    # one home: the names figures still export are the text module's own functions
    assert (viz.fmt_seconds, viz.fmt_ratio, viz.fmt_percent) == (text.fmt_seconds, text.fmt_ratio, text.fmt_percent)
    assert viz.comparison_frame is tables.comparison_frame
    assert text.fmt_seconds(0.002) == "2 ms" and text.fmt_bytes(1536) == "1.50 KiB"
    assert viz.fmt_seconds(0.9996) == "1 s"
    assert viz.fmt_seconds(float("nan")) == "–"
    assert viz.fmt_ratio(np.float64(1.9)) == "×1.90"
    assert viz.fmt_percent(np.float64(0.25)) == "25 %"


def test_comparison_frame_reads_like_compare(measured, h3_sim):
    runs = measured + [h3_sim]
    raw, text = offload_lab.compare(runs), viz.comparison_frame(runs)
    assert text["run"].tolist() == [display_label(r) for r in runs]
    assert text["backend"].tolist() == ["cpu", "cpu", "sim (simulated)"]
    assert text["step"].tolist() == [viz.fmt_seconds(r.step_time) for r in runs]
    assert text["ratio"][0] == "×1.00"
    assert text["ratio"][1] == viz.fmt_ratio(measured[1].step_time / measured[0].step_time)
    assert text["ratio"][2] == "" and "no ratio" in text["note"][2] and "model" in text["note"][2]
    assert text["overlap"].tolist() == [f"{100 * x:.0f} %" for x in raw["overlap"]]


def test_figures_say_why_they_are_empty():
    spec = catalog.load("wan2.1-t2v-14b")
    run = offload_lab.simulate(offload_lab.plan(spec, resident=40, host=HOST), "h200", steps=2)
    fig = viz.bandwidth([run])
    assert not fig.data and "no timed copies" in fig.layout.annotations[0].text
    # an all-resident run still has a timeline: compute only, no copy lane
    lanes = {y for t in viz.timeline(run).data for y in t.y}
    assert lanes == {"compute"}
    fig = viz.startup_peaks([run.__class__.build([], [], run.layers, meta={"label": "nothing"})])
    assert not fig.data and "no startup peaks" in fig.layout.annotations[0].text


LABELS = [f"rtx4090-pcie4 · 480p tokens · {t} (simulated)" for t in ("pinned", "pageable", "8GiB pin budget")]


@pytest.fixture(scope="module")
def labelled() -> list[Run]:
    """Runs labelled as the widgets label them: device and tokens shared, the tier differs."""
    spec = catalog.load("wan2.1-t2v-14b")
    plans = [offload_lab.plan(spec, tier="pinned", host=HOST), offload_lab.plan(spec, tier="pageable", host=HOST),
             offload_lab.plan(spec, pin_budget="8GiB", host=HOST)]
    return [offload_lab.simulate(p, "h200", steps=2, tokens="480p", label=lab)
            for p, lab in zip(plans, LABELS)]


def test_labels_put_what_differs_first_and_share_the_rest(labelled):
    for fig in (viz.step_times(labelled), viz.bandwidth(labelled)):
        ys = list(fig.layout.yaxis.categoryarray)[::-1]
        assert {y for t in fig.data for y in t.y} == set(ys)
        assert ys == ["pinned (simulated)", "pageable (simulated)", "8GiB pin budget (simulated)"]
        assert "rtx4090-pcie4 · 480p tokens" in fig.layout.title.text
        assert "…" not in fig.layout.title.text
    # the same labels twice stay apart, and the hover keeps each run's full label
    fig = viz.step_times(labelled + labelled[:1])
    assert list(fig.data[0].y)[-1] == "pinned (simulated) #2"
    assert fig.data[0].customdata[0][0] == LABELS[0]


def test_long_labels_wrap_instead_of_being_cut(labelled):
    long = "rtx4090-pcie4 · 480p tokens · a long description of this particular plan · prefetch 1"
    run = offload_lab.simulate(offload_lab.plan(catalog.load("wan2.1-t2v-14b"), tier="pinned", host=HOST),
                               "h200", steps=1, label=long)
    for fig in (viz.timeline(run), viz.memory(run), viz.tier_map(run)):
        title = fig.layout.title.text
        assert "…" not in title and "prefetch 1" in title and "<br>" in title
        # said once: the SIMULATED tag, not also "(simulated)" and "(sim)"
        assert "(simulated)" not in title and title.count("SIMULATED") == 1
        sub = fig.layout.title.subtitle.text
        assert "(sim)" not in sub and "(simulated)" not in sub
    (bar,) = viz.step_times([run, labelled[0]]).data
    assert all("…" not in y for y in bar.y) and "prefetch 1" in bar.y[0]


def test_time_axes_in_ms_when_steps_are_short(measured, h3_sim):
    fast = measured[0]
    assert fast.step_time < 1
    fig = viz.timeline(fast)
    assert fig.layout.xaxis.title.text == "time (ms from run start)"
    bars = [t for t in fig.data if t.type == "bar"]
    starts = sorted(b for t in bars for b in t.base)
    assert starts[0] == pytest.approx(fast.events["start_s"].min() * 1e3, abs=1e-6)
    assert max(b + x for t in bars for b, x in zip(t.base, t.x)) == pytest.approx(
        fast.events["end_s"].max() * 1e3, abs=1e-6)
    assert viz.memory(fast).layout.xaxis.title.text == "time (ms from run start)"
    fig = viz.step_times(measured)
    assert fig.layout.xaxis.title.text == "ms per step"
    assert fig.data[0].x[0] == pytest.approx(fast.step_time * 1e3)
    # steps of seconds stay in seconds
    assert h3_sim.step_time > 1
    assert viz.timeline(h3_sim).layout.xaxis.title.text == "time (s from run start)"
    assert viz.step_times([h3_sim]).layout.xaxis.title.text == "s per step"


def test_pinned_vs_pageable_from_the_shipped_runs_keeps_sources_apart_and_marks_unconfirmed():
    from offload_lab.views import story

    measured, simulated = story.story_runs()
    df = story.story_frame(measured, simulated)
    # the measured pair is the shipped H200 runs' own step times, before-compute order
    steps = {r.label: r.step_time for r in offload_lab.shipped_runs("wan2.1-t2v-14b")}
    m14 = df[(df["source"] == story.SOURCES[0]) & (df["model"] == "wan2.1-t2v-14b")].set_index("tier")
    assert m14.loc["pinned", "step_s"] == steps["14B pinned p1"]
    assert m14.loc["pageable", "step_s"] == steps["14B pageable p1"]
    assert set(m14["issue"]) == {"before-compute"}
    assert m14.loc["pageable", "vs_pinned"] == pytest.approx(steps["14B pageable p1"] / steps["14B pinned p1"])
    # the after-compute pageable prediction is unconfirmed; the before-compute one carries its band
    after = df[(df["source"] == "simulated after-compute") & (df["tier"] == "pageable")]
    before = df[(df["source"] == "simulated before-compute") & (df["tier"] == "pageable")]
    assert set(after["status"]) == {"unconfirmed"} and after["band"].isna().all()
    assert set(before["status"]) == {"held-out"} and (before["band"] > 0).all()
    # every ratio is within one source, model and token count: the reported pair only against itself
    rep = df[df["source"] == story.SOURCES[3]].set_index("tier")
    assert rep.loc["pageable", "vs_pinned"] == pytest.approx(1.90 / 1.03)

    fig = story.pinned_vs_pageable(measured, simulated)
    names = [t.name for t in fig.data]
    assert [n.split(" — ")[0] for n in names] == list(story.SOURCES)
    by = {t.name.split(" — ")[0]: t for t in fig.data}
    assert "prediction" in by["simulated after-compute"].name
    assert any("unconfirmed" in s for s in by["simulated after-compute"].text)
    assert all("unconfirmed" not in s for s in by["measured (before-compute)"].text)
    assert set(by["reported (another runtime)"].x[0]) == {"Wan2.1<br>reported"}
    assert list(by["reported (another runtime)"].y) == [1.03, 1.90]
    assert by["simulated before-compute"].error_y.visible
    assert by["simulated after-compute"].marker.pattern.shape == "x"
    with pytest.raises(VizError, match="no all-pinned or all-pageable"):
        story.story_frame([r for r in offload_lab.shipped_runs() if "half" in r.label])


def test_pipeline_timeline_draws_only_the_lanes_that_recorded_something(tiny_pipe):
    """A whole-pipeline run plans the VAE's encoder too, which text-to-video never calls: the
    timeline has a lane per group that ran (the transformer, the VAE's decoder), none empty."""
    from tiny_pipelines import STEPS

    from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_call

    pspec = offload_lab.spec_of(tiny_pipe).with_uses(steps=STEPS, passes=2)
    pplan = offload_lab.plan_pipeline(pspec, pin_budget=pspec["transformer"].spec.layer_bytes)
    with offload_lab.offload(tiny_pipe, pplan, backend="cpu") as m:
        tiny_pipe(**tiny_wan_call(steps=STEPS))
    run = m.build_run()
    assert any(g.startswith("vae.encoder") for g in run.layers["group"])
    fig = viz.timeline(run)
    lanes = list(fig.layout.yaxis.categoryarray)
    drawn = {y for t in fig.data if t.type == "bar" for y in t.y}
    assert set(lanes) == drawn
    assert not [n for n in lanes if "encoder" in n]
    assert {"compute · transformer.blocks", "compute · vae.decoder.up_blocks"} <= set(lanes)
