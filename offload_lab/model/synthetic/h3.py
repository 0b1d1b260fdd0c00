"""A MiniMax-H3 single-stream audio + video DiT with the original tensor names."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from offload_lab.model.synthetic.dims import H3Dims, SyntheticError
from offload_lab.model.synthetic.ops import RMSNorm, lin, patchify, sdpa, sinusoid, unpatchify


class H3Attention(nn.Module):
    def __init__(self, d: H3Dims):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = d.heads, d.kv_heads, d.head_dim
        self.qkv_proj = nn.Linear(d.dim, (d.heads + 2 * d.kv_heads) * d.head_dim, bias=False)
        self.q_norm = RMSNorm(d.head_dim)
        self.k_norm = RMSNorm(d.head_dim)
        self.out_proj = nn.Linear(d.heads * d.head_dim, d.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        hd, dt = self.head_dim, self.qkv_proj.weight.dtype
        q, k, v = lin(x, self.qkv_proj).split(
            [self.heads * hd, self.kv_heads * hd, self.kv_heads * hd], dim=-1)
        # per-head q/k norm
        q = self.q_norm(q.reshape(B, L, self.heads, hd)).to(dt).reshape(B, L, -1)
        k = self.k_norm(k.reshape(B, L, self.kv_heads, hd)).to(dt).reshape(B, L, -1)
        return lin(sdpa(q, k, v.contiguous(), self.heads, self.kv_heads, hd), self.out_proj)


class H3MLP(nn.Module):
    def __init__(self, d: H3Dims):
        super().__init__()
        self.fc1 = nn.Linear(d.dim, 2 * d.ffn, bias=False)  # fused gate + up
        self.fc2 = nn.Linear(d.ffn, d.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = lin(x, self.fc1).chunk(2, dim=-1)
        return lin(F.silu(gate) * up, self.fc2)


class _AdaLNProj(nn.Module):
    def __init__(self, time_dim: int, out: int):
        super().__init__()
        self.linear = nn.Linear(time_dim, out)

    def forward(self, temb: torch.Tensor) -> torch.Tensor:
        return lin(F.silu(temb.float()), self.linear).float()


class H3RefinerBlock(nn.Module):
    """A token-refiner block: pre-RMSNorm self-attention + SwiGLU over the condition tokens."""

    def __init__(self, d: H3Dims):
        super().__init__()
        self.norm1 = RMSNorm(d.dim)
        self.attn = H3Attention(d)
        self.norm2 = RMSNorm(d.dim)
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
        self.norm1 = RMSNorm(d.dim)
        self.attn = H3Attention(d)
        self.norm2 = RMSNorm(d.dim)
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
        return lin(F.silu(lin(sinusoid(t, freq_dim), self.proj_in).float()), self.proj_out).float()


class _H3TokenRefiner(nn.Module):
    def __init__(self, d: H3Dims, n: int):
        super().__init__()
        self.blocks = nn.ModuleList(H3RefinerBlock(d) for _ in range(n))
        self.final_norm = RMSNorm(d.dim)


class _H3FinalLayer(nn.Module):
    def __init__(self, d: H3Dims):
        super().__init__()
        self.norm = RMSNorm(d.dim)
        self.adaln_proj = _AdaLNProj(d.time_dim, 2 * d.dim)
        self.video_out = nn.Linear(d.dim, d.video_patch_dim)
        self.audio_out = nn.Linear(d.dim, d.audio_patch_dim)


class H3Model(nn.Module):
    """A MiniMax-H3 single-stream audio+video DiT with the original tensor names.

    ``forward(x, t, context, audio=None, return_audio=False)`` → the video denoiser output
    shaped like ``x`` (and the audio one too when ``return_audio``).
    """

    #: read by :func:`offload_lab.spec_of`: declared order, and 1-block lists are groups too
    offload_layer_groups = ("token_refiner.blocks", "blocks")
    """The layer groups the planner offloads, in execution order."""

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
        patches, grid = patchify(x, d.patch)
        video = lin(patches, self.video_patch_proj).float()
        cond = lin(context, self.condition_proj).float()
        for block in self.token_refiner.blocks:
            cond = block(cond)
        cond = self.token_refiner.final_norm(cond)
        parts = [cond, video]
        if audio is not None:
            parts.append(lin(audio, self.audio_patch_proj).float())
        lengths = tuple(p.shape[1] for p in parts)
        h = torch.cat(parts, dim=1)
        temb = self.time_embedder(t, d.freq_dim)
        for block in self.blocks:
            h = block(h, temb, lengths)
        fl = self.final_layer
        shift, scale = fl.adaln_proj(temb).view(-1, 2, d.dim).chunk(2, dim=1)
        h = fl.norm(h) * (1 + scale) + shift
        lc, lv = lengths[0], lengths[1]
        out = lin(h[:, lc:lc + lv], fl.video_out)
        out = unpatchify(out, grid, d.patch, d.in_channels, channels_last=False).to(x.dtype)
        if not return_audio:
            return out
        aud = lin(h[:, lc + lv:], fl.audio_out).to(audio.dtype) if audio is not None else None
        return out, aud

