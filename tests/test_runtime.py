"""The offload runtime on the cpu backend: exactness, frame invariants, restore, startup, mapped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import torch

import offload_lab
from offload_lab import HostMemory, catalog, synthetic
from offload_lab.record.runtime import OffloadError, offload, profile

HOST = HostMemory(available="64GiB")


def _wan(layers=6, seed=0):
    return synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.04, layers=layers, seed=seed,
                           dtype=torch.float32)


def _h3(seed=0, refiner_first=True):
    return synthetic.build(catalog.load("minimax-h3"), scale=0.02, layers={"token_refiner.blocks": 2, "blocks": 6},
                           seed=seed, dtype=torch.float32)


@pytest.fixture(scope="module")
def wan():
    model = _wan()
    inputs = synthetic.example_inputs(model, tokens=48, seed=1)
    with torch.no_grad():
        ref = model(**inputs)
    return model, inputs, ref


@pytest.fixture(scope="module")
def h3():
    model = _h3()
    inputs = synthetic.example_inputs(model, tokens=32, seed=2)
    with torch.no_grad():
        ref = model(**inputs)
    return model, inputs, ref


def _state(model):
    return {k: (v.detach().clone(), v.dtype, v.device, getattr(v, "requires_grad", False))
            for k, v in model.state_dict(keep_vars=True).items()}


def _assert_restored(model, before):
    after = model.state_dict(keep_vars=True)
    assert set(after) == set(before)
    for k, (val, dt, dev, req) in before.items():
        t = after[k]
        assert t.dtype == dt and t.device == dev and getattr(t, "requires_grad", False) == req, k
        assert torch.equal(t.detach(), val), k
    for m in model.modules():
        assert not m._forward_pre_hooks and not m._forward_hooks, type(m).__name__
    assert not [t for t in threading.enumerate() if t.name.startswith("offload-lab-copy")]


def _run_steps(model, plan, inputs, steps=2, **kw):
    outs = []
    with offload(model, plan, backend="cpu", **kw) as m, torch.no_grad():
        for _ in range(steps):
            with m.step():
                outs.append(model(**inputs))
    return outs, m.build_run()


@pytest.mark.parametrize("tier", ["pinned", "pageable"])
@pytest.mark.parametrize("prefetch", [0, 1, 2, 3])
def test_bit_identical_per_tier_and_prefetch(wan, tier, prefetch):
    model, inputs, ref = wan
    plan = offload_lab.plan(offload_lab.spec_of(model), tier=tier, prefetch=prefetch, host=HOST)
    outs, run = _run_steps(model, plan, inputs)
    for out in outs:
        assert torch.equal(out, ref)
    assert set(run.events.loc[run.events["kind"] == "copy", "tier"]) == {tier}


@pytest.mark.parametrize("residency,resident", [("leading", 2), ("strided", 3), ("leading", 0.5)])
def test_bit_identical_with_residency(wan, residency, resident):
    model, inputs, ref = wan
    plan = offload_lab.plan(offload_lab.spec_of(model), resident=resident, residency=residency,
                            prefetch=2, host=HOST)
    outs, run = _run_steps(model, plan, inputs)
    assert all(torch.equal(o, ref) for o in outs)
    resident_ids = set(plan.layers.loc[~plan.layers["streamed"], "layer"])
    copied = set(run.events.loc[run.events["kind"] == "copy", "layer"])
    assert resident_ids and not (resident_ids & copied)
    # resident layers are copied once, at init, and never per step
    assert run.meta["init"]["resident_bytes_copied"] == int(plan.layers.loc[~plan.layers["streamed"], "bytes"].sum())


def test_bit_identical_explicit_order_and_budget(wan):
    model, inputs, ref = wan
    spec = offload_lab.spec_of(model)
    two = int(offload_lab.plan(spec, host=HOST).layers["bytes"].iloc[0]) * 2
    plan = offload_lab.plan(spec, order=[4, 1, 5, 0, 2, 3], pin_budget=two, host=HOST)
    assert sorted(plan.layers.loc[plan.layers["tier"] == "pinned", "layer"]) == [1, 4]
    outs, run = _run_steps(model, plan, inputs)
    assert all(torch.equal(o, ref) for o in outs)
    tiers = run.events[run.events["kind"] == "copy"].groupby("layer")["tier"].first()
    assert tiers[1] == "pinned" and tiers[0] == "pageable"


def test_bit_identical_two_groups(h3):
    model, inputs, ref = h3
    spec = offload_lab.spec_of(model)
    assert spec.group_names == ["token_refiner.blocks", "blocks"]
    for tier in ("pinned", "pageable"):
        plan = offload_lab.plan(spec, tier=tier, prefetch=1, host=HOST)
        outs, run = _run_steps(model, plan, inputs)
        assert all(torch.equal(o, ref) for o in outs)
        assert set(run.events["group"]) == {"token_refiner.blocks", "blocks"}


def test_frame_invariants(wan):
    model, inputs, _ = wan
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned", prefetch=1, host=HOST)
    run = profile(model, lambda: model(**inputs), plan, steps=3, warmup=1, backend="cpu")
    ev = run.events
    assert list(run.steps["step"]) == [1, 2, 3] and run.meta["warmup_dropped"] == 1
    streamed_bytes = int(plan.layers.loc[plan.layers["streamed"], "bytes"].sum())
    assert run.steps["bytes_moved"].tolist() == [streamed_bytes] * 3
    for _step, g in ev.groupby("step"):
        comp = g[g["kind"] == "compute"].sort_values("start_s")
        # compute intervals never overlap each other
        assert (comp["start_s"].to_numpy()[1:] >= comp["end_s"].to_numpy()[:-1]).all()
        for row in comp.itertuples():
            copy = g[(g["kind"] == "copy") & (g["layer"] == row.layer)]
            assert len(copy) == 1
            # the copy ends before its compute starts; when compute had to wait, a wait row shows it
            assert copy["end_s"].iloc[0] <= row.start_s + 1e-9
            wait = g[(g["kind"] == "wait") & (g["layer"] == row.layer)]
            if len(wait):
                assert wait["end_s"].iloc[0] <= row.start_s + 1e-9
    assert (ev["dur_s"] >= 0).all()
    assert set(run.layers.columns) >= {"copy_s", "compute_s", "stall_s", "gbps"}
    assert len(run.layers) == len(plan.layers)


def test_pageable_blocks_the_host(wan):
    model, inputs, _ = wan
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pageable", prefetch=1, host=HOST)
    _, run = _run_steps(model, plan, inputs)
    copies = run.events[run.events["kind"] == "copy"]
    blocks = run.events[run.events["kind"] == "host_block"]
    assert len(blocks) == len(copies) > 0
    assert (blocks["stream"] == "host").all()


def test_restore_after_normal_exit_exception_and_interrupt(wan):
    model, inputs, ref = wan
    before = _state(model)
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned", resident=1, prefetch=2, host=HOST)
    profile(model, lambda: model(**inputs), plan, steps=1, warmup=0, backend="cpu")
    _assert_restored(model, before)

    calls = []

    def boom():
        calls.append(1)
        model(**inputs)
        raise RuntimeError("user code failed")

    with pytest.raises(RuntimeError, match="user code failed"):
        profile(model, boom, plan, steps=2, backend="cpu")
    _assert_restored(model, before)

    def interrupt():
        model.blocks[0](*[]) if False else None
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with offload(model, plan, backend="cpu") as m, m.step():
            model(**inputs)
            interrupt()
    _assert_restored(model, before)
    with torch.no_grad():
        assert torch.equal(model(**inputs), ref)


def test_entering_twice_is_an_error(wan):
    model, _, _ = wan
    plan = offload_lab.plan(offload_lab.spec_of(model), host=HOST)
    with offload(model, plan, backend="cpu"):
        with pytest.raises(OffloadError, match="already under an offload manager"):
            with offload(model, plan, backend="cpu"):
                pass


def test_plan_for_another_model_is_refused(wan):
    model, _, _ = wan
    other = offload_lab.plan(offload_lab.spec_of(_wan(layers=4)), host=HOST)
    with pytest.raises(OffloadError, match="layers"):
        with offload(model, other, backend="cpu"):
            pass


def test_bad_backend_messages(wan):
    model, _, _ = wan
    plan = offload_lab.plan(offload_lab.spec_of(model), host=HOST)
    with pytest.raises(OffloadError, match="'gpu' is not one of"):
        with offload(model, plan, backend="gpu"):
            pass
    if not torch.cuda.is_available():
        with pytest.raises(OffloadError, match="no CUDA device"):
            with offload(model, plan, backend="cuda"):
                pass


def test_startup_peak_grouped_below_naive():
    # the large group is declared second: naive makes it transiently resident
    model = _h3()
    spec = offload_lab.spec_of(model)
    assert spec.group("blocks").bytes > spec.group("token_refiner.blocks").bytes
    plan = offload_lab.plan(spec, tier="pageable", prefetch=1, host=HOST)
    peaks = {}
    for init in ("grouped", "naive"):
        with offload(model, plan, backend="cpu", init=init) as m:
            pass
        peaks[init] = m._meta["startup_peak_bytes"]
        predicted = plan.startup_peak(init)
        assert abs(peaks[init] - predicted) <= 0.03 * predicted, (init, peaks[init], predicted)
    assert peaks["grouped"] < peaks["naive"]


_MAPPED_SCRIPT = r"""
import json, sys, torch
import offload_lab
from offload_lab import HostMemory, catalog, synthetic
from offload_lab.record.runtime import offload
path = sys.argv[1]
model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.25, layers=4, dtype=torch.bfloat16)
inputs = synthetic.example_inputs(model, tokens=16)
with torch.no_grad():
    ref = model(**inputs)
synthetic.save(model, path)
del model
loaded = synthetic.load(path, mmap=True)
spec = offload_lab.spec_of(loaded)
out = {"layer_bytes": spec.layer_bytes, "mapped_bytes": int(spec.layers["mapped_bytes"].sum())}
for tier in ("mapped", "pageable"):
    plan = offload_lab.plan(spec, tier=tier, prefetch=1, host=HostMemory(available="64GiB"))
    with offload(loaded, plan, backend="cpu") as m, torch.no_grad():
        with m.step():
            y = loaded(**inputs)
    out[tier] = m._meta["net_anonymous_bytes"]
    out[tier + "_equal"] = bool(torch.equal(y, ref))
print(json.dumps(out))
"""


def test_mapped_tier_adds_no_anonymous_memory(tmp_path):
    # its own process, with glibc returning large frees at once, so RssAnon reads true
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    proc = subprocess.run([sys.executable, "-c", _MAPPED_SCRIPT, str(tmp_path / "ckpt")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    layer_bytes = r["layer_bytes"]
    assert r["mapped_bytes"] == layer_bytes  # every layer tensor is a view of the file
    assert r["mapped_equal"] and r["pageable_equal"]
    assert abs(r["mapped"]) < 0.1 * layer_bytes
    assert 0.8 * layer_bytes < r["pageable"] < 1.3 * layer_bytes


def test_profile_sizes_cpu_threads_and_restores_them(wan, monkeypatch):
    """On the cpu backend a spinning OpenMP team leaves a core to the copy engine, and the
    user's thread count is back afterwards (also after fn raises); passive OpenMP: untouched."""
    model, inputs, _ = wan
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned")
    cores = len(os.sched_getaffinity(0))
    before = torch.get_num_threads()
    seen = []

    def fn():
        seen.append(torch.get_num_threads())
        return model(**inputs)

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    try:
        torch.set_num_threads(2)
        profile(model, fn, plan, steps=1, warmup=0, backend="cpu")
        assert set(seen) == {min(2, max(1, cores - 1))}
        assert torch.get_num_threads() == 2
        with pytest.raises(ZeroDivisionError):
            profile(model, lambda: 1 / 0, plan, steps=1, warmup=0, backend="cpu")
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
        seen.clear()
        profile(model, fn, plan, steps=1, warmup=0, backend="cpu")
        assert set(seen) == {2}
    finally:
        torch.set_num_threads(before)
