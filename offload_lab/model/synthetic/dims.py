"""Widths of the synthetic architectures: read from a spec's tensor shapes, scaled, recorded in meta."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from offload_lab.errors import OffloadLabError
from offload_lab.model.spec import ModelSpec

ARCHS = ("wan", "h3")
"""The synthetic architectures: Wan2.1-style and MiniMax-H3-style blocks."""
_WAN_HEAD_DIM = 128  # Wan2.1 uses 128 for every size; its q/k norms span d, so shapes can't say
WAN_IMG_TOKENS = 257  # CLIP ViT-H/14 tokens fed to Wan2.1 I2V


class SyntheticError(OffloadLabError, ValueError):
    """A spec, argument or checkpoint that cannot become a synthetic model."""



@dataclass(frozen=True)
class WanDims:
    """Widths of a Wan2.1 DiT, read from tensor shapes."""

    dim: int
    ffn: int
    heads: int
    head_dim: int
    in_channels: int
    out_channels: int
    patch: tuple[int, int, int]
    text_dim: int
    freq_dim: int
    img_dim: int | None = None  # I2V only

    @property
    def arch(self) -> str:
        return "wan"


@dataclass(frozen=True)
class H3Dims:
    """Widths of a MiniMax-H3 DiT, read from tensor shapes."""

    dim: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    time_dim: int
    freq_dim: int
    cond_dim: int
    video_patch_dim: int
    audio_patch_dim: int
    mod_sets: int  # adaLN sets of 6 vectors per block: one per token kind (condition, video, audio)
    patch: tuple[int, int, int]

    @property
    def arch(self) -> str:
        return "h3"

    @property
    def in_channels(self) -> int:
        return self.video_patch_dim // math.prod(self.patch)


def arch_of(spec: ModelSpec) -> str:
    arch = spec.meta.get("arch")
    if arch is not None:
        if arch not in ARCHS:
            raise SyntheticError(f"spec {spec.name!r} has meta['arch'] = {arch!r}; accepted: {list(ARCHS)}")
        return arch
    names = [t.name for t in spec.tensors()]
    if any(".attn.qkv_proj." in n for n in names):
        return "h3"
    if any(".self_attn.q." in n for n in names):
        return "wan"
    raise SyntheticError(
        f"cannot tell the architecture of {spec.name!r}: meta['arch'] is missing and no tensor is "
        f"named like '*.attn.qkv_proj.*' (h3) or '*.self_attn.q.*' (wan); accepted archs: {list(ARCHS)}"
    )


def _shape_getter(spec: ModelSpec, arch: str):
    shapes = {t.name: t.shape for t in spec.tensors()}

    def get(name: str) -> tuple[int, ...]:
        try:
            return shapes[name]
        except KeyError:
            raise SyntheticError(
                f"spec {spec.name!r} has no tensor {name!r}, which a {arch!r} model needs"
            ) from None

    return get, shapes


def dims_of(spec: ModelSpec) -> WanDims | H3Dims:
    """The architecture's widths at the spec's own size, from tensor shapes only."""
    arch = arch_of(spec)
    get, shapes = _shape_getter(spec, arch)
    if arch == "wan":
        pe = get("patch_embedding.weight")
        if len(pe) != 5:
            raise SyntheticError(f"patch_embedding.weight of {spec.name!r} has shape {pe}; expected [d, in, p0, p1, p2]")
        dim, in_ch, patch = pe[0], pe[1], tuple(pe[2:])
        head_out = get("head.head.weight")[0]
        if head_out % math.prod(patch):
            raise SyntheticError(f"head.head.weight rows {head_out} are not a multiple of patch {patch}")
        img_dim = shapes["img_emb.proj.1.weight"][1] if "img_emb.proj.1.weight" in shapes else None
        head_dim = _wan_head_dim(spec, dim)
        return WanDims(
            dim=dim, ffn=get("blocks.0.ffn.0.weight")[0], heads=dim // head_dim,
            head_dim=head_dim, in_channels=in_ch,
            out_channels=head_out // math.prod(patch), patch=patch,  # type: ignore[arg-type]
            text_dim=get("text_embedding.0.weight")[1], freq_dim=get("time_embedding.0.weight")[1],
            img_dim=img_dim,
        )
    dim = get("video_patch_proj.weight")[0]
    video_patch = get("video_patch_proj.weight")[1]
    head_dim = get("blocks.0.attn.q_norm.weight")[0]
    attn = get("blocks.0.attn.out_proj.weight")[1]
    qkv = get("blocks.0.attn.qkv_proj.weight")[0]
    mod = get("blocks.0.adaln_proj.linear.weight")[0]
    if attn % head_dim or (qkv - attn) % (2 * head_dim) or mod % (6 * dim):
        raise SyntheticError(
            f"spec {spec.name!r} has inconsistent H3 attention shapes: head_dim {head_dim}, "
            f"attention width {attn}, fused qkv rows {qkv}, adaLN rows {mod} (hidden {dim}); "
            f"expected widths that are whole heads and adaLN rows a multiple of 6 × hidden"
        )
    heads, kv_heads = attn // head_dim, (qkv - attn) // (2 * head_dim)
    if heads % kv_heads:
        raise SyntheticError(f"H3 spec {spec.name!r} has {heads} query heads and {kv_heads} kv heads; expected a multiple")
    # 96 = 24 channels × patch 1·2·2; the reference fixes that patch, so keep it when it divides
    patch = (1, 2, 2) if video_patch % 4 == 0 else (1, 1, 1)
    return H3Dims(
        dim=dim, ffn=get("blocks.0.mlp.fc2.weight")[1], heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, time_dim=get("time_embedder.proj_out.weight")[0],
        freq_dim=get("time_embedder.proj_in.weight")[1], cond_dim=get("condition_proj.weight")[1],
        video_patch_dim=video_patch, audio_patch_dim=get("audio_patch_proj.weight")[1],
        mod_sets=mod // (6 * dim), patch=patch,
    )


def _wan_head_dim(spec: ModelSpec, dim: int) -> int:
    # Wan's q/k norms span the full width, so the head split is not in any shape: take the
    # spec's hint when it fits (a scaled synthetic checkpoint records its own), else Wan's 128.
    hint = (spec.meta.get("dims") or {}).get("head_dim")
    for hd in (hint, _WAN_HEAD_DIM, 64, 32, 16, 8):
        if isinstance(hd, int) and hd > 0 and dim % hd == 0:
            return hd
    return dim


def _width(w: int, scale: float) -> int:
    return w if scale == 1 else max(8, 8 * round(w * scale / 8))


def _head_dim(hd: int, scale: float) -> int:
    return hd if scale == 1 else min(hd, max(8, 8 * round(hd * math.sqrt(scale) / 8)))


def scale_dims(d: WanDims | H3Dims, scale: float) -> WanDims | H3Dims:
    if scale == 1:
        return d
    hd = _head_dim(d.head_dim, scale)
    if isinstance(d, WanDims):
        heads = max(1, round(d.dim * scale / hd))
        return WanDims(
            dim=heads * hd, ffn=_width(d.ffn, scale), heads=heads, head_dim=hd,
            in_channels=d.in_channels, out_channels=d.out_channels, patch=d.patch,
            text_dim=_width(d.text_dim, scale), freq_dim=d.freq_dim,
            img_dim=None if d.img_dim is None else _width(d.img_dim, scale),
        )
    group = d.heads // d.kv_heads
    kv_heads = max(1, round(d.heads * d.head_dim * scale / hd / group))
    return H3Dims(
        dim=_width(d.dim, scale), ffn=_width(d.ffn, scale), heads=kv_heads * group,
        kv_heads=kv_heads, head_dim=hd, time_dim=_width(d.time_dim, scale), freq_dim=d.freq_dim,
        cond_dim=_width(d.cond_dim, scale), video_patch_dim=d.video_patch_dim,
        audio_patch_dim=d.audio_patch_dim, mod_sets=d.mod_sets, patch=d.patch,
    )


def dims_meta(d: WanDims | H3Dims, layers: dict[str, int]) -> dict[str, Any]:
    """The catalog's ``meta['dims']`` keys, at this model's (scaled) size."""
    out: dict[str, Any] = {
        "d": d.dim, "ffn": d.ffn, "heads": d.heads, "head_dim": d.head_dim, "patch": list(d.patch),
        "freq_dim": d.freq_dim, "num_layers": layers.get("blocks", 0),
    }
    if isinstance(d, WanDims):
        out.update(in_channels=d.in_channels, out_channels=d.out_channels, text_dim=d.text_dim)
        if d.img_dim is not None:
            out.update(img_dim=d.img_dim, img_tokens=WAN_IMG_TOKENS)
    else:
        out.update(
            adaln_dim=d.time_dim, adaln_out=6 * d.mod_sets * d.dim, text_dim=d.cond_dim,
            video_patch_dim=d.video_patch_dim, audio_patch_dim=d.audio_patch_dim,
            refiner_layers=layers.get("token_refiner.blocks", 0), attn_width=d.heads * d.head_dim,
            ffn_fused=2 * d.ffn, in_channels=d.in_channels, out_channels=d.in_channels,
            audio_channels=d.audio_patch_dim, kv_heads=d.kv_heads,
        )
    return out

