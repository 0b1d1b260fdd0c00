"""Steps found without editing the loop: a real diffusers WanPipeline (tiny random config, CPU)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import offload_lab

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from tiny_pipelines import STEPS  # noqa: E402

from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_call  # noqa: E402


def _check_steps(run, blocks: int) -> None:
    assert len(run.steps) == STEPS
    assert run.meta["steps_from"] == "scheduler"
    assert run.steps["calls"].tolist() == [2] * STEPS
    comp = run.events[run.events["kind"] == "compute"]
    # every block runs once per call: 2 calls × 6 blocks per step, calls numbered 0 and 1
    per = comp.groupby(["step", "call"]).size()
    assert per.tolist() == [blocks] * (2 * STEPS)


@pytest.mark.parametrize("tier", ["pinned", "pageable", "mapped"])
def test_offload_transformer_no_markers(tiny_pipe, tiny_reference, tiny_loaded, tiny_loaded_reference, tier):
    if tier == "mapped":  # mapped needs the weights on a checkpoint's pages
        # the loaded pipeline is compared with its own output: loading may round differently
        tiny_pipe, tiny_reference = tiny_loaded, tiny_loaded_reference
        assert all(offload_lab.is_file_backed(p) for p in tiny_pipe.transformer.parameters())
    plan = offload_lab.plan(offload_lab.spec_of(tiny_pipe.transformer), tier=tier)
    sched_step = tiny_pipe.scheduler.step
    with offload_lab.offload(tiny_pipe.transformer, plan, backend="cpu") as m:
        out = tiny_pipe(**tiny_wan_call(steps=STEPS)).frames
    run = m.build_run()
    assert torch.equal(out, tiny_reference)
    _check_steps(run, 6)
    copies = run.events[run.events["kind"] == "copy"]
    # every block copied twice per step; bytes per step = calls × streamed bytes
    assert copies.groupby(["step", "layer"]).size().tolist() == [2] * (6 * STEPS)
    streamed = int(plan.layers.loc[plan.layers["streamed"], "bytes"].sum())
    assert run.steps["bytes_moved"].tolist() == [2 * streamed] * STEPS
    # the scheduler is restored: the instance holds no wrapper, the method is the class's
    assert "step" not in vars(tiny_pipe.scheduler)
    assert tiny_pipe.scheduler.step == sched_step


def test_observe_pipeline_no_markers(tiny_pipe, tiny_reference):
    with offload_lab.observe(tiny_pipe.transformer, backend="cpu") as obs:
        out = tiny_pipe(**tiny_wan_call(steps=STEPS)).frames
    assert torch.equal(out, tiny_reference)
    _check_steps(obs.run, 6)
    assert "step" not in vars(tiny_pipe.scheduler)


def test_observe_plain_module_calls_are_steps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ModuleList([nn.Linear(8, 8) for _ in range(3)]))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    model = Net()
    x = torch.randn(2, 8)
    with offload_lab.observe(model, backend="cpu") as obs, torch.no_grad():
        for _ in range(3):
            model(x)
    run = obs.run
    assert len(run.steps) == 3 and run.meta["steps_from"] == "calls"
    assert run.steps["calls"].tolist() == [1, 1, 1]
    assert run.meta["calls_recorded"] == 3


def test_explicit_steps_win_and_count_calls():
    from offload_lab import synthetic

    model = synthetic.build(offload_lab.catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=3)
    inputs = synthetic.example_inputs(model, tokens=32)
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned")
    with offload_lab.offload(model, plan, backend="cpu") as m, torch.no_grad():
        for _ in range(2):
            with m.step():
                model(**inputs)
                model(**inputs)
        model(**inputs)  # outside any step: still recorded, as its own step
    run = m.run
    assert run.meta["steps_from"] == "explicit"
    assert run.steps["calls"].tolist() == [2, 2, 1]
    streamed = int(plan.layers.loc[plan.layers["streamed"], "bytes"].sum())
    assert run.steps["bytes_moved"].tolist() == [2 * streamed, 2 * streamed, streamed]


def test_scheduler_restored_on_interrupt(tiny_pipe):
    plan = offload_lab.plan(offload_lab.spec_of(tiny_pipe.transformer), tier="pinned")
    kw = tiny_wan_call(steps=STEPS)
    calls = []

    def stop(module, args, output):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    h = tiny_pipe.transformer.blocks[0].register_forward_hook(stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            with offload_lab.offload(tiny_pipe.transformer, plan, backend="cpu"):
                tiny_pipe(**kw)
    finally:
        h.remove()
    assert "step" not in vars(tiny_pipe.scheduler)
    assert not tiny_pipe.transformer._forward_pre_hooks and not tiny_pipe.transformer._forward_hooks


def test_simulator_numbers_passes():
    spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    run = offload_lab.simulate(plan, "h200", steps=2, passes=2)
    assert run.steps["calls"].tolist() == [2, 2]
    comp = run.events[run.events["kind"] == "compute"]
    assert comp.groupby(["step", "call"]).size().tolist() == [spec.groups[0].num_layers] * 4


def test_old_runs_without_call_columns_load(tmp_path):
    spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    run = offload_lab.simulate(plan, "h200", steps=2)
    ev = run.events.drop(columns=["call"])
    st = run.steps.drop(columns=["calls"])
    old = offload_lab.Run(ev, run.layers, st, run.memory, run.meta)
    path = tmp_path / "old.olrun"
    old.save(path)
    back = offload_lab.Run.load(path)
    assert back.events["call"].eq(0).all() and back.steps["calls"].eq(1).all()


def test_no_scheduler_asked_one_step_per_call(tiny_pipe, tiny_reference):
    plan = offload_lab.plan(offload_lab.spec_of(tiny_pipe.transformer), tier="pinned")
    with offload_lab.offload(tiny_pipe.transformer, plan, backend="cpu", scheduler=None) as m:
        out = tiny_pipe(**tiny_wan_call(steps=STEPS)).frames
    run = m.build_run()
    assert torch.equal(out, tiny_reference)
    assert run.meta["steps_from"] == "calls" and len(run.steps) == 2 * STEPS
    assert "step" not in vars(tiny_pipe.scheduler)
