"""Components that a pipeline calls by another entry point than ``forward`` (an autoencoder's
``decode``) are recorded all the same; a recording that saw no call says what to do."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_pipelines import STEPS

import offload_lab
from offload_lab import HostMemory
from offload_lab.record.recorder import RecordWarning, entry_points

HOST = HostMemory(available="64GiB")


def _call():
    from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_call

    return tiny_wan_call(steps=STEPS)


def _hooks(m: torch.nn.Module) -> int:
    return sum(len(x._forward_pre_hooks) + len(x._forward_hooks) for x in m.modules())


def test_offload_vae_records_the_decode(tiny_pipe, tiny_reference):
    vae = tiny_pipe.vae
    assert entry_points(vae) == ["encode", "decode"]
    hooks = _hooks(vae)
    plan = offload_lab.plan(offload_lab.spec_of(vae), tier="pageable", host=HOST)
    with offload_lab.offload(vae, plan, backend="cpu") as m, torch.no_grad():
        frames = tiny_pipe(**_call()).frames
    np.testing.assert_array_equal(frames, tiny_reference)
    assert "decode" not in vars(vae) and "encode" not in vars(vae) and _hooks(vae) == hooks
    run = m.run
    # the pipeline decodes once: one call, one step, every decoder layer computed and copied
    assert len(run.steps) == 1 and run.meta["calls_recorded"] == 1
    decoder = {g.name for g in offload_lab.spec_of(vae).groups if g.name.startswith("decoder.")}
    comp = run.events[run.events["kind"] == "compute"]
    assert set(comp["group"]) == decoder
    layers = {(g.name, la.index) for g in offload_lab.spec_of(vae).groups if g.name in decoder for la in g.layers}
    # the Wan decoder runs once per latent frame: every layer at least once, each use copied
    assert set(zip(comp["group"], comp["layer"])) == layers
    assert (run.events["kind"] == "copy").sum() == len(comp) >= len(layers)


def test_observe_vae_records_the_decode(tiny_pipe, tiny_reference):
    with offload_lab.observe(tiny_pipe.vae, backend="cpu") as obs, torch.no_grad():
        frames = tiny_pipe(**_call()).frames
    np.testing.assert_array_equal(frames, tiny_reference)
    run = obs.run
    assert len(run.steps) == 1
    assert set(run.events["group"]) >= {"decoder.up_blocks"}
    assert run.layers.loc[run.layers["group"] == "decoder.up_blocks", "tier"].eq("resident").all()


def test_a_run_that_saw_no_call_warns_with_what_to_do(tiny_pipe):
    plan = offload_lab.plan(offload_lab.spec_of(tiny_pipe.vae), tier="pageable", host=HOST)
    with offload_lab.offload(tiny_pipe.vae, plan, backend="cpu") as m:
        pass
    with pytest.warns(RecordWarning, match="recorded nothing.*AutoencoderKLWan.*decode.*call the model"):
        run = m.run
    assert len(run.events) == 0
