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
:func:`spec_of` is :func:`offload_lab.spec_of`: a synthetic model keeps its catalog name and meta.

The modules: ``dims`` (widths from shapes, scaling), ``ops`` (shared compute), ``wan`` and
``h3`` (the architectures), ``weights`` (seeded random init), ``construct`` (:func:`build`),
``inputs`` (:func:`example_inputs`), ``checkpoint`` (:func:`save`, :func:`load`).

>>> from offload_lab import catalog, synthetic
>>> model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=2)
>>> inputs = synthetic.example_inputs(model, tokens=64)
>>> model(**inputs).shape == inputs["x"].shape
True
"""

from __future__ import annotations

from offload_lab.model.load import spec_of
from offload_lab.model.synthetic.checkpoint import DEFAULT_SHARD_BYTES, load, save
from offload_lab.model.synthetic.construct import build
from offload_lab.model.synthetic.dims import ARCHS, H3Dims, SyntheticError, WanDims
from offload_lab.model.synthetic.h3 import H3Model
from offload_lab.model.synthetic.inputs import example_inputs
from offload_lab.model.synthetic.wan import WanModel
from offload_lab.model.synthetic.weights import set_tensor as _set_tensor  # noqa: F401  (scripts/gpu_check.py)

__all__ = [
    "SyntheticError", "build", "example_inputs", "save", "load", "spec_of",
    "WanModel", "H3Model", "WanDims", "H3Dims", "ARCHS", "DEFAULT_SHARD_BYTES",
]
