"""offload_lab.load reads back every kind of file offload-lab writes, and says what a file is not."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import offload_lab
from offload_lab.artifacts import ArtifactError

HOST = offload_lab.HostMemory(available="256GiB")


@pytest.fixture(scope="module")
def spec() -> offload_lab.ModelSpec:
    return offload_lab.catalog.load("wan2.1-t2v-1.3b")


def test_every_saved_kind_loads_back_equal(spec, tmp_path):
    plan = offload_lab.plan(spec, tier="pinned", host=HOST)
    run = offload_lab.simulate(plan, "h200", steps=2)
    run.save(tmp_path / "run.zip")
    (tmp_path / "plan.json").write_text(plan.to_json())
    spec.to_json(tmp_path / "spec.json")
    prof = offload_lab.DeviceProfile.load("h200")
    prof.to_json(tmp_path / "h200.json")
    pp = offload_lab.plan_pipeline([offload_lab.Component("dit", spec, uses=100)], host=HOST)
    (tmp_path / "pipe.json").write_text(json.dumps(pp.to_dict()))

    assert offload_lab.load(tmp_path / "run.zip").equals(run)
    assert offload_lab.load(tmp_path / "plan.json").to_dict() == plan.to_dict()
    assert offload_lab.load(str(tmp_path / "spec.json")).to_dict() == spec.to_dict()
    assert offload_lab.load(tmp_path / "h200.json") == prof
    assert offload_lab.load(tmp_path / "pipe.json").to_dict() == pp.to_dict()


def test_a_checkpoint_loads_as_its_spec(tmp_path):
    tensors = {f"blocks.{i}.w": torch.zeros(4, 4, dtype=torch.bfloat16) for i in range(2)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    spec = offload_lab.load(tmp_path / "m.safetensors")
    assert isinstance(spec, offload_lab.ModelSpec)
    assert spec.total_bytes == 2 * 4 * 4 * 2
    assert offload_lab.load(tmp_path).total_bytes == spec.total_bytes  # the directory too


@pytest.mark.parametrize("name, body, match", [
    ("missing.zip", None, "no such file"),
    ("notes.txt", "hello", "not an offload-lab artefact"),
    ("broken.json", "{not json", "not valid JSON"),
])
def test_what_is_not_an_artefact_says_so_in_one_line(tmp_path, name, body, match):
    if body is not None:
        (tmp_path / name).write_text(body)
    with pytest.raises(ArtifactError, match=match) as e:
        offload_lab.load(tmp_path / name)
    assert "\n" not in str(e.value)


def test_a_json_that_is_no_offload_lab_document_is_read_as_a_trace(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="trace"):
        offload_lab.load(tmp_path / "other.json")
