"""The staged tier and the issue orders on the cpu backend: exact outputs, timeline, restore, Ctrl-C."""

from __future__ import annotations

import os
import signal

import pytest
import torch

import offload_lab
from offload_lab import HostMemory, catalog, synthetic
from offload_lab.record.run import display_label
from offload_lab.record.runtime import (
    OffloadError,
    OffloadManager,
    offload,
    profile,
    staging,
    stores,
)

HOST = HostMemory(available="64GiB")


def _wan():
    return synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.04, layers=5, dtype=torch.float32)


def _h3():
    return synthetic.build(catalog.load("minimax-h3"), scale=0.02, layers={"token_refiner.blocks": 2, "blocks": 5},
                           seed=4, dtype=torch.float32)


@pytest.fixture(scope="module", params=["wan", "h3"])
def model_case(request):
    model = _wan() if request.param == "wan" else _h3()
    inputs = synthetic.example_inputs(model, tokens=32, seed=5)
    with torch.no_grad():
        ref = model(**inputs)
    return model, inputs, ref


def _state(model):
    return {k: (v.detach().clone(), v.dtype, v.device, v.requires_grad) for k, v in model.named_parameters()}


def _assert_whole(model, before):
    after = dict(model.named_parameters())
    assert set(after) == set(before)
    for k, (val, dt, dev, req) in before.items():
        t = after[k]
        assert (t.dtype, t.device, t.requires_grad) == (dt, dev, req), k
        assert torch.equal(t.detach(), val), k
    for m in model.modules():
        assert not m._forward_pre_hooks and not m._forward_hooks


def _run(model, inputs, plan, **kw):
    outs = []
    run = profile(model, lambda: outs.append(model(**inputs)), plan, steps=2, warmup=0, backend="cpu", **kw)
    return run, outs


@pytest.mark.parametrize("init", ["grouped", "naive"])
@pytest.mark.parametrize("prefetch", [0, 1, 2, 3])
@pytest.mark.parametrize("case", ["staged", "staged-2-threads", "pageable-after",
                                  "pageable-before", "mixed"])
def test_outputs_bit_identical(model_case, init, prefetch, case):
    model, inputs, ref = model_case
    before = _state(model)
    spec = offload_lab.spec_of(model)
    kw, issue = {}, "after-compute"
    if case.startswith("staged"):
        p = offload_lab.plan(spec, tier="staged", prefetch=prefetch, host=HOST)
        kw["stage_threads"] = 2 if case.endswith("threads") else 1
    elif case == "mixed":  # a quarter of the layers' bytes pinned, the rest staged
        budget = spec.layer_bytes // 4 + 2 * max(g.layers[0].bytes for g in spec.groups) * (prefetch + 1)
        p = offload_lab.plan(spec, pin_budget=budget, staging=True, prefetch=prefetch, host=HOST)
    else:
        tier = case.split("-")[0]
        issue = "before-compute" if case.endswith("before") else "after-compute"
        p = offload_lab.plan(spec, tier=tier, prefetch=prefetch, host=HOST)
    run, outs = _run(model, inputs, p, init=init, issue=issue, **kw)
    assert all(torch.equal(o, ref) for o in outs)
    assert run.meta["issue"] == issue
    streamed = p.layers[p.layers["streamed"]]
    assert run.steps["bytes_moved"].tolist() == [int(streamed["bytes"].sum())] * 2
    _assert_whole(model, before)


def test_staged_timeline_has_host_memcpy_rows_separate_from_the_copy(model_case):
    model, inputs, _ = model_case
    p = offload_lab.plan(offload_lab.spec_of(model), tier="staged", prefetch=1, host=HOST)
    run, _ = _run(model, inputs, p)
    ev = run.events
    stage = ev[ev["kind"] == "stage"]
    copy = ev[ev["kind"] == "copy"]
    assert set(stage["stream"]) == {"host_copy"} and set(stage["tier"]) == {"staged"}
    assert len(stage) == len(copy) and stage["bytes"].sum() == copy["bytes"].sum()
    # the device copy of a layer starts after its host memcpy into the staging buffer ended
    key = ["step", "group", "layer"]
    both = stage.merge(copy, on=key, suffixes=("_stage", "_copy"))
    assert (both["start_s_copy"] >= both["end_s_stage"]).all()
    k = {g: v["buffers"] for g, v in p.ledger["staging"].items()}
    assert run.meta["staging"] == {g: {"buffers": k[g], "buffer_bytes": p.ledger["staging"][g]["buffer_bytes"],
                                       "pinned_bytes": 0} for g in k}


def test_after_compute_issues_pageable_copies_behind_the_running_block():
    model = _wan()
    inputs = synthetic.example_inputs(model, tokens=32, seed=5)
    spec = offload_lab.spec_of(model)
    p = offload_lab.plan(spec, tier="pageable", prefetch=1, host=HOST)
    for issue in ("after-compute", "before-compute"):
        run, _ = _run(model, inputs, p, issue=issue)
        ev = run.events
        comp = ev[ev["kind"] == "compute"].set_index(["step", "layer"])
        copy = ev[(ev["kind"] == "copy")]
        for r in copy.itertuples():
            prev = (r.step, r.layer - 1)
            if r.layer == 0 or prev not in comp.index:
                continue
            # prefetch 1: layer l is copied by layer l-1's hooks
            if issue == "after-compute":
                assert r.start_s >= comp.loc[prev, "end_s"]
            else:
                assert r.end_s <= comp.loc[prev, "start_s"]


def test_restore_frees_staging_buffers_and_stops_threads():
    model = _wan()
    inputs = synthetic.example_inputs(model, tokens=32, seed=5)
    before = _state(model)
    p = offload_lab.plan(offload_lab.spec_of(model), tier="staged", prefetch=2, host=HOST)
    with offload(model, p, backend="cpu") as m, torch.no_grad():
        with m.step():
            model(**inputs)
        pools = [g.pool for g in m._groups if g.pool is not None]
        assert [pl.allocated_bytes for pl in pools] == [3 * p.ledger["staging"]["blocks"]["buffer_bytes"]]
        assert m._backend.stagers_alive() == 1
    assert all(pl.allocated_bytes == 0 for pl in pools)
    assert all(g.pool is None for g in m._groups) and m._backend.threads_alive() == 0
    _assert_whole(model, before)


@pytest.mark.parametrize("nth", [1, 3, 7])
def test_ctrl_c_mid_stage_restores_the_model(monkeypatch, nth):
    model = _wan()
    inputs = synthetic.example_inputs(model, tokens=32, seed=5)
    before = _state(model)
    p = offload_lab.plan(offload_lab.spec_of(model), tier="staged", prefetch=1, host=HOST)
    orig, calls = stores.LayerStore.stage_into, []

    def stage_into(self, *a, **kw):  # the signal arrives while the stager thread copies
        calls.append(1)
        if len(calls) == nth:
            os.kill(os.getpid(), signal.SIGINT)
        return orig(self, *a, **kw)

    monkeypatch.setattr(stores.LayerStore, "stage_into", stage_into)
    with pytest.raises(KeyboardInterrupt):
        m = OffloadManager(model, p, backend="cpu")
        with m, torch.no_grad():
            for _ in range(3):
                with m.step():
                    model(**inputs)
    monkeypatch.undo()
    assert len(calls) >= nth and m._backend.threads_alive() == 0
    _assert_whole(model, before)
    run, outs = _run(model, inputs, p)
    with torch.no_grad():
        assert torch.equal(outs[-1], model(**inputs))


def test_staging_size_and_bad_options():
    assert staging.staging_size(1, [3, 9, 4]) == (2, 9)
    model = _wan()
    p = offload_lab.plan(offload_lab.spec_of(model), tier="staged", host=HOST)
    with pytest.raises(OffloadError, match="issue 'early' is not one of"):
        offload(model, p, backend="cpu", issue="early").__enter__()
    with pytest.raises(OffloadError, match="stage_threads = 0; accepted: an int"):
        offload(model, p, backend="cpu", stage_threads=0).__enter__()


def test_planner_stages_h3_on_a_small_pin_budget():
    spec = catalog.load("minimax-h3")
    p = offload_lab.plan(spec, pin_budget="5.32GiB", staging=True, host=HOST)
    led = p.ledger
    main = spec.group("blocks").layers[0].bytes
    assert led["staging"]["blocks"] == {"buffers": 2, "buffer_bytes": main}
    assert led["pinned_bytes"] + led["staging_bytes"] <= led["budget"]
    assert p.tier_counts["staged"] + p.tier_counts["pinned"] == 52
    assert p.reason_of("blocks", 49).startswith("staged through 2 × 1.20 GiB pinned buffers")
    off = offload_lab.plan(spec, pin_budget="5.32GiB", host=HOST)
    assert off.tier_counts["staged"] == 0 and off.ledger["staging_bytes"] == 0


# -- simulator ---------------------------------------------------------------------------------------
def test_simulated_h200_wan14b_staged_near_pinned_and_pageable_after_compute_below_measured():
    spec = catalog.load("wan2.1-t2v-14b")
    host = HostMemory(available="256GiB")
    prof = offload_lab.DeviceProfile.load("h200")
    t = {}
    for name, tier, issue in (("pinned", "pinned", None), ("staged", "staged", None),
                              ("pageable-after", "pageable", "after-compute"),
                              ("pageable-before", "pageable", "before-compute")):
        run = offload_lab.simulate(offload_lab.plan(spec, tier=tier, host=host), prof, steps=3,
                                   tokens="480p", issue=issue)
        assert run.simulated and display_label(run).endswith("(simulated)")
        t[name] = run.step_time
    assert t["staged"] <= 1.15 * t["pinned"]
    assert t["pageable-after"] < 0.8 * 6.38 < t["pageable-before"]


def test_simulated_staging_rows_and_buffer_limit():
    spec = catalog.load("wan2.1-t2v-14b")
    prof = offload_lab.DeviceProfile.load("h200").replace(host_memcpy_gbps=2.0)
    run = offload_lab.simulate(offload_lab.plan(spec, tier="staged", prefetch=3, host=HOST), prof, steps=2)
    ev = run.events
    st, cp = ev[ev["kind"] == "stage"], ev[ev["kind"] == "copy"]
    assert set(st["stream"]) == {"host_copy"} and len(st) == len(cp)
    # memcpy-bound: the stager runs back to back at 2 GB/s
    assert st["dur_s"].median() == pytest.approx(spec.group("blocks").layers[0].bytes / 2e9, rel=0.01)
    with pytest.raises(offload_lab.simulation.ProfileError, match="host_memcpy_gbps"):
        offload_lab.simulate(offload_lab.plan(spec, tier="staged", host=HOST),
                             prof.replace(host_memcpy_gbps=None), steps=1)


def test_calibrate_fits_host_memcpy_from_a_staged_cpu_run():
    model = _wan()
    inputs = synthetic.example_inputs(model, tokens=32, seed=5)
    p = offload_lab.plan(offload_lab.spec_of(model), tier="staged", prefetch=1, host=HOST)
    run, _ = _run(model, inputs, p)
    fit = offload_lab.calibrate(run)
    st = run.events[run.events["kind"] == "stage"]
    assert fit.host_memcpy_gbps == pytest.approx(float((st["bytes"] / st["dur_s"]).median() / 1e9))
    again = offload_lab.simulate(offload_lab.simulation.plan_of_run(run)[1], fit, steps=2)
    assert (again.events["kind"] == "stage").any() == (fit.compute_mode == "async")
