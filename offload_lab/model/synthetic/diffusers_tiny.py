"""A tiny diffusers ``WanPipeline`` built from a random config: runs on the CPU in about a second.

Needs the ``diffusers`` extra (diffusers, transformers, accelerate); nothing is downloaded.

>>> import pytest; _ = pytest.importorskip("diffusers")
>>> pipe = tiny_wan_pipeline(layers=2)
>>> type(pipe).__name__, len(pipe.transformer.blocks), pipe.text_encoder is None
('WanPipeline', 2, True)
"""

from __future__ import annotations

from typing import Any

from offload_lab.checks import check_int

#: the text embedding width of :func:`tiny_wan_pipeline`'s transformer
TEXT_DIM = 64


def tiny_wan_pipeline(layers: int = 6, seed: int = 0) -> Any:
    """A ``WanPipeline`` with a ``layers``-block random transformer, a tiny VAE, no text encoder.

    The progress bar is switched off; weights come from ``torch.manual_seed(seed)``.
    """
    import torch
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )

    check_int("layers", layers, minimum=1)
    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=32, in_channels=16,
        out_channels=16, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=128, num_layers=layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    pipe = WanPipeline(tokenizer=None, text_encoder=None, transformer=transformer, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_wan_call(steps: int = 3, guidance: float = 5.0, height: int = 16, width: int = 16,
                  frames: int = 5, seed: int = 0, text_dim: int = TEXT_DIM,
                  device: Any = "cpu") -> dict[str, Any]:
    """Keyword arguments for one deterministic call of a Wan pipeline without a text encoder:
    random prompt embeddings (seeded, drawn on the CPU and put on ``device``), a seeded CPU
    generator (diffusers draws the latents with it and moves them), tensors out.

    >>> sorted(tiny_wan_call(steps=2))[:3]
    ['generator', 'guidance_scale', 'height']
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    pe = torch.randn(1, 12, text_dim, generator=g).to(device)
    ne = torch.randn(1, 12, text_dim, generator=g).to(device)
    return dict(prompt_embeds=pe, negative_prompt_embeds=ne, height=height, width=width,
                num_frames=frames, num_inference_steps=steps, guidance_scale=guidance,
                output_type="pt", generator=torch.Generator().manual_seed(seed))
