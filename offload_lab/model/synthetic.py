"""Synthetic DiT models: exactly a spec's tensors, random weights, real compute.

The real Wan2.1 and MiniMax-H3 weights cannot be downloaded here, so :func:`build` makes a
runnable stand-in whose ``state_dict`` has the spec's names, shapes and dtypes (at
``scale=1``), and whose ``forward`` does the work a DiT does: patch embedding of video
latents, self-attention with q/k RMSNorm, cross-attention to text (Wan) or one
single-stream sequence of refined condition + video + audio tokens (H3), an FFN (GELU for
Wan, SwiGLU with a fused ``fc1`` for H3) and adaLN modulation from a timestep embedding.

Layer groups are ``nn.ModuleList`` entries (``model.blocks``, ``model.token_refiner.blocks``)
and a block's ``forward`` reads only its own parameters and its arguments, so a forward
pre-hook that swaps a block's weights in just before it runs sees no difference.

Scale semantics (``scale`` in (0, 1]): every model width (hidden, FFN, attention, text /
condition / image embedding, H3 adaLN width) is multiplied by ``scale`` and rounded to a
multiple of 8; the head dimension is multiplied by ``√scale`` (a multiple of 8, at least 8,
at most the original) and the attention width is rounded to whole heads. Interface sizes
stay: latent channels, patch size, timestep frequency dim, audio patch width. Parameter
bytes therefore shrink about ``scale²``; depth is kept unless ``layers=`` overrides it.

:func:`save` writes safetensors (sharded with an index past ``shard_bytes``) and :func:`load`
maps the file(s) so that every parameter is a view of the file pages (``mmap=True``).

>>> from offload_lab import catalog, synthetic
>>> model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=2)
>>> inputs = synthetic.example_inputs(model, tokens=64)
>>> model(**inputs).shape == inputs["x"].shape
True
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import struct
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from offload_lab.model.spec import ModelSpec, SpecError, _safetensors_files, dtype_name

__all__ = [
    "SyntheticError", "build", "example_inputs", "save", "load", "spec_of",
    "WanModel", "H3Model", "DEFAULT_SHARD_BYTES",
]

ARCHS = ("wan", "h3")
DEFAULT_SHARD_BYTES = 4 * 2**30
_EPS = 1e-6
_WAN_HEAD_DIM = 128  # Wan2.1 uses 128 for every size; its q/k norms span d, so shapes can't say
_WAN_IMG_TOKENS = 257  # CLIP ViT-H/14 tokens fed to Wan2.1 I2V
_META_KEY = "offload_lab"
# known latent token grids (frames × h × w after patching), so examples look like real videos
_KNOWN_GRIDS = {32760: (21, 30, 52), 75600: (21, 45, 80)}

_TORCH_TO_ST = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        _TORCH_TO_ST[getattr(torch, _name)] = _code
_ST_TO_TORCH = {v: k for k, v in _TORCH_TO_ST.items()}


class SyntheticError(ValueError):
    """A spec, argument or checkpoint that cannot become a synthetic model."""


# ------------------------------------------------------------------------------------------
# dimensions
# ------------------------------------------------------------------------------------------
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


def _arch_of(spec: ModelSpec) -> str:
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


def _dims_of(spec: ModelSpec) -> WanDims | H3Dims:
    """The architecture's widths at the spec's own size, from tensor shapes only."""
    arch = _arch_of(spec)
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


def _scale_dims(d: WanDims | H3Dims, scale: float) -> WanDims | H3Dims:
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


def _dims_meta(d: WanDims | H3Dims, layers: dict[str, int]) -> dict[str, Any]:
    """The catalog's ``meta['dims']`` keys, at this model's (scaled) size."""
    out: dict[str, Any] = {
        "d": d.dim, "ffn": d.ffn, "heads": d.heads, "head_dim": d.head_dim, "patch": list(d.patch),
        "freq_dim": d.freq_dim, "num_layers": layers.get("blocks", 0),
    }
    if isinstance(d, WanDims):
        out.update(in_channels=d.in_channels, out_channels=d.out_channels, text_dim=d.text_dim)
        if d.img_dim is not None:
            out.update(img_dim=d.img_dim, img_tokens=_WAN_IMG_TOKENS)
    else:
        out.update(
            adaln_dim=d.time_dim, adaln_out=6 * d.mod_sets * d.dim, text_dim=d.cond_dim,
            video_patch_dim=d.video_patch_dim, audio_patch_dim=d.audio_patch_dim,
            refiner_layers=layers.get("token_refiner.blocks", 0), attn_width=d.heads * d.head_dim,
            ffn_fused=2 * d.ffn, in_channels=d.in_channels, out_channels=d.in_channels,
            audio_channels=d.audio_patch_dim, kv_heads=d.kv_heads,
        )
    return out


# ------------------------------------------------------------------------------------------
# shared compute helpers
# ------------------------------------------------------------------------------------------
def _lin(x: torch.Tensor, m: nn.Linear) -> torch.Tensor:
    # compute in the weight's dtype (bf16 GEMMs, like the real models); mixed-dtype specs
    # (H3 keeps some projections in fp32) then just work
    w = m.weight
    b = m.bias
    if b is not None and b.dtype != w.dtype:
        b = b.to(w.dtype)
    return F.linear(x.to(w.dtype), w, b)


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float = _EPS) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.float()


def _ln(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.layer_norm(
        x.float(), (x.shape[-1],),
        None if weight is None else weight.float(), None if bias is None else bias.float(), _EPS,
    )


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int, hd: int) -> torch.Tensor:
    """[B, L, heads·hd] queries against [B, S, kv_heads·hd] keys/values → [B, L, heads·hd]."""
    B, L, _ = q.shape
    S = k.shape[1]
    q = q.view(B, L, heads, hd).transpose(1, 2)
    k = k.view(B, S, kv_heads, hd).transpose(1, 2)
    v = v.view(B, S, kv_heads, hd).transpose(1, 2)
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(B, L, heads * hd)


def _sinusoid(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, device=t.device, dtype=torch.float64) / half)
    args = t.to(torch.float64)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1).float()


def _patchify(x: torch.Tensor, patch: tuple[int, int, int]) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """[B, C, F, H, W] → [B, f·h·w, C·p0·p1·p2] (the layout a Conv3d with stride = kernel reads)."""
    if x.dim() != 5:
        raise SyntheticError(f"video latents have shape {tuple(x.shape)}; expected [batch, channels, frames, height, width]")
    B, C, Fr, H, W = x.shape
    p0, p1, p2 = patch
    if Fr % p0 or H % p1 or W % p2:
        raise SyntheticError(
            f"video latents of shape {tuple(x.shape)} do not tile by patch {patch}; "
            f"expected frames, height, width divisible by it"
        )
    f, h, w = Fr // p0, H // p1, W // p2
    x = x.reshape(B, C, f, p0, h, p1, w, p2).permute(0, 2, 4, 6, 1, 3, 5, 7)
    return x.reshape(B, f * h * w, C * p0 * p1 * p2), (f, h, w)


def _unpatchify(x: torch.Tensor, grid: tuple[int, int, int], patch: tuple[int, int, int], c: int,
                channels_last: bool) -> torch.Tensor:
    B = x.shape[0]
    f, h, w = grid
    p0, p1, p2 = patch
    if channels_last:  # Wan's head emits (p0, p1, p2, c) per token
        x = x.reshape(B, f, h, w, p0, p1, p2, c).permute(0, 7, 1, 4, 2, 5, 3, 6)
    else:  # H3's video_out mirrors video_patch_proj: (c, p0, p1, p2)
        x = x.reshape(B, f, h, w, c, p0, p1, p2).permute(0, 4, 1, 5, 2, 6, 3, 7)
    return x.reshape(B, c, f * p0, h * p1, w * p2)


class _RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(x, self.weight)


# ------------------------------------------------------------------------------------------
# Wan2.1
# ------------------------------------------------------------------------------------------
class WanSelfAttention(nn.Module):
    def __init__(self, d: WanDims):
        super().__init__()
        self.heads, self.head_dim = d.heads, d.head_dim
        self.q = nn.Linear(d.dim, d.dim)
        self.k = nn.Linear(d.dim, d.dim)
        self.v = nn.Linear(d.dim, d.dim)
        self.o = nn.Linear(d.dim, d.dim)
        self.norm_q = _RMSNorm(d.dim)
        self.norm_k = _RMSNorm(d.dim)

    def _qkv(self, x: torch.Tensor, ctx: torch.Tensor):
        dt = self.q.weight.dtype
        q = self.norm_q(_lin(x, self.q)).to(dt)
        k = self.norm_k(_lin(ctx, self.k)).to(dt)
        return q, k, _lin(ctx, self.v).to(dt)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(x, x)
        return _lin(_sdpa(q, k, v, self.heads, self.heads, self.head_dim), self.o)


class WanCrossAttention(WanSelfAttention):
    def __init__(self, d: WanDims):
        super().__init__(d)
        if d.img_dim is not None:  # I2V: a second key/value path over the CLIP image tokens
            self.k_img = nn.Linear(d.dim, d.dim)
            self.v_img = nn.Linear(d.dim, d.dim)
            self.norm_k_img = _RMSNorm(d.dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor,  # type: ignore[override]
                context_img: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self._qkv(x, context)
        out = _sdpa(q, k, v, self.heads, self.heads, self.head_dim)
        if hasattr(self, "k_img"):
            if context_img is None:
                raise SyntheticError("an I2V block needs context_img (the CLIP image tokens); got None")
            dt = self.q.weight.dtype
            ki = self.norm_k_img(_lin(context_img, self.k_img)).to(dt)
            vi = _lin(context_img, self.v_img).to(dt)
            out = out + _sdpa(q, ki, vi, self.heads, self.heads, self.head_dim)
        return _lin(out, self.o)


class WanAttentionBlock(nn.Module):
    """One Wan2.1 block: modulated self-attention, cross-attention to text, modulated GELU FFN."""

    def __init__(self, d: WanDims):
        super().__init__()
        self.dim = d.dim
        # registration order follows the catalog's tensor order
        self.modulation = nn.Parameter(torch.zeros(1, 6, d.dim))
        self.self_attn = WanSelfAttention(d)
        self.norm3 = nn.LayerNorm(d.dim, eps=_EPS, elementwise_affine=True)
        self.cross_attn = WanCrossAttention(d)
        self.ffn = nn.Sequential(nn.Linear(d.dim, d.ffn), nn.GELU(approximate="tanh"), nn.Linear(d.ffn, d.dim))

    def forward(self, x: torch.Tensor, e: torch.Tensor, context: torch.Tensor,
                context_img: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [B, L, d] fp32 residual stream, ``e`` [B, 6, d] time projection, ``context`` [B, Lc, d]."""
        e = (self.modulation.float() + e.float()).chunk(6, dim=1)
        y = self.self_attn(_ln(x) * (1 + e[1]) + e[0])
        x = x + y.float() * e[2]
        x = x + self.cross_attn(_ln(x, self.norm3.weight, self.norm3.bias), context, context_img).float()
        h = _ln(x) * (1 + e[4]) + e[3]
        y = _lin(F.gelu(_lin(h, self.ffn[0]), approximate="tanh"), self.ffn[2])
        return x + y.float() * e[5]


class _WanHead(nn.Module):
    def __init__(self, d: WanDims):
        super().__init__()
        self.modulation = nn.Parameter(torch.zeros(1, 2, d.dim))
        self.head = nn.Linear(d.dim, d.out_channels * math.prod(d.patch))

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.modulation.float() + e.float()[:, None]).chunk(2, dim=1)
        return _lin(_ln(x) * (1 + scale) + shift, self.head)


class _WanImageEmbedding(nn.Module):
    def __init__(self, d: WanDims):
        super().__init__()
        assert d.img_dim is not None
        self.proj = nn.Sequential(
            nn.LayerNorm(d.img_dim), nn.Linear(d.img_dim, d.img_dim), nn.GELU(),
            nn.Linear(d.img_dim, d.dim), nn.LayerNorm(d.dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.proj
        x = _ln(x, p[0].weight, p[0].bias)
        x = _lin(F.gelu(_lin(x, p[1])), p[3])
        return _ln(x, p[4].weight, p[4].bias)


class WanModel(nn.Module):
    """A Wan2.1 DiT (T2V, or I2V when ``dims.img_dim`` is set) with the original tensor names.

    ``forward(x, t, context, y=None, clip_fea=None)`` → the denoiser output shaped like ``x``.
    """

    def __init__(self, dims: WanDims, layers: dict[str, int]):
        super().__init__()
        d = dims
        self.dims = d
        self.patch_embedding = nn.Conv3d(d.in_channels, d.dim, d.patch, stride=d.patch)
        self.text_embedding = nn.Sequential(nn.Linear(d.text_dim, d.dim), nn.GELU(approximate="tanh"), nn.Linear(d.dim, d.dim))
        self.time_embedding = nn.Sequential(nn.Linear(d.freq_dim, d.dim), nn.SiLU(), nn.Linear(d.dim, d.dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d.dim, 6 * d.dim))
        self.blocks = nn.ModuleList(WanAttentionBlock(d) for _ in range(layers["blocks"]))
        self.head = _WanHead(d)
        if d.img_dim is not None:
            self.img_emb = _WanImageEmbedding(d)

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor,
                y: torch.Tensor | None = None, clip_fea: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [B, out_ch, F, H, W] noisy latents; ``t`` [B] timesteps; ``context`` [B, Lc, text_dim];
        I2V also ``y`` [B, in_ch − out_ch, F, H, W] (mask + image latents) and ``clip_fea`` [B, 257, img_dim].
        """
        d = self.dims
        inp = x
        if d.in_channels != d.out_channels:
            if y is None:
                raise SyntheticError(
                    f"this model takes {d.in_channels} input channels and x has {x.shape[1]}; "
                    f"pass y with the other {d.in_channels - x.shape[1]} (mask + image latents)"
                )
            inp = torch.cat([x, y.to(x.dtype)], dim=1)
        if inp.shape[1] != d.in_channels:
            raise SyntheticError(f"latent input has {inp.shape[1]} channels; this model accepts {d.in_channels}")
        patches, grid = _patchify(inp, d.patch)
        pe = self.patch_embedding
        tokens = F.linear(patches.to(pe.weight.dtype), pe.weight.reshape(d.dim, -1), pe.bias.to(pe.weight.dtype)).float()
        te = self.time_embedding
        e = _lin(F.silu(_lin(_sinusoid(t, d.freq_dim), te[0]).float()), te[2]).float()
        e0 = _lin(F.silu(e), self.time_projection[1]).float().unflatten(1, (6, d.dim))
        txt = self.text_embedding
        ctx = _lin(F.gelu(_lin(context, txt[0]), approximate="tanh"), txt[2])
        ctx_img = None
        if d.img_dim is not None:
            if clip_fea is None:
                raise SyntheticError("an I2V model needs clip_fea [batch, 257, img_dim]; got None")
            ctx_img = self.img_emb(clip_fea)
        for block in self.blocks:
            tokens = block(tokens, e0, ctx, ctx_img)
        out = self.head(tokens, e)
        return _unpatchify(out, grid, d.patch, d.out_channels, channels_last=True).to(x.dtype)


# ------------------------------------------------------------------------------------------
# MiniMax-H3
# ------------------------------------------------------------------------------------------
class H3Attention(nn.Module):
    def __init__(self, d: H3Dims):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = d.heads, d.kv_heads, d.head_dim
        self.qkv_proj = nn.Linear(d.dim, (d.heads + 2 * d.kv_heads) * d.head_dim, bias=False)
        self.q_norm = _RMSNorm(d.head_dim)
        self.k_norm = _RMSNorm(d.head_dim)
        self.out_proj = nn.Linear(d.heads * d.head_dim, d.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        hd, dt = self.head_dim, self.qkv_proj.weight.dtype
        q, k, v = _lin(x, self.qkv_proj).split(
            [self.heads * hd, self.kv_heads * hd, self.kv_heads * hd], dim=-1)
        # per-head q/k norm
        q = self.q_norm(q.reshape(B, L, self.heads, hd)).to(dt).reshape(B, L, -1)
        k = self.k_norm(k.reshape(B, L, self.kv_heads, hd)).to(dt).reshape(B, L, -1)
        return _lin(_sdpa(q, k, v.contiguous(), self.heads, self.kv_heads, hd), self.out_proj)


class H3MLP(nn.Module):
    def __init__(self, d: H3Dims):
        super().__init__()
        self.fc1 = nn.Linear(d.dim, 2 * d.ffn, bias=False)  # fused gate + up
        self.fc2 = nn.Linear(d.ffn, d.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = _lin(x, self.fc1).chunk(2, dim=-1)
        return _lin(F.silu(gate) * up, self.fc2)


class _AdaLNProj(nn.Module):
    def __init__(self, time_dim: int, out: int):
        super().__init__()
        self.linear = nn.Linear(time_dim, out)

    def forward(self, temb: torch.Tensor) -> torch.Tensor:
        return _lin(F.silu(temb.float()), self.linear).float()


class H3RefinerBlock(nn.Module):
    """A token-refiner block: pre-RMSNorm self-attention + SwiGLU over the condition tokens."""

    def __init__(self, d: H3Dims):
        super().__init__()
        self.norm1 = _RMSNorm(d.dim)
        self.attn = H3Attention(d)
        self.norm2 = _RMSNorm(d.dim)
        self.mlp = H3MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x)).float()
        return x + self.mlp(self.norm2(x)).float()


def _per_segment(mods: torch.Tensor, lengths: tuple[int, ...], k: int) -> torch.Tensor:
    """Modulation vector ``k`` of each token's kind, [B, L, d] (segment i uses set i mod sets)."""
    parts = []
    for i, n in enumerate(lengths):
        if n:
            parts.append(mods[:, i % mods.shape[1], k, None].expand(-1, n, -1))
    return torch.cat(parts, dim=1)


class H3Block(nn.Module):
    """A single-stream H3 block over [condition | video | audio] tokens with per-kind adaLN."""

    def __init__(self, d: H3Dims):
        super().__init__()
        self.dim, self.mod_sets = d.dim, d.mod_sets
        self.norm1 = _RMSNorm(d.dim)
        self.attn = H3Attention(d)
        self.norm2 = _RMSNorm(d.dim)
        self.mlp = H3MLP(d)
        self.adaln_proj = _AdaLNProj(d.time_dim, 6 * d.mod_sets * d.dim)

    def forward(self, x: torch.Tensor, temb: torch.Tensor, lengths: tuple[int, ...]) -> torch.Tensor:
        """``x`` [B, L, d] fp32, ``temb`` [B, time_dim], ``lengths`` tokens per kind (sum = L)."""
        mods = self.adaln_proj(temb).view(x.shape[0], self.mod_sets, 6, self.dim)

        def m(k: int) -> torch.Tensor:
            return _per_segment(mods, lengths, k)

        x = x + self.attn(self.norm1(x) * (1 + m(1)) + m(0)).float() * m(2)
        return x + self.mlp(self.norm2(x) * (1 + m(4)) + m(3)).float() * m(5)


class _H3TimeEmbedder(nn.Module):
    def __init__(self, d: H3Dims):
        super().__init__()
        self.proj_in = nn.Linear(d.freq_dim, d.dim)
        self.proj_out = nn.Linear(d.dim, d.time_dim)

    def forward(self, t: torch.Tensor, freq_dim: int) -> torch.Tensor:
        return _lin(F.silu(_lin(_sinusoid(t, freq_dim), self.proj_in).float()), self.proj_out).float()


class _H3TokenRefiner(nn.Module):
    def __init__(self, d: H3Dims, n: int):
        super().__init__()
        self.blocks = nn.ModuleList(H3RefinerBlock(d) for _ in range(n))
        self.final_norm = _RMSNorm(d.dim)


class _H3FinalLayer(nn.Module):
    def __init__(self, d: H3Dims):
        super().__init__()
        self.norm = _RMSNorm(d.dim)
        self.adaln_proj = _AdaLNProj(d.time_dim, 2 * d.dim)
        self.video_out = nn.Linear(d.dim, d.video_patch_dim)
        self.audio_out = nn.Linear(d.dim, d.audio_patch_dim)


class H3Model(nn.Module):
    """A MiniMax-H3 single-stream audio+video DiT with the original tensor names.

    ``forward(x, t, context, audio=None, return_audio=False)`` → the video denoiser output
    shaped like ``x`` (and the audio one too when ``return_audio``).
    """

    def __init__(self, dims: H3Dims, layers: dict[str, int]):
        super().__init__()
        d = dims
        self.dims = d
        self.video_patch_proj = nn.Linear(d.video_patch_dim, d.dim)
        self.audio_patch_proj = nn.Linear(d.audio_patch_dim, d.dim)
        self.time_embedder = _H3TimeEmbedder(d)
        self.condition_proj = nn.Linear(d.cond_dim, d.dim)
        self.token_refiner = _H3TokenRefiner(d, layers.get("token_refiner.blocks", 0))
        self.blocks = nn.ModuleList(H3Block(d) for _ in range(layers["blocks"]))
        self.final_layer = _H3FinalLayer(d)

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor,
                audio: torch.Tensor | None = None, return_audio: bool = False):
        """``x`` [B, C, F, H, W] video latents; ``t`` [B]; ``context`` [B, Lc, text_dim] condition
        features; ``audio`` [B, La, audio_patch_dim] audio latents (optional).
        """
        d = self.dims
        if x.dim() == 5 and x.shape[1] != d.in_channels:
            raise SyntheticError(f"video latents have {x.shape[1]} channels; this model accepts {d.in_channels}")
        patches, grid = _patchify(x, d.patch)
        video = _lin(patches, self.video_patch_proj).float()
        cond = _lin(context, self.condition_proj).float()
        for block in self.token_refiner.blocks:
            cond = block(cond)
        cond = self.token_refiner.final_norm(cond)
        parts = [cond, video]
        if audio is not None:
            parts.append(_lin(audio, self.audio_patch_proj).float())
        lengths = tuple(p.shape[1] for p in parts)
        h = torch.cat(parts, dim=1)
        temb = self.time_embedder(t, d.freq_dim)
        for block in self.blocks:
            h = block(h, temb, lengths)
        fl = self.final_layer
        shift, scale = fl.adaln_proj(temb).view(-1, 2, d.dim).chunk(2, dim=1)
        h = fl.norm(h) * (1 + scale) + shift
        lc, lv = lengths[0], lengths[1]
        out = _lin(h[:, lc:lc + lv], fl.video_out)
        out = _unpatchify(out, grid, d.patch, d.in_channels, channels_last=False).to(x.dtype)
        if not return_audio:
            return out
        aud = _lin(h[:, lc + lv:], fl.audio_out).to(audio.dtype) if audio is not None else None
        return out, aud


# ------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------
def _layer_counts(spec: ModelSpec, arch: str, layers: int | Mapping[str, int] | None) -> dict[str, int]:
    counts = {g.name: g.num_layers for g in spec.groups}
    expected = ["blocks"] if arch == "wan" else ["token_refiner.blocks", "blocks"]
    unknown = [g for g in counts if g not in expected]
    if unknown or "blocks" not in counts:
        raise SyntheticError(
            f"spec {spec.name!r} has layer groups {list(counts)}; a {arch!r} model has {expected}"
        )
    if layers is None:
        return counts
    if isinstance(layers, bool) or not isinstance(layers, (int, Mapping)):
        raise SyntheticError(f"layers={layers!r}; accepted: None, an int ≥ 1, or a dict {{group: int ≥ 1}} over {list(counts)}")
    if isinstance(layers, int):
        layers = dict.fromkeys(counts, layers)
    out = dict(counts)
    for g, n in layers.items():
        if g not in counts:
            raise SyntheticError(f"layers names group {g!r}; groups of {spec.name!r}: {list(counts)}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SyntheticError(f"layers[{g!r}] = {n!r}; accepted: an int ≥ 1")
        out[g] = n
    return out


def _group_pattern(groups: list[str]) -> re.Pattern:
    alts = "|".join(re.escape(g) for g in sorted(groups, key=len, reverse=True))
    return re.compile(rf"^({alts})\.\d+\.")


def _dtype_lookup(spec: ModelSpec):
    """Dtype of a tensor by name, with any layer index matching layer 0 of its group."""
    pat = _group_pattern(spec.group_names)
    table = {pat.sub(r"\1.*.", t.name): t.dtype for t in spec.tensors()}

    def lookup(name: str) -> torch.dtype | None:
        dt = table.get(pat.sub(r"\1.*.", name))
        return None if dt is None else getattr(torch, dt)

    return lookup


def _resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None:
        return None
    resolved = getattr(torch, dtype.removeprefix("torch."), None) if isinstance(dtype, str) else dtype
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise SyntheticError(f"dtype={dtype!r}; accepted: None (keep the spec's) or a floating torch dtype / name such as 'bfloat16'")
    return resolved


def _seed_for(seed: int, name: str) -> int:
    # per-tensor streams keyed by name: weights don't depend on build order, device or depth
    return (seed * 0x9E3779B97F4A7C15 + zlib.crc32(name.encode())) % (2**63 - 1)


_CHUNK = 1 << 22  # elements per random stream: fixed, so values never depend on the thread count


def _init_affine(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """``(a, b)`` so that the tensor is ``a + b · N(0, 1)``: sane activations at any depth."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "modulation":
        return 0.0, 1 / math.sqrt(shape[-1])
    if len(shape) == 1 and leaf == "weight":  # norm weights near 1, not exactly, so they matter
        return 1.0, 0.05
    if leaf == "bias" or len(shape) < 2:
        return 0.0, 0.02
    return 0.0, 1 / math.sqrt(math.prod(shape) // shape[0])


def _init_tensor(name: str, shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32,
                 pool: ThreadPoolExecutor | None = None) -> torch.Tensor:
    """Random CPU tensor from per-chunk generators keyed by ``seed``, ``name`` and chunk index."""
    n = math.prod(shape)
    out = torch.empty(n, dtype=dtype)
    a, b = _init_affine(name, shape)

    def fill(i: int) -> None:
        lo, hi = i * _CHUNK, min(n, (i + 1) * _CHUNK)
        g = torch.Generator().manual_seed(_seed_for(seed, name if i == 0 else f"{name}#{i}"))
        x = torch.empty(hi - lo, dtype=torch.float32).normal_(generator=g)
        out[lo:hi].copy_(x.mul_(b).add_(a))

    chunks = range(max(1, -(-n // _CHUNK)))
    if pool is None or len(chunks) == 1:
        for i in chunks:
            fill(i)
    else:
        # the CPU generator is serial (~100 M values/s): spread a big tensor over the cores
        list(pool.map(fill, chunks))
    return out.view(shape)


def _set_tensor(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    mod_name, _, leaf = name.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    if leaf in mod._parameters:
        # inference only: no autograd state on the weights
        mod._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
    elif leaf in mod._buffers:
        mod._buffers[leaf] = tensor
    else:
        raise SyntheticError(f"{name!r} is not a parameter or buffer of {type(model).__name__}")


def _construct(dims: WanDims | H3Dims, counts: dict[str, int]) -> nn.Module:
    with torch.device("meta"):
        return WanModel(dims, counts) if isinstance(dims, WanDims) else H3Model(dims, counts)


def _check_names(model: nn.Module, spec: ModelSpec, exact: bool, dtypes: bool = True) -> None:
    """Every model tensor must be in the spec (by group-relative name); at full size, exactly."""
    if exact:
        want = {t.name: (tuple(t.shape), t.dtype if dtypes else "") for t in spec.tensors()}
        have = {n: (tuple(p.shape), dtype_name(p.dtype) if dtypes else "")
                for n, p in model.state_dict().items()}
        if want != have:
            missing = sorted(set(want) - set(have))[:5]
            extra = sorted(set(have) - set(want))[:5]
            diff = sorted(n for n in set(want) & set(have) if want[n] != have[n])[:5]
            raise SyntheticError(
                f"spec {spec.name!r} does not match the {_arch_name(model)!r} architecture: "
                f"tensors only in the spec {missing}, only in the model {extra}, "
                f"different shape/dtype {[(n, want[n], have[n]) for n in diff]}"
            )
        return
    pat = _group_pattern(spec.group_names)
    want_rel = {pat.sub(r"\1.*.", t.name) for t in spec.tensors()}
    have_rel = {pat.sub(r"\1.*.", n) for n in model.state_dict()}
    if want_rel != have_rel:
        raise SyntheticError(
            f"spec {spec.name!r} does not match the {_arch_name(model)!r} architecture: "
            f"only in the spec {sorted(want_rel - have_rel)[:5]}, only in the model {sorted(have_rel - want_rel)[:5]}"
        )


def _arch_name(model: nn.Module) -> str:
    dims = getattr(model, "dims", None)
    return dims.arch if dims is not None else type(model).__name__


def build(
    spec: ModelSpec,
    scale: float = 1.0,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    layers: int | Mapping[str, int] | None = None,
) -> nn.Module:
    """A runnable DiT with the spec's tensors (names, shapes, dtypes at ``scale=1``), random weights.

    ``scale`` in (0, 1] shrinks widths (see the module doc); ``layers`` overrides the depth of
    every group (an int) or of named groups (``{"blocks": 4}``); ``dtype`` forces every
    floating tensor (``None`` keeps the spec's); ``device="meta"`` allocates nothing. Weights
    depend only on ``seed`` and each tensor's name and shape, never on the device or the run.
    The module records ``model.offload_spec_meta`` (the spec's meta with ``scale``, ``seed``,
    ``arch`` and the scaled ``dims``).

    >>> from offload_lab import catalog, synthetic
    >>> m = synthetic.build(catalog.load("minimax-h3"), device="meta")
    >>> sum(p.nbytes for p in m.parameters())
    66280430080
    >>> small = synthetic.build(catalog.load("wan2.1-t2v-14b"), scale=0.05, layers=2)
    >>> small.dims.dim, small.dims.heads, len(small.blocks)
    (256, 8, 2)
    """
    if not isinstance(spec, ModelSpec):
        raise SyntheticError(f"build expects a ModelSpec, got {type(spec).__name__}; e.g. offload_lab.catalog.load(name)")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1:
        raise SyntheticError(f"scale={scale!r}; accepted: a number in (0, 1]")
    scale = float(scale)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SyntheticError(f"seed={seed!r}; accepted: an int")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise SyntheticError(f"device={device!r}; accepted: a torch device such as 'cpu', 'cuda', 'meta'") from None
    force = _resolve_dtype(dtype)
    arch = _arch_of(spec)
    counts = _layer_counts(spec, arch, layers)
    dims = _scale_dims(_dims_of(spec), scale)
    model = _construct(dims, counts)
    exact = scale == 1 and counts == {g.name: g.num_layers for g in spec.groups}
    lookup = _dtype_lookup(spec)
    with ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads())) as pool:
        for name, p in list(model.named_parameters()):
            dt = force or lookup(name) or torch.float32
            if dev.type == "meta":
                t = torch.empty(p.shape, dtype=dt, device="meta")
            else:
                t = _init_tensor(name, tuple(p.shape), seed, dt, pool).to(dev)
            _set_tensor(model, name, t)
    _check_names(model, spec, exact, dtypes=force is None)
    model.eval()
    meta = copy.deepcopy(spec.meta)
    dmeta = dict(meta.get("dims") or {})
    dmeta.update(_dims_meta(dims, counts))
    meta.update(
        arch=arch, scale=float(spec.meta.get("scale", 1.0)) * scale, seed=seed, dims=dmeta,
        spec_name=spec.name,
    )
    model.offload_spec_meta = meta
    return model


def spec_of(model: nn.Module) -> ModelSpec:
    """The spec of a synthetic model, named after its source spec and carrying its meta.

    >>> from offload_lab import catalog, synthetic
    >>> s = synthetic.spec_of(synthetic.build(catalog.load("minimax-h3"), scale=0.02, layers=2))
    >>> s.group_names, s.meta["scale"]
    (['token_refiner.blocks', 'blocks'], 0.02)
    """
    from offload_lab.model.spec import spec_of as _spec_of

    meta = getattr(model, "offload_spec_meta", {})
    groups = ["token_refiner.blocks", "blocks"] if isinstance(model, H3Model) else None
    if isinstance(model, (WanModel, H3Model)):
        groups = [g for g in (groups or ["blocks"]) if len(model.get_submodule(g)) > 0]
    out = _spec_of(model, groups=groups, name=meta.get("spec_name"))
    out.meta = copy.deepcopy(meta)
    return out


# ------------------------------------------------------------------------------------------
# example inputs
# ------------------------------------------------------------------------------------------
def _grid(tokens: int) -> tuple[int, int, int]:
    """frames × height × width (in patches) with that many tokens; near-cubic frames, near-square frames."""
    if tokens in _KNOWN_GRIDS:
        return _KNOWN_GRIDS[tokens]
    f = max(x for x in range(1, round(tokens ** (1 / 3)) + 1) if tokens % x == 0)
    rest = tokens // f
    h = max(x for x in range(1, math.isqrt(rest) + 1) if rest % x == 0)
    return f, h, rest // h


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def example_inputs(
    model: nn.Module,
    tokens: int = 1024,
    batch: int = 1,
    seed: int = 0,
    text_tokens: int | None = None,
    audio_tokens: int | None = None,
    device: str | torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """Keyword arguments for one forward of a synthetic model, with ``tokens`` video tokens.

    The latent grid is a frames × height × width factorisation of ``tokens`` (480p's 32,760
    and 720p's 75,600 give the real 21 × 30 × 52 and 21 × 45 × 80 grids), times the patch.
    ``text_tokens`` defaults to ``meta["text_tokens"]`` (512); H3's ``audio_tokens`` to
    ``tokens // 8``. Inputs are float32 on the model's device (``device`` overrides).

    >>> from offload_lab import catalog, synthetic
    >>> m = synthetic.build(catalog.load("wan2.1-i2v-14b"), scale=0.02, layers=2)
    >>> sorted(synthetic.example_inputs(m, tokens=64, text_tokens=16))
    ['clip_fea', 'context', 't', 'x', 'y']
    """
    dims = getattr(model, "dims", None)
    if not isinstance(dims, (WanDims, H3Dims)):
        raise SyntheticError(f"example_inputs needs a synthetic model (WanModel or H3Model), got {type(model).__name__}")
    for what, v in (("tokens", tokens), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SyntheticError(f"{what}={v!r}; accepted: an int ≥ 1")
    meta = getattr(model, "offload_spec_meta", {})
    if text_tokens is None:
        text_tokens = int(meta.get("text_tokens") or 512)
    if isinstance(text_tokens, bool) or not isinstance(text_tokens, int) or text_tokens < 1:
        raise SyntheticError(f"text_tokens={text_tokens!r}; accepted: an int ≥ 1")
    dev = torch.device(device) if device is not None else _model_device(model)
    if dev.type == "meta":
        dev = torch.device("cpu")
    g = torch.Generator().manual_seed(seed)
    f, h, w = _grid(tokens)
    p0, p1, p2 = dims.patch
    spatial = (f * p0, h * p1, w * p2)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g, dtype=torch.float32).to(dev)

    t = (torch.rand(batch, generator=g) * 1000).to(dev)
    if isinstance(dims, WanDims):
        out = {"x": randn(batch, dims.out_channels, *spatial), "t": t,
               "context": randn(batch, text_tokens, dims.text_dim)}
        if dims.in_channels != dims.out_channels:
            out["y"] = randn(batch, dims.in_channels - dims.out_channels, *spatial)
        if dims.img_dim is not None:
            out["clip_fea"] = randn(batch, _WAN_IMG_TOKENS, dims.img_dim)
        return out
    if audio_tokens is None:
        audio_tokens = max(1, tokens // 8)
    if isinstance(audio_tokens, bool) or not isinstance(audio_tokens, int) or audio_tokens < 0:
        raise SyntheticError(f"audio_tokens={audio_tokens!r}; accepted: an int ≥ 0 (0 = no audio)")
    out = {"x": randn(batch, dims.in_channels, *spatial), "t": t,
           "context": randn(batch, text_tokens, dims.cond_dim)}
    if audio_tokens:
        out["audio"] = randn(batch, audio_tokens, dims.audio_patch_dim)
    return out


# ------------------------------------------------------------------------------------------
# safetensors save / load
# ------------------------------------------------------------------------------------------
_DATA_ALIGN = 64  # the data section starts on a cache line; tensors sit at natural alignment


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _write_safetensors(path: Path, items: list[tuple[str, torch.Tensor]], metadata: dict[str, str]) -> None:
    # safetensors forbids gaps between tensors, so order by element size (largest first, stable
    # otherwise): with an aligned data start every tensor is then aligned to its element size and
    # can be viewed in place from a mapping
    ordered = sorted(items, key=lambda it: -it[1].element_size())
    header: dict[str, Any] = {"__metadata__": metadata}
    off = 0
    for name, t in ordered:
        n = _tensor_bytes(t)
        header[name] = {"dtype": _TORCH_TO_ST[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((-(8 + len(raw))) % _DATA_ALIGN)
    tmp = path.with_name(path.name + ".tmp")
    # write beside and rename: the target may be mapped by a model loaded from it
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, t in ordered:
            if t.numel():
                data = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                f.write(memoryview(data.numpy()))
    os.replace(tmp, path)


def save(model: nn.Module, path: str | os.PathLike, shard_bytes: int | str = DEFAULT_SHARD_BYTES) -> Path:
    """Write the model's state dict as safetensors; returns the path to hand to :func:`load`.

    ``path`` is a ``.safetensors`` file or a directory (``model.safetensors`` inside). Past
    ``shard_bytes`` (bytes or a size string) the tensors go into ``<stem>-0000i-of-0000n.safetensors``
    shards, whole tensors in model order, plus ``<stem>.safetensors.index.json`` with a
    ``weight_map``; the index path is returned. The model's ``offload_spec_meta`` (arch, scale,
    dims, ...) is stored in each file's ``__metadata__`` so :func:`load` can rebuild it.

    >>> import tempfile
    >>> from offload_lab import catalog, synthetic
    >>> m = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.02, layers=2)
    >>> d = tempfile.mkdtemp()
    >>> synthetic.save(m, d, shard_bytes="64KiB").name
    'model.safetensors.index.json'
    """
    from offload_lab.units import parse_size

    if not isinstance(model, nn.Module):
        raise SyntheticError(f"save expects a torch.nn.Module, got {type(model).__name__}")
    limit = parse_size(shard_bytes, "shard_bytes")
    if limit <= 0:
        raise SyntheticError(f"shard_bytes={shard_bytes!r}; accepted: a positive size such as '4GiB'")
    items = list(model.state_dict().items())
    for name, t in items:
        if t.device.type == "meta":
            raise SyntheticError(f"tensor {name!r} is on the meta device and has no data to save; build on 'cpu' to save")
        if t.dtype not in _TORCH_TO_ST:
            raise SyntheticError(f"tensor {name!r} has dtype {t.dtype}; safetensors accepts {sorted(map(str, _TORCH_TO_ST))}")
    meta = getattr(model, "offload_spec_meta", None) or {}
    metadata = {"format": "pt", _META_KEY: json.dumps(meta, default=str)}
    p = Path(path)
    if p.name.endswith(".safetensors"):
        directory, stem = p.parent, p.name[: -len(".safetensors")]
    else:
        directory, stem = p, "model"
    directory.mkdir(parents=True, exist_ok=True)
    total = sum(_tensor_bytes(t) for _, t in items)
    if total <= limit:
        out = directory / f"{stem}.safetensors"
        _write_safetensors(out, items, metadata)
        return out
    shards: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, t in items:
        n = _tensor_bytes(t)
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append((name, t))
        size += n
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        _write_safetensors(directory / fname, shard, metadata)
        weight_map.update(dict.fromkeys((n for n, _ in shard), fname))
    index = directory / f"{stem}.safetensors.index.json"
    tmp = index.with_name(index.name + ".tmp")
    tmp.write_text(json.dumps({"metadata": {"total_size": total, _META_KEY: meta},
                               "weight_map": weight_map}, indent=1, default=str))
    os.replace(tmp, index)
    return index


def _read_header(path: Path) -> tuple[dict[str, tuple[torch.dtype, tuple[int, ...], int, int]], int, dict[str, str]]:
    """``({name: (dtype, shape, begin, end)}, data_start, __metadata__)`` of one safetensors file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if n < 0 or 8 + n > size:
                raise SyntheticError(f"{str(path)!r} has a truncated or corrupt safetensors header")
            header = json.loads(f.read(n))
    except OSError as e:
        raise SyntheticError(f"cannot read safetensors file {str(path)!r}: {e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SyntheticError(f"{str(path)!r} has a corrupt safetensors header (not JSON: {e})") from None
    metadata = header.pop("__metadata__", None) or {}
    out = {}
    for name, info in header.items():
        try:
            dt = _ST_TO_TORCH[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            b, e = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SyntheticError(f"{str(path)!r}: tensor {name!r} has a malformed header entry {info!r}") from None
        if e - b != math.prod(shape) * torch.empty((), dtype=dt).element_size():
            raise SyntheticError(f"{str(path)!r}: tensor {name!r} spans {e - b} bytes, which does not match shape {shape} of {dt}")
        if 8 + n + e > size:
            raise SyntheticError(f"{str(path)!r} is truncated: tensor {name!r} ends past the end of the file")
        out[name] = (dt, shape, b, e)
    return out, 8 + n, metadata


def load(path: str | os.PathLike, mmap: bool = True, spec: ModelSpec | None = None) -> nn.Module:
    """Rebuild a model saved by :func:`save` (a file, a directory, or a sharded index).

    The architecture comes from the file headers (``ModelSpec.from_safetensors``) and the
    ``offload_lab`` metadata :func:`save` stored (arch, scale, head split); ``spec`` overrides
    the header-derived spec (its names and shapes must match the file). With ``mmap=True``
    every parameter is a view of the file's pages (a private, copy-on-write mapping: no
    anonymous memory until written, and writes never reach the file); ``mmap=False`` reads
    ordinary anonymous copies.

    >>> import tempfile
    >>> from offload_lab import catalog, synthetic
    >>> m = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.02, layers=2)
    >>> m2 = synthetic.load(synthetic.save(m, tempfile.mkdtemp()))
    >>> all((a == b).all() for a, b in zip(m.state_dict().values(), m2.state_dict().values()))
    True
    """
    p = Path(path)
    try:
        files = _safetensors_files(p)
    except SpecError as e:
        raise SyntheticError(str(e)) from None
    headers = [(f, *_read_header(f)) for f in files]
    stored: dict[str, Any] = {}
    raw = headers[0][3].get(_META_KEY)
    if raw:
        try:
            stored = json.loads(raw)
        except json.JSONDecodeError:
            raise SyntheticError(f"{str(files[0])!r} has unreadable {_META_KEY!r} metadata: {raw[:80]!r}") from None
    if spec is None:
        # name the groups when the arch is known: a 1-layer group is not found by name alone
        names = {n for _, entries, _, _ in headers for n in entries}
        groups = None
        if stored.get("arch") in ARCHS:
            expected = ["blocks"] if stored["arch"] == "wan" else ["token_refiner.blocks", "blocks"]
            groups = [g for g in expected if any(n.startswith(g + ".") for n in names)] or None
        spec = ModelSpec.from_safetensors(p, groups=groups, name=stored.get("spec_name"))
        spec.meta = dict(stored)
    else:
        spec = copy.deepcopy(spec)
        spec.meta = {**stored, **spec.meta}
    model = _construct(_dims_of(spec), {g.name: g.num_layers for g in spec.groups})
    want = {n: (tuple(t.shape), t.dtype) for n, t in model.state_dict().items()}
    seen = set()
    for f, entries, start, _ in headers:
        buf = None
        if mmap and entries:
            # MAP_PRIVATE: pages stay file-backed until written; nothing is read here
            buf = torch.from_file(str(f), shared=False, size=f.stat().st_size, dtype=torch.uint8)
        with open(f, "rb") as fh:
            for name, (dt, shape, b, e) in entries.items():
                if name not in want:
                    raise SyntheticError(f"{str(f)!r} holds tensor {name!r}, which the rebuilt {spec.name!r} model does not have")
                if buf is not None:
                    t = buf[start + b:start + e].view(dt).view(shape)
                else:
                    t = torch.empty(e - b, dtype=torch.uint8)
                    fh.seek(start + b)
                    if e > b and fh.readinto(memoryview(t.numpy())) != e - b:
                        raise SyntheticError(f"{str(f)!r} is truncated inside tensor {name!r}")
                    t = t.view(dt).view(shape)
                if want[name][0] != tuple(t.shape):
                    raise SyntheticError(f"tensor {name!r} has shape {tuple(t.shape)} in {str(f)!r}; the model expects {want[name][0]}")
                _set_tensor(model, name, t)
                seen.add(name)
    missing = sorted(set(want) - seen)
    if missing:
        raise SyntheticError(f"{str(p)!r} lacks tensors the model needs: {missing[:5]}")
    model.eval()
    meta = copy.deepcopy(spec.meta)
    meta.setdefault("arch", _arch_of(spec))
    meta.setdefault("spec_name", spec.name)
    meta["checkpoint"] = str(p)
    model.offload_spec_meta = meta
    return model

