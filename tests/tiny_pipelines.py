"""The tiny diffusers pipeline the pipeline tests share, written and read by the real writer
and loader; the fixtures over it (one of each per session) are in ``conftest.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: denoising steps of every reference output
STEPS = 3
#: transformer blocks of the tiny pipeline
LAYERS = 6


def save(pipe: Any, d: Path) -> Path:
    """``pipe`` written to ``d`` in small shards, so the transformer has a sharded index."""
    pipe.save_pretrained(d, max_shard_size="100KB")
    return d


def load(d: Path) -> Any:
    """The pipeline in ``d`` loaded back (its weights on the files' pages)."""
    from diffusers import WanPipeline

    back = WanPipeline.from_pretrained(d, text_encoder=None, tokenizer=None, local_files_only=True)
    back.set_progress_bar_config(disable=True)
    return back


def frames(pipe: Any, steps: int = STEPS) -> Any:
    """The frames of one deterministic call of ``pipe``, without offload."""
    import torch

    from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_call

    with torch.no_grad():
        return pipe(**tiny_wan_call(steps=steps)).frames
