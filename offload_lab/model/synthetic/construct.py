"""``build``: a runnable synthetic DiT with exactly a spec's tensors and random weights."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from offload_lab.checks import check_int, check_number
from offload_lab.model.spec import ModelSpec, dtype_name
from offload_lab.model.synthetic.dims import (
    H3Dims,
    SyntheticError,
    WanDims,
    arch_of,
    dims_meta,
    dims_of,
    scale_dims,
)
from offload_lab.model.synthetic.h3 import H3Model
from offload_lab.model.synthetic.wan import WanModel
from offload_lab.model.synthetic.weights import init_tensor, set_tensor


def _layer_counts(spec: ModelSpec, arch: str, layers: int | Mapping[str, int] | None) -> dict[str, int]:
    counts = {g.name: g.num_layers for g in spec.groups}
    expected = ["blocks"] if arch == "wan" else ["token_refiner.blocks", "blocks"]
    unknown = [g for g in counts if g not in expected]
    if unknown or "blocks" not in counts:
        raise SyntheticError(
            f"spec {spec.name!r} has layer groups {list(counts)}; a {arch!r} model has {expected}"
        )
    if layers is None:
        return counts
    if isinstance(layers, bool) or not isinstance(layers, (int, Mapping)):
        raise SyntheticError(f"layers={layers!r}; accepted: None, an int ≥ 1, or a dict {{group: int ≥ 1}} over {list(counts)}")
    if isinstance(layers, int):
        layers = dict.fromkeys(counts, layers)
    out = dict(counts)
    for g, n in layers.items():
        if g not in counts:
            raise SyntheticError(f"layers names group {g!r}; groups of {spec.name!r}: {list(counts)}")
        out[g] = check_int(f"layers[{g!r}]", n, minimum=1, error=SyntheticError)
    return out


def group_pattern(groups: list[str]) -> re.Pattern:
    alts = "|".join(re.escape(g) for g in sorted(groups, key=len, reverse=True))
    return re.compile(rf"^({alts})\.\d+\.")


def _dtype_lookup(spec: ModelSpec):
    """Dtype of a tensor by name, with any layer index matching layer 0 of its group."""
    pat = group_pattern(spec.group_names)
    table = {pat.sub(r"\1.*.", t.name): t.dtype for t in spec.tensors()}

    def lookup(name: str) -> torch.dtype | None:
        dt = table.get(pat.sub(r"\1.*.", name))
        return None if dt is None else getattr(torch, dt)

    return lookup


def _resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None:
        return None
    resolved = getattr(torch, dtype.removeprefix("torch."), None) if isinstance(dtype, str) else dtype
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise SyntheticError(f"dtype={dtype!r}; accepted: None (keep the spec's) or a floating torch dtype / name such as 'bfloat16'")
    return resolved



def construct(dims: WanDims | H3Dims, counts: dict[str, int]) -> nn.Module:
    with torch.device("meta"):
        return WanModel(dims, counts) if isinstance(dims, WanDims) else H3Model(dims, counts)


def _check_names(model: nn.Module, spec: ModelSpec, exact: bool, dtypes: bool = True) -> None:
    """Every model tensor must be in the spec (by group-relative name); at full size, exactly."""
    if exact:
        want = {t.name: (tuple(t.shape), t.dtype if dtypes else "") for t in spec.tensors()}
        have = {n: (tuple(p.shape), dtype_name(p.dtype) if dtypes else "")
                for n, p in model.state_dict().items()}
        if want != have:
            missing = sorted(set(want) - set(have))[:5]
            extra = sorted(set(have) - set(want))[:5]
            diff = sorted(n for n in set(want) & set(have) if want[n] != have[n])[:5]
            raise SyntheticError(
                f"spec {spec.name!r} does not match the {_arch_name(model)!r} architecture: "
                f"tensors only in the spec {missing}, only in the model {extra}, "
                f"different shape/dtype {[(n, want[n], have[n]) for n in diff]}"
            )
        return
    pat = group_pattern(spec.group_names)
    want_rel = {pat.sub(r"\1.*.", t.name) for t in spec.tensors()}
    have_rel = {pat.sub(r"\1.*.", n) for n in model.state_dict()}
    if want_rel != have_rel:
        raise SyntheticError(
            f"spec {spec.name!r} does not match the {_arch_name(model)!r} architecture: "
            f"only in the spec {sorted(want_rel - have_rel)[:5]}, only in the model {sorted(have_rel - want_rel)[:5]}"
        )


def _arch_name(model: nn.Module) -> str:
    dims = getattr(model, "dims", None)
    return dims.arch if dims is not None else type(model).__name__


def build(
    spec: ModelSpec,
    scale: float = 1.0,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    layers: int | Mapping[str, int] | None = None,
) -> nn.Module:
    """A runnable DiT with the spec's tensors (names, shapes, dtypes at ``scale=1``), random weights.

    ``scale`` in (0, 1] shrinks widths (see the module doc); ``layers`` overrides the depth of
    every group (an int) or of named groups (``{"blocks": 4}``); ``dtype`` forces every
    floating tensor (``None`` keeps the spec's); ``device="meta"`` allocates nothing. Weights
    depend only on ``seed`` and each tensor's name and shape, never on the device or the run.
    The module records ``model.offload_spec_meta`` (the spec's meta with ``scale``, ``seed``,
    ``arch`` and the scaled ``dims``).

    >>> from offload_lab import catalog, synthetic
    >>> m = synthetic.build(catalog.load("minimax-h3"), device="meta")
    >>> sum(p.nbytes for p in m.parameters())
    66280430080
    >>> small = synthetic.build(catalog.load("wan2.1-t2v-14b"), scale=0.05, layers=2)
    >>> small.dims.dim, small.dims.heads, len(small.blocks)
    (256, 8, 2)
    """
    if not isinstance(spec, ModelSpec):
        raise SyntheticError(f"build expects a ModelSpec, got {type(spec).__name__}; e.g. offload_lab.catalog.load(name)")
    scale = check_number("scale", scale, above=0, maximum=1, error=SyntheticError)
    check_int("seed", seed, error=SyntheticError)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise SyntheticError(f"device={device!r}; accepted: a torch device such as 'cpu', 'cuda', 'meta'") from None
    force = _resolve_dtype(dtype)
    arch = arch_of(spec)
    counts = _layer_counts(spec, arch, layers)
    dims = scale_dims(dims_of(spec), scale)
    model = construct(dims, counts)
    exact = scale == 1 and counts == {g.name: g.num_layers for g in spec.groups}
    lookup = _dtype_lookup(spec)
    with ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads())) as pool:
        for name, p in list(model.named_parameters()):
            dt = force or lookup(name) or torch.float32
            if dev.type == "meta":
                t = torch.empty(p.shape, dtype=dt, device="meta")
            else:
                t = init_tensor(name, tuple(p.shape), seed, dt, pool).to(dev)
            set_tensor(model, name, t)
    _check_names(model, spec, exact, dtypes=force is None)
    model.eval()
    meta = copy.deepcopy(spec.meta)
    dmeta = dict(meta.get("dims") or {})
    dmeta.update(dims_meta(dims, counts))
    meta.update(
        arch=arch, scale=float(spec.meta.get("scale", 1.0)) * scale, seed=seed, dims=dmeta,
        spec_name=spec.name,
    )
    model.offload_spec_meta = meta
    return model

