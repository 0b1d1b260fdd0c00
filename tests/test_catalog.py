"""The shipped catalog matches the public model code byte for byte; FLOPs; packaging.

The expected figures were worked out by hand from the public configs (Wan-Video/Wan2.1
``wan/configs/*.py`` and ``wan/modules/model.py``; the MiniMax-H3 DiT config), independently of
``scripts/make_catalog.py``, which writes the JSON.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from offload_lab import catalog, flops
from offload_lab.model.spec import ModelSpec, TensorSpec

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
WAN = ["wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.1-i2v-14b"]
H3_QKV = 21504 * 5376 * 2


def test_names_are_the_four_shipped_models():
    assert catalog.names() == ["minimax-h3", "wan2.1-i2v-14b", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b"]


# -- Wan2.1 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, layers, block_bytes, non_block_params",
    [
        ("wan2.1-t2v-1.3b", 30, 92_881_408, 25_775_680),
        ("wan2.1-t2v-14b", 40, 702_788_608, 232_719_424),
        ("wan2.1-i2v-14b", 40, 807_676_928, 241_340_224),
    ],
)
def test_wan_bytes_equal_reference(name, layers, block_bytes, non_block_params):
    spec = catalog.load(name)
    assert spec.group_names == ["blocks"]
    assert spec.group("blocks").num_layers == layers
    assert [layer.bytes for layer in spec.iter_layers()] == [block_bytes] * layers
    assert sum(t.numel for t in spec.non_layer) == non_block_params
    assert spec.non_layer_bytes == 2 * non_block_params
    assert spec.total_bytes == layers * block_bytes + 2 * non_block_params
    # every Wan tensor is a bf16 checkpoint view (the documented choice)
    assert {t.dtype for t in spec.tensors()} == {"bfloat16"}
    assert spec.mapped_bytes == spec.total_bytes


def test_wan_1_3b_total_and_params():
    spec = catalog.load("wan2.1-t2v-1.3b")
    assert spec.total_bytes == 2_837_993_600
    assert sum(t.numel for t in spec.tensors()) == 1_418_996_800


def test_wan_totals_round_to_reference_table():
    got = {n: catalog.load(n) for n in WAN}
    assert [round(sum(t.numel for t in s.tensors()) / 1e9, 3) for s in got.values()] == [
        1.419, 14.288, 16.395]
    assert [round(s.total_bytes / 1e9, 2) for s in got.values()] == [2.84, 28.58, 32.79]


def test_wan_tensor_names_follow_original_code():
    t2v = catalog.load("wan2.1-t2v-14b")
    block = {t.name.removeprefix("blocks.0."): t.shape for t in t2v.group("blocks").layers[0].tensors}
    d, f = 5120, 13824
    assert block["modulation"] == (1, 6, d)
    for attn in ("self_attn", "cross_attn"):
        for p in "qkvo":
            assert block[f"{attn}.{p}.weight"] == (d, d)
            assert block[f"{attn}.{p}.bias"] == (d,)
        assert block[f"{attn}.norm_q.weight"] == block[f"{attn}.norm_k.weight"] == (d,)
    assert block["norm3.weight"] == block["norm3.bias"] == (d,)
    assert block["ffn.0.weight"] == (f, d) and block["ffn.2.weight"] == (d, f)
    assert len(block) == 27
    non = {t.name: t.shape for t in t2v.non_layer}
    assert non["patch_embedding.weight"] == (d, 16, 1, 2, 2)
    assert non["text_embedding.0.weight"] == (d, 4096)
    assert non["time_embedding.0.weight"] == (d, 256)
    assert non["time_projection.1.weight"] == (6 * d, d)
    assert non["head.head.weight"] == (64, d)
    assert non["head.modulation"] == (1, 2, d)

    i2v = catalog.load("wan2.1-i2v-14b")
    extra = {t.name for t in i2v.group("blocks").layers[3].tensors} - {
        t.name for t in t2v.group("blocks").layers[3].tensors}
    assert extra == {f"blocks.3.cross_attn.{n}" for n in (
        "k_img.weight", "k_img.bias", "v_img.weight", "v_img.bias", "norm_k_img.weight")}
    non = {t.name: t.shape for t in i2v.non_layer}
    assert non["patch_embedding.weight"] == (d, 36, 1, 2, 2)
    assert non["img_emb.proj.1.weight"] == (1280, 1280)
    assert non["img_emb.proj.3.weight"] == (d, 1280)
    assert non["img_emb.proj.4.weight"] == (d,)


def test_a_wan_block_by_part_has_every_part_and_sums_to_the_block():
    block = catalog.load("wan2.1-t2v-14b").group("blocks").layers[0]
    parts = block.bytes_by_part()
    d, f = 5120, 13824
    # bf16: four d x d projections with biases and two d-wide qk norms per attention
    attn = 2 * (4 * (d * d + d) + 2 * d)
    assert parts == {"ffn": 2 * (2 * f * d + f + d), "cross_attn": attn, "self_attn": attn,
                     "modulation": 2 * 6 * d, "norm3": 2 * 2 * d}
    assert sum(parts.values()) == block.bytes and len(parts) > 3
    assert block.part_of("blocks.0.norm3.bias") == "norm3" and block.part_of("other.x") == "other"


# -- MiniMax-H3 --------------------------------------------------------------------------------------
def test_h3_groups_in_declared_order():
    spec = catalog.load("minimax-h3")
    assert [(g.name, g.num_layers) for g in spec.groups] == [
        ("token_refiner.blocks", 2), ("blocks", 50)]
    df = spec.layers
    assert list(df["group"]) == ["token_refiner.blocks"] * 2 + ["blocks"] * 50
    assert list(df["layer"]) == [0, 1] + list(range(50))


def test_h3_bytes_equal_reference():
    spec = catalog.load("minimax-h3")
    assert spec.total_bytes == 66_280_430_080
    assert round(spec.total_bytes / GiB, 2) == 61.73
    assert {layer.bytes for layer in spec.group("blocks").layers} == {1_291_143_680}
    assert {layer.bytes for layer in spec.group("token_refiner.blocks").layers} == {770_725_376}
    by_dtype: dict[str, int] = {}
    for t in spec.non_layer:
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
    assert by_dtype == {"float32": 68_888_576, "bfloat16": 112_906_752}
    block = {t.name.removeprefix("blocks.7."): (t.shape, t.nbytes)
             for t in spec.group("blocks").layers[7].tensors}
    assert block == {
        "norm1.weight": ((5376,), 10_752),
        "norm2.weight": ((5376,), 10_752),
        "attn.qkv_proj.weight": ((21504, 5376), 231_211_008),
        "attn.q_norm.weight": ((128,), 256),
        "attn.k_norm.weight": ((128,), 256),
        "attn.out_proj.weight": ((5376, 7168), 77_070_336),
        "mlp.fc1.weight": ((28672, 5376), 308_281_344),
        "mlp.fc2.weight": ((5376, 14336), 154_140_672),
        "adaln_proj.linear.weight": ((96768, 2688), 520_224_768),
        "adaln_proj.linear.bias": ((96768,), 193_536),
    }


def test_h3_mapped_is_everything_but_fused_qkv():
    spec = catalog.load("minimax-h3")
    unmapped = [t.name for t in spec.tensors() if not t.mapped]
    assert len(unmapped) == 52 and all(n.endswith(".attn.qkv_proj.weight") for n in unmapped)
    assert spec.mapped_bytes == spec.total_bytes - 52 * H3_QKV
    assert round(spec.mapped_bytes / GiB, 2) == 50.53
    assert list(spec.layers["mapped_bytes"]) == [770_725_376 - H3_QKV] * 2 + [
        1_291_143_680 - H3_QKV] * 50


# -- meta, JSON, loading -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", WAN + ["minimax-h3"])
def test_meta_has_the_shared_keys(name):
    meta = catalog.load(name).meta
    for key in ("arch", "display_name", "default_steps", "guidance_passes", "tokens",
                "text_tokens", "dims", "scale", "source"):
        assert key in meta, key
    assert meta["tokens"] == {"480p": 32760, "720p": 75600}
    assert meta["text_tokens"] == 512 and meta["scale"] == 1.0
    assert meta["arch"] == ("h3" if name == "minimax-h3" else "wan")
    if meta["arch"] == "wan":
        assert meta["guidance_passes"] == 2
        assert meta["default_steps"] == (40 if "i2v" in name else 50)
        assert meta["dims"]["text_dim"] == 4096 and meta["dims"]["patch"] == [1, 2, 2]


@pytest.mark.parametrize("name", WAN + ["minimax-h3"])
def test_json_round_trip(name):
    spec = catalog.load(name)
    back = ModelSpec.from_json(spec.to_json())
    assert back == spec
    assert back.to_dict() == spec.to_dict()
    assert ModelSpec.from_json(catalog.path(name)) == spec


def test_committed_json_matches_generator(tmp_path):
    sp = importlib.util.spec_from_file_location("make_catalog", ROOT / "scripts" / "make_catalog.py")
    mod = importlib.util.module_from_spec(sp)
    sp.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0


def test_load_is_case_insensitive_and_fresh():
    a = catalog.load("Wan2.1-T2V-1.3B")
    assert a.name == "wan2.1-t2v-1.3b"
    assert catalog.path(" MINIMAX-H3 ").name == "minimax-h3.json"
    a.meta["dims"]["d"] = 1
    a.groups.clear()
    b = catalog.load("wan2.1-t2v-1.3b")
    assert b.meta["dims"]["d"] == 1536 and b.group("blocks").num_layers == 30


def test_unknown_name_error_names_it_and_lists_names():
    with pytest.raises(ValueError) as e:
        catalog.load("wan2.2-t2v-5b")
    msg = str(e.value)
    assert "'wan2.2-t2v-5b'" in msg
    for n in catalog.names():
        assert n in msg
    with pytest.raises(ValueError, match="minimax-h3"):
        catalog.path("h3")
    with pytest.raises(ValueError, match="string"):
        catalog.load(None)


# -- FLOPs ---------------------------------------------------------------------------------------
def _close(got: float, want: float, rel: float = 0.02) -> bool:
    return abs(got - want) <= rel * want


def test_wan_flops_match_reference_figures():
    small, big = catalog.load("wan2.1-t2v-1.3b"), catalog.load("wan2.1-t2v-14b")
    assert _close(flops.layer_flops(small, "blocks", "480p"), 9.4e12)
    assert _close(flops.step_flops(small, "480p"), 0.57e15)
    assert _close(flops.layer_flops(big, "blocks", 32760), 42e12)
    assert _close(flops.step_flops(big, 32760), 3.4e15)
    assert _close(flops.layer_flops(big, "blocks", "720p"), 163e12)
    i2v = catalog.load("wan2.1-i2v-14b")
    assert _close(flops.layer_flops(i2v, "blocks", "480p"), 42e12)
    # the image k/v add a little over the T2V block, never less
    assert flops.layer_flops(i2v, "blocks", "480p") > flops.layer_flops(big, "blocks", "480p")


def test_wan_formula_exact():
    L, Lc, d, f = 32760, 512, 1536, 8960
    want = 12 * L * d * d + 4 * L * d * f + 4 * L * L * d + 4 * L * Lc * d + 4 * Lc * d * d
    spec = catalog.load("wan2.1-t2v-1.3b")
    assert flops.layer_flops(spec, "blocks", L) == want
    assert flops.step_flops(spec, L) == want * 30 * 2
    # without arch/dims the shape-based estimate gives the same count for a Wan block
    spec.meta = {}
    assert flops.layer_flops(spec, "blocks", L, text_tokens=Lc) == want


def test_h3_flops_from_shapes():
    spec = catalog.load("minimax-h3")
    L, Lc, H, W = 32760, 512, 5376, 7168
    linear = 21504 * H + H * W + 28672 * H + H * 14336
    S = L + Lc
    main = 2 * S * linear + 4 * S * S * W + 2 * 96768 * 2688
    refiner = 2 * Lc * linear + 4 * Lc * Lc * W
    assert flops.layer_flops(spec, "blocks", "480p") == main
    assert flops.layer_flops(spec, "token_refiner.blocks", "480p", layer=1) == refiner
    assert flops.step_flops(spec, L) == 2 * (50 * main + 2 * refiner)


def test_generic_flops_from_diffusers_style_names():
    d, c, f, L, Lc = 64, 32, 256, 100, 7
    tensors = [TensorSpec(f"blocks.{i}.{n}", s, "float32") for i in range(2) for n, s in [
        ("attn1.to_q.weight", (d, d)), ("attn1.to_k.weight", (d, d)),
        ("attn1.to_v.weight", (d, d)), ("attn1.to_out.0.weight", (d, d)),
        ("attn2.to_q.weight", (d, d)), ("attn2.to_k.weight", (d, c)),
        ("attn2.to_v.weight", (d, c)), ("attn2.to_out.0.weight", (d, d)),
        ("ff.net.0.proj.weight", (f, d)), ("ff.net.2.weight", (d, f)),
        ("adaLN_modulation.1.weight", (6 * d, d)), ("norm2.weight", (d,)),
    ]]
    spec = ModelSpec("toy", [], [], {})
    spec = ModelSpec.from_dict({**spec.to_dict(), "groups": [
        {"name": "blocks", "block_class": None,
         "layers": [[t.to_dict() for t in tensors if t.name.startswith(f"blocks.{i}.")]
                    for i in range(2)]}]})
    want = 2 * L * (6 * d * d + 2 * f * d)   # q, k, v, out, q, out and the FFN on L tokens
    want += 2 * Lc * 2 * d * c               # cross-attention k, v on the text tokens
    want += 2 * 6 * d * d                    # adaLN once per sample
    want += 4 * L * L * d + 4 * L * Lc * d   # self- and cross-attention scores and values
    assert flops.layer_flops(spec, "blocks", L, text_tokens=Lc) == want
    assert flops.step_flops(spec, L, text_tokens=Lc) == 2 * want  # 2 layers, 1 guidance pass
    # without text tokens the cross-attention terms vanish instead of failing
    assert flops.layer_flops(spec, "blocks", L) == want - 2 * Lc * 2 * d * c - 4 * L * Lc * d


def test_flops_bad_tokens_name_the_value():
    spec = catalog.load("wan2.1-t2v-1.3b")
    with pytest.raises(ValueError, match="'1080p'.*480p"):
        flops.layer_flops(spec, "blocks", "1080p")
    with pytest.raises(ValueError, match="-5"):
        flops.step_flops(spec, -5)
    with pytest.raises(ValueError, match="'blockz'"):
        flops.layer_flops(spec, "blockz", 10)
    with pytest.raises(ValueError, match="30"):
        flops.layer_flops(spec, "blocks", 10, layer=30)
    with pytest.raises(ValueError, match="layer = True"):  # a bool is not layer 1
        flops.layer_flops(spec, "blocks", 10, layer=True)


# -- packaging -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_catalog_and_shipped_runs_load_after_regular_install(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "-w", str(tmp_path / "wheel"), str(ROOT)],
                   check=True, cwd=ROOT, env=env, timeout=120)
    (wheel,) = (tmp_path / "wheel").glob("offload_lab-*.whl")
    site = tmp_path / "site"
    subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, env=env, timeout=120)
    code = (
        "import offload_lab.model.catalog as c; print(c.__file__); print(c.path('minimax-h3')); "
        "print(c.load('minimax-h3').total_bytes); import offload_lab, offload_lab.shipped as s; "
        "print(len(offload_lab.shipped_runs())); print(s.data_dir('runs'))"
    )
    # PYTHONPATH puts the installed copy ahead of the venv's editable one; cwd keeps the
    # repository off sys.path; the venv's site-packages still supply pandas
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, env={**env, "PYTHONPATH": str(site)}, timeout=60)
    assert out.returncode == 0, out.stderr
    module_file, json_path, total, n_runs, runs_dir = out.stdout.split()
    assert Path(module_file).is_relative_to(site)
    assert Path(json_path) == site / "offload_lab" / "_data" / "models" / "minimax-h3.json"
    assert int(total) == 66_280_430_080
    # the measured GPU runs travel in the wheel too, found through the package
    assert Path(runs_dir) == site / "offload_lab" / "_data" / "runs"
    assert int(n_runs) == len(list(ROOT.glob("data/runs/*/*.zip"))) > 0
