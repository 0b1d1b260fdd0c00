"""Whole diffusers pipelines: pipeline specs, plan_pipeline by frequency, one run of every
component, and checkpoint directories written by the real writer (tiny random configs, CPU)."""

from __future__ import annotations

import json

import pytest
import torch

import offload_lab

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from tiny_pipelines import STEPS  # noqa: E402

from offload_lab.model.pipeline import component_from_tensors  # noqa: E402
from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_call  # noqa: E402


def _own_bytes(mod: torch.nn.Module) -> int:
    ts = {id(t): t for t in [*mod.parameters(), *mod.buffers()]}
    return sum(t.numel() * t.element_size() for t in ts.values())


def test_spec_of_pipeline_bytes(tiny_pipe):
    ps = offload_lab.spec_of(tiny_pipe)
    assert list(ps.components) == ["vae", "transformer"]
    for name in ps.components:
        assert ps[name].total_bytes == _own_bytes(getattr(tiny_pipe, name))
    assert ps.total_bytes == _own_bytes(tiny_pipe.transformer) + _own_bytes(tiny_pipe.vae)
    assert ps["transformer"].spec.group_names == ["transformer.blocks"]
    assert ps.uses("transformer") == 50 * 2 and ps.uses("vae") == 1
    assert ps.with_uses(steps=4).uses("transformer") == 8


def test_plan_pipeline_pins_denoiser_first(tiny_pipe):
    ps = offload_lab.spec_of(tiny_pipe).with_uses(steps=STEPS)
    budget = ps["transformer"].spec.layer_bytes  # covers the denoiser's layers, nothing more
    pp = offload_lab.plan_pipeline(ps, pin_budget=budget, host=offload_lab.HostMemory(available="64GiB"))
    assert list(pp.components) == ["transformer", "vae"]
    assert pp.ranking["component"].tolist() == ["transformer", "vae"]
    assert pp["transformer"].tier_counts["pinned"] == 6
    assert pp["vae"].tier_counts["pinned"] == 0


def test_offload_whole_pipeline_one_run(tiny_pipe, tiny_reference):
    ps = offload_lab.spec_of(tiny_pipe).with_uses(steps=STEPS)
    pp = offload_lab.plan_pipeline(ps, tier="pageable")
    with offload_lab.offload(tiny_pipe, pp, backend="cpu") as m:
        out = tiny_pipe(**tiny_wan_call(steps=STEPS)).frames
    run = m.build_run()
    assert torch.equal(out, tiny_reference)
    assert run.meta["steps_from"] == "scheduler" and run.meta["pipeline"] == "WanPipeline"
    groups = set(run.layers["group"])
    assert "transformer.blocks" in groups and all(g.startswith(("transformer.", "vae.")) for g in groups)
    # 3 denoising steps of 2 transformer calls each, then the VAE's decode in a step of its own
    assert len(run.steps) == STEPS + 1
    streamed = int(pp["transformer"].layers.query("streamed")["bytes"].sum())
    assert run.steps["bytes_moved"].tolist()[:STEPS] == [2 * streamed] * STEPS
    assert run.steps["calls"].tolist()[:STEPS] == [2] * STEPS
    last = run.events[run.events["step"] == STEPS]
    assert set(last["group"].str.split(".").str[0]) == {"vae"}
    assert "step" not in vars(tiny_pipe.scheduler)


def test_component_without_layer_group_is_one_unit(tiny_pipe, tiny_reference):
    ps = offload_lab.spec_of(tiny_pipe).with_uses(steps=STEPS)
    # the VAE read as if it had no ModuleList: all of its weights are one layer
    vae_tensors = [offload_lab.TensorSpec(n, tuple(p.shape), str(p.dtype).removeprefix("torch."))
                   for n, p in tiny_pipe.vae.named_parameters()]
    ps.components["vae"] = component_from_tensors("vae", vae_tensors, groups=[])
    assert ps["vae"].unit and ps["vae"].spec.group_names == ["vae"]
    pp = offload_lab.plan_pipeline(ps, tier="pinned")
    before = {n: p.detach().clone() for n, p in tiny_pipe.vae.named_parameters()}
    with offload_lab.offload(tiny_pipe, pp, backend="cpu") as m:
        out = tiny_pipe(**tiny_wan_call(steps=STEPS)).frames
    run = m.build_run()
    assert torch.equal(out, tiny_reference)
    vae = run.events[(run.events["group"] == "vae") & (run.events["kind"] == "copy")]
    # one layer, copied whole each time one of its top-level submodules runs (its packed store
    # aligns each tensor, so a copy moves at least the layer's bytes)
    assert len(vae) >= 1 and set(vae["layer"]) == {0}
    assert (vae["bytes"] >= ps["vae"].spec.layer_bytes).all() and vae["bytes"].nunique() == 1
    # leaving restores every parameter of every component
    after = dict(tiny_pipe.vae.named_parameters())
    assert all(torch.equal(after[n], t) for n, t in before.items())
    with torch.no_grad():
        assert torch.equal(tiny_pipe(**tiny_wan_call(steps=STEPS)).frames, tiny_reference)


def test_profile_pipeline_requests(tiny_pipe):
    pp = offload_lab.plan_pipeline(offload_lab.spec_of(tiny_pipe).with_uses(steps=2), tier="pinned")
    run = offload_lab.profile(tiny_pipe, lambda: tiny_pipe(**tiny_wan_call(steps=2)), pp, backend="cpu",
                              warmup=1, requests=1)
    assert len(run.steps) == 2 + 1 and run.meta["warmup_dropped"] == 3
    assert run.meta["requests"] == 1


def test_directory_spec_equals_loaded_pipeline(tiny_saved, tiny_loaded):
    shards = list((tiny_saved / "transformer").glob("*.safetensors"))
    assert len(shards) >= 3
    assert (tiny_saved / "transformer" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    from_dir = offload_lab.spec_of(tiny_saved)
    assert from_dir == offload_lab.ModelSpec.from_safetensors(tiny_saved)
    live = offload_lab.spec_of(tiny_loaded)
    assert from_dir.signature() == live.signature()
    assert from_dir.name == "WanPipeline" and list(from_dir.components) == ["transformer", "vae"]


def test_loading_reproduces_the_original(tiny_pipe, tiny_loaded, tiny_loaded_reference, tiny_reference):
    # the loaded weights are the original's bit for bit; the outputs may still round apart
    # (diffusers and transformers versions differ in what loading sets up), so this is loose
    for name in ("transformer", "vae"):
        back = getattr(tiny_loaded, name).state_dict()
        assert all(torch.equal(back[n], t) for n, t in getattr(tiny_pipe, name).state_dict().items())
    assert torch.allclose(tiny_loaded_reference, tiny_reference, rtol=0, atol=1e-5)


def test_mapped_run_on_file_pages(tiny_loaded, tiny_loaded_reference):
    assert all(offload_lab.is_file_backed(p) for p in tiny_loaded.transformer.parameters())
    ps = offload_lab.spec_of(tiny_loaded).with_uses(steps=STEPS)
    pp = offload_lab.plan_pipeline(ps, tier="mapped")
    assert pp["transformer"].tier_counts["mapped"] == 6
    with offload_lab.offload(tiny_loaded, pp, backend="cpu") as m:
        out = tiny_loaded(**tiny_wan_call(steps=STEPS)).frames
    run = m.build_run()
    # like with like: offload of the loaded pipeline reproduces the loaded pipeline exactly
    assert torch.equal(out, tiny_loaded_reference)
    lay = run.layers[run.layers["group"] == "transformer.blocks"]
    assert (lay["tier"] == "mapped").all() and (lay["mapped_bytes"] == lay["bytes"]).all()
    copies = run.events[(run.events["group"] == "transformer.blocks") & (run.events["kind"] == "copy")]
    assert (copies["tier"] == "mapped").all()


def test_not_a_pipeline_directory(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps(
        {"_class_name": "WanPipeline", "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]}))
    with pytest.raises(offload_lab.SpecError, match="no component with safetensors"):
        offload_lab.spec_of(tmp_path)
