"""A Wan2.1 DiT (T2V and I2V) with the original tensor names."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from offload_lab.model.synthetic.dims import SyntheticError, WanDims
from offload_lab.model.synthetic.ops import (
    EPS,
    RMSNorm,
    lin,
    ln,
    patchify,
    sdpa,
    sinusoid,
    unpatchify,
)


class WanSelfAttention(nn.Module):
    def __init__(self, d: WanDims):
        super().__init__()
        self.heads, self.head_dim = d.heads, d.head_dim
        self.q = nn.Linear(d.dim, d.dim)
        self.k = nn.Linear(d.dim, d.dim)
        self.v = nn.Linear(d.dim, d.dim)
        self.o = nn.Linear(d.dim, d.dim)
        self.norm_q = RMSNorm(d.dim)
        self.norm_k = RMSNorm(d.dim)

    def _qkv(self, x: torch.Tensor, ctx: torch.Tensor):
        dt = self.q.weight.dtype
        q = self.norm_q(lin(x, self.q)).to(dt)
        k = self.norm_k(lin(ctx, self.k)).to(dt)
        return q, k, lin(ctx, self.v).to(dt)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(x, x)
        return lin(sdpa(q, k, v, self.heads, self.heads, self.head_dim), self.o)


class WanCrossAttention(WanSelfAttention):
    def __init__(self, d: WanDims):
        super().__init__(d)
        if d.img_dim is not None:  # I2V: a second key/value path over the CLIP image tokens
            self.k_img = nn.Linear(d.dim, d.dim)
            self.v_img = nn.Linear(d.dim, d.dim)
            self.norm_k_img = RMSNorm(d.dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor,  # type: ignore[override]
                context_img: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self._qkv(x, context)
        out = sdpa(q, k, v, self.heads, self.heads, self.head_dim)
        if hasattr(self, "k_img"):
            if context_img is None:
                raise SyntheticError("an I2V block needs context_img (the CLIP image tokens); got None")
            dt = self.q.weight.dtype
            ki = self.norm_k_img(lin(context_img, self.k_img)).to(dt)
            vi = lin(context_img, self.v_img).to(dt)
            out = out + sdpa(q, ki, vi, self.heads, self.heads, self.head_dim)
        return lin(out, self.o)


class WanAttentionBlock(nn.Module):
    """One Wan2.1 block: modulated self-attention, cross-attention to text, modulated GELU FFN."""

    def __init__(self, d: WanDims):
        super().__init__()
        self.dim = d.dim
        # registration order follows the catalog's tensor order
        self.modulation = nn.Parameter(torch.zeros(1, 6, d.dim))
        self.self_attn = WanSelfAttention(d)
        self.norm3 = nn.LayerNorm(d.dim, eps=EPS, elementwise_affine=True)
        self.cross_attn = WanCrossAttention(d)
        self.ffn = nn.Sequential(nn.Linear(d.dim, d.ffn), nn.GELU(approximate="tanh"), nn.Linear(d.ffn, d.dim))

    def forward(self, x: torch.Tensor, e: torch.Tensor, context: torch.Tensor,
                context_img: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [B, L, d] fp32 residual stream, ``e`` [B, 6, d] time projection, ``context`` [B, Lc, d]."""
        e = (self.modulation.float() + e.float()).chunk(6, dim=1)
        y = self.self_attn(ln(x) * (1 + e[1]) + e[0])
        x = x + y.float() * e[2]
        x = x + self.cross_attn(ln(x, self.norm3.weight, self.norm3.bias), context, context_img).float()
        h = ln(x) * (1 + e[4]) + e[3]
        y = lin(F.gelu(lin(h, self.ffn[0]), approximate="tanh"), self.ffn[2])
        return x + y.float() * e[5]


class _WanHead(nn.Module):
    def __init__(self, d: WanDims):
        super().__init__()
        self.modulation = nn.Parameter(torch.zeros(1, 2, d.dim))
        self.head = nn.Linear(d.dim, d.out_channels * math.prod(d.patch))

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.modulation.float() + e.float()[:, None]).chunk(2, dim=1)
        return lin(ln(x) * (1 + scale) + shift, self.head)


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
        x = ln(x, p[0].weight, p[0].bias)
        x = lin(F.gelu(lin(x, p[1])), p[3])
        return ln(x, p[4].weight, p[4].bias)


class WanModel(nn.Module):
    """A Wan2.1 DiT (T2V, or I2V when ``dims.img_dim`` is set) with the original tensor names.

    ``forward(x, t, context, y=None, clip_fea=None)`` → the denoiser output shaped like ``x``.
    """

    #: read by :func:`offload_lab.spec_of`: a 1-block list is a group too
    offload_layer_groups = ("blocks",)
    """The layer groups the planner offloads."""

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
        patches, grid = patchify(inp, d.patch)
        pe = self.patch_embedding
        tokens = F.linear(patches.to(pe.weight.dtype), pe.weight.reshape(d.dim, -1), pe.bias.to(pe.weight.dtype)).float()
        te = self.time_embedding
        e = lin(F.silu(lin(sinusoid(t, d.freq_dim), te[0]).float()), te[2]).float()
        e0 = lin(F.silu(e), self.time_projection[1]).float().unflatten(1, (6, d.dim))
        txt = self.text_embedding
        ctx = lin(F.gelu(lin(context, txt[0]), approximate="tanh"), txt[2])
        ctx_img = None
        if d.img_dim is not None:
            if clip_fea is None:
                raise SyntheticError("an I2V model needs clip_fea [batch, 257, img_dim]; got None")
            ctx_img = self.img_emb(clip_fea)
        for block in self.blocks:
            tokens = block(tokens, e0, ctx, ctx_img)
        out = self.head(tokens, e)
        return unpatchify(out, grid, d.patch, d.out_channels, channels_last=True).to(x.dtype)

