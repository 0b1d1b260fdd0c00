"""Specs from live modules and safetensors headers; sizes; bad input."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import offload_lab
from offload_lab import catalog, synthetic
from offload_lab.model.checkpoints import read_header
from offload_lab.model.load import spec_of
from offload_lab.model.spec import ModelSpec, SpecError
from offload_lab.units import SizeError, format_bytes, parse_size


class Block(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(self.a(x))


class Refiner(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block(4) for _ in range(2))


class TwoGroups(nn.Module):
    def __init__(self):
        super().__init__()
        self.token_refiner = Refiner()
        self.blocks = nn.ModuleList(Block(8) for _ in range(3))
        self.head = nn.Linear(8, 2)
        self.mixed = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])  # not one class: not a group


def test_spec_of_detects_dotted_groups_and_counts_non_layer_apart():
    spec = spec_of(TwoGroups())
    assert spec.group_names == ["token_refiner.blocks", "blocks"]
    assert [g.num_layers for g in spec.groups] == [2, 3]
    block8 = (8 * 8 + 8 + 8 + 8) * 4
    assert spec.group("blocks").bytes == 3 * block8
    assert spec.non_layer_bytes == (8 * 2 + 2 + 2 * 2 + 2) * 4
    assert spec.total_bytes == sum(p.numel() * 4 for p in TwoGroups().parameters())
    assert spec.group("blocks").block_class == "Block"
    df = spec.layers
    assert {"group", "layer", "bytes", "mapped_bytes", "bytes_float32"} <= set(df.columns)


def test_spec_of_explicit_groups_and_bad_names():
    m = TwoGroups()
    assert spec_of(m, groups=["blocks"]).group_names == ["blocks"]
    with pytest.raises(SpecError, match="'nope' is not a submodule"):
        spec_of(m, groups=["nope"])
    with pytest.raises(SpecError, match="is a Linear, not an nn.ModuleList"):
        spec_of(m, groups=["head"])
    with pytest.raises(SpecError, match="no layer group"):
        spec_of(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(SpecError, match="expects a torch.nn.Module"):
        spec_of("model")


def test_shared_tensors_counted_once():
    m = TwoGroups()
    m.blocks[1].a.weight = m.blocks[0].a.weight  # tied across layers
    shared = nn.Linear(8, 8)
    m.extra, m.extra2 = shared, shared  # one module under two names
    spec = spec_of(m)
    assert spec.total_bytes == sum(p.numel() * 4 for p in {id(p): p for p in m.parameters()}.values())
    b = spec.group("blocks").layers
    assert b[0].bytes - b[1].bytes == 8 * 8 * 4  # the tied weight counts at its first owner only
    assert spec.non_layer_bytes == (8 * 2 + 2 + 2 * 2 + 2 + 8 * 8 + 8) * 4


def test_json_round_trip_and_repr():
    spec = catalog.load("minimax-h3")
    again = ModelSpec.from_json(spec.to_json())
    assert again.to_dict() == spec.to_dict()
    assert "61.73 GiB" in repr(spec)
    with pytest.raises(SpecError, match="not valid JSON"):
        ModelSpec.from_json("{nope")


def test_from_safetensors_file_dir_and_index(tmp_path):
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=3)
    path = synthetic.save(model, tmp_path / "one")
    from_file = ModelSpec.from_safetensors(path)
    live = spec_of(model)
    assert from_file.group_names == ["blocks"] and from_file.groups[0].num_layers == 3
    assert from_file.total_bytes == live.total_bytes
    assert from_file.mapped_bytes == from_file.total_bytes  # every tensor can stay on the file
    idx = synthetic.save(model, tmp_path / "sharded", shard_bytes=64 * 1024)
    assert str(idx).endswith(".index.json")
    assert ModelSpec.from_safetensors(idx).total_bytes == live.total_bytes
    assert ModelSpec.from_safetensors(idx.parent).total_bytes == live.total_bytes


def test_from_safetensors_reads_only_the_header(tmp_path):
    p = tmp_path / "x.safetensors"
    save_file({"blocks.0.w": torch.zeros(4, 4), "blocks.1.w": torch.zeros(4, 4)}, str(p))
    # cut the data: a header-only reader must still name the tensors, and say it is truncated
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    e = read_header(p).tensors["blocks.0.w"]
    assert (e.dtype, e.shape) == ("float32", (4, 4))
    (tmp_path / "cut.safetensors").write_bytes(raw[: 8 + n + 10])
    with pytest.raises(SpecError, match="truncated"):
        ModelSpec.from_safetensors(tmp_path / "cut.safetensors")


@pytest.mark.parametrize("payload,needle", [
    (b"\x01\x00", "truncated"),
    (struct.pack("<Q", 10**12) + b"{}", "corrupt safetensors header"),
    (struct.pack("<Q", 5) + b"nope!", "not JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
])
def test_corrupt_headers(tmp_path, payload, needle):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(payload)
    with pytest.raises(SpecError, match=needle):
        ModelSpec.from_safetensors(p)


def test_bad_header_entry_and_missing_paths(tmp_path):
    header = json.dumps({"blocks.0.w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}).encode()
    p = tmp_path / "e.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0")
    with pytest.raises(SpecError, match="malformed header entry"):
        ModelSpec.from_safetensors(p)
    with pytest.raises(SpecError, match="no such safetensors file"):
        ModelSpec.from_safetensors(tmp_path / "missing.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="holds no .safetensors"):
        ModelSpec.from_safetensors(tmp_path / "empty")


def test_sizes():
    assert parse_size("8GiB") == 8 * 2**30
    assert parse_size("512 MiB") == 512 * 2**20
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size(8e9) == 8_000_000_000
    assert parse_size(0) == parse_size("0") == 0
    assert format_bytes(1_291_143_680) == "1.20 GiB"
    for bad, needle in [("-1GiB", "is not a size"), (-5, "negative"), ("8 parsecs", "unknown unit"),
                        ("8", "ambiguous"), ("lots", "is not a size"), (True, "bool"),
                        (float("inf"), "not finite"), ([1], "has type list")]:
        with pytest.raises(SizeError, match=needle):
            parse_size(bad)
    assert issubclass(SizeError, ValueError)


def test_lazy_package_api():
    assert callable(offload_lab.plan) and callable(offload_lab.report)
    assert offload_lab.ModelSpec is ModelSpec
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        offload_lab.nope  # noqa: B018


def test_one_spec_of_for_synthetic_and_plain_modules():
    from offload_lab.notebook.models import spec_for_model

    model = synthetic.build(catalog.load("minimax-h3"), scale=0.02, layers=1)
    spec = offload_lab.spec_of(model)
    # a synthetic model keeps its catalog name and meta, and its 1-block groups are groups
    assert spec.name == "minimax-h3"
    assert spec.group_names == ["token_refiner.blocks", "blocks"]
    assert [g.num_layers for g in spec.groups] == [1, 1]
    assert spec.meta == model.offload_spec_meta
    spec.meta["dims"]["d"] = -1
    assert model.offload_spec_meta["dims"]["d"] != -1  # the spec's meta is its own copy
    assert synthetic.spec_of is offload_lab.spec_of
    assert spec_for_model(model).to_dict() == offload_lab.spec_of(model).to_dict()
    assert spec_of(model, name="mine").name == "mine"
    assert spec_of(model, groups=["blocks"]).group_names == ["blocks"]
    assert spec_of(TwoGroups()).name == "TwoGroups" and spec_of(TwoGroups()).meta == {}


def test_declared_groups_skip_empty_lists_and_named_empty_lists_are_refused():
    m = TwoGroups()
    m.offload_layer_groups = ("nothing", "blocks")
    m.nothing = nn.ModuleList()
    assert spec_of(m).group_names == ["blocks"]
    with pytest.raises(SpecError, match="'nothing' of 'TwoGroups' is an empty nn.ModuleList"):
        spec_of(m, groups=["nothing", "blocks"])


@pytest.mark.parametrize("shape", [(True, 2), (-1, 2), (2.0,), ("2",), [2, 2]])
def test_tensor_shapes_are_tuples_of_non_negative_ints(shape):
    from offload_lab.model.spec import TensorSpec

    with pytest.raises(SpecError, match="accepted: a tuple of ints ≥ 0"):
        TensorSpec("w", shape, "float32")


def test_malformed_spec_json_is_one_line_spec_error(tmp_path):
    good = catalog.load("wan2.1-t2v-1.3b").to_dict()
    bad_file = tmp_path / "latin1.json"
    bad_file.write_bytes(b'{"name": "\xff"}')
    cases = [
        (bad_file, "latin1.json.* is not UTF-8 text"),
        (tmp_path / "absent.json", "no such model spec"),
        ('{"format": "offload-lab/model-spec", "name": "m"}', "'m' is malformed: missing 'groups'"),
        (json.dumps({**good, "groups": [{"name": "blocks", "layers": [[{"name": "w"}]]}]}),
         "missing 'shape'"),
        (json.dumps({**good, "groups": 5}), "is malformed"),
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ]
    for source, needle in cases:
        with pytest.raises(SpecError, match=needle) as e:
            ModelSpec.from_json(source)
        assert "\n" not in str(e.value)
