"""Forward FLOPs per layer and per sampling step, from a spec's tensor shapes and ``meta``.

A multiply-add counts as 2 FLOPs; norms, activations, softmax and RoPE are left out (they are
a few per cent of a DiT block at video lengths and the simulator's rate is fitted anyway).
``L`` is the number of video tokens, ``Lc`` the number of text tokens.

* ``arch == "wan"`` (Wan2.1), per block per forward, with ``d``
  and ``f`` read from ``self_attn.q.weight`` and ``ffn.0.weight`` (so scaled synthetic specs
  work too; ``meta["dims"]`` is the fallback)::

      12·L·d² + 4·L·d·f + 4·L²·d + 4·L·Lc·d + 4·Lc·d²

  (q, k, v, o of self-attention and q, o of cross-attention on L tokens; the FFN; scores and
  values of self-attention; of cross-attention; k, v of cross-attention on Lc tokens). An I2V
  block adds ``4·Li·d² + 4·L·Li·d`` for k_img / v_img over ``Li = dims["img_tokens"]`` (257
  CLIP tokens).

* ``arch == "h3"`` (MiniMax-H3, single stream), the same counting applied to its shapes: every
  2-D token-wise weight ``[out, in]`` costs ``2·S·in·out`` and attention costs
  ``4·S²·attn_width`` (``QKᵀ`` and ``AV`` over ``attn_width = heads × head_dim = 7168``).
  ``S = L + Lc`` in the main ``blocks`` (refined text tokens join the video tokens; the block
  has no cross-attention) and ``S = Lc`` in ``token_refiner.blocks``. ``adaln_proj`` acts on one
  conditioning vector per sample, so it costs ``2·in·out`` once, not per token.

* Any other spec (a user's module, no ``arch``): an approximation from weight shapes. Every
  2-D weight costs ``2·L·in·out``, except k/v projections of a cross-attention (a module path
  containing ``cross`` or ``attn2``), which run on ``Lc`` tokens, and adaLN / modulation /
  time-embedding weights, which run once per sample. Attention is detected by name: a q
  projection (``q``, ``to_q``, ``q_proj``, ``query``) of width ``w`` adds ``4·L²·w``, or
  ``4·L·Lc·w`` under a cross-attention; a fused ``qkv``/``in_proj_weight`` of ``3w`` rows adds
  ``4·L²·w``. Convolutions and attention that cannot be found by name are not counted.

>>> from offload_lab import catalog, flops
>>> spec = catalog.load("wan2.1-t2v-14b")
>>> round(flops.layer_flops(spec, "blocks", "480p") / 1e12, 1)
42.0
>>> round(flops.step_flops(spec, 32760) / 1e15, 2)
3.36
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from offload_lab.checks import check_int
from offload_lab.errors import OffloadLabError
from offload_lab.model.spec import LayerSpec, ModelSpec, TensorSpec

__all__ = ["FlopsError", "layer_flops", "forward_flops", "step_flops", "resolve_tokens"]

# weights that act on one conditioning vector per sample, not on every token
_PER_SAMPLE = re.compile(r"adaln|ada_ln|modulation|time_?embed|time_?proj|timestep")
_CROSS = re.compile(r"cross|attn2")
_Q_LEAVES = {"q", "to_q", "q_proj", "query"}
_KV_LEAVES = {"k", "v", "to_k", "to_v", "k_proj", "v_proj", "key", "value", "k_img", "v_img"}
_QKV_LEAVES = {"qkv", "to_qkv", "qkv_proj", "qkv_linear", "in_proj"}
_WAN_IMG_TOKENS = 257  # CLIP ViT-H/14 context of Wan2.1 I2V, when dims do not say


class FlopsError(OffloadLabError, ValueError):
    """A token count the FLOPs model cannot use."""


def resolve_tokens(spec: ModelSpec, tokens: int | str) -> int:
    """A token count: a positive int, or a resolution key of ``spec.meta["tokens"]``.

    >>> from offload_lab import catalog
    >>> resolve_tokens(catalog.load("wan2.1-t2v-1.3b"), "720P")
    75600
    """
    table = spec.meta.get("tokens") or {}
    if isinstance(tokens, str):
        for key, value in table.items():
            if key.lower() == tokens.strip().lower():
                return int(value)
        raise FlopsError(
            f"tokens {tokens!r} is not a resolution of {spec.name!r}; accepted: a positive int"
            + (f" or one of {sorted(table)}" if table else " (this spec names no resolutions)")
        )
    return check_int("tokens", tokens, minimum=1, error=FlopsError,
                     accepted=f"a positive int or a resolution name {sorted(table)}")


def _text_tokens(spec: ModelSpec, text_tokens: int | None) -> int:
    if text_tokens is None:
        text_tokens = spec.meta.get("text_tokens", 0) or 0
    return check_int("text_tokens", text_tokens, minimum=0, error=FlopsError, accepted="an int ≥ 0 or None")


def layer_flops(
    spec: ModelSpec, group: str, tokens: int | str, text_tokens: int | None = None, layer: int = 0
) -> float:
    """FLOPs of one forward of one layer of ``group`` (layer 0 unless ``layer`` is given).

    ``tokens`` is the video token count or a resolution key (``"480p"``); ``text_tokens``
    defaults to ``spec.meta["text_tokens"]`` (0 when absent).

    >>> from offload_lab import catalog
    >>> round(layer_flops(catalog.load("wan2.1-t2v-1.3b"), "blocks", "480p") / 1e12, 2)
    9.43
    """
    g = spec.group(group)
    check_int("layer", layer, minimum=0, maximum=g.num_layers - 1, error=FlopsError,
              note=f"a layer of group {group!r}")
    return _layer_flops(spec, g.layers[layer], resolve_tokens(spec, tokens),
                        _text_tokens(spec, text_tokens))


def forward_flops(spec: ModelSpec, tokens: int | str, text_tokens: int | None = None) -> float:
    """FLOPs of one forward pass through every layer of every group (non-layer tensors omitted).

    >>> from offload_lab import catalog
    >>> round(forward_flops(catalog.load("wan2.1-t2v-1.3b"), "480p") / 1e15, 3)
    0.283
    """
    L, Lc = resolve_tokens(spec, tokens), _text_tokens(spec, text_tokens)
    return float(sum(_layer_flops(spec, layer, L, Lc) for layer in spec.iter_layers()))


def step_flops(spec: ModelSpec, tokens: int | str, text_tokens: int | None = None) -> float:
    """FLOPs of one sampling step: :func:`forward_flops` × ``meta["guidance_passes"]`` (default 1).

    >>> from offload_lab import catalog
    >>> round(step_flops(catalog.load("wan2.1-t2v-1.3b"), "480p") / 1e15, 2)
    0.57
    """
    passes = spec.meta.get("guidance_passes", 1)
    return forward_flops(spec, tokens, text_tokens) * int(passes)


# -- per-architecture counting ------------------------------------------------------------------
def _layer_flops(spec: ModelSpec, layer: LayerSpec, L: int, Lc: int) -> float:
    arch = spec.meta.get("arch")
    dims = spec.meta.get("dims") or {}
    if arch == "wan":
        got = _wan_flops(layer.tensors, L, Lc, dims)
        if got is not None:
            return got
    if arch == "h3":
        refiner = dims.get("refiner_group", "token_refiner.blocks")
        seq = Lc if layer.group == refiner else L + Lc
        # single stream: no cross-attention, so the context length does not enter on its own
        return _shape_flops(layer.tensors, seq, 0)
    return _shape_flops(layer.tensors, L, Lc)


def _wan_flops(tensors: Iterable[TensorSpec], L: int, Lc: int, dims: dict) -> float | None:
    by_suffix = {}
    for t in tensors:
        for suffix in ("self_attn.q.weight", "ffn.0.weight", "cross_attn.k_img.weight"):
            if t.name.endswith(suffix):
                by_suffix[suffix] = t
    d = by_suffix["self_attn.q.weight"].shape[0] if "self_attn.q.weight" in by_suffix else dims.get("d")
    f = by_suffix["ffn.0.weight"].shape[0] if "ffn.0.weight" in by_suffix else dims.get("ffn")
    if not d or not f:
        return None
    out = 12 * L * d * d + 4 * L * d * f + 4 * L * L * d + 4 * L * Lc * d + 4 * Lc * d * d
    if "cross_attn.k_img.weight" in by_suffix:
        li = int(dims.get("img_tokens", _WAN_IMG_TOKENS))
        out += 4 * li * d * d + 4 * L * li * d
    return float(out)


def _shape_flops(tensors: Iterable[TensorSpec], L: int, Lc: int) -> float:
    total = 0
    for t in tensors:
        if len(t.shape) != 2:
            continue  # biases, norms, modulation tables and convolutions
        out_f, in_f = t.shape
        parts = t.name.lower().split(".")
        # "attn.q.weight" -> "q"; nn.MultiheadAttention's "attn.in_proj_weight" -> "in_proj"
        if parts[-1] == "weight":
            leaf = parts[-2] if len(parts) > 1 else ""
        else:
            leaf = parts[-1].removesuffix("_weight")
        path = ".".join(parts[:-1])
        cross = bool(_CROSS.search(path))
        if _PER_SAMPLE.search(path):
            total += 2 * in_f * out_f
            continue
        rows = Lc if cross and leaf in _KV_LEAVES else L
        total += 2 * rows * in_f * out_f
        if leaf in _Q_LEAVES:
            total += 4 * L * (Lc if cross else L) * out_f
        elif leaf in _QKV_LEAVES:
            total += 4 * L * L * (out_f // 3)
    return float(total)
