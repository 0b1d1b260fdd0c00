"""Layout kept: strides, views and storages of a model's tensors, inside the forward and after."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


def _mixed(tmp_path) -> Net:
    """The mapped model (every tensor a view of one checkpoint file) with anonymous parameters
    added to each block, as a partly mapped checkpoint has them (H3's fused QKV): a pinned or
    pageable layer of it is packed on the cpu backend, the path a pinned layer takes on cuda."""
    model = _model(tmp_path, "mapped")
    for k, b in enumerate(model.blocks):
        g = torch.Generator().manual_seed(100 + k)
        b.wt = nn.Parameter(torch.randn(D, D, generator=g).t())  # owns its storage: released
        b.tied = b.wt  # the same Parameter under a second name
        pair = torch.randn(2, D, generator=g)
        b.ha, b.hb = nn.Parameter(pair[0]), nn.Parameter(pair[1], requires_grad=False)  # one storage
        b.wm = nn.Parameter(torch.randn(D, generator=g))
        b.register_buffer("wm_view", b.wm.detach()[: D // 2])  # a buffer over the parameter's storage
        # a storage of its own, but over file pages: kept (a checkpoint page is not anonymous)
        f = tmp_path / f"wf{k}.bin"
        torch.randn(D, generator=g).numpy().tofile(f)
        b.wf = nn.Parameter(torch.from_file(str(f), shared=False, size=D, dtype=torch.float32))
    return model


@pytest.mark.parametrize("tier", ["pinned", "pageable"])
@pytest.mark.parametrize("init", ["grouped", "naive"])
def test_a_packed_store_releases_originals_it_replaces_and_restore_rebuilds_them(tmp_path, inputs, tier, init):
    from torch.multiprocessing.reductions import StorageWeakRef

    model = _mixed(tmp_path)
    with torch.no_grad():
        ref = model(inputs)
    before = _layout(model)
    owned = [StorageWeakRef(b.wt.untyped_storage()) for b in model.blocks]
    kept = {n: StorageWeakRef(t.untyped_storage()) for b in model.blocks
            for n, t in (("file", b.wv), ("pair", b.ha), ("wm", b.wm), ("own file", b.wf))}
    plan = offload_lab.plan(offload_lab.spec_of(model), tier=tier, prefetch=1, host=HOST)
    assert set(plan.layers["tier"]) == {tier}
    with offload(model, plan, backend="cpu", init=init) as m, torch.no_grad():
        # packed (the file pages are not the tier's own memory) and the wt originals are gone
        assert all(s.buffers for s in m._stores.values())
        assert all(w.expired() for w in owned)
        # checkpoint pages and storages shared with other tensors stay where they were
        assert not any(w.expired() for w in kept.values())
        per_layer = D * D * 4  # wt's extent, in float32
        assert m._meta["init"]["originals_released_bytes"] == LAYERS * per_layer
        with m.step():
            out = model(inputs)
    assert torch.equal(out, ref)
    after = _layout(model)
    assert set(after) == set(before)
    for k, b in before.items():
        a = after[k]
        # shape, stride, dtype, device, requires_grad, offset and values as found ...
        assert (a[:5], a[6]) == (b[:5], b[6]), k
        assert torch.equal(a[7], b[7]), k
        # ... and the same storage for every tensor but the released ones
        if not k.endswith((".wt", ".tied")):
            assert a[5] == b[5], k
    for blk in model.blocks:
        assert blk.tied is blk.wt
        assert blk.wt.stride() == (1, D) and not blk.wt.is_contiguous()
        assert blk.wt.untyped_storage().nbytes() == D * D * 4 and blk.wt.storage_offset() == 0
        assert not blk.wt.is_pinned()
        assert blk.ha.untyped_storage().data_ptr() == blk.hb.untyped_storage().data_ptr()
        assert blk.wm_view.untyped_storage().data_ptr() == blk.wm.untyped_storage().data_ptr()
    # views of the file-backed bank are views of it still
    saved = model.bank.clone()
    with torch.no_grad():
        model.bank[1].add_(1.0)
    assert torch.equal(model.blocks[1].wv.detach(), model.bank[1])
    assert torch.equal(model.blocks[1].ws.detach(), model.bank[1][:, ::2])
    with torch.no_grad():
        model.bank.copy_(saved)
    # the rebuilt storage is the parameter's own again: a second manager releases it again
    with offload(model, plan, backend="cpu") as m2, torch.no_grad():
        assert m2._meta["init"]["originals_released_bytes"] == LAYERS * per_layer
        assert torch.equal(model(inputs), ref)


_RELEASE_SCRIPT = r"""
import json, sys, torch
from torch import nn
import offload_lab
from offload_lab import HostMemory
from offload_lab.record.runtime import offload

N, LAYERS = 1024, 6  # two 4 MiB float32 weights per layer


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Parameter(torch.randn(N, N))
        self.a = nn.Parameter(torch.randn(N, N))

    def forward(self, x):
        return torch.tanh(x @ self.f + x @ self.a)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


model = Net()
torch.save(model.state_dict(), sys.argv[1])
model.load_state_dict(torch.load(sys.argv[1], mmap=True, weights_only=True), assign=True)
for b in model.blocks:  # f stays on the file's pages; a is anonymous memory of its own
    b.a = nn.Parameter(torch.randn(N, N))
x = torch.randn(4, N)
with torch.no_grad():
    ref = model(x)
spec = offload_lab.spec_of(model)
plan = offload_lab.plan(spec, tier=sys.argv[2], prefetch=1, host=HostMemory(available="64GiB"))
with offload(model, plan, backend="cpu") as m, torch.no_grad():
    with m.step():
        y = model(x)
print(json.dumps({"measured": m._meta["net_anonymous_bytes"], "predicted": plan.ledger["net_anonymous_bytes"],
                  "mapped": int(spec.layers["mapped_bytes"].sum()), "layer_bytes": spec.layer_bytes,
                  "released": m._meta["init"]["originals_released_bytes"], "equal": bool(torch.equal(y, ref))}))
"""


@pytest.mark.parametrize("tier", ["pinned", "pageable"])
def test_a_packed_layer_costs_only_its_mapped_bytes(tmp_path, tier):
    # its own process, with glibc returning large frees at once, so RssAnon reads true
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    proc = subprocess.run([sys.executable, "-c", _RELEASE_SCRIPT, str(tmp_path / "net.pt"), tier], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["equal"]
    assert r["mapped"] == r["layer_bytes"] // 2 == r["released"]
    # the planner's assumption: the packed store replaces the anonymous half, the mapped half
    # is new; holding both halves beside the store would read as the whole layer bytes
    assert r["predicted"] == r["mapped"]
    assert 0.8 * r["mapped"] < r["measured"] < 1.2 * r["mapped"], r


def test_a_storage_is_owned_alone_only_when_nothing_else_overlaps_it():
    from offload_lab.record.runtime.stores import exclusive_storages, storage_key

    raw = bytearray(4 * 64)
    a = torch.frombuffer(raw, dtype=torch.float32)  # two storages over the same memory
    b = torch.frombuffer(raw, dtype=torch.float32, count=16, offset=64)
    own, tail = torch.zeros(8, 4).t(), torch.zeros(10)[2:]
    p = nn.Parameter(torch.zeros(3))
    keys = exclusive_storages([a, b, own, tail, p, p, torch.zeros(0)])
    assert storage_key(own) in keys and storage_key(p) in keys  # a tied parameter counts once
    assert not {storage_key(t) for t in (a, b, tail)} & keys  # overlapped, or not from offset 0
