"""How big a synthetic stand-in of a catalog model to build on this machine, and why."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from offload_lab.model import flops, synthetic
from offload_lab.planning.hostmem import HostMemory
from offload_lab.units import format_bytes
from offload_lab.views.text import fmt_seconds

if TYPE_CHECKING:
    from torch import nn

    from offload_lab.model.spec import ModelSpec

__all__ = ["Sizing", "choose_size"]

#: candidate width scales for the CPU demo, largest first
_CPU_SCALES = (1.0, 0.75, 0.5, 0.35, 0.25, 0.18, 0.125, 0.09, 0.0625)
_PROBE_BLOCK_BYTES = 24 * 2**20


@dataclass
class Sizing:
    """How big a synthetic stand-in of a catalog model to build here, and why.

    >>> Sizing(0.25, {"blocks": 8}, 256, 64).describe()
    'scale 0.25 × 8 blocks, 256 video tokens, 64 text tokens'
    """

    scale: float
    layers: dict[str, int]
    tokens: int
    text_tokens: int
    why: list[str] = field(default_factory=list)

    def describe(self) -> str:
        groups = ", ".join(f"{n} {g}" for g, n in self.layers.items())
        return (f"scale {self.scale:g} × {groups}, {self.tokens} video tokens, "
                f"{self.text_tokens} text tokens")


def _layer_counts(spec: ModelSpec, n: int | None) -> dict[str, int]:
    return {g.name: g.num_layers if n is None else min(g.num_layers, n) for g in spec.groups}


def _scaled_spec(spec: ModelSpec, scale: float, layers: dict[str, int]) -> ModelSpec:
    # the meta device allocates nothing: shapes only, so trying many sizes is free
    return synthetic.spec_of(synthetic.build(spec, scale=scale, layers=layers, device="meta"))


def _time_forward(model: nn.Module, inputs: dict[str, Any], repeats: int = 2) -> float:
    import torch

    best = math.inf
    with torch.no_grad():
        model(**inputs)  # first call pays one-off costs (allocator, kernel selection)
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(**inputs)
            best = min(best, time.perf_counter() - t0)
    return best


def choose_size(spec: ModelSpec, backend: str, quick: bool = False, scale: float | None = None,
                layers: int | None = None, tokens: int | None = None) -> Sizing:
    """Pick a synthetic model size so that a profile takes a few seconds on this machine.

    ``cpu``: widths shrink (compute grows with width², and a 2-core CPU is ~1000× slower than a
    GPU) and depth is cut to 8 layers (4 with ``quick``); one block is timed at a small probe
    scale and FLOPs extrapolate to each candidate scale, the largest whose forward fits about
    1 s (0.2 s quick) is chosen. ``cuda``: full width (so each layer's copy-vs-compute balance
    is the real model's), depth cut only to what fits host and device memory comfortably.
    Explicit ``scale`` / ``layers`` / ``tokens`` are kept as given.

    >>> from offload_lab import catalog
    >>> choose_size(catalog.load("wan2.1-t2v-1.3b"), "cpu", scale=0.1, layers=2).describe()
    'scale 0.1 × 2 blocks, 256 video tokens, 64 text tokens'
    """
    biggest = max(layer.bytes for layer in spec.iter_layers())
    host = HostMemory.probe()
    why: list[str] = []
    full_layers = ", ".join(f"{g.num_layers} {g.name}" for g in spec.groups)
    why.append(f"the full model has {full_layers}: {format_bytes(spec.layer_bytes)} of layer weights "
               f"(largest layer {format_bytes(biggest)}); this host has {format_bytes(host.available)} available")
    if backend == "cuda":
        import torch

        tokens = tokens or (4096 if quick else 8192)
        text_tokens = int(spec.meta.get("text_tokens") or 512)
        free = torch.cuda.mem_get_info()[0]
        cap = min(host.available // 4, free // 4, 6 * 2**30)
        scale = scale or 1.0
        scaled_biggest = biggest * scale * scale
        if layers is None:
            n_fit = max(2, int(cap // max(1, scaled_biggest)))
            n = min(max(g.num_layers for g in spec.groups), n_fit, 12 if quick else 10**6)
        else:
            n = layers
        counts = _layer_counts(spec, n)
        why.append(f"cuda: full width keeps each layer's copy-vs-compute balance real; "
                   f"{sum(counts.values())} layers fit a cap of {format_bytes(cap)} "
                   f"(¼ of host and device memory, at most 6 GiB); {tokens} tokens make a layer's "
                   f"compute comparable to its pinned copy")
        return Sizing(scale, counts, tokens, text_tokens, why)

    n = layers or (4 if quick else 8)
    counts = _layer_counts(spec, n)
    tokens = tokens or (128 if quick else 256)
    text_tokens = 32 if quick else 64
    if scale is not None:
        why.append(f"scale {scale:g} as given")
        return Sizing(scale, counts, tokens, text_tokens, why)
    target = 0.2 if quick else 1.0
    probe_scale = round(min(0.5, math.sqrt(_PROBE_BLOCK_BYTES / biggest)), 3)
    probe = synthetic.build(spec, scale=probe_scale, layers=_layer_counts(spec, 1))
    inputs = synthetic.example_inputs(probe, tokens=tokens, text_tokens=text_tokens)
    t = _time_forward(probe, inputs)
    rate = flops.forward_flops(synthetic.spec_of(probe), tokens, text_tokens) / max(t, 1e-6)
    del probe, inputs
    why.append(f"cpu: one block at scale {probe_scale:g} took {fmt_seconds(t)} at "
               f"{tokens} tokens, about {rate / 1e9:.0f} GFLOP/s; the width scale is the largest whose "
               f"forward of {sum(counts.values())} layers should take ≤ {target:g} s")
    mem_cap = min(2**30, host.available // 12)
    chosen = None
    for c in _CPU_SCALES:
        s = _scaled_spec(spec, c, counts)
        est = flops.forward_flops(s, tokens, text_tokens) / rate
        if est <= target and s.layer_bytes <= mem_cap:
            chosen = (c, est, s.layer_bytes)
            break
    if chosen is None:
        c = _CPU_SCALES[-1]
        s = _scaled_spec(spec, c, counts)
        chosen = (c, flops.forward_flops(s, tokens, text_tokens) / rate, s.layer_bytes)
        why.append(f"even the smallest scale is slower than the target here (a busy machine?); using {c:g}")
    c, est, nbytes = chosen
    why.append(f"chose scale {c:g}: {format_bytes(nbytes)} of layer weights, a forward ≈ {fmt_seconds(est)}")
    return Sizing(c, counts, tokens, text_tokens, why)
