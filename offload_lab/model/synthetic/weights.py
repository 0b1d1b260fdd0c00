"""Random weights keyed by seed and tensor name, and putting a tensor into a module by name."""

from __future__ import annotations

import math
import zlib
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from offload_lab.model.synthetic.dims import SyntheticError


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


def init_tensor(name: str, shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32,
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


def set_tensor(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    mod_name, _, leaf = name.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    if leaf in mod._parameters:
        # inference only: no autograd state on the weights
        mod._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
    elif leaf in mod._buffers:
        mod._buffers[leaf] = tensor
    else:
        raise SyntheticError(f"{name!r} is not a parameter or buffer of {type(model).__name__}")

