"""Layout kept: strides, views and storages of a model's tensors, inside the forward and after."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import offload_lab
from offload_lab import HostMemory
from offload_lab.record.runtime import offload

HOST = HostMemory(available="64GiB")
D, LAYERS = 32, 4


class Block(nn.Module):
    """A transposed weight, a weight that is a slice of the shared bank, a strided bank view."""

    def __init__(self, bank: torch.Tensor, k: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.wt = nn.Parameter(torch.randn(D, D, generator=g).t())  # stride (1, D)
        self.wv = nn.Parameter(bank[k])  # contiguous, storage offset k * D * D into the bank
        self.ws = nn.Parameter(bank[k][:, ::2], requires_grad=False)  # strided: (D, 2)
        self.b = nn.Parameter(torch.randn(D, generator=g) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.wt + x @ self.wv.t() + self.b
        return torch.tanh(y + (x @ self.ws).repeat(1, 2))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bank", torch.randn(LAYERS, D, D, generator=torch.Generator().manual_seed(9)))
        self.blocks = nn.ModuleList(Block(self.bank, k, seed=k) for k in range(LAYERS))
        self.head = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _layout(model: nn.Module) -> dict[str, tuple]:
    return {k: (t.shape, t.stride(), t.dtype, t.device, t.requires_grad, t.untyped_storage().data_ptr(),
                t.storage_offset(), t.detach().clone())
            for k, t in model.state_dict(keep_vars=True).items()}


def _assert_same(model: nn.Module, before: dict[str, tuple]) -> None:
    after = _layout(model)
    assert set(after) == set(before)
    for k, b in before.items():
        a = after[k]
        assert a[:7] == b[:7], k
        assert torch.equal(a[7], b[7]), k


def _model(tmp_path, tier: str) -> Net:
    model = Net()
    if tier != "mapped":
        return model
    # the mapped tier streams from checkpoint pages: torch.save keeps views and strides, and
    # torch.load(mmap=True) gives tensors over the file that still share the bank's storage
    torch.save(model.state_dict(), tmp_path / "net.pt")
    sd = torch.load(tmp_path / "net.pt", mmap=True, weights_only=True)
    model.load_state_dict(sd, assign=True)
    return model


@pytest.fixture(scope="module")
def inputs():
    return torch.randn(8, D, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("tier", ["pinned", "pageable", "staged", "mapped"])
@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_layout_is_kept_inside_the_forward_and_after(tmp_path, inputs, tier, prefetch):
    model = _model(tmp_path, tier)
    assert model.blocks[1].wt.stride() == (1, D) and model.blocks[1].ws.stride() == (D, 2)
    assert model.blocks[2].wv.untyped_storage().data_ptr() == model.bank.untyped_storage().data_ptr()
    with torch.no_grad():
        ref = model(inputs)
    before = _layout(model)
    seen: list[tuple] = []

    def look(block, args):
        seen.append((block.wt.stride(), block.ws.stride(), block.wv.stride(),
                     *(t.data_ptr() % 32 for t in (block.wt, block.wv, block.ws, block.b))))

    spec = offload_lab.spec_of(model)
    assert spec.group_names == ["blocks"]
    plan = offload_lab.plan(spec, tier=tier, prefetch=prefetch, host=HOST)
    assert set(plan.layers["tier"]) == {tier}
    outs = []
    with offload(model, plan, backend="cpu") as m, torch.no_grad():
        hooks = [b.register_forward_pre_hook(look) for b in model.blocks]  # after the manager's
        for _ in range(2):
            with m.step():
                outs.append(model(inputs))
        for h in hooks:
            h.remove()
    assert all(torch.equal(o, ref) for o in outs)
    assert len(seen) == 2 * LAYERS
    assert set(seen) == {((1, D), (D, 2), (D, 1), 0, 0, 0, 0)}
    _assert_same(model, before)
    # a view of the bank is still a view of it: writing the bank changes the weight
    with torch.no_grad():
        model.bank[2].add_(1.0)
    assert torch.equal(model.blocks[2].wv.detach(), model.bank[2])
    assert torch.equal(model.blocks[2].ws.detach(), model.bank[2][:, ::2])


def test_tied_parameters_within_a_layer_stay_tied(inputs):
    model = Net()
    for b in model.blocks:
        b.tied = b.b  # the same Parameter under two names
    before = _layout(model)
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned", prefetch=1, host=HOST)
    with torch.no_grad():
        ref = model(inputs)
        with offload(model, plan, backend="cpu"):
            out = model(inputs)
    assert torch.equal(out, ref)
    _assert_same(model, before)
    assert all(b.tied is b.b for b in model.blocks)
