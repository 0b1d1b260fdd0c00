"""What the runtime refuses or guards, in clear words: threads, shared weights, nested lists,
backward, meta tensors, options, and a manager never left."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch
from torch import nn

import offload_lab
from offload_lab import HostMemory
from offload_lab.record.runtime import (
    OffloadError,
    OffloadManager,
    OffloadOptions,
    offload,
    profile,
)

HOST = HostMemory(available="64GiB")
D = 16


class Block(nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(D, D, generator=g).t())
        self.b = nn.Parameter(torch.randn(D, generator=g) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w + self.b)


class Net(nn.Module):
    def __init__(self, layers: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(k) for k in range(layers))
        self.head = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _plan(model, tier="pinned", prefetch=1):
    return offload_lab.plan(offload_lab.spec_of(model), tier=tier, prefetch=prefetch, host=HOST)


def _state(model):
    return {k: (t.stride(), t.requires_grad, t.untyped_storage().data_ptr(), t.detach().clone())
            for k, t in model.state_dict(keep_vars=True).items()}


def _assert_whole(model, before):
    after = _state(model)
    for k, (stride, req, ptr, val) in before.items():
        assert after[k][:3] == (stride, req, ptr), k
        assert torch.equal(after[k][3], val), k
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("tier", ["pinned", "pageable"])
def test_two_threads_are_served_one_at_a_time(tier):
    model = Net()
    xs = [torch.randn(4, D, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    with torch.no_grad():
        refs = [model(x) for x in xs]
    wrong, errors = [], []

    def caller(k: int) -> None:
        try:
            with torch.no_grad():
                for _ in range(50):
                    if not torch.equal(model(xs[k]), refs[k]):
                        wrong.append(k)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    before = _state(model)
    with offload(model, _plan(model, tier, prefetch=2), backend="cpu") as m:
        threads = [threading.Thread(target=caller, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors and not wrong
    assert len(m.build_run().steps) == 100  # one step per call, none interleaved
    _assert_whole(model, before)


def test_a_parameter_shared_by_two_layers_is_named():
    model = Net()
    model.blocks[2].w = model.blocks[0].w
    spec = offload_lab.spec_of(model)
    with pytest.raises(OffloadError) as e:
        OffloadManager(model, _plan(model), backend="cpu")
    msg = str(e.value)
    assert "layers blocks.0, blocks.2 share one parameter (blocks.0.w = blocks.2.w)" in msg
    assert "untie" in msg and "\n" not in msg
    assert spec.group_names == ["blocks"]


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.ModuleList(Block(2 * k + j) for j in range(2)) for k in range(3))

    def forward(self, x):
        for pair in self.blocks:
            for b in pair:
                x = b(x)
        return x


def test_nested_lists_are_refused_naming_groups():
    model = Nested()
    spec = offload_lab.spec_of(model)
    if spec.group_names == ["blocks"]:  # the container list was taken for the layers
        with pytest.raises(OffloadError, match=r"holds module containers \(blocks\.0 is an nn\.ModuleList\).*groups="):
            OffloadManager(model, offload_lab.plan(spec, tier="pinned", host=HOST), backend="cpu")
    # what the message says to do works
    x = torch.randn(2, D)
    with torch.no_grad():
        ref = model(x)
    spec = offload_lab.spec_of(model, groups=["blocks.0", "blocks.1", "blocks.2"])
    with torch.no_grad(), offload(model, offload_lab.plan(spec, tier="pageable", host=HOST), backend="cpu"):
        assert torch.equal(model(x), ref)


def test_backward_is_refused_in_one_line_and_the_model_restored():
    model = Net()
    before = _state(model)
    x = torch.randn(4, D)
    with pytest.raises(OffloadError) as e:
        with offload(model, _plan(model), backend="cpu"):
            model(x).sum().backward()
    msg = str(e.value)
    assert msg.startswith("backward through offloaded layer blocks.3: offload(...) is for inference only")
    assert "torch.no_grad()" in msg and "\n" not in msg
    _assert_whole(model, before)
    model(x).sum().backward()  # restored: training works again
    assert model.blocks[0].w.grad.shape == (D, D)


def test_meta_parameters_are_named():
    real = Net()
    plan = _plan(real)
    with torch.device("meta"):
        model = Net()
    with pytest.raises(OffloadError, match=r"parameter\(s\) blocks\.0\.w, blocks\.0\.b, blocks\.1\.w and "
                                           r"\d+ more of Net are on the meta device"):
        OffloadManager(model, plan, backend="cpu")


def test_options_object_and_keywords():
    model = Net()
    x = torch.randn(2, D)
    with torch.no_grad():
        ref = model(x)
    opts = OffloadOptions(backend="cpu", label="mine", stage_threads=2)
    with torch.no_grad(), offload(model, _plan(model, "staged"), options=opts) as m:
        assert torch.equal(model(x), ref)
    assert m.options is opts and m.build_run().meta["label"] == "mine"
    run = profile(model, lambda: model(x), _plan(model), steps=1, warmup=0, options=opts)
    assert run.meta["label"] == "mine"
    with pytest.raises(OffloadError, match="not both: issue given beside options"):
        offload(model, _plan(model), issue="before-compute", options=opts).__enter__()
    with pytest.raises(OffloadError, match=r"stage_threads = 0; accepted: an int in \[1, 64\]"):
        OffloadOptions(stage_threads=0)
    with pytest.raises(OffloadError, match="backend 'tpu' is not one of"):
        profile(model, lambda: None, _plan(model), backend="tpu")
    with pytest.raises(OffloadError, match="options must be an OffloadOptions"):
        OffloadManager(model, _plan(model), options={"backend": "cpu"})
    with pytest.raises(Exception, match="cannot assign"):
        opts.backend = "cuda"  # frozen


_NEVER_LEFT = """
import atexit, sys, torch
from torch import nn
import offload_lab
from offload_lab import HostMemory
from offload_lab.record.runtime import offload
sys.path.insert(0, sys.argv[1])
from test_runtime_guards import Net
model = Net()
strides = {k: t.stride() for k, t in model.named_parameters()}
ptrs = {k: t.untyped_storage().data_ptr() for k, t in model.named_parameters()}
ref = model(torch.ones(1, 16)).detach()
def check():  # registered first, so it runs after the manager's own exit handler
    ok = (all(t.stride() == strides[k] and t.untyped_storage().data_ptr() == ptrs[k]
              for k, t in model.named_parameters())
          and not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
          and torch.equal(model(torch.ones(1, 16)).detach(), ref))
    print("restored", ok)
atexit.register(check)
plan = offload_lab.plan(offload_lab.spec_of(model), tier=sys.argv[2], prefetch=1, host=HostMemory(available="64GiB"))
m = offload(model, plan, backend="cpu").__enter__()
with torch.no_grad():
    model(torch.ones(1, 16))
"""


@pytest.mark.parametrize("tier", ["pinned", "staged"])
def test_a_manager_never_left_is_restored_at_exit(tier):
    here = str(__import__("pathlib").Path(__file__).parent)
    proc = subprocess.run([sys.executable, "-c", _NEVER_LEFT, here, tier], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "restored True"
    assert proc.stderr == ""


def test_a_caller_waiting_when_ctrl_c_cuts_the_first_short_is_let_through():
    model = Net()
    x = torch.randn(2, D)
    with torch.no_grad():
        ref = model(x)
    results = []

    def interrupt(block, args):
        # the second caller reaches the gate and waits; then the first call is cut short
        waiter.start()
        threading.Event().wait(0.2)
        raise KeyboardInterrupt

    def second():
        with torch.no_grad():
            results.append(torch.equal(model(x), ref))

    waiter = threading.Thread(target=second, daemon=True)  # a failure must not hang the session
    with pytest.raises(KeyboardInterrupt):
        with offload(model, _plan(model), backend="cpu"), torch.no_grad():
            h = model.blocks[1].register_forward_pre_hook(interrupt)
            try:
                model(x)
            finally:
                h.remove()
    waiter.join(timeout=30)
    assert not waiter.is_alive() and results == [True]
