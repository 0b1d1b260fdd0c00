"""Pipeline specs: the torch components of a diffusers pipeline, each with its uses per request.

A :class:`PipelineSpec` holds one :class:`ComponentSpec` per torch component (text encoder,
transformer(s), VAE). Every component spec names its groups and tensors with the component as
prefix (``transformer.blocks``, ``text_encoder.encoder.block``), so one run can hold them all.
Groups are the outermost numbered prefixes of the component's tensor names (``blocks.0.…``,
``blocks.1.…``), the rule a checkpoint directory can apply without loading weights; on a live
pipeline only those that are ``nn.ModuleList``\\ s count. A component with no group is one
*unit*: a single layer (``vae.0``) holding all its weights, copied in when any of its top-level
submodules runs.

Uses per request: a denoiser (``transformer``, ``transformer_2``, ``unet``, ``prior``) runs
``steps × passes`` times (classifier-free guidance: 2 passes); everything else once.

>>> from offload_lab.model.spec import TensorSpec
>>> c = component_from_tensors("vae", [TensorSpec("conv.weight", (4, 4), "float32")])
>>> c.unit, c.spec.group_names, c.spec.groups[0].layers[0].name
(True, ['vae'], 'vae.0')
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from offload_lab.checks import check_int
from offload_lab.filemaps import file_backed_checker
from offload_lab.model.checkpoints import read_checkpoint
from offload_lab.model.pipeline_index import check_pipeline_index
from offload_lab.model.spec import (
    ModelSpec,
    SpecError,
    TensorSpec,
    candidate_groups,
    parameter_specs,
    spec_from_named,
)
from offload_lab.units import format_bytes

#: components that run once per denoising pass; the rest run once per request
DENOISERS = ("transformer", "transformer_2", "unet", "prior")
#: defaults of a diffusers text-to-video call: 50 steps, classifier-free guidance on
DEFAULT_STEPS, DEFAULT_PASSES = 50, 2


def is_denoiser(name: str) -> bool:
    """Whether the component ``name`` runs every denoising pass.

    >>> is_denoiser("transformer_2"), is_denoiser("vae")
    (True, False)
    """
    return name in DENOISERS


@dataclass
class ComponentSpec:
    """One torch component: its prefixed spec, whether it is a unit, and its buffer bytes."""

    name: str
    spec: ModelSpec
    unit: bool = False
    buffer_bytes: int = 0
    class_name: str | None = None

    @property
    def total_bytes(self) -> int:
        """Parameters (the spec) plus buffers, in bytes."""
        return self.spec.total_bytes + self.buffer_bytes


@dataclass
class PipelineSpec:
    """The torch components of a pipeline and how often each runs per request.

    >>> from offload_lab.model.spec import TensorSpec
    >>> ts = [TensorSpec(f"blocks.{i}.w", (8, 8), "float32") for i in range(2)]
    >>> ps = PipelineSpec("P", {"transformer": component_from_tensors("transformer", ts)}, steps=4)
    >>> ps.uses("transformer"), ps.total_bytes
    (8, 512)
    """

    name: str
    """The pipeline's name (its class or directory name)."""
    components: dict[str, ComponentSpec]
    """The torch components by name, each with its spec."""
    steps: int = DEFAULT_STEPS
    """Denoising steps per request."""
    passes: int = DEFAULT_PASSES
    """Denoiser forwards per step (2 with classifier-free guidance)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form facts about the pipeline (its source, class name, ...)."""

    def __post_init__(self) -> None:
        for what, v in (("steps", self.steps), ("passes", self.passes)):
            check_int(what, v, minimum=1, error=SpecError)
        if not self.components:
            raise SpecError(f"pipeline {self.name!r} has no torch component")

    def __getitem__(self, name: str) -> ComponentSpec:
        if name not in self.components:
            raise SpecError(f"component {name!r} is not in pipeline {self.name!r}: {list(self.components)}")
        return self.components[name]

    def uses(self, name: str) -> int:
        """Forward passes of component ``name`` per request."""
        self[name]
        return self.steps * self.passes if is_denoiser(name) else 1

    def with_uses(self, steps: int | None = None, passes: int | None = None) -> PipelineSpec:
        """The same components, for requests of ``steps`` steps and ``passes`` passes each."""
        return replace(self, steps=self.steps if steps is None else steps,
                       passes=self.passes if passes is None else passes)

    @property
    def total_bytes(self) -> int:
        return sum(c.total_bytes for c in self.components.values())

    @property
    def group_names(self) -> list[str]:
        return [g for c in self.components.values() for g in c.spec.group_names]

    def merged(self) -> ModelSpec:
        """One spec of every component (groups prefixed), as one run of the pipeline records it."""
        groups = [g for c in self.components.values() for g in c.spec.groups]
        non_layer = [t for c in self.components.values() for t in c.spec.non_layer]
        return ModelSpec(self.name, groups, non_layer, {"components": list(self.components)})

    def signature(self) -> list[tuple]:
        """What two specs of the same weights share, whoever read them (names, shapes, dtypes,
        mapping): a checkpoint directory's spec and its loaded pipeline's compare equal on it."""
        return [(n, c.unit, sorted(c.spec.group_names),
                 sorted((t.name, tuple(t.shape), t.dtype, t.mapped) for t in c.spec.tensors()))
                for n, c in sorted(self.components.items())]

    def table(self) -> Any:
        """One row per component: groups, layers, bytes, uses per request."""
        import pandas as pd

        rows = [{"component": n, "class": c.class_name, "groups": ", ".join(c.spec.group_names),
                 "layers": sum(g.num_layers for g in c.spec.groups), "unit": c.unit,
                 "bytes": format_bytes(c.total_bytes), "uses": self.uses(n)}
                for n, c in self.components.items()]
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        parts = ", ".join(f"{n} ×{self.uses(n)}" for n in self.components)
        return f"<PipelineSpec {self.name!r}: {parts}; {format_bytes(self.total_bytes)}>"


# -- building component specs ------------------------------------------------------------------------
def component_from_tensors(name: str, tensors: list[TensorSpec], groups: list[str] | None = None,
                           buffer_bytes: int = 0, class_name: str | None = None) -> ComponentSpec:
    """A component spec from its (unprefixed) tensors: groups by name, else one unit."""
    if groups is None:
        groups = sorted(candidate_groups(tensors), key=lambda g: _first(tensors, g))
    if groups:
        pref = [TensorSpec(f"{name}.{t.name}", t.shape, t.dtype, t.mapped) for t in tensors]
        spec = spec_from_named(pref, name, [f"{name}.{g}" for g in groups])
        return ComponentSpec(name, spec, False, buffer_bytes, class_name)
    pref = [TensorSpec(f"{name}.0.{t.name}", t.shape, t.dtype, t.mapped) for t in tensors]
    spec = spec_from_named(pref, name, [name])
    return ComponentSpec(name, spec, True, buffer_bytes, class_name)


def _first(tensors: list[TensorSpec], group: str) -> int:
    return next(i for i, t in enumerate(tensors) if t.name.startswith(group + "."))


def is_pipeline(obj: Any) -> bool:
    """Whether ``obj`` is a diffusers ``DiffusionPipeline`` (checked without importing diffusers)."""
    return any(k.__name__ == "DiffusionPipeline" for k in type(obj).__mro__)


def torch_components(pipe: Any) -> dict[str, Any]:
    """The pipeline's ``nn.Module`` components by name, in the pipeline's order."""
    from torch import nn

    comps = getattr(pipe, "components", None)
    if not isinstance(comps, dict):
        raise SpecError(f"{type(pipe).__name__} has no components dict; expected a diffusers pipeline")
    return {n: m for n, m in comps.items() if isinstance(m, nn.Module)}


def pipeline_spec_of(pipe: Any, steps: int = DEFAULT_STEPS, passes: int = DEFAULT_PASSES) -> PipelineSpec:
    """Spec of a live diffusers pipeline: one component spec per torch component.

    Tensors whose storage lies in a file mapping (a pipeline loaded by ``from_pretrained``) are
    marked ``mapped``; shared tensors are counted once.
    """
    from torch import nn

    mods = torch_components(pipe)
    if not mods:
        raise SpecError(f"{type(pipe).__name__} has no torch component (every component is None)")
    is_mapped = file_backed_checker()
    out: dict[str, ComponentSpec] = {}
    for name, mod in mods.items():
        tensors, seen = parameter_specs(mod, is_mapped)
        bufs = {id(b): b for b in mod.buffers() if id(b) not in seen}
        nbytes = sum(b.numel() * b.element_size() for b in bufs.values())
        subs = dict(mod.named_modules())
        groups = [g for g in sorted(candidate_groups(tensors), key=lambda g: _first(tensors, g))
                  if isinstance(subs.get(g), nn.ModuleList)]
        out[name] = component_from_tensors(name, tensors, groups, nbytes, type(mod).__name__)
    return PipelineSpec(type(pipe).__name__, out, steps, passes)


# -- checkpoint directories ----------------------------------------------------------------------------
def is_pipeline_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a diffusers-format pipeline directory (it has ``model_index.json``).

    >>> is_pipeline_dir("/nonexistent")
    False
    """
    return (Path(path) / "model_index.json").is_file()


def pipeline_spec_from_dir(path: str | os.PathLike, steps: int = DEFAULT_STEPS,
                           passes: int = DEFAULT_PASSES) -> PipelineSpec:
    """Spec of a diffusers-format directory from its headers only (no weights are loaded).

    ``model_index.json`` names the components; each one with safetensors in its folder (one
    file, or shards with their ``*.safetensors.index.json``) becomes a component spec; every
    tensor is a checkpoint view (``mapped``). Components listed as ``[null, null]`` or without
    weights (schedulers, tokenizers) are skipped. The index is checked first
    (:func:`~offload_lab.model.pipeline_index.check_pipeline_index`: supported libraries and
    exported classes only, no custom code, nothing resolving outside the directory).
    """
    root = Path(path)
    index = check_pipeline_index(root)
    out: dict[str, ComponentSpec] = {}
    for name, (_, class_name) in index.components.items():
        folder = root / name
        # shards listed by an index are checked even when none lies in the folder itself
        if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.safetensors.index.json")):
            continue
        tensors = [TensorSpec(e.name, tuple(e.shape), e.dtype, True)
                   for h in read_checkpoint(folder) for e in h.tensors.values()]
        out[name] = component_from_tensors(name, tensors, class_name=class_name)
    if not out:
        raise SpecError(f"{str(root)!r} lists no component with safetensors weights")
    return PipelineSpec(index.class_name, out, steps, passes,
                        {"source": str(root)})
