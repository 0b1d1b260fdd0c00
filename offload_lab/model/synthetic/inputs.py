"""``example_inputs``: keyword arguments for one forward of a synthetic model."""

from __future__ import annotations

import math

import torch
from torch import nn

from offload_lab.checks import check_int
from offload_lab.model.synthetic.dims import WAN_IMG_TOKENS, H3Dims, SyntheticError, WanDims

# known latent token grids (frames × h × w after patching), so examples look like real videos
_KNOWN_GRIDS = {32760: (21, 30, 52), 75600: (21, 45, 80)}


def grid(tokens: int) -> tuple[int, int, int]:
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
        check_int(what, v, minimum=1, error=SyntheticError)
    meta = getattr(model, "offload_spec_meta", {})
    if text_tokens is None:
        text_tokens = int(meta.get("text_tokens") or 512)
    check_int("text_tokens", text_tokens, minimum=1, error=SyntheticError)
    dev = torch.device(device) if device is not None else _model_device(model)
    if dev.type == "meta":
        dev = torch.device("cpu")
    g = torch.Generator().manual_seed(seed)
    f, h, w = grid(tokens)
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
            out["clip_fea"] = randn(batch, WAN_IMG_TOKENS, dims.img_dim)
        return out
    if audio_tokens is None:
        audio_tokens = max(1, tokens // 8)
    check_int("audio_tokens", audio_tokens, minimum=0, error=SyntheticError, note="0 = no audio")
    out = {"x": randn(batch, dims.in_channels, *spatial), "t": t,
           "context": randn(batch, text_tokens, dims.cond_dim)}
    if audio_tokens:
        out["audio"] = randn(batch, audio_tokens, dims.audio_patch_dim)
    return out

