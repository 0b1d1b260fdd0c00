"""Model specs: which tensors a model has, how they fall into layer groups, and their bytes.

A :class:`ModelSpec` is built from a live module (:func:`~offload_lab.model.load.spec_of`),
from safetensors headers (:meth:`ModelSpec.from_safetensors`, never reading tensor data) or from
the shipped catalog. It knows nothing of plans, devices or timings, and it is the bottom of
``model``: the readers of checkpoints and pipelines build on it (:mod:`offload_lab.model.load`).
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from offload_lab.checks import is_int
from offload_lab.errors import OffloadLabError
from offload_lab.reading import json_document
from offload_lab.units import format_bytes
from offload_lab.writing import atomic_write

# bytes per element, by the dtype names torch prints without the "torch." prefix
DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}


class SpecError(OffloadLabError, ValueError):
    """A model, file or group name that cannot be turned into a spec."""


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor: full dotted name, shape, dtype, and whether it is a checkpoint view."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    mapped: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple) or not all(
            is_int(s) and s >= 0 for s in self.shape
        ):
            raise SpecError(
                f"tensor {self.name!r} has shape {self.shape!r}; accepted: a tuple of ints ≥ 0"
            )
        if self.dtype not in DTYPE_BYTES:
            raise SpecError(
                f"tensor {self.name!r} has dtype {self.dtype!r}; accepted: {sorted(DTYPE_BYTES)}"
            )

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.mapped:
            d["mapped"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorSpec:
        return cls(d["name"], tuple(d["shape"]), d["dtype"], bool(d.get("mapped", False)))


@dataclass
class LayerSpec:
    """One block of a group: the unit that is offloaded."""

    group: str
    index: int
    tensors: list[TensorSpec]

    @property
    def name(self) -> str:
        return f"{self.group}.{self.index}"

    @property
    def bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def mapped_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors if t.mapped)

    def bytes_by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for t in self.tensors:
            out[t.dtype] += t.nbytes
        return dict(out)

    def part_of(self, tensor_name: str) -> str:
        """The part of the block a tensor belongs to: the first name component after the
        layer prefix (``blocks.0.self_attn.q.weight`` -> ``self_attn``); a tensor directly on
        the block (``blocks.0.modulation``) is its own part.

        >>> from offload_lab import catalog
        >>> catalog.load("wan2.1-t2v-14b").group("blocks").layers[0].part_of("blocks.0.ffn.0.weight")
        'ffn'
        """
        prefix = self.name + "."
        rest = tensor_name[len(prefix):] if tensor_name.startswith(prefix) else tensor_name
        return rest.split(".")[0]

    def bytes_by_part(self) -> dict[str, int]:
        """Bytes per part of the block (:meth:`part_of`), largest first; they sum to :attr:`bytes`.

        >>> from offload_lab import catalog
        >>> block = catalog.load("wan2.1-t2v-14b").group("blocks").layers[0]
        >>> list(block.bytes_by_part())[:3]
        ['ffn', 'cross_attn', 'self_attn']
        """
        out: dict[str, int] = defaultdict(int)
        for t in self.tensors:
            out[self.part_of(t.name)] += t.nbytes
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class GroupSpec:
    """An ordered list of layers driven by one manager (``blocks``, ``token_refiner.blocks``)."""

    name: str
    layers: list[LayerSpec]
    block_class: str | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def bytes(self) -> int:
        return sum(layer.bytes for layer in self.layers)


@dataclass
class ModelSpec:
    """The tensors of a model split into layer groups and non-layer tensors.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> [(g.name, g.num_layers) for g in spec.groups]
    [('blocks', 30)]
    >>> spec.total_bytes
    2837993600
    """

    name: str
    groups: list[GroupSpec]
    non_layer: list[TensorSpec] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    # -- views -------------------------------------------------------------------------
    def group(self, name: str) -> GroupSpec:
        """The group called ``name``; an unknown name is a SpecError listing the groups."""
        for g in self.groups:
            if g.name == name:
                return g
        raise SpecError(f"group {name!r} is not in {self.name!r}; groups: {self.group_names}")

    @property
    def group_names(self) -> list[str]:
        return [g.name for g in self.groups]

    def iter_layers(self) -> Iterator[LayerSpec]:
        """Every layer, group by group in declared order."""
        for g in self.groups:
            yield from g.layers

    @property
    def layers(self) -> pd.DataFrame:
        """One row per layer: group, layer, bytes, mapped_bytes, tensors, bytes_<dtype>..."""
        rows = []
        dtypes = sorted({t.dtype for layer in self.iter_layers() for t in layer.tensors})
        for layer in self.iter_layers():
            by = layer.bytes_by_dtype()
            row = {
                "group": layer.group,
                "layer": layer.index,
                "bytes": layer.bytes,
                "mapped_bytes": layer.mapped_bytes,
                "tensors": len(layer.tensors),
            }
            for d in dtypes:
                row[f"bytes_{d}"] = by.get(d, 0)
            rows.append(row)
        cols = ["group", "layer", "bytes", "mapped_bytes", "tensors"] + [f"bytes_{d}" for d in dtypes]
        df = pd.DataFrame(rows, columns=cols)
        return df.astype({c: "int64" for c in cols if c != "group"})

    @property
    def layer_bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    @property
    def non_layer_bytes(self) -> int:
        return sum(t.nbytes for t in self.non_layer)

    @property
    def total_bytes(self) -> int:
        return self.layer_bytes + self.non_layer_bytes

    @property
    def mapped_bytes(self) -> int:
        return sum(layer.mapped_bytes for layer in self.iter_layers()) + sum(
            t.nbytes for t in self.non_layer if t.mapped
        )

    def tensors(self) -> list[TensorSpec]:
        """Every tensor: the layers' in group and layer order, then the non-layer ones."""
        out = [t for layer in self.iter_layers() for t in layer.tensors]
        return out + list(self.non_layer)

    def __repr__(self) -> str:
        groups = ", ".join(f"{g.name}×{g.num_layers}" for g in self.groups)
        return f"ModelSpec({self.name!r}, groups=[{groups}], total={format_bytes(self.total_bytes)})"

    # -- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "offload-lab/model-spec",
            "version": 1,
            "name": self.name,
            "meta": self.meta,
            "groups": [
                {
                    "name": g.name,
                    "block_class": g.block_class,
                    "layers": [[t.to_dict() for t in layer.tensors] for layer in g.layers],
                }
                for g in self.groups
            ],
            "non_layer": [t.to_dict() for t in self.non_layer],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        """A spec from the dict :meth:`to_dict` writes; a malformed one is a one-line SpecError.

        >>> ModelSpec.from_dict({"format": "offload-lab/model-spec", "name": "m"})
        Traceback (most recent call last):
        ...
        offload_lab.model.spec.SpecError: model spec 'm' is malformed: missing 'groups'
        """
        if not isinstance(d, dict) or d.get("format") != "offload-lab/model-spec":
            raise SpecError("not an offload-lab model spec (expected format 'offload-lab/model-spec')")
        try:
            return cls._parse(d)
        except KeyError as e:
            raise SpecError(f"model spec {d.get('name')!r} is malformed: missing {e.args[0]!r}") from None
        except (TypeError, AttributeError, ValueError) as e:
            if isinstance(e, SpecError):
                raise
            raise SpecError(f"model spec {d.get('name')!r} is malformed: {e}") from None

    @classmethod
    def _parse(cls, d: dict[str, Any]) -> ModelSpec:
        groups = []
        for g in d["groups"]:
            layers = [
                LayerSpec(g["name"], i, [TensorSpec.from_dict(t) for t in tensors])
                for i, tensors in enumerate(g["layers"])
            ]
            groups.append(GroupSpec(g["name"], layers, g.get("block_class")))
        return cls(
            d["name"], groups, [TensorSpec.from_dict(t) for t in d.get("non_layer", [])],
            dict(d.get("meta", {})),
        )

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The spec as JSON text (written to ``path`` too when given); :meth:`from_json` reads it.

        >>> import offload_lab
        >>> s = offload_lab.catalog.load("wan2.1-t2v-1.3b")
        >>> ModelSpec.from_json(s.to_json()) == s
        True
        """
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            atomic_write(path, text, what="spec path", example="spec.json")
        return text

    @classmethod
    def from_json(cls, path_or_text: str | os.PathLike) -> ModelSpec:
        """A spec from JSON text, or from a JSON file written by :meth:`to_json`.

        >>> ModelSpec.from_json("{nope")
        Traceback (most recent call last):
        ...
        offload_lab.model.spec.SpecError: model spec is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)
        """
        return cls.from_dict(json_document(path_or_text, "model spec", SpecError))

    # -- safetensors ---------------------------------------------------------------------
    @classmethod
    def from_safetensors(
        cls, path: str | os.PathLike, groups: list[str] | None = None, name: str | None = None
    ) -> ModelSpec:
        """Spec of a checkpoint from its headers only: a file, a directory, or a sharded index.

        Every tensor is a checkpoint view (``mapped``) since it can be served from the file's
        pages. A diffusers-format pipeline directory (``model_index.json`` and one folder per
        component) gives a :class:`~offload_lab.model.pipeline.PipelineSpec` instead. The headers are validated in full (:mod:`offload_lab.model.checkpoints`); a bad
        one raises a one-line :class:`SpecError` naming the file and the tensor.

        >>> ModelSpec.from_safetensors("/nonexistent/model.safetensors")
        Traceback (most recent call last):
        ...
        offload_lab.model.spec.SpecError: no such safetensors file or directory: '/nonexistent/model.safetensors'
        """
        # the readers build specs, so they sit above this module: the classmethod, kept as the
        # documented entry point, reaches them by name when called rather than at import
        load = importlib.import_module("offload_lab.model.load")
        return load.spec_from_safetensors(path, groups, name)


# -- grouping by names ------------------------------------------------------------------------
_LAYER_RE = re.compile(r"^(?P<group>.+?)\.(?P<idx>\d+)\.(?P<rest>.+)$")


def spec_from_named(
    tensors: list[TensorSpec], name: str, groups: list[str] | None, meta: dict | None = None,
    block_classes: dict[str, str] | None = None,
) -> ModelSpec:
    """Split named tensors into groups ``<group>.<i>.<rest>`` and non-layer tensors.

    Without ``groups``, a group is every outermost prefix numbered 0..n-1 with n ≥ 2, in order
    of first appearance.

    >>> ts = [TensorSpec(n, (2,), "float32") for n in ("blocks.0.w", "blocks.1.w", "head.w")]
    >>> s = spec_from_named(ts, "m", None)
    >>> s.group_names, [t.name for t in s.non_layer]
    (['blocks'], ['head.w'])
    """
    by_group: dict[str, dict[int, list[TensorSpec]]] = defaultdict(lambda: defaultdict(list))
    non_layer: list[TensorSpec] = []
    if groups is not None:
        groups = list(groups)
        wanted = sorted(groups, key=len, reverse=True)  # longest prefix wins
        for t in tensors:
            for g in wanted:
                m = re.match(re.escape(g) + r"\.(\d+)\.", t.name)
                if m:
                    by_group[g][int(m.group(1))].append(t)
                    break
            else:
                non_layer.append(t)
        missing = [g for g in groups if g not in by_group]
        if missing:
            found = sorted(candidate_groups(tensors))
            raise SpecError(
                f"group(s) {missing} match no tensor of {name!r}; groups found by name: {found}"
            )
        order = groups
    else:
        cands = candidate_groups(tensors)
        for t in tensors:
            m = _LAYER_RE.match(t.name)
            if m and m.group("group") in cands:
                by_group[m.group("group")][int(m.group("idx"))].append(t)
            else:
                non_layer.append(t)
        # declared order = order of first appearance
        order = []
        for t in tensors:
            m = _LAYER_RE.match(t.name)
            if m and m.group("group") in cands and m.group("group") not in order:
                order.append(m.group("group"))
    if not order:
        raise SpecError(
            f"{name!r} has no layer group: no tensor names of the form '<group>.<index>.<name>' "
            f"with at least 2 indices; pass groups=[...] to name them"
        )
    out_groups = []
    for g in order:
        idxs = sorted(by_group[g])
        if idxs != list(range(len(idxs))):
            raise SpecError(f"group {g!r} has layer indices {idxs[:8]}...; expected 0..{len(idxs) - 1}")
        layers = [LayerSpec(g, i, by_group[g][i]) for i in idxs]
        out_groups.append(GroupSpec(g, layers, (block_classes or {}).get(g)))
    return ModelSpec(name, out_groups, non_layer, dict(meta or {}))


def candidate_groups(tensors: list[TensorSpec]) -> set[str]:
    """The outermost prefixes ``<group>.<i>.`` numbered 0..n-1 (n ≥ 2) among the tensor names.

    >>> sorted(candidate_groups([TensorSpec(f"blocks.{i}.w", (1,), "float32") for i in range(2)]))
    ['blocks']
    """
    idx: dict[str, set[int]] = defaultdict(set)
    for t in tensors:
        m = _LAYER_RE.match(t.name)
        if m:
            idx[m.group("group")].add(int(m.group("idx")))
    # a group nested in another group's layer (blocks.0.sub.1.w) is not a group of its own
    # a layer group numbers its blocks 0..n-1; `text_embedding.0/.2` (a Sequential) is not one
    cands = {g for g, s in idx.items() if len(s) >= 2 and s == set(range(len(s)))}
    return {g for g in cands if not any(g != o and g.startswith(o + ".") for o in cands)}


# -- live modules -----------------------------------------------------------------------------
def dtype_name(dtype: Any) -> str:
    """A torch dtype's name as specs write it.

    >>> import torch
    >>> dtype_name(torch.bfloat16)
    'bfloat16'
    """
    return str(dtype).removeprefix("torch.")


def find_layer_groups(module: Any) -> list[str]:
    """Dotted names of the outermost ``nn.ModuleList`` s whose blocks ``0..n-1`` (n ≥ 2) hold
    parameters, in the order of their first parameter.

    The blocks may be of different classes (a UNet's ``down_blocks``: cross-attention blocks and
    a plain one): the rule reads the parameters' names, as :func:`spec_of` of a whole pipeline
    and of a pipeline directory do, so a component gets the same groups whichever object is
    passed. A list nested in a block of another group is part of that block's layer.

    >>> from torch import nn
    >>> find_layer_groups(nn.ModuleDict({"blocks": nn.ModuleList(nn.Linear(2, 2) for _ in range(3))}))
    ['blocks']
    >>> find_layer_groups(nn.ModuleDict({"mixed": nn.ModuleList([nn.Linear(2, 2), nn.Conv1d(2, 2, 1)])}))
    ['mixed']
    """
    from torch import nn

    lists = {name for name, sub in module.named_modules() if name and isinstance(sub, nn.ModuleList)}
    idx: dict[str, set[int]] = defaultdict(set)
    first: dict[str, int] = {}
    for k, (pname, _) in enumerate(module.named_parameters()):
        parts = pname.split(".")
        # the outermost ModuleList on the parameter's path, and the block it is in
        for j in range(1, len(parts) - 1):
            head = ".".join(parts[:j])
            if head in lists and parts[j].isdigit():
                idx[head].add(int(parts[j]))
                first.setdefault(head, k)
                break
    found = [g for g, s in idx.items() if len(s) >= 2 and s == set(range(len(s)))]
    return sorted(found, key=first.__getitem__)


def parameter_specs(module: Any, is_mapped: Any) -> tuple[list[TensorSpec], set[int]]:
    """A :class:`TensorSpec` per parameter of ``module`` (a shared one once; ``is_mapped`` says
    whether its storage lies in a file mapping), and the ids of the parameters seen."""
    seen: set[int] = set()
    tensors: list[TensorSpec] = []
    for pname, p in module.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        mapped = False if p.device.type == "meta" else is_mapped(p)
        tensors.append(TensorSpec(pname, tuple(p.shape), dtype_name(p.dtype), mapped))
    return tensors, seen
