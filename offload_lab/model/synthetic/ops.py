"""The compute both architectures share: linear in the weight's dtype, norms, attention, patching."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from offload_lab.model.synthetic.dims import SyntheticError

EPS = 1e-6


def lin(x: torch.Tensor, m: nn.Linear) -> torch.Tensor:
    # compute in the weight's dtype (bf16 GEMMs, like the real models); mixed-dtype specs
    # (H3 keeps some projections in fp32) then just work
    w = m.weight
    b = m.bias
    if b is not None and b.dtype != w.dtype:
        b = b.to(w.dtype)
    return F.linear(x.to(w.dtype), w, b)


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float = EPS) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.float()


def ln(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.layer_norm(
        x.float(), (x.shape[-1],),
        None if weight is None else weight.float(), None if bias is None else bias.float(), EPS,
    )


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int, hd: int) -> torch.Tensor:
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


def sinusoid(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, device=t.device, dtype=torch.float64) / half)
    args = t.to(torch.float64)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1).float()


def patchify(x: torch.Tensor, patch: tuple[int, int, int]) -> tuple[torch.Tensor, tuple[int, int, int]]:
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


def unpatchify(x: torch.Tensor, grid: tuple[int, int, int], patch: tuple[int, int, int], c: int,
                channels_last: bool) -> torch.Tensor:
    B = x.shape[0]
    f, h, w = grid
    p0, p1, p2 = patch
    if channels_last:  # Wan's head emits (p0, p1, p2, c) per token
        x = x.reshape(B, f, h, w, p0, p1, p2, c).permute(0, 7, 1, 4, 2, 5, 3, 6)
    else:  # H3's video_out mirrors video_patch_proj: (c, p0, p1, p2)
        x = x.reshape(B, f, h, w, c, p0, p1, p2).permute(0, 4, 1, 5, 2, 6, 3, 7)
    return x.reshape(B, c, f * p0, h * p1, w * p2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x, self.weight)

