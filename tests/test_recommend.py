"""recommend(): the best plan fits and is at least as fast as any valid plan; the truths the
search must find; bad input; confirm() on the real (cpu) backend; the CLI and the report."""

import warnings
from functools import cache

import pytest
import torch
from conftest import XSS
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import offload_lab
from offload_lab import DeviceProfile, HostMemory, catalog, synthetic
from offload_lab.cli.app import main
from offload_lab.planning.errors import PlanError, PlanWarning
from offload_lab.planning.grants import store_bytes
from offload_lab.simulation.recommend import RecommendError, recommend

GiB = 2**30
#: (model, device, host available, device memory, calls per step)
SCENARIOS = [
    ("wan2.1-t2v-14b", "rtx4090-pcie4", "64GiB", "24GiB", 1),
    ("minimax-h3", "rtx5090-pcie5", "40GiB", None, 2),
]


def sim_step(p, device, passes=1):
    """The steady-state step of a plan by the public simulator (the second of two steps)."""
    run = offload_lab.simulate(p, device, steps=2, passes=passes)
    return float(run.steps["wall_s"].iloc[-1])


@cache
def rec_of(i):
    model, dev, host, mem, calls = SCENARIOS[i]
    return recommend(catalog.load(model), dev, host=host, device_memory=mem, calls_per_step=calls)


# -- the property -----------------------------------------------------------------------------------
@pytest.mark.parametrize("i", range(len(SCENARIOS)))
def test_best_fits_and_its_step_is_the_simulators(i):
    rec = rec_of(i)
    best = rec.best
    assert best.fits and best.ledger["fits"] and best.ledger["device_fits"]
    assert best.ledger["device_peak_bytes"] <= rec.device_memory
    assert sim_step(best, rec.profile, rec.calls_per_step) == pytest.approx(rec.best_row["step_s"], rel=1e-9)
    assert bool(rec.tried.loc[rec.best_row["id"], "front"])


plan_args = st.fixed_dictionaries({
    "resident": st.integers(0, 50), "residency": st.sampled_from(["leading", "strided"]),
    "prefetch": st.integers(0, 4), "order": st.sampled_from(["execution", "strided", "largest", "reverse"]),
    "tier": st.sampled_from([None, None, "pinned", "pageable", "mapped"]),
    "budget_share": st.one_of(st.none(), st.floats(0, 1)),
})


def _valid_plan(rec, args):
    """A plan from drawn arguments, with the resident count lowered until it fits the device
    (so every draw gives a valid plan rather than being thrown away)."""
    budget = None if args["budget_share"] is None else int(args["budget_share"] * rec.host.spendable)
    k = args["resident"]
    while True:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PlanWarning)
                p = offload_lab.plan(rec.spec, pin_budget=budget, resident=k, residency=args["residency"],
                                     order=args["order"], prefetch=args["prefetch"], tier=args["tier"],
                                     host=rec.host, device_memory=rec.device_memory)
        except PlanError:
            return None
        if p.ledger["device_fits"] or k == 0:
            return p
        k -= 1


@pytest.mark.parametrize("i", range(len(SCENARIOS)))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(args=plan_args)
def test_no_valid_plan_beats_the_recommendation_by_more_than_the_tolerance(i, args):
    rec = rec_of(i)
    p = _valid_plan(rec, args)
    assume(p is not None and p.fits)
    assert sim_step(p, rec.profile, rec.calls_per_step) >= rec.best_row["step_s"] / (1 + rec.tolerance) * (1 - 0.005)


# -- the objective: the pace, then the least spent ---------------------------------------------------
@cache
def spent_rec(model):
    return recommend(catalog.load(model), "rtx4090-pcie4", host="64GiB", device_memory="24GiB")


@pytest.mark.parametrize("model", ["minimax-h3", "wan2.1-t2v-14b"])
def test_nothing_tried_keeps_the_pace_with_fewer_pins(model):
    rec = spent_rec(model)
    t, b = rec.tried[rec.tried["fits"]], rec.best_row
    keep = t[t["step_s"] <= t["step_s"].min() * (1 + rec.tolerance)]
    assert rec.tolerance == 0.01 and int(b["id"]) in set(keep["id"])
    assert not (keep["pinned_bytes"] < b["pinned_bytes"]).any()
    near = t[t["step_s"] <= b["step_s"] * (1 + rec.tolerance)]  # within the tolerance of the best's step
    assert not (near["pinned_bytes"] < b["pinned_bytes"]).any()
    same = keep[keep["pinned_bytes"] == b["pinned_bytes"]]
    assert not (same["device_peak_bytes"] < b["device_peak_bytes"]).any()
    # the search tried the smallest footprints: nothing pinned, nothing resident
    assert ((t["pinned_bytes"] == 0) & (t["resident_layers"] == 0)).any()


@pytest.mark.parametrize("model", ["minimax-h3", "wan2.1-t2v-14b"])
def test_a_pinning_best_beats_its_twin_that_pins_nothing(model):
    rec = spent_rec(model)
    best, b = rec.best, rec.best_row
    twin = offload_lab.plan(rec.spec, pin_budget=0, resident=int(b["resident"]), residency=b["residency"],
                            prefetch=best.prefetch, order=b["order"], host=rec.host,
                            device_memory=rec.device_memory)
    fastest = rec.tried.loc[rec.tried["fits"], "step_s"].min()
    keeps = twin.fits and sim_step(twin, rec.profile) <= fastest * (1 + rec.tolerance)
    if best.ledger["pinned_bytes"] > GiB:
        assert not keeps
    else:  # compute hides the copies on this card: the answer pins nothing and says so
        assert keeps and best.ledger["pinned_bytes"] == 0
        assert "compute-bound" in rec.explanation and "pinning buys nothing here" in rec.explanation
        assert "of device memory free" in rec.explanation


def test_tolerance_zero_is_the_fastest_and_bad_tolerance_is_one_line():
    spec = catalog.load("wan2.1-t2v-1.3b")
    rec = recommend(spec, "h200", host="64GiB", tolerance=0)
    assert rec.best_row["step_s"] == rec.tried.loc[rec.tried["fits"], "step_s"].min()
    loose = recommend(spec, "h200", host="64GiB")
    assert loose.best.ledger["pinned_bytes"] <= rec.best.ledger["pinned_bytes"]
    assert loose.best.ledger["device_peak_bytes"] <= rec.best.ledger["device_peak_bytes"]
    for bad in (-0.1, 1.0, float("nan"), "1%", True):
        with pytest.raises(RecommendError, match="tolerance") as e:
            recommend(spec, "h200", host="64GiB", tolerance=bad)
        assert "\n" not in str(e.value)


def test_step_times_say_their_calls():
    rec = recommend(catalog.load("wan2.1-t2v-14b"), "rtx4090-pcie4", host="64GiB", device_memory="24GiB",
                    calls_per_step=2)
    step = rec.best_row["step_s"]
    assert f"{step / 2:.3f} s per call × 2 calls = {step:.3f} s/step" in rec.summary()
    assert f"{step / 2:.3f} s per call × 2 calls = {step:.3f} s/step" in rec.explanation


# -- truths -----------------------------------------------------------------------------------------
SLOW = DeviceProfile("slow-link", {"pinned": 4.0, "pageable": 1.0, "mapped_warm": 1.0},
                     tflops=2000.0, memory_bytes=24 * GiB)


def test_device_larger_than_the_model_is_as_fast_as_every_layer_resident_when_copies_cost():
    spec = catalog.load("wan2.1-t2v-14b")
    rec = recommend(spec, SLOW, host="64GiB", device_memory=spec.total_bytes + 8 * GiB, tolerance=0)
    every = offload_lab.plan(spec, resident=40, host="64GiB", pin_budget=0)
    assert rec.best_row["step_s"] == pytest.approx(sim_step(every, SLOW), rel=1e-9)
    # resident layers keep no pinned host copies they do not need; one layer streamed instead
    # of resident, if it ties, is preferred (same peak, fewer residents)
    assert rec.best.ledger["pinned_bytes"] == 0 and rec.best.tier_counts["resident"] >= 39


def test_room_for_one_layer_in_flight_means_prefetch_0_else_nothing_fits():
    spec = catalog.load("wan2.1-t2v-14b")
    base = offload_lab.plan(spec, prefetch=0, host="64GiB")
    one = base.ledger["device_non_layer_bytes"] + base.ledger["device_activation_bytes"] + \
        max(store_bytes(layer)[0] for layer in spec.group("blocks").layers)
    rec = recommend(spec, "rtx4090-pcie4", host="64GiB", device_memory=one)
    assert rec.best.prefetch == 0 and rec.best.tier_counts["resident"] == 0
    assert rec.best.ledger["device_peak_bytes"] == one
    none = recommend(spec, "rtx4090-pcie4", host="64GiB", device_memory=one - 1)
    assert none.best is None and not none.fits and none.explanation.startswith("No plan fits")
    assert "nothing fits" in repr(none)


def test_zero_pin_budget_pins_nothing():
    spec = catalog.load("minimax-h3")
    rec = recommend(spec, "rtx4090-pcie4", host="64GiB", device_memory="24GiB", pin_budget=0)
    assert rec.best.tier_counts["pinned"] == 0 and int(rec.tried["pinned_bytes"].max()) == 0


def test_on_a_copy_bound_device_pins_beat_prefetch_depth():
    spec = catalog.load("wan2.1-t2v-14b")
    slow = SLOW
    rec = recommend(spec, slow, host="64GiB")
    best = rec.best
    streamed = best.layers[best.layers["streamed"]]
    assert (streamed["tier"] == "pinned").all() and len(streamed) > 0
    # the same residents both ways (as many as fit with 4 layers in flight): every streamed layer
    # pinned at prefetch 1 beats a third of them pinned at prefetch 4
    k = best.tier_counts["resident"]
    while True:
        k -= 1
        kw = dict(resident=k, host="64GiB", device_memory="24GiB")
        pins = offload_lab.plan(spec, prefetch=1, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlanWarning)
            # a third of the streamed layers' bytes (resident layers' host copies take pins too)
            third = int(pins.layers.loc[pins.layers["streamed"], "bytes"].sum()) // 3
            deep = offload_lab.plan(spec, prefetch=4, pin_budget=third, **kw)
        if deep.fits:
            break
    assert pins.fits and deep.fits
    assert sim_step(deep, slow) > sim_step(pins, slow) >= sim_step(best, slow)
    assert "copy-bound" in rec.explanation


def test_wan14b_on_a_24gib_card_with_64gib_host_is_a_real_answer():
    rec = rec_of(0)
    counts = rec.best.tier_counts
    # compute-bound: every block streams, unpinned, and the step is the fastest plan's
    assert counts["resident"] + counts["pinned"] + counts["pageable"] + counts["mapped"] == 40
    assert counts["pinned"] == 0 and counts["resident"] < 40
    assert rec.best.ledger["device_peak_bytes"] <= 24 * GiB
    assert rec.search_s < 60  # a sanity bound only; the speed is measured by benchmarks/recommend.py


def test_front_is_not_dominated_and_the_frame_has_every_plan():
    rec = rec_of(1)
    t = rec.tried
    assert len(t) == len(rec.plans) and list(t["id"]) == list(range(len(t)))
    fit = t[t["fits"]]
    for _, a in rec.front.iterrows():
        better = fit[(fit["step_s"] <= a["step_s"]) & (fit["pinned_bytes"] <= a["pinned_bytes"]) &
                     (fit["device_peak_bytes"] <= a["device_peak_bytes"]) &
                     ((fit["step_s"] < a["step_s"]) | (fit["pinned_bytes"] < a["pinned_bytes"]) |
                      (fit["device_peak_bytes"] < a["device_peak_bytes"]))]
        assert better.empty
    for pid in (0, len(t) - 1):
        p = rec.plan_at(pid)
        assert p.ledger["device_peak_bytes"] == t.loc[pid, "device_peak_bytes"]
    with pytest.raises(RecommendError, match="plan id = 9999"):
        rec.plan_at(9999)


# -- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["nonsense", "-5GiB", 0])
def test_bad_device_memory_is_one_line(bad):
    with pytest.raises(ValueError) as e:
        recommend(catalog.load("wan2.1-t2v-1.3b"), "rtx4090-pcie4", host="64GiB", device_memory=bad)
    assert "\n" not in str(e.value) and repr(bad) in str(e.value)


def test_profile_without_memory_size_needs_device_memory():
    prof = DeviceProfile("no-mem", {"pinned": 20.0}, tflops=100.0)
    with pytest.raises(RecommendError) as e:
        recommend(catalog.load("wan2.1-t2v-1.3b"), prof, host="64GiB")
    assert "\n" not in str(e.value) and "'no-mem'" in str(e.value) and "device_memory=" in str(e.value)
    assert recommend(catalog.load("wan2.1-t2v-1.3b"), prof, host="64GiB", device_memory="24GiB").fits


@pytest.mark.parametrize("kw, match", [({"calls_per_step": 0}, "calls_per_step = 0"),
                                       ({"device": 3}, "device 3"), ({"tokens": "9000p"}, "9000p")])
def test_other_bad_arguments(kw, match):
    args = {"device": "h200", "host": "64GiB", **kw}
    with pytest.raises(ValueError, match=match):
        recommend(catalog.load("wan2.1-t2v-1.3b"), **args)


def test_html_is_escaped():
    spec = catalog.load("wan2.1-t2v-1.3b")
    spec = offload_lab.ModelSpec(XSS, spec.groups, spec.non_layer, spec.meta)
    rec = recommend(spec, "rtx4090-pcie4", host="64GiB")
    assert XSS not in rec._repr_html_() and "&lt;/script&gt;" in rec._repr_html_()
    html = offload_lab.report([offload_lab.simulate(rec.best, rec.profile, steps=1)], recommendation=rec).to_html()
    assert "<script>alert(1)" not in html and 'id="recommend-front"' in html


# -- confirm on the cpu backend ----------------------------------------------------------------------
def test_confirm_runs_best_and_baseline_and_restores_the_model():
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=4)
    inputs = synthetic.example_inputs(model, tokens=32)
    with torch.no_grad():
        before = model(**inputs)
    spec = offload_lab.spec_of(model)
    sizes = [store_bytes(layer)[0] for layer in spec.group("blocks").layers]
    # a slow link, so residents pay (when compute hides every copy, ties go to the smaller device peak)
    dev = DeviceProfile("cpu-ish", {"pinned": 0.05, "pageable": 0.02, "mapped_warm": 0.02},
                        compute_s={"blocks": 1e-4}, compute_mode="sync", memory_bytes=1 * GiB)
    # room for two resident layers and one in flight: a plan with both resident and streamed layers
    mem = spec.non_layer_bytes + offload_lab.plan(spec, host=HostMemory(available="8GiB"), tokens=32) \
        .ledger["device_activation_bytes"] + 3 * max(sizes)
    rec = recommend(spec, dev, host="8GiB", device_memory=mem, tokens=32)
    assert 0 < rec.best.tier_counts["resident"] < 4
    c = rec.confirm(model, lambda: model(**inputs), steps=2, backend="cpu")
    t = c.table.set_index("plan")
    assert list(t.index) == ["recommended", "baseline"] and set(t["backend"]) == {"cpu"}
    assert t.loc["recommended", "predicted_step_s"] == pytest.approx(
        float(offload_lab.simulate(rec.best, dev, steps=2, tokens=32).steps["wall_s"].median()))
    assert (t["measured_step_s"] > 0).all() and (t["measured_device_peak_bytes"] > 0).all()
    assert t.loc["recommended", "predicted_device_peak_bytes"] == rec.best.device_peak
    assert [r.simulated for r in c.runs] == [False, True, False, True]
    assert set(c.speedup) == {"predicted", "measured"}
    html = offload_lab.report(c.runs, recommendation=rec, confirmation=c).to_html()
    assert 'id="confirmation"' in html
    with torch.no_grad():
        assert torch.equal(model(**inputs), before)
    other = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=3)
    with pytest.raises(ValueError, match="is not the model of this recommendation"):
        rec.confirm(other, lambda: None)


# -- the CLI ----------------------------------------------------------------------------------------
def test_cli_prints_the_wan14b_answer_and_writes_a_report(tmp_path, capsys):
    out = tmp_path / "rec.html"
    rc = main(["recommend", "wan2.1-t2v-14b", "--device", "rtx4090-pcie4", "--host-available", "64GiB",
               "--device-memory", "24GiB", "--tokens", "480p", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and out.exists() and 'id="recommendation"' in out.read_text()
    best = next(line for line in text.splitlines() if line.startswith("best:"))
    resident = int(best.split()[1])
    assert 0 <= resident < 40 and "pinned 0 B" in best and "s/step (1 call)" in best
    peak = float(best.split("device peak ")[1].split()[0])
    assert peak <= 24.0 and "front" in text and "SIMULATED" in text


@pytest.mark.parametrize("argv, needle", [
    (["--device-memory", "nonsense"], "'nonsense'"),
    (["--device-memory=-5GiB"], "'-5GiB'"),
    (["--device", "no-such-gpu"], "no-such-gpu"),
    (["--host-available", "lots"], "lots"),
])
def test_cli_bad_input_is_one_line(argv, needle, capsys):
    args = ["recommend", "wan2.1-t2v-1.3b", "--device", "h200", *argv]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err


def test_cli_nothing_fits_exits_1(capsys):
    assert main(["recommend", "minimax-h3", "--device", "rtx4090-pcie4", "--device-memory", "2GiB"]) == 1
    assert "No plan fits" in capsys.readouterr().out


# -- the explorer's Recommend button ------------------------------------------------------------------
def test_explorer_recommend_sets_the_controls_and_a_click_loads_a_front_plan():
    from plotly.callbacks import Points

    from offload_lab.notebook.explorer import PlanExplorer

    ex = PlanExplorer("wan2.1-t2v-14b", profile="rtx4090-pcie4", host="64GiB", live=False)
    assert ex.device_memory_bytes() == 24 * GiB  # the profile's memory size
    ex.recommend_button.click()
    rec = ex.recommendation
    assert ex.error is None and rec is not None
    assert list(ex.plan.layers["tier"]) == list(rec.best.layers["tier"]) and ex.plan.prefetch == rec.best.prefetch
    assert ex.plan.ledger["device_peak_bytes"] == rec.best_row["device_peak_bytes"]
    fig = ex.figures["recommend_front"]
    front = next(t for t in fig.data if t.name == "front")
    assert sorted(int(i) for i in front.customdata) == sorted(int(i) for i in rec.front["id"])
    target = next(k for k, i in enumerate(front.customdata) if int(i) != int(rec.best_row["id"]))
    pid = int(front.customdata[target])
    ex.on_front_click(front, Points(point_inds=[target], xs=[front.x[target]], ys=[front.y[target]],
                                   trace_name="front", trace_index=1))
    row = rec.tried.loc[pid]
    assert ex.resident.value == row["resident"] and ex.prefetch.value == row["prefetch"]
    assert ex.plan.tier_counts["resident"] == row["resident_layers"] and ex.front_choice.value == pid
    ex.device_memory.value = 2.0  # nothing fits a 2 GiB card: the plan says so, Recommend explains
    assert not ex.plan.fits and "does not fit the device" in ex.plan.layers["reason"].iloc[0]
    assert ex.recommend().best is None and "No plan fits" in ex.message


def test_a_pipeline_searches_every_component():
    from offload_lab.planning.pipeline import Component

    comps = [Component("enc", catalog.load("wan2.1-t2v-1.3b"), uses=1),
             Component("dit", catalog.load("wan2.1-t2v-14b"), uses=100)]
    rec = recommend(comps, "rtx4090-pcie4", host="64GiB", device_memory="24GiB")
    assert rec.spec.name == "wan2.1-t2v-14b" and rec.fits
    assert list(rec.components) == ["dit", "enc"] and rec.components["dit"] is rec
    enc = rec.components["enc"]
    assert enc.spec.name == "wan2.1-t2v-1.3b" and enc.fits
    # the encoder was searched against what the DiT left: its device memory less the DiT's
    # kept bytes and its transient, its host less the DiT's new bytes
    led = rec.best.ledger
    assert enc.device_memory == 24 * GiB - led["device_non_layer_bytes"] - led["device_resident_bytes"] - \
        led["device_in_flight_bytes"] - led["device_activation_bytes"]
    assert enc.host.headroom == rec.host.headroom - max(led["pinned_bytes"], led["net_anonymous_bytes"])
    assert "components (rank order" in rec.summary() and "  enc: " in rec.summary()
    with pytest.raises(RecommendError, match="not a list of Components"):
        recommend([1, 2], "h200")


def test_confirm_baseline_differs_from_a_best_that_is_the_default_baseline():
    import dataclasses

    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=4)
    inputs = synthetic.example_inputs(model, tokens=64)
    dev = DeviceProfile("cpu", {"pinned": 5, "pageable": 5, "mapped_warm": 5},
                        compute_s={"blocks": 1e-3}, compute_mode="sync", memory_bytes=GiB)
    rec = recommend(offload_lab.spec_of(model), dev, host="8GiB", tokens=64)
    # where compute hides every pageable copy at prefetch 1 (Wan2.1-1.3B on the h200 profile)
    # the best is the default baseline itself: confirm then compares with prefetch 0
    pageable = offload_lab.plan(rec.spec, tier="pageable", prefetch=1, host=rec.host,
                                device_memory=rec.device_memory, tokens=64)
    rec = dataclasses.replace(rec, best=pageable)
    c = rec.confirm(model, lambda: model(**inputs), steps=2, backend="cpu")
    # runs: recommended measured, simulated, then the baseline's
    assert [r.meta["prefetch"] for r in c.runs] == [1, 1, 0, 0]
    assert c.calls_per_step == 1 and "1 call of fn" in c.summary()
