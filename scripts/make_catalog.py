"""Write the shipped model catalog, ``data/models/*.json``, from the public model code.

Run from the repository root after changing anything here, and commit the JSON it writes::

    .venv/bin/python scripts/make_catalog.py           # (re)write data/models/*.json
    .venv/bin/python scripts/make_catalog.py --check   # exit 1 if the committed JSON is stale

Every tensor's name, shape and dtype is read off the public model code: Wan-Video/Wan2.1's
``wan/modules/model.py`` + ``wan/configs/*.py`` (github.com/Wan-Video/Wan2.1) and the public
MiniMax-H3 DiT config and model code. The script refuses to write a spec whose byte totals
differ from the totals in ``EXPECTED`` below (worked out by hand from those configs) by a
single byte; ``tests/test_catalog.py`` checks the same totals.

Choices made where the model code leaves room (also recorded in each JSON's ``meta``):

* Wan tensor names are those of the original ``WanModel`` state dict (not diffusers'): block
  tensors in ``nn.Module.named_parameters`` order, which lists a module's own parameters before
  its children's, so ``modulation`` comes first in a block and ``head.modulation`` before
  ``head.head``. ``norm1``/``norm2`` and ``head.norm`` are LayerNorms without affine
  parameters and so have no tensors; ``norm3`` is the affine LayerNorm before cross-attention.
* Wan dtypes are all ``bfloat16``: the byte counts are 2 bytes per parameter, which
  is how the public inference code runs the DiT (diffusers would keep ``scale_shift_table`` and
  the affine norm in fp32; a spec of such a load can be taken with ``spec_of``).
* Wan ``mapped``: every tensor. The original code loads each tensor by name with no re-layout
  (no fusing, no transposes), so each can be served as a view of the checkpoint file's pages.
* I2V ``img_emb`` is ``MLPProj.proj`` = Sequential(LayerNorm(1280), Linear(1280, 1280), GELU,
  Linear(1280, d), LayerNorm(d)), hence indices 0, 1, 3, 4; the CLIP context is 257 tokens.
* H3 group and block classes are not named in the public config, so ``block_class`` is left unset.
  Tensor names are the config's module names with the ``.weight`` suffix a torch module adds.
* H3 ``mapped``: every tensor except each block's fused ``attn.qkv_proj.weight``, which is
  re-ordered at load time (50.53 GiB of 61.73 GiB are views).
* H3 sampling defaults are assumptions (the public config gives none): 50 steps, classifier-free
  guidance with 2 passes, the Wan token counts at 480p/720p (a 1x2x2 patch over a latent of the
  same 21x60x104 / 21x90x160 grid; audio tokens are not counted), 512 text tokens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a clone without an install

from offload_lab.model.spec import GroupSpec, LayerSpec, ModelSpec, TensorSpec  # noqa: E402

OUT_DIR = ROOT / "data" / "models"
BF16, FP32 = "bfloat16", "float32"

WAN_SOURCE = (
    "Wan-Video/Wan2.1 wan/modules/model.py (WanModel, WanAttentionBlock, "
    "WanI2VCrossAttention, Head, MLPProj) and wan/configs/{cfg}.py "
    "(github.com/Wan-Video/Wan2.1); byte totals checked by tests/test_catalog.py"
)
H3_SOURCE = "public MiniMax-H3 DiT config and model code; byte totals checked by tests/test_catalog.py"
TOKENS = {"480p": 32760, "720p": 75600}
TOKENS_NOTE = (
    "480p = 832x480, 81 frames -> latent 21x60x104 -> 32,760 tokens at patch 1x2x2; "
    "720p = 1280x720, 81 frames -> latent 21x90x160 -> 75,600 tokens"
)

# expected figures, worked out from the public configs; the script fails rather than write anything else
EXPECTED = {
    "wan2.1-t2v-1.3b": {"layer": {"blocks": 92_881_408}, "non_layer_params": 25_775_680,
                        "total": 2_837_993_600},
    "wan2.1-t2v-14b": {"layer": {"blocks": 702_788_608}, "non_layer_params": 232_719_424},
    "wan2.1-i2v-14b": {"layer": {"blocks": 807_676_928}, "non_layer_params": 241_340_224},
    "minimax-h3": {"layer": {"token_refiner.blocks": 770_725_376, "blocks": 1_291_143_680},
                   "non_layer_bytes": {FP32: 68_888_576, BF16: 112_906_752},
                   "total": 66_280_430_080},
}


def _t(name: str, shape: tuple[int, ...], dtype: str = BF16, mapped: bool = True) -> TensorSpec:
    return TensorSpec(name, tuple(shape), dtype, mapped)


def _linear(prefix: str, out_f: int, in_f: int, bias: bool = True, **kw) -> list[TensorSpec]:
    out = [_t(f"{prefix}.weight", (out_f, in_f), **kw)]
    if bias:
        out.append(_t(f"{prefix}.bias", (out_f,), **kw))
    return out


# -- Wan2.1 ---------------------------------------------------------------------------------------
WAN_CONFIGS = {
    # name: (display, config file, layers, d, ffn, heads, in_ch, i2v, steps)
    "wan2.1-t2v-1.3b": ("Wan2.1 T2V-1.3B", "wan_t2v_1_3B", 30, 1536, 8960, 12, 16, False, 50),
    "wan2.1-t2v-14b": ("Wan2.1 T2V-14B", "wan_t2v_14B", 40, 5120, 13824, 40, 16, False, 50),
    "wan2.1-i2v-14b": ("Wan2.1 I2V-14B", "wan_i2v_14B", 40, 5120, 13824, 40, 36, True, 40),
}
WAN_TEXT_DIM, WAN_FREQ_DIM, WAN_OUT_CH, WAN_PATCH = 4096, 256, 16, (1, 2, 2)
WAN_IMG_DIM, WAN_IMG_TOKENS = 1280, 257


def _wan_attention(prefix: str, d: int, i2v_cross: bool = False) -> list[TensorSpec]:
    # WanSelfAttention registers q, k, v, o, norm_q, norm_k; the I2V cross-attention subclass
    # then adds k_img, v_img, norm_k_img
    out: list[TensorSpec] = []
    for p in ("q", "k", "v", "o"):
        out += _linear(f"{prefix}.{p}", d, d)
    out += [_t(f"{prefix}.norm_q.weight", (d,)), _t(f"{prefix}.norm_k.weight", (d,))]
    if i2v_cross:
        out += _linear(f"{prefix}.k_img", d, d) + _linear(f"{prefix}.v_img", d, d)
        out.append(_t(f"{prefix}.norm_k_img.weight", (d,)))
    return out


def _wan_block(d: int, f: int, i2v: bool) -> list[TensorSpec]:
    return (
        [_t("modulation", (1, 6, d))]
        + _wan_attention("self_attn", d)
        + [_t("norm3.weight", (d,)), _t("norm3.bias", (d,))]
        + _wan_attention("cross_attn", d, i2v_cross=i2v)
        + _linear("ffn.0", f, d)
        + _linear("ffn.2", d, f)
    )


def _wan_non_block(d: int, in_ch: int, i2v: bool) -> list[TensorSpec]:
    pt, ph, pw = WAN_PATCH
    out = [_t("patch_embedding.weight", (d, in_ch, pt, ph, pw)), _t("patch_embedding.bias", (d,))]
    out += _linear("text_embedding.0", d, WAN_TEXT_DIM) + _linear("text_embedding.2", d, d)
    out += _linear("time_embedding.0", d, WAN_FREQ_DIM) + _linear("time_embedding.2", d, d)
    out += _linear("time_projection.1", 6 * d, d)
    out += [_t("head.modulation", (1, 2, d))]
    out += _linear("head.head", WAN_OUT_CH * pt * ph * pw, d)
    if i2v:
        e = WAN_IMG_DIM
        out += [_t("img_emb.proj.0.weight", (e,)), _t("img_emb.proj.0.bias", (e,))]
        out += _linear("img_emb.proj.1", e, e) + _linear("img_emb.proj.3", d, e)
        out += [_t("img_emb.proj.4.weight", (d,)), _t("img_emb.proj.4.bias", (d,))]
    return out


def wan_spec(name: str) -> ModelSpec:
    """The catalog spec of one Wan2.1 DiT (``wan2.1-t2v-1.3b`` etc.)."""
    display, cfg, n, d, f, heads, in_ch, i2v, steps = WAN_CONFIGS[name]
    block = _wan_block(d, f, i2v)
    layers = [
        LayerSpec("blocks", i, [TensorSpec(f"blocks.{i}.{t.name}", t.shape, t.dtype, t.mapped)
                                for t in block])
        for i in range(n)
    ]
    dims = {
        "d": d, "ffn": f, "heads": heads, "head_dim": d // heads, "num_layers": n,
        "in_channels": in_ch, "out_channels": WAN_OUT_CH, "text_dim": WAN_TEXT_DIM,
        "freq_dim": WAN_FREQ_DIM, "patch": list(WAN_PATCH), "eps": 1e-6,
        "qk_norm": True, "cross_attn_norm": True, "window_size": [-1, -1],
    }
    if i2v:
        dims.update(img_dim=WAN_IMG_DIM, img_tokens=WAN_IMG_TOKENS)
    meta = {
        "arch": "wan",
        "display_name": display,
        "default_steps": steps,
        "guidance_passes": 2,
        "tokens": dict(TOKENS),
        "tokens_note": TOKENS_NOTE,
        "text_tokens": 512,
        "dims": dims,
        "scale": 1.0,
        "source": WAN_SOURCE.format(cfg=cfg),
        "dtype_note": "all tensors bfloat16 (2 bytes/parameter, as the public inference code runs the DiT)",
        "mapped_note": (
            "every tensor is marked mapped: the original Wan loader takes each checkpoint "
            "tensor by name without re-layout, so each can stay a view of the file's pages"
        ),
    }
    return ModelSpec(name, [GroupSpec("blocks", layers, "WanAttentionBlock")],
                     _wan_non_block(d, in_ch, i2v), meta)


# -- MiniMax-H3 ----------------------------------------------------------------------------------
H3 = {
    "d": 5376, "ffn": 14336, "heads": 56, "head_dim": 128, "adaln_dim": 2688,
    "adaln_out": 96768, "text_dim": 5120, "freq_dim": 256, "video_patch_dim": 96,
    "audio_patch_dim": 32, "num_layers": 50, "refiner_layers": 2,
}


def _h3_block(adaln: bool) -> list[TensorSpec]:
    d, f, w = H3["d"], H3["ffn"], H3["heads"] * H3["head_dim"]
    out = [
        _t("norm1.weight", (d,)),
        # fused QKV is re-ordered at load time, so it is never a view of the checkpoint
        _t("attn.qkv_proj.weight", (3 * w, d), mapped=False),
        _t("attn.q_norm.weight", (H3["head_dim"],)),
        _t("attn.k_norm.weight", (H3["head_dim"],)),
        _t("attn.out_proj.weight", (d, w)),
        _t("norm2.weight", (d,)),
        _t("mlp.fc1.weight", (2 * f, d)),  # SwiGLU gate and up, fused
        _t("mlp.fc2.weight", (d, f)),
    ]
    if adaln:
        out += _linear("adaln_proj.linear", H3["adaln_out"], H3["adaln_dim"])
    return out


def _h3_non_layer() -> list[TensorSpec]:
    d, t = H3["d"], H3["adaln_dim"]
    vp, ap = H3["video_patch_dim"], H3["audio_patch_dim"]
    fp32 = dict(dtype=FP32)
    return (
        _linear("video_patch_proj", d, vp, **fp32)
        + _linear("audio_patch_proj", d, ap, **fp32)
        + _linear("time_embedder.proj_in", d, H3["freq_dim"], **fp32)
        + _linear("time_embedder.proj_out", t, d, **fp32)
        + _linear("condition_proj", d, H3["text_dim"])
        + [_t("token_refiner.final_norm.weight", (d,)), _t("final_layer.norm.weight", (d,))]
        + _linear("final_layer.adaln_proj.linear", 2 * d, t)
        + _linear("final_layer.video_out", vp, d, **fp32)
        + _linear("final_layer.audio_out", ap, d, **fp32)
    )


def h3_spec() -> ModelSpec:
    """The catalog spec of MiniMax-H3: refiner group (2 blocks) declared before ``blocks`` (50)."""
    groups = []
    for gname, n, adaln in (("token_refiner.blocks", H3["refiner_layers"], False),
                            ("blocks", H3["num_layers"], True)):
        block = _h3_block(adaln)
        layers = [
            LayerSpec(gname, i, [TensorSpec(f"{gname}.{i}.{t.name}", t.shape, t.dtype, t.mapped)
                                 for t in block])
            for i in range(n)
        ]
        groups.append(GroupSpec(gname, layers, None))
    dims = dict(H3)
    dims.update(
        attn_width=H3["heads"] * H3["head_dim"], ffn_fused=2 * H3["ffn"],
        in_channels=H3["video_patch_dim"] // 4, out_channels=H3["video_patch_dim"] // 4,
        audio_channels=H3["audio_patch_dim"], patch=[1, 2, 2], norm="rmsnorm", mlp="swiglu",
        refiner_group="token_refiner.blocks", single_stream=True,
    )
    meta = {
        "arch": "h3",
        "display_name": "MiniMax-H3",
        "default_steps": 50,
        "guidance_passes": 2,
        "tokens": dict(TOKENS),
        "tokens_note": (
            "assumption: the Wan video token counts (" + TOKENS_NOTE + "); the public config gives "
            "no H3 latent grid, and audio tokens are not counted"
        ),
        "text_tokens": 512,
        "dims": dims,
        "scale": 1.0,
        "source": H3_SOURCE,
        "assumptions": {
            "default_steps": "50: the public config gives no H3 sampler default; 50 is assumed",
            "guidance_passes": "2: classifier-free guidance (cond + uncond) is assumed",
            "tokens": "Wan's 480p/720p video token counts are assumed (see tokens_note)",
            "text_tokens": "512, as Wan; the public config gives no H3 text length",
            "sequence": (
                "single-stream: refined text tokens join the video tokens in every main block; "
                "the refiner blocks see the text tokens only"
            ),
        },
        "mapped_note": (
            "every tensor but the fused attn.qkv_proj.weight is a checkpoint view "
            "(the QKV is re-ordered at load time)"
        ),
    }
    return ModelSpec("minimax-h3", groups, _h3_non_layer(), meta)


# -- checks and output ------------------------------------------------------------------------------
def build_all() -> dict[str, ModelSpec]:
    """Every catalog spec, checked against the expected totals."""
    specs = {name: wan_spec(name) for name in WAN_CONFIGS}
    specs["minimax-h3"] = h3_spec()
    for name, spec in specs.items():
        _check(name, spec, EXPECTED[name])
    return specs


def _check(name: str, spec: ModelSpec, exp: dict) -> None:
    for g, want in exp["layer"].items():
        got = {layer.bytes for layer in spec.group(g).layers}
        if got != {want}:
            raise SystemExit(f"{name}: {g} layer bytes {sorted(got)} != {want} (EXPECTED)")
    if "non_layer_params" in exp:
        got = sum(t.numel for t in spec.non_layer)
        if got != exp["non_layer_params"]:
            raise SystemExit(f"{name}: non-layer params {got} != {exp['non_layer_params']}")
    if "non_layer_bytes" in exp:
        got = {}
        for t in spec.non_layer:
            got[t.dtype] = got.get(t.dtype, 0) + t.nbytes
        if got != exp["non_layer_bytes"]:
            raise SystemExit(f"{name}: non-layer bytes {got} != {exp['non_layer_bytes']}")
    if "total" in exp and spec.total_bytes != exp["total"]:
        raise SystemExit(f"{name}: total {spec.total_bytes} != {exp['total']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare with the committed JSON")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="output directory")
    args = ap.parse_args(argv)
    stale = []
    for name, spec in build_all().items():
        path = args.out / f"{name}.json"
        text = spec.to_json() + "\n"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path} ({spec.total_bytes:,} B)")
    if stale:
        print("stale (rerun scripts/make_catalog.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
