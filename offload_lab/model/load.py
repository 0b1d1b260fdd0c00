"""Specs from what a user holds: a live module or pipeline (:func:`spec_of`), or the path of a
safetensors file, directory, sharded index or diffusers-format pipeline directory
(:func:`spec_from_safetensors`, behind :meth:`ModelSpec.from_safetensors`).

The dispatch between single models and pipelines lives here, above :mod:`~offload_lab.model.spec`
(the data), :mod:`~offload_lab.model.checkpoints` and :mod:`~offload_lab.model.pipeline` (the
readers), so none of those imports another's caller.

>>> spec_from_safetensors("/nonexistent/model.safetensors")
Traceback (most recent call last):
...
offload_lab.model.spec.SpecError: no such safetensors file or directory: '/nonexistent/model.safetensors'
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from offload_lab.filemaps import file_backed_checker
from offload_lab.model.checkpoints import read_checkpoint, spec_from_headers
from offload_lab.model.pipeline import (
    PipelineSpec,
    is_pipeline,
    is_pipeline_dir,
    pipeline_spec_from_dir,
    pipeline_spec_of,
)
from offload_lab.model.spec import (
    ModelSpec,
    SpecError,
    find_layer_groups,
    parameter_specs,
    spec_from_named,
)

__all__ = ["spec_of", "spec_from_safetensors"]


def spec_from_safetensors(
    path: str | os.PathLike, groups: list[str] | None = None, name: str | None = None
) -> ModelSpec | PipelineSpec:
    """Spec of a checkpoint from its headers only (what :meth:`ModelSpec.from_safetensors` returns):
    a :class:`~offload_lab.model.pipeline.PipelineSpec` for a diffusers-format pipeline directory,
    else a :class:`ModelSpec` named ``name`` (default: the file name up to its first dot)."""
    p = Path(path)
    if is_pipeline_dir(p):  # a diffusers-format pipeline: one spec per component
        return pipeline_spec_from_dir(p)
    return spec_from_headers(read_checkpoint(p), name or p.name.split(".")[0], groups)


def _groups_of(module: Any, groups: list[str] | str | None, mname: str) -> list[str]:
    """The layer groups to use: named, else declared by the module, else detected."""
    from torch import nn

    submods = dict(module.named_modules())
    if groups is None:
        declared = getattr(module, "offload_layer_groups", None)
        if declared is not None:
            # a module that declares its groups may have some empty (an H3 without a refiner)
            groups = [g for g in declared if isinstance(submods.get(g), nn.ModuleList) and len(submods[g])]
        else:
            groups = find_layer_groups(module)
        if not groups:
            raise SpecError(
                f"{mname!r} has no layer group: no nn.ModuleList of ≥ 2 blocks of one class; "
                f"pass groups=[...] naming its block lists"
            )
        return groups
    groups = [groups] if isinstance(groups, str) else list(groups)
    for g in groups:
        if g not in submods:
            raise SpecError(
                f"group {g!r} is not a submodule of {mname!r}; detected groups: "
                f"{find_layer_groups(module)}"
            )
        if not isinstance(submods[g], nn.ModuleList):
            raise SpecError(f"group {g!r} of {mname!r} is a {type(submods[g]).__name__}, not an nn.ModuleList")
        if not len(submods[g]):
            raise SpecError(f"group {g!r} of {mname!r} is an empty nn.ModuleList; name groups with blocks")
    return groups


def spec_of(module: Any, groups: list[str] | None = None, name: str | None = None) -> ModelSpec:
    """Spec of a live ``nn.Module``: its layer groups, per-layer bytes and non-layer bytes.

    A diffusers pipeline (or the path of a diffusers-format pipeline directory) gives a
    :class:`~offload_lab.model.pipeline.PipelineSpec`: one spec per torch component, each with
    its uses per request (see :mod:`offload_lab.model.pipeline`).

    Groups are the ones named, else those the module declares in ``offload_layer_groups``
    (dotted names in order; empty ones skipped), else auto-detected (every outermost
    ``nn.ModuleList`` of ≥ 2 same-class blocks). A module carrying ``offload_spec_meta`` (the
    synthetic models, and models loaded from their checkpoints) keeps it as the spec's
    ``meta``, and its ``spec_name`` names the spec unless ``name`` is given; otherwise the
    spec is named after the module's class. Shared tensors are counted once (at their first
    owner); tensors whose storage lies in a file mapping are marked ``mapped``.

    >>> import offload_lab
    >>> from offload_lab import synthetic
    >>> model = synthetic.build(offload_lab.catalog.load("minimax-h3"), scale=0.02, layers=1)
    >>> spec = offload_lab.spec_of(model)
    >>> spec.name, spec.group_names, spec.meta["scale"]
    ('minimax-h3', ['token_refiner.blocks', 'blocks'], 0.02)
    """
    from torch import nn

    if is_pipeline(module):
        return pipeline_spec_of(module)  # type: ignore[return-value]
    if isinstance(module, (str, os.PathLike)) and is_pipeline_dir(module):
        return pipeline_spec_from_dir(module)  # type: ignore[return-value]
    if not isinstance(module, nn.Module):
        raise SpecError(f"spec_of expects a torch.nn.Module, a diffusers pipeline or a pipeline "
                        f"directory, got {type(module).__name__}")
    meta = getattr(module, "offload_spec_meta", None)
    meta = copy.deepcopy(meta) if isinstance(meta, dict) else {}
    mname = name or meta.get("spec_name") or type(module).__name__
    groups = _groups_of(module, groups, mname)
    tensors, _ = parameter_specs(module, file_backed_checker())
    classes = {g: type(module.get_submodule(g)[0]).__name__ for g in groups}
    return spec_from_named(tensors, mname, groups, meta=meta, block_classes=classes)
