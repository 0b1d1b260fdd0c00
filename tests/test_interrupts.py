"""Ctrl-C at any point of an offloaded or observed run: the model always comes back whole.

A real SIGINT is delivered (``os.kill`` of this process) from inside the runtime at many points,
restore included, and from a timer thread at arbitrary moments; after each, every parameter must
be bit-identical and on its original device and dtype, no hook may remain, and the model must
be usable under a new manager.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

import offload_lab
from offload_lab import HostMemory, catalog, synthetic
from offload_lab.record import observer as observer_mod
from offload_lab.record.runtime import backends, offload, profile, stores

HOST = HostMemory(available="64GiB")
# where the runtime is interrupted: (object, attribute, which call delivers the signal)
POINTS = [
    (stores.LayerStore, "from_module", 3),   # during init, between layers
    (stores.LayerStore, "host_fill", 2),     # during init, inside a layer's fill
    (stores.LayerStore, "unbind", 4),        # during init or a release
    (stores.LayerStore, "bind", 3),          # during a step, as a layer arrives
    (stores.LayerStore, "copy_into", 5),     # inside a copy
    (backends.CpuBackend, "begin_step", 2),  # at a step boundary
    (backends.CpuBackend, "close", 1),       # at the start of restore
    (stores.LayerStore, "restore", 2),       # inside the per-layer restore loop
]


@pytest.fixture(scope="module")
def wan():
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.04, layers=5, dtype=torch.float32)
    inputs = synthetic.example_inputs(model, tokens=32, seed=3)
    with torch.no_grad():
        ref = model(**inputs)
    return model, inputs, ref


def _state(model):
    return {k: (v.detach().clone(), v.dtype, v.device, v.requires_grad)
            for k, v in model.named_parameters()}


def _assert_whole(model, before, inputs, ref):
    after = dict(model.named_parameters())
    assert set(after) == set(before)
    for k, (val, dt, dev, req) in before.items():
        t = after[k]
        assert (t.dtype, t.device, t.requires_grad) == (dt, dev, req), k
        assert t.shape == val.shape and torch.equal(t.detach(), val), k
    for m in model.modules():
        assert not m._forward_pre_hooks and not m._forward_hooks, type(m).__name__
    # offloadable again, with the same output
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned", prefetch=1, host=HOST)
    out = []
    run = profile(model, lambda: out.append(model(**inputs)), plan, steps=1, warmup=0, backend="cpu")
    assert len(run.steps) == 1 and torch.equal(out[-1], ref)


def _sigint_on_call(monkeypatch, owner, name, nth):
    orig = getattr(owner, name)
    calls = []

    def wrapper(*a, **kw):
        calls.append(1)
        if len(calls) == nth:
            os.kill(os.getpid(), signal.SIGINT)
        return orig(*a, **kw)

    if isinstance(owner.__dict__.get(name), classmethod):  # `orig` is already bound to the class
        monkeypatch.setattr(owner, name, classmethod(lambda cls, *a, **kw: wrapper(*a, **kw)))
    else:
        monkeypatch.setattr(owner, name, wrapper)
    return calls


@pytest.mark.parametrize("tier", ["pinned", "pageable"])
@pytest.mark.parametrize(("owner", "name", "nth"), POINTS, ids=[f"{p[1]}#{p[2]}" for p in POINTS])
def test_sigint_anywhere_leaves_the_model_whole(wan, monkeypatch, owner, name, nth, tier):
    model, inputs, ref = wan
    before = _state(model)
    plan = offload_lab.plan(offload_lab.spec_of(model), tier=tier, resident=1, prefetch=2, host=HOST)
    calls = _sigint_on_call(monkeypatch, owner, name, nth)
    with pytest.raises(KeyboardInterrupt):
        with offload(model, plan, backend="cpu") as m, torch.no_grad():
            for _ in range(3):
                with m.step():
                    model(**inputs)
    assert len(calls) >= nth, "the signal was never delivered"
    monkeypatch.undo()
    _assert_whole(model, before, inputs, ref)


def test_sigint_before_enter_changes_nothing(wan):
    model, inputs, ref = wan
    before = _state(model)
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned", host=HOST)
    with pytest.raises(KeyboardInterrupt):
        with offload(model, plan, backend="cpu"):
            pass
        signal.raise_signal(signal.SIGINT)  # lands after leaving: nothing to undo
    _assert_whole(model, before, inputs, ref)


@pytest.mark.parametrize("delay_steps", [0, 1, 2, 4, 7])
def test_sigint_from_a_timer_thread(wan, delay_steps):
    """A signal from another thread lands wherever the main thread is; the model survives."""
    model, inputs, ref = wan
    before = _state(model)
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned", resident=1, prefetch=1, host=HOST)
    done = threading.Event()

    def send():
        os.kill(os.getpid(), signal.SIGINT)
        done.set()

    def progress(k, total):
        if k == delay_steps:
            threading.Thread(target=send).start()

    with pytest.raises(KeyboardInterrupt):
        if delay_steps == 0:
            threading.Thread(target=send).start()
        profile(model, lambda: model(**inputs), plan, steps=8, warmup=0, backend="cpu", progress=progress)
        # the run may end before the signal lands: it is raised here at the latest
        done.wait(30)
    _assert_whole(model, before, inputs, ref)


def test_sigint_inside_the_observers_restore(wan, monkeypatch):
    model, inputs, ref = wan
    before = _state(model)
    handle_cls = type(model.register_forward_hook(lambda *a: None))
    for m in model.modules():
        m._forward_hooks.clear()
    calls = _sigint_on_call(monkeypatch, handle_cls, "remove", 2)
    with pytest.raises(KeyboardInterrupt):
        with observer_mod.observe(model, backend="cpu") as obs, torch.no_grad():
            with obs.step():
                model(**inputs)
    assert len(calls) >= 2
    monkeypatch.undo()
    _assert_whole(model, before, inputs, ref)
    with observer_mod.observe(model, backend="cpu") as obs, obs.step(), torch.no_grad():
        model(**inputs)
    assert len(obs.run.steps) == 1


def test_keyboardinterrupt_raised_inside_restore_is_finished_then_reraised(wan, monkeypatch):
    """The second layer's restore raises KeyboardInterrupt before doing anything: restore retries
    it, finishes every other layer, and the interrupt still reaches the caller."""
    model, inputs, ref = wan
    before = _state(model)
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pageable", prefetch=1, host=HOST)
    orig = stores.LayerStore.restore
    calls = []

    def restore(self):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return orig(self)

    monkeypatch.setattr(stores.LayerStore, "restore", restore)
    with pytest.raises(KeyboardInterrupt):
        with offload(model, plan, backend="cpu") as m, torch.no_grad(), m.step():
            model(**inputs)
    monkeypatch.undo()
    _assert_whole(model, before, inputs, ref)
