"""Model specs: which tensors a model has, how they fall into layer groups, and their bytes.

A :class:`ModelSpec` is built from a live module (:func:`spec_of`), from safetensors headers
(:meth:`ModelSpec.from_safetensors`, never reading tensor data) or from the shipped catalog.
It knows nothing of plans, devices or timings.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

# bytes per element, by the dtype names torch prints without the "torch." prefix
DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
# safetensors header dtype codes -> our names
_ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}
_MAX_HEADER = 100 * 2**20


class SpecError(ValueError):
    """A model, file or group name that cannot be turned into a spec."""


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor: full dotted name, shape, dtype, and whether it is a checkpoint view."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    mapped: bool = False

    def __post_init__(self) -> None:
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
        return cls(d["name"], tuple(int(s) for s in d["shape"]), d["dtype"], bool(d.get("mapped", False)))


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
        for g in self.groups:
            if g.name == name:
                return g
        raise SpecError(f"group {name!r} is not in {self.name!r}; groups: {self.group_names}")

    @property
    def group_names(self) -> list[str]:
        return [g.name for g in self.groups]

    def iter_layers(self):
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
        out = [t for layer in self.iter_layers() for t in layer.tensors]
        return out + list(self.non_layer)

    def __repr__(self) -> str:
        from offload_lab.units import format_bytes

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
        if not isinstance(d, dict) or d.get("format") != "offload-lab/model-spec":
            raise SpecError("not an offload-lab model spec (expected format 'offload-lab/model-spec')")
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
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, path_or_text: str | os.PathLike) -> ModelSpec:
        text = str(path_or_text)
        if not text.lstrip().startswith("{"):
            try:
                text = Path(path_or_text).read_text()
            except OSError as e:
                raise SpecError(f"cannot read model spec {str(path_or_text)!r}: {e}") from None
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise SpecError(f"model spec is not valid JSON: {e}") from None

    # -- safetensors ---------------------------------------------------------------------
    @classmethod
    def from_safetensors(
        cls, path: str | os.PathLike, groups: list[str] | None = None, name: str | None = None
    ) -> ModelSpec:
        """Spec of a checkpoint from its headers only: a file, a directory, or a sharded index.

        Every tensor is a checkpoint view (``mapped``) since it can be served from the file's pages.
        """
        p = Path(path)
        files = _safetensors_files(p)
        tensors: list[TensorSpec] = []
        for f in files:
            for tname, (dtype, shape) in read_safetensors_header(f).items():
                tensors.append(TensorSpec(tname, shape, dtype, mapped=True))
        return _spec_from_named(tensors, name or p.name.split(".")[0], groups)


# -- safetensors headers --------------------------------------------------------------------
def read_safetensors_header(path: str | os.PathLike) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` from one safetensors file's header, reading only the header."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SpecError(f"{str(path)!r} is truncated: {len(head)} bytes, no safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise SpecError(
                    f"{str(path)!r} has a corrupt safetensors header: declares {n} header bytes "
                    f"but the file has {size} bytes"
                )
            raw = f.read(n)
    except OSError as e:
        raise SpecError(f"cannot read safetensors file {str(path)!r}: {e}") from None
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"{str(path)!r} has a corrupt safetensors header (not JSON: {e})") from None
    if not isinstance(header, dict):
        raise SpecError(f"{str(path)!r} has a corrupt safetensors header (not a JSON object)")
    out = {}
    data_len = size - 8 - n
    for tname, info in header.items():
        if tname == "__metadata__":
            continue
        try:
            dtype = _ST_DTYPES[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SpecError(
                f"{str(path)!r}: tensor {tname!r} has a malformed header entry {info!r}; "
                f"expected dtype in {sorted(_ST_DTYPES)}, shape and data_offsets"
            ) from None
        if end > data_len or begin > end:
            raise SpecError(
                f"{str(path)!r} is truncated: tensor {tname!r} ends at byte {end} of the data "
                f"section but only {data_len} bytes are present"
            )
        out[tname] = (dtype, shape)
    return out


def _safetensors_files(p: Path) -> list[Path]:
    if p.is_dir():
        indexes = sorted(p.glob("*.safetensors.index.json"))
        if indexes:
            return _safetensors_files(indexes[0])
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise SpecError(f"directory {str(p)!r} holds no .safetensors files or index")
        return files
    if p.name.endswith(".index.json"):
        try:
            index = json.loads(p.read_text())
            shards = sorted(set(index["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError, AttributeError) as e:
            raise SpecError(
                f"{str(p)!r} is not a safetensors index (expected JSON with a 'weight_map'): {e}"
            ) from None
        return [p.parent / s for s in shards]
    if not p.exists():
        raise SpecError(f"no such safetensors file or directory: {str(p)!r}")
    return [p]


# -- grouping by names ------------------------------------------------------------------------
_LAYER_RE = re.compile(r"^(?P<group>.+?)\.(?P<idx>\d+)\.(?P<rest>.+)$")


def _spec_from_named(
    tensors: list[TensorSpec], name: str, groups: list[str] | None, meta: dict | None = None,
    block_classes: dict[str, str] | None = None,
) -> ModelSpec:
    """Split named tensors into groups ``<group>.<i>.<rest>`` and non-layer tensors."""
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
            found = sorted(_candidate_groups(tensors))
            raise SpecError(
                f"group(s) {missing} match no tensor of {name!r}; groups found by name: {found}"
            )
        order = groups
    else:
        cands = _candidate_groups(tensors)
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


def _candidate_groups(tensors: list[TensorSpec]) -> set[str]:
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
def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def find_layer_groups(module) -> list[str]:
    """Dotted names of every ``nn.ModuleList`` of ≥ 2 blocks of one class (outermost only)."""
    from torch import nn

    found = []
    for name, sub in module.named_modules():
        if not isinstance(sub, nn.ModuleList) or len(sub) < 2 or not name:
            continue
        classes = {type(m) for m in sub}
        if len(classes) != 1:
            continue
        if any(name.startswith(f + ".") for f in found):
            continue
        if not any(True for _ in sub[0].parameters()):
            continue
        found.append(name)
    return found


def spec_of(module, groups: list[str] | None = None, name: str | None = None) -> ModelSpec:
    """Spec of a live ``nn.Module``: its layer groups, per-layer bytes and non-layer bytes.

    Groups are auto-detected (``nn.ModuleList`` of ≥ 2 same-class blocks) unless named.
    Shared tensors are counted once (at their first owner); tensors whose storage lies in a
    file mapping are marked ``mapped``.

    >>> import offload_lab
    >>> from offload_lab import synthetic
    >>> model = synthetic.build(offload_lab.catalog.load("wan2.1-t2v-1.3b"), scale=0.05)
    >>> offload_lab.spec_of(model).group_names
    ['blocks']
    """
    from torch import nn

    from offload_lab.planning.hostmem import file_backed_checker

    if not isinstance(module, nn.Module):
        raise SpecError(f"spec_of expects a torch.nn.Module, got {type(module).__name__}")
    mname = name or type(module).__name__
    submods = dict(module.named_modules())
    if groups is None:
        groups = find_layer_groups(module)
        if not groups:
            raise SpecError(
                f"{mname!r} has no layer group: no nn.ModuleList of ≥ 2 blocks of one class; "
                f"pass groups=[...] naming its block lists"
            )
    else:
        groups = list(groups)
        for g in groups:
            if g not in submods:
                raise SpecError(
                    f"group {g!r} is not a submodule of {mname!r}; detected groups: "
                    f"{find_layer_groups(module)}"
                )
            if not isinstance(submods[g], nn.ModuleList):
                raise SpecError(f"group {g!r} of {mname!r} is a {type(submods[g]).__name__}, not an nn.ModuleList")
    is_mapped = file_backed_checker()
    seen: set[tuple[int, int]] = set()
    tensors: list[TensorSpec] = []
    for pname, p in module.named_parameters(remove_duplicate=False):
        key = (id(p), 0)
        if key in seen:
            continue
        seen.add(key)
        mapped = False if p.device.type == "meta" else is_mapped(p)
        tensors.append(TensorSpec(pname, tuple(p.shape), dtype_name(p.dtype), mapped))
    classes = {g: type(submods[g][0]).__name__ for g in groups}
    return _spec_from_named(tensors, mname, groups, block_classes=classes)
