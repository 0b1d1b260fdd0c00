"""Safetensors headers are validated in full: every malformed, hostile or inconsistent
checkpoint is refused with a one-line SpecError naming the file and the tensor."""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from offload_lab import catalog, synthetic
from offload_lab.model.spec import ModelSpec, SpecError


def _write(path: Path, header: dict | str, data: bytes = b"") -> Path:
    """A safetensors file written by hand, so that its header can say anything."""
    raw = header if isinstance(header, str) else json.dumps(header)
    path.write_bytes(struct.pack("<Q", len(raw.encode())) + raw.encode() + data)
    return path


def _refused(path, *needles: str) -> str:
    with pytest.raises(SpecError) as e:
        ModelSpec.from_safetensors(path)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


def _f32(shape, begin, end):
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


def test_real_files_of_every_dtype_and_empty_tensors_are_accepted(tmp_path):
    tensors = {
        "blocks.0.w": torch.zeros(3, 5, dtype=torch.bfloat16),
        "blocks.1.w": torch.zeros(3, 5, dtype=torch.bfloat16),
        "blocks.0.b": torch.zeros(7, dtype=torch.float64),
        "blocks.1.b": torch.zeros(7, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "mask": torch.zeros(2, 2, dtype=torch.bool),
        "f8": torch.zeros(9, dtype=torch.float8_e4m3fn),
    }
    save_file(tensors, str(tmp_path / "m.safetensors"))
    spec = ModelSpec.from_safetensors(tmp_path / "m.safetensors")
    assert spec.total_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
    assert {t.name: t.shape for t in spec.tensors()}["empty"] == (0, 4)


def test_shape_must_match_the_span_of_data_offsets(tmp_path):
    # 16 bytes hold 4 floats, not the 16 a 4 × 4 shape says: the plan would count 64 bytes
    p = _write(tmp_path / "a.safetensors", {"blocks.0.w": _f32([4, 4], 0, 16)}, bytes(16))
    _refused(p, "'blocks.0.w'", "spans 16 bytes", "needs 64", str(p))


@pytest.mark.parametrize("dim, shape_bytes", [
    (-1, 16),      # negative: negative layer bytes that "fit" any budget
    ("4", 16),     # a string
    (4.0, 16),     # a float
    (True, 4),     # a bool is not the int 1
])
def test_dimensions_must_be_non_negative_ints(tmp_path, dim, shape_bytes):
    p = _write(tmp_path / "d.safetensors", {"w": _f32([dim, 4], 0, shape_bytes)}, bytes(shape_bytes))
    _refused(p, "'w'", f"dimension {dim!r}", "ints ≥ 0")


def test_huge_dimensions_are_refused_before_anything_multiplies_them(tmp_path):
    # a zero dimension makes the span 0 whatever the others say
    p = _write(tmp_path / "h.safetensors", {"w": _f32([0, 2**62, 2**62], 0, 0)})
    _refused(p, "'w'", "past the limit")
    p = _write(tmp_path / "h2.safetensors", '{"w": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}}',
               bytes(4))
    _refused(p, "'w'", "dimension inf")


def test_negative_and_overlapping_offsets_are_refused(tmp_path):
    p = _write(tmp_path / "n.safetensors", {"w": _f32([4], -16, 0)}, bytes(16))
    _refused(p, "'w'", "data_offsets [-16, 0]")
    p = _write(tmp_path / "o.safetensors",
               {"a": _f32([4], 0, 16), "b": _f32([4], 8, 24)}, bytes(24))
    _refused(p, "'b' overlaps tensor 'a'")
    p = _write(tmp_path / "r.safetensors", {"w": _f32([4], 16, 32)}, bytes(16))
    _refused(p, "'w'", "truncated")


def test_a_name_twice_in_one_header_is_refused(tmp_path):
    raw = '{"w": ' + json.dumps(_f32([1], 0, 4)) + ', "w": ' + json.dumps(_f32([1], 4, 8)) + "}"
    p = _write(tmp_path / "twice.safetensors", raw, bytes(8))
    _refused(p, "'w' appears twice")


def test_names_duplicated_across_shards_are_refused(tmp_path):
    for i in (1, 2):
        save_file({"blocks.0.w": torch.zeros(4), "blocks.1.w": torch.zeros(4), f"x{i}": torch.zeros(1)},
                  str(tmp_path / f"m-{i}.safetensors"))
    _refused(tmp_path, "'blocks.0.w' is in both", "m-1.safetensors", "m-2.safetensors")
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "blocks.0.w": "m-1.safetensors", "blocks.1.w": "m-2.safetensors",
        "x1": "m-1.safetensors", "x2": "m-2.safetensors"}}))
    _refused(tmp_path / "m.safetensors.index.json", "is in both")


def test_index_must_agree_with_its_shards(tmp_path):
    save_file({"blocks.0.w": torch.zeros(4), "blocks.1.w": torch.zeros(4)}, str(tmp_path / "a.safetensors"))
    idx = tmp_path / "m.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"blocks.0.w": "a.safetensors", "blocks.9.w": "a.safetensors"}}))
    _refused(idx, "'blocks.9.w'", "does not hold it")


def test_deep_nesting_is_a_spec_error_not_a_recursion_error(tmp_path):
    deep = "[" * 200_000 + "]" * 200_000
    p = _write(tmp_path / "deep.safetensors", '{"w": ' + deep + "}")
    _refused(p, "nested too deeply", str(p))
    idx = tmp_path / "deep.safetensors.index.json"
    idx.write_text('{"weight_map": ' + deep + "}")
    _refused(idx, "nested too deeply")


def test_index_values_must_be_file_names(tmp_path):
    idx = tmp_path / "m.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"blocks.0.w": 5}}))
    _refused(idx, "'blocks.0.w' maps to 5")
    idx.write_text(json.dumps({"weight_map": ["a.safetensors"]}))
    _refused(idx, "weight_map")


def _unblock(fifo: Path) -> None:
    # a reader stuck in open() of the FIFO returns once a writer comes and goes
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader is waiting: nothing to release


def _refused_without_hanging(path, fifo: Path, *needles: str) -> None:
    result: dict = {}

    def call():
        try:
            ModelSpec.from_safetensors(path)
            result["error"] = None
        except Exception as e:  # noqa: BLE001 - reported below
            result["error"] = e

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(60)  # a safety net only: the refusal itself involves no waiting
    if t.is_alive():
        _unblock(fifo)
        t.join(10)
        pytest.fail(f"reading {path} blocked in open()")
    err = result["error"]
    assert isinstance(err, SpecError), repr(err)
    for n in needles:
        assert n in str(err)


def test_a_fifo_is_never_opened_for_reading(tmp_path):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    _refused_without_hanging(fifo, fifo, "not a regular file")
    idx = tmp_path / "m.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"blocks.0.w": "pipe.safetensors"}}))
    _refused_without_hanging(idx, fifo, "pipe.safetensors'", "not a regular file")


@pytest.fixture
def outside(tmp_path):
    """A checkpoint directory, and a file outside it whose size an error must not reveal."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    secret = tmp_path / "secret" / "key.safetensors"
    secret.parent.mkdir()
    secret.write_bytes(b"x" * 12345)
    return ckpt, secret


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_index_shards_outside_the_directory_are_refused_silently(outside, how):
    ckpt, secret = outside
    shard = {"dotdot": "../secret/key.safetensors", "absolute": str(secret),
             "symlink": "link.safetensors"}[how]
    if how == "symlink":
        (ckpt / "link.safetensors").symlink_to(secret)
    idx = ckpt / "m.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"blocks.0.w": shard}}))
    msg = _refused(idx, "outside its directory", repr(shard))
    assert "12345" not in msg and "truncated" not in msg and "corrupt" not in msg


def test_directory_symlinks_escaping_are_refused(outside):
    ckpt, secret = outside
    (ckpt / "model.safetensors").symlink_to(secret)
    msg = _refused(ckpt, "links outside")
    assert "12345" not in msg


def test_synthetic_load_uses_the_same_validation(tmp_path):
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.02, layers=2)
    path = synthetic.save(model, tmp_path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    # a bool first dimension of the same element count: old readers took it for 1
    name = next(k for k, v in header.items() if k != "__metadata__" and v["shape"][:1] == [1])
    header[name]["shape"][0] = True
    bad = _write(tmp_path / "bad.safetensors", json.dumps(header), raw[8 + n:])
    with pytest.raises(SpecError, match=f"tensor '{name}' has dimension True"):
        synthetic.load(bad)
