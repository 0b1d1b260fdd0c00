"""Observer mode on the CPU: models offloaded by independent mechanisms written here, watched
by ``offload_lab.observe`` without changing their outputs.

The two offloaders below are deliberately not offload-lab code: one moves each block's weights
in its own torch forward hooks (accelerate's semantics: a synchronous copy on entry, a release
on exit), the other wraps ``block.forward`` and prefetches the next block (the shape of
diffusers' ``HookRegistry`` / group offloading). On the CPU the "device copy" is a fresh
clone of the host master tensor: a real second copy of the bytes, made by the other system.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import offload_lab
from offload_lab import HostMemory, catalog, synthetic
from offload_lab.planning.hostmem import is_file_backed
from offload_lab.record.observer import LOOKAHEAD, ObserveError, observe

HOST = HostMemory(available="64GiB")


def _wan(layers: int = 4) -> torch.nn.Module:
    return synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.04, layers=layers, dtype=torch.float32)


@pytest.fixture(scope="module")
def wan():
    model = _wan()
    inputs = synthetic.example_inputs(model, tokens=32)
    with torch.no_grad():
        ref = model(**inputs)
    return model, inputs, ref


def _block_bytes(block: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in block.parameters())


def _hook_count(model: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def _forward_is_plain(model: torch.nn.Module) -> bool:
    return all("forward" not in vars(m) for m in model.modules())


class HookOffloader:
    """Accelerate-style: each block's weights are copied in its own pre-forward hook, synchronously,
    and released in its post hook. ``between="host"`` leaves each parameter pointing at its host
    master between uses (the source is visible); ``"placeholder"`` at a 1-element tensor (as
    offload-lab's runtime does; accelerate uses ``meta``) so the source is hidden."""

    def __init__(self, blocks: torch.nn.ModuleList, between: str = "host", source=None, device=None):
        self.blocks, self.between, self.device = blocks, between, device
        self.originals = {id(p): p.data for b in blocks for p in b.parameters()}
        self.masters = {id(p): (source(p.data) if source else p.data) for b in blocks for p in b.parameters()}
        self.copied: list[tuple[int, int]] = []  # (block, bytes), in order
        self.handles = []
        for i, b in enumerate(blocks):
            self.handles.append(b.register_forward_pre_hook(self._pre(i)))
            self.handles.append(b.register_forward_hook(self._post))
            self._release(b)

    def _release(self, block):
        for p in block.parameters():
            m = self.masters[id(p)]
            p.data = m if self.between == "host" else torch.zeros(1, dtype=m.dtype)

    def _pre(self, i):
        def hook(module, args):
            n = 0
            for p in module.parameters():
                m = self.masters[id(p)]
                # the "host → device" copy (on the CPU: a second copy of the bytes)
                p.data = m.clone() if self.device is None else m.to(self.device, non_blocking=m.is_pinned())
                n += p.numel() * p.element_size()
            self.copied.append((i, n))
        return hook

    def _post(self, module, args, output):
        self._release(module)

    def close(self):
        for h in self.handles:
            h.remove()
        for b in self.blocks:
            for p in b.parameters():
                p.data = self.originals[id(p)]


class WrapOffloader:
    """Diffusers-style: ``block.forward`` is wrapped (an instance attribute, as diffusers'
    ``HookRegistry`` and accelerate's ``add_hook_to_module`` do); on entry it loads the block if
    it is not loaded and prefetches the next one, synchronously; on exit it releases the block."""

    def __init__(self, blocks: torch.nn.ModuleList):
        self.blocks = blocks
        self.masters = {id(p): p.data for b in blocks for p in b.parameters()}
        self.loaded: set[int] = set()
        self.copied: list[tuple[int, int]] = []
        for i, b in enumerate(blocks):
            b.forward = self._wrap(i, b.forward)

    def _load(self, i):
        if i in self.loaded or i >= len(self.blocks):
            return
        n = 0
        for p in self.blocks[i].parameters():
            p.data = self.masters[id(p)].clone()
            n += p.numel() * p.element_size()
        self.loaded.add(i)
        self.copied.append((i, n))

    def _wrap(self, i, forward):
        def new_forward(*args, **kwargs):
            self._load(i)
            self._load(i + 1)
            try:
                return forward(*args, **kwargs)
            finally:
                for p in self.blocks[i].parameters():
                    p.data = self.masters[id(p)]
                self.loaded.discard(i)
        return new_forward

    def close(self):
        for b in self.blocks:
            del b.forward
            for p in b.parameters():
                p.data = self.masters[id(p)]


def _observe_steps(model, inputs, steps=2, passes=1, backend="cpu", **kw):
    outs = []
    with observe(model, backend=backend, **kw) as obs, torch.no_grad():
        for _ in range(steps):
            with obs.step():
                for _ in range(passes):
                    outs.append(model(**inputs))
    return obs, outs


def _uses(run, kind):
    return run.events[run.events["kind"] == kind]


# -- nobody offloads --------------------------------------------------------------------------------
def test_resident_model_every_layer_resident_no_copies(wan):
    model, inputs, ref = wan
    hooks = _hook_count(model)
    obs, outs = _observe_steps(model, inputs, steps=2)
    run = obs.run
    assert all(torch.equal(o, ref) for o in outs)
    assert _hook_count(model) == hooks
    assert run.backend == "observe" and run.simulated is False and run.meta["clock"] == "cpu"
    assert run.meta["device"] == "cpu" and "observed_system" not in run.meta
    assert run.layers["tier"].tolist() == ["resident"] * 4
    assert not run.layers["streamed"].any() and run.layers["pin_rank"].isna().all()
    assert run.layers["bytes"].tolist() == [_block_bytes(b) for b in model.blocks]
    assert set(run.events["kind"]) == {"compute"}
    comp = _uses(run, "compute")
    assert comp.groupby(["step", "layer"]).size().tolist() == [1] * 8
    assert run.steps["bytes_moved"].tolist() == [0, 0]
    assert (comp["dur_s"] >= 0).all()
    assert run.label.startswith("observed: 4 resident")


def test_explicit_groups_and_label(wan):
    model, inputs, _ = wan
    obs, _ = _observe_steps(model, inputs, steps=1, groups=["blocks"], label="nobody")
    run = obs.run
    assert run.label == "nobody" and run.meta["observed_system"] == "nobody"
    assert run.meta["groups"] == ["blocks"]


def test_mapped_checkpoint_resident_layers_count_mapped_bytes(tmp_path):
    model = synthetic.load(synthetic.save(_wan(layers=2), tmp_path))
    assert is_file_backed(model.blocks[0].modulation)
    inputs = synthetic.example_inputs(model, tokens=32)
    obs, _ = _observe_steps(model, inputs, steps=1)
    lay = obs.run.layers
    assert lay["tier"].tolist() == ["resident"] * 2
    assert lay["mapped_bytes"].tolist() == lay["bytes"].tolist()


# -- accelerate-style hooks -------------------------------------------------------------------------------
def test_hook_offloader_outputs_identical_and_copies_attributed(wan):
    model, inputs, ref = wan
    hooks0 = _hook_count(model)
    off = HookOffloader(model.blocks, between="host")
    try:
        with torch.no_grad():
            plain = model(**inputs)
        off.copied.clear()
        obs, outs = _observe_steps(model, inputs, steps=3, passes=2, label="hook offloader")
        assert _hook_count(model) == hooks0 + 2 * len(model.blocks)  # only the offloader's remain
    finally:
        off.close()
    assert torch.equal(plain, ref)
    assert all(torch.equal(o, ref) for o in outs)

    run = obs.build_run(warmup=1)
    sizes = [_block_bytes(b) for b in model.blocks]
    # one compute row per layer per forward, in order
    comp = _uses(run, "compute")
    assert len(comp) == 2 * 2 * 4
    assert comp.groupby(["step", "layer"]).size().eq(2).all()
    assert comp.sort_values("start_s")["layer"].tolist() == [0, 1, 2, 3] * 4
    # every copy the offloader made in the kept steps, attributed to its layer with its bytes
    copies = _uses(run, "copy").sort_values("start_s")
    assert list(zip(copies["layer"], copies["bytes"])) == off.copied[8:]
    assert list(zip(copies["layer"], copies["bytes"])) == [(i, sizes[i]) for i in range(4)] * 4
    assert set(copies["tier"]) == {"pageable"}  # host masters are ordinary memory: not guessed pinned
    assert set(copies["stream"]) == {"copy"}
    # the host thread did those copies: one host_block per copy, same bytes
    hb = _uses(run, "host_block").sort_values("start_s")
    assert hb["bytes"].tolist() == copies["bytes"].tolist() and set(hb["stream"]) == {"host"}
    # each layer waited for its own on-entry copy; compute starts after it
    waits = _uses(run, "wait")
    assert len(waits) == len(copies)
    for (step, layer), c in copies.groupby(["step", "layer"]):
        u = comp[(comp["step"] == step) & (comp["layer"] == layer)].sort_values("start_s")
        cc = c.sort_values("start_s")
        assert (cc["end_s"].to_numpy() <= u["start_s"].to_numpy()).all()
    assert run.layers["tier"].tolist() == ["pageable"] * 4
    assert run.layers["streamed"].all() and run.layers["bytes"].tolist() == sizes
    assert run.steps["bytes_moved"].tolist() == [2 * sum(sizes)] * 2
    assert (run.steps["stall_s"] > 0).all()
    b = run.steps.iloc[0]
    assert b["wall_s"] >= b["compute_s"]


def test_placeholder_source_is_unknown_not_guessed(wan):
    model, inputs, ref = wan
    off = HookOffloader(model.blocks, between="placeholder")
    try:
        obs, outs = _observe_steps(model, inputs, steps=2)
    finally:
        off.close()
    assert all(torch.equal(o, ref) for o in outs)
    run = obs.run
    copies = _uses(run, "copy")
    assert set(copies["tier"]) == {"unknown"}
    sizes = [_block_bytes(b) for b in model.blocks]
    assert sorted(zip(copies["step"], copies["layer"], copies["bytes"])) == \
        sorted((s, i, sizes[i]) for s in (0, 1) for i in range(4))
    # the layer tier and its full size come from what arrived, never from the placeholder
    assert run.layers["tier"].tolist() == ["unknown"] * 4
    assert run.layers["bytes"].tolist() == sizes


def test_mapped_source_copies_are_mapped(tmp_path):
    model = synthetic.load(synthetic.save(_wan(layers=2), tmp_path))
    inputs = synthetic.example_inputs(model, tokens=32)
    off = HookOffloader(model.blocks, between="host")  # masters are views of the checkpoint file
    try:
        obs, _ = _observe_steps(model, inputs, steps=1)
    finally:
        off.close()
    lay = obs.run.layers
    assert set(_uses(obs.run, "copy")["tier"]) == {"mapped"}
    assert lay["tier"].tolist() == ["mapped"] * 2
    assert lay["mapped_bytes"].tolist() == lay["bytes"].tolist()


def test_hooks_registered_after_entering_are_kept_inside_the_probes(wan):
    model, inputs, ref = wan
    with observe(model, backend="cpu") as obs, torch.no_grad():
        off = HookOffloader(model.blocks, between="host")  # its pre-hook lands after ours
        try:
            with obs.step():
                out = model(**inputs)
        finally:
            off.close()
    assert torch.equal(out, ref)
    run = obs.run
    assert len(_uses(run, "copy")) == 4 and len(_uses(run, "wait")) == 4
    assert set(_uses(run, "copy")["tier"]) == {"pageable"}


# -- diffusers-style forward wrapper with prefetch ------------------------------------------------
def test_forward_wrapper_prefetch_attributed_by_ownership(wan):
    model, inputs, ref = wan
    off = WrapOffloader(model.blocks)
    try:
        obs, outs = _observe_steps(model, inputs, steps=2, label="wrapper")
    finally:
        off.close()
    assert _forward_is_plain(model)
    assert all(torch.equal(o, ref) for o in outs)
    run = obs.run
    sizes = [_block_bytes(b) for b in model.blocks]
    copies = _uses(run, "copy").sort_values(["step", "layer"])
    assert list(zip(copies["layer"], copies["bytes"])) == [(i, sizes[i]) for i in range(4)] * 2
    assert set(copies["tier"]) == {"pageable"}
    comp = _uses(run, "compute")
    for c in copies.itertuples():
        if c.layer == 0:
            continue
        # block k's copy was made inside block k-1's forward (the prefetch): attributed to k,
        # and it ended before block k-1's compute began
        prev = comp[(comp["step"] == c.step) & (comp["layer"] == c.layer - 1)].iloc[0]
        own = comp[(comp["step"] == c.step) & (comp["layer"] == c.layer)].iloc[0]
        assert c.end_s <= prev["start_s"] < own["start_s"]
    # only block 0 waited for its own weights; the others were prefetched
    assert sorted(_uses(run, "wait")["layer"].tolist()) == [0, 0]
    assert run.layers["tier"].tolist() == ["pageable"] * 4
    assert LOOKAHEAD >= 1


# -- offload-lab's own manager, watched from outside --------------------------------------------------
def test_observing_offload_lab_manager_matches_its_bytes(wan):
    model, inputs, ref = wan
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pageable", prefetch=0, host=HOST)
    with offload_lab.offload(model, plan, backend="cpu") as m:
        with observe(model, backend="cpu", label="offload-lab manager") as obs, torch.no_grad():
            for _ in range(2):
                with m.step(), obs.step():
                    out = model(**inputs)
    assert torch.equal(out, ref)
    own, seen = m.run, obs.run
    sizes = [_block_bytes(b) for b in model.blocks]
    # the observer counts the parameters' bytes; the manager's packed stores add slice alignment
    assert seen.steps["bytes_moved"].tolist() == [sum(sizes)] * 2
    assert (own.steps["bytes_moved"] >= seen.steps["bytes_moved"]).all()
    assert len(_uses(seen, "copy")) == len(_uses(own, "copy")) == 8
    # its packed stores are hidden behind placeholders: the tier is not guessed
    assert seen.layers["tier"].tolist() == ["unknown"] * 4
    assert seen.layers["bytes"].tolist() == sizes


# -- restore -------------------------------------------------------------------------------------------
def test_hooks_removed_after_exception_and_interrupt(wan):
    model, inputs, ref = wan
    hooks = _hook_count(model)
    with pytest.raises(RuntimeError, match="boom"):
        with observe(model, backend="cpu") as obs, torch.no_grad():
            with obs.step():
                model(**inputs)
                raise RuntimeError("boom")
    assert _hook_count(model) == hooks
    with pytest.raises(KeyboardInterrupt):
        with observe(model, backend="cpu"):
            raise KeyboardInterrupt
    assert _hook_count(model) == hooks
    # the recording made before the error is still readable
    assert len(_uses(obs.run, "compute")) == 4
    with torch.no_grad():
        assert torch.equal(model(**inputs), ref)
    # the model can be observed again
    obs2, _ = _observe_steps(model, inputs, steps=1)
    assert len(obs2.run.steps) == 1


@pytest.mark.parametrize("exc", [ValueError, KeyboardInterrupt])
def test_error_inside_a_block_still_restores(wan, exc):
    model, inputs, ref = wan
    hooks = _hook_count(model)

    def bad(module, args):
        raise exc("block failed")

    h = model.blocks[2].register_forward_pre_hook(bad)
    try:
        with pytest.raises(exc, match="block failed"):
            _observe_steps(model, inputs, steps=1)
    finally:
        h.remove()
    assert _hook_count(model) == hooks
    with torch.no_grad():
        assert torch.equal(model(**inputs), ref)


# -- the Run goes everywhere a Run goes -----------------------------------------------------------
def test_compare_with_a_profiled_run_and_save_load(wan, tmp_path):
    model, inputs, _ = wan
    off = HookOffloader(model.blocks, between="host")
    try:
        obs, _ = _observe_steps(model, inputs, steps=3, label="hook offloader")
    finally:
        off.close()
    observed = obs.build_run(warmup=1)
    plan = offload_lab.plan(offload_lab.spec_of(model), tier="pageable", host=HOST)
    with torch.no_grad():
        profiled = offload_lab.profile(model, lambda: model(**inputs), plan, steps=2, warmup=1,
                                       backend="cpu", label="offload-lab pageable")
    table = offload_lab.compare([observed, profiled])
    assert table["label"].tolist() == ["hook offloader", "offload-lab pageable"]
    assert table["backend"].tolist() == ["observe", "cpu"]
    assert table["tiers"].tolist() == ["4 pageable", "4 pageable"]
    assert not table["simulated"].any() and table["step_s"].gt(0).all()
    # same bytes, give or take the manager's slice alignment in its packed stores
    assert (observed.steps["bytes_moved"] <= profiled.steps["bytes_moved"]).all()
    assert (observed.steps["bytes_moved"] > 0.98 * profiled.steps["bytes_moved"]).all()
    back = offload_lab.Run.load(observed.save(tmp_path / "observed"))
    assert back.equals(observed)
    assert isinstance(observed.memory, pd.DataFrame) and len(observed.memory)


# -- errors ------------------------------------------------------------------------------------------
def test_errors_name_the_bad_value(wan):
    model, inputs, _ = wan
    with pytest.raises(ObserveError, match="got int"):
        observe(3)
    with pytest.raises(ObserveError, match="'gpu'"):
        observe(model, backend="gpu")
    with pytest.raises(ObserveError, match="'nope'.*detected: \\['blocks'\\]"):
        observe(model, groups=["nope"])
    with pytest.raises(ObserveError, match="no layer group"):
        observe(torch.nn.Linear(2, 2))
    with pytest.raises(ObserveError, match="'cuda:0' does not match backend 'cpu'"):
        observe(model, backend="cpu", device="cuda:0")
    if not torch.cuda.is_available():
        with pytest.raises(ObserveError, match="no CUDA device"):
            observe(model, backend="cuda")
    obs = observe(model, backend="cpu")
    with pytest.raises(ObserveError, match="nothing recorded"):
        obs.build_run()
    with pytest.raises(ObserveError, match="inside"):
        with obs.step():
            pass
    with obs:
        with pytest.raises(ObserveError, match="already being observed"):
            with observe(model, backend="cpu"):
                pass
        with obs.step():
            with pytest.raises(ObserveError, match="do not nest"):
                with obs.step():
                    pass
    with pytest.raises(ObserveError, match="-1"):
        obs.build_run(warmup=-1)
    with pytest.raises(ObserveError, match="one session"):
        with obs:
            pass
    assert isinstance(ObserveError("x"), ValueError)


# -- CUDA: timing events on the current stream ------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_hook_offloader_tiers_and_events():
    model = _wan().cuda()
    inputs = synthetic.example_inputs(model, tokens=32)
    with torch.no_grad():
        ref = model(**inputs)
    obs, outs = _observe_steps(model, inputs, steps=1, backend="cuda")
    assert all(torch.equal(o, ref) for o in outs)
    assert obs.run.layers["tier"].tolist() == ["resident"] * 4 and obs.run.meta["clock"] == "cuda"
    sizes = [_block_bytes(b) for b in model.blocks]
    sources = {"pageable": lambda t: t.cpu(), "pinned": lambda t: t.cpu().pin_memory()}
    for tier, source in sources.items():
        off = HookOffloader(model.blocks, between="host", source=source, device="cuda")
        try:
            with torch.no_grad():
                plain = model(**inputs)
            obs, outs = _observe_steps(model, inputs, steps=3, backend="cuda", label=f"hooks, {tier}")
        finally:
            off.close()
        assert torch.equal(plain, ref) and all(torch.equal(o, ref) for o in outs), tier
        run = obs.build_run(warmup=1)
        copies = _uses(run, "copy")
        comp = _uses(run, "compute")
        assert sorted(zip(copies["step"], copies["layer"], copies["bytes"])) == \
            sorted((s, i, sizes[i]) for s in (1, 2) for i in range(4)), tier
        assert set(copies["tier"]) == {tier} and run.layers["tier"].tolist() == [tier] * 4
        assert (copies["dur_s"] > 0).all() and len(comp) == 8
        # CUDA makes the host wait for pageable copies; pinned ones are asynchronous
        assert len(_uses(run, "host_block")) == (8 if tier == "pageable" else 0), tier
        for c in copies.itertuples():
            u = comp[(comp["step"] == c.step) & (comp["layer"] == c.layer)].iloc[0]
            assert c.end_s <= u["start_s"] + 1e-9
        assert run.meta["clock"] == "cuda" and run.meta["device_name"]
        if tier == "pinned":
            assert run.memory["pinned_bytes"].max() == sum(sizes)


# -- real offloaders: accelerate's hooks and diffusers' group offloading, on the CPU ----------------
# On the CPU accelerate's hooks move each leaf's weights between ``meta`` and the CPU (its map of
# offloaded weights, or files in an offload folder), replacing the ``nn.Parameter`` objects as
# they go; diffusers' disk groups rebind every tensor to a file's bytes on entry and to a fresh
# empty buffer on exit. The observer must see each load once, with its bytes.
def _tiny_transformer():
    pytest.importorskip("diffusers")
    from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_call, tiny_wan_pipeline

    pipe = tiny_wan_pipeline(layers=4)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        ref = pipe(**tiny_wan_call(steps=2)).frames
    return pipe, ref, (lambda: pipe(**tiny_wan_call(steps=2)).frames)


def _observe_pipe(pipe, call):
    with observe(pipe.transformer, backend="cpu") as obs, torch.no_grad():
        out = call()
    return obs.run, out


def _per_call(run):
    copies = _uses(run, "copy")
    return copies.groupby(["step", "call", "layer"])["bytes"].sum()


def test_accelerate_cpu_offload_per_block_every_call_moves_the_block():
    pytest.importorskip("accelerate")
    from accelerate import cpu_offload

    pipe, ref, call = _tiny_transformer()
    blocks = pipe.transformer.blocks
    sizes = [_block_bytes(b) for b in blocks]
    for b in blocks:
        cpu_offload(b, execution_device="cpu")
    assert next(blocks[0].parameters()).device.type == "meta"
    run, out = _observe_pipe(pipe, call)
    assert torch.equal(torch.as_tensor(out), torch.as_tensor(ref))
    per = _per_call(run)
    comp = _uses(run, "compute")
    assert len(per) == len(comp) == 2 * 2 * 4  # steps × guidance calls × blocks
    assert all(per.loc[s, c, i] == sizes[i] for s, c, i in per.index)
    # the map of offloaded weights holds ordinary CPU tensors: that is the tier
    assert set(_uses(run, "copy")["tier"]) == {"pageable"}
    assert run.layers["tier"].tolist() == ["pageable"] * 4


def test_accelerate_dispatch_model_blocks_on_disk_are_mapped(tmp_path):
    pytest.importorskip("accelerate")
    from accelerate import dispatch_model

    pipe, ref, call = _tiny_transformer()
    m = pipe.transformer
    sizes = [_block_bytes(b) for b in m.blocks]
    device_map = {n: "cpu" for n, _ in m.named_children() if n != "blocks"}
    device_map.update({n: "cpu" for n, _ in m.named_parameters(recurse=False)})
    device_map.update({f"blocks.{i}": "disk" for i in range(len(m.blocks))})
    with pytest.warns(UserWarning):  # accelerate's own notes on the map and the meta weights
        dispatch_model(m, device_map=device_map, offload_dir=str(tmp_path / "offload"))
    run, out = _observe_pipe(pipe, call)
    assert torch.equal(torch.as_tensor(out), torch.as_tensor(ref))
    per = _per_call(run)
    assert len(per) == 16 and all(per.loc[s, c, i] == sizes[i] for s, c, i in per.index)
    # read from the offload folder's files at each load
    assert set(_uses(run, "copy")["tier"]) == {"mapped"}
    assert run.steps["bytes_moved"].tolist() == [2 * sum(sizes)] * 2


def test_diffusers_group_offload_to_disk_exact_bytes_per_step(tmp_path):
    pytest.importorskip("diffusers")
    from diffusers.hooks import apply_group_offloading

    pipe, ref, call = _tiny_transformer()
    m = pipe.transformer
    sizes = [_block_bytes(b) for b in m.blocks]
    cpu = torch.device("cpu")
    apply_group_offloading(m, onload_device=cpu, offload_device=cpu, offload_type="block_level",
                           num_blocks_per_group=1, offload_to_disk_path=str(tmp_path / "groups"))
    run, out = _observe_pipe(pipe, call)
    assert torch.equal(torch.as_tensor(out), torch.as_tensor(ref))
    per = _per_call(run)
    assert len(per) == 16 and all(per.loc[s, c, i] == sizes[i] for s, c, i in per.index)
    # its exit rebinds to empty buffers of full size: releases, not copies
    assert run.steps["bytes_moved"].tolist() == [2 * sum(sizes)] * 2


class RefreshOffloader:
    """Drops each block's copy and makes a fresh one on every entry, with no release in between:
    the new buffer may land at the address of the one just freed."""

    def __init__(self, blocks: torch.nn.ModuleList):
        self.masters = {id(p): p.data for b in blocks for p in b.parameters()}
        self.handles = [b.register_forward_pre_hook(self._pre) for b in blocks]
        self.reused = 0  # copies that landed where the one they replaced was

    def _pre(self, module, args):
        for p in module.parameters():
            before = p.data_ptr()
            p.data = torch.empty(0)  # frees the previous copy first
            p.data = self.masters[id(p)].clone()
            self.reused += p.data_ptr() == before

    def close(self):
        for h in self.handles:
            h.remove()


def test_copy_into_a_reused_address_is_still_a_copy(wan):
    model, inputs, ref = wan
    off = RefreshOffloader(model.blocks)
    try:
        with torch.no_grad():
            model(**inputs)  # every block holds a copy before the observer enters
        obs, outs = _observe_steps(model, inputs, steps=2)
    finally:
        off.close()
        for b in model.blocks:
            for p in b.parameters():
                p.data = off.masters[id(p)]
    assert all(torch.equal(o, ref) for o in outs)
    per = _per_call(obs.run)
    sizes = [_block_bytes(b) for b in model.blocks]
    assert off.reused > 0  # the allocator did hand the freed address back: the case at hand
    assert [per.loc[s, 0, i] for s in (0, 1) for i in range(4)] == sizes * 2


def test_moves_no_hook_can_see_are_said_in_a_warning(wan):
    model, inputs, ref = wan
    originals = {(sub, n): p for b in model.blocks for sub in b.modules() for n, p in sub._parameters.items()}
    handles = []

    def release(module, args, out):
        # replaces the parameter objects, as accelerate does
        for sub in module.modules():
            for n, p in list(sub._parameters.items()):
                sub._parameters[n] = torch.nn.Parameter(torch.empty(p.shape, device="meta"), requires_grad=False)

    try:
        with observe(model, backend="cpu") as obs, torch.no_grad():
            # after entering: the blocks go to meta at the end of the call; whatever loads them
            # again would do so where no probe runs
            for b in model.blocks:
                handles.append(b.register_forward_hook(release))
            with obs.step():
                model(**inputs)
    finally:
        for h in handles:
            h.remove()
        for (sub, n), p in originals.items():
            sub._parameters[n] = p
    with pytest.warns(offload_lab.record.observer.ObserveWarning, match="no copy.*changed device"):
        run = obs.run
    assert len(_uses(run, "compute")) == 4 and len(_uses(run, "copy")) == 0
    with torch.no_grad():
        assert torch.equal(model(**inputs), ref)


def test_accelerate_cpu_offload_of_the_whole_model_the_sequential_offload_hook():
    pytest.importorskip("accelerate")
    from accelerate import cpu_offload

    pipe, _, _ = _tiny_transformer()
    m = pipe.transformer
    lat = torch.randn(1, m.config.in_channels, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    emb = torch.randn(1, 12, m.config.text_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = m(lat, torch.tensor([10]), emb).sample
    sizes = [_block_bytes(b) for b in m.blocks]
    cpu_offload(m, execution_device="cpu")  # what enable_sequential_cpu_offload attaches
    with observe(m, backend="cpu") as obs, torch.no_grad():
        out = m(lat, torch.tensor([10]), emb).sample
    assert torch.equal(out, ref)
    copies = _uses(obs.run, "copy")
    assert copies.groupby("layer")["bytes"].sum().tolist() == sizes
    assert set(copies["tier"]) == {"pageable"}
