"""``save`` and ``load``: synthetic models as safetensors files, loaded as views of the file pages."""

from __future__ import annotations

import copy
import json
import os
import struct
from pathlib import Path
from typing import Any

import torch
from torch import nn

from offload_lab.model.checkpoints import ST_DTYPES, Header, read_checkpoint, spec_from_headers
from offload_lab.model.spec import ModelSpec
from offload_lab.model.synthetic.construct import construct
from offload_lab.model.synthetic.dims import ARCHS, SyntheticError, arch_of, dims_of
from offload_lab.model.synthetic.weights import set_tensor
from offload_lab.reading import open_binary
from offload_lab.units import parse_size
from offload_lab.writing import atomic_write

DEFAULT_SHARD_BYTES = 4 * 2**30
"""Largest safetensors shard ``save`` writes (4 GiB) before starting another."""
_META_KEY = "offload_lab"

# torch dtype -> safetensors code, for the dtypes this torch build has
_TORCH_TO_ST = {getattr(torch, name): code for code, (name, _) in ST_DTYPES.items() if hasattr(torch, name)}


_DATA_ALIGN = 64  # the data section starts on a cache line; tensors sit at natural alignment


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _write_safetensors(path: Path, items: list[tuple[str, torch.Tensor]], metadata: dict[str, str]) -> None:
    # safetensors forbids gaps between tensors, so order by element size (largest first, stable
    # otherwise): with an aligned data start every tensor is then aligned to its element size and
    # can be viewed in place from a mapping
    ordered = sorted(items, key=lambda it: -it[1].element_size())
    header: dict[str, Any] = {"__metadata__": metadata}
    off = 0
    for name, t in ordered:
        n = _tensor_bytes(t)
        header[name] = {"dtype": _TORCH_TO_ST[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((-(8 + len(raw))) % _DATA_ALIGN)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for _, t in ordered:
                if t.numel():
                    data = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                    f.write(memoryview(data.numpy()))

    # written beside and renamed: the target may be mapped by a model loaded from it
    atomic_write(path, write, what="checkpoint path", example="model.safetensors")


def save(model: nn.Module, path: str | os.PathLike, shard_bytes: int | str = DEFAULT_SHARD_BYTES) -> Path:
    """Write the model's state dict as safetensors; returns the path to hand to :func:`load`.

    ``path`` is a ``.safetensors`` file or a directory (``model.safetensors`` inside). Past
    ``shard_bytes`` (bytes or a size string) the tensors go into ``<stem>-0000i-of-0000n.safetensors``
    shards, whole tensors in model order, plus ``<stem>.safetensors.index.json`` with a
    ``weight_map``; the index path is returned. The model's ``offload_spec_meta`` (arch, scale,
    dims, ...) is stored in each file's ``__metadata__`` so :func:`load` can rebuild it.

    >>> import tempfile
    >>> from offload_lab import catalog, synthetic
    >>> m = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.02, layers=2)
    >>> d = tempfile.mkdtemp()
    >>> synthetic.save(m, d, shard_bytes="64KiB").name
    'model.safetensors.index.json'
    """
    if not isinstance(model, nn.Module):
        raise SyntheticError(f"save expects a torch.nn.Module, got {type(model).__name__}")
    limit = parse_size(shard_bytes, "shard_bytes")
    if limit <= 0:
        raise SyntheticError(f"shard_bytes={shard_bytes!r}; accepted: a positive size such as '4GiB'")
    items = list(model.state_dict().items())
    for name, t in items:
        if t.device.type == "meta":
            raise SyntheticError(f"tensor {name!r} is on the meta device and has no data to save; build on 'cpu' to save")
        if t.dtype not in _TORCH_TO_ST:
            raise SyntheticError(f"tensor {name!r} has dtype {t.dtype}; safetensors accepts {sorted(map(str, _TORCH_TO_ST))}")
    meta = getattr(model, "offload_spec_meta", None) or {}
    metadata = {"format": "pt", _META_KEY: json.dumps(meta, default=str)}
    p = Path(path)
    if p.name.endswith(".safetensors"):
        directory, stem = p.parent, p.name[: -len(".safetensors")]
    else:
        directory, stem = p, "model"
    directory.mkdir(parents=True, exist_ok=True)
    total = sum(_tensor_bytes(t) for _, t in items)
    if total <= limit:
        out = directory / f"{stem}.safetensors"
        _write_safetensors(out, items, metadata)
        return out
    shards: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, t in items:
        n = _tensor_bytes(t)
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append((name, t))
        size += n
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        _write_safetensors(directory / fname, shard, metadata)
        weight_map.update(dict.fromkeys((n for n, _ in shard), fname))
    index = directory / f"{stem}.safetensors.index.json"
    atomic_write(index, json.dumps({"metadata": {"total_size": total, _META_KEY: meta},
                                    "weight_map": weight_map}, indent=1, default=str),
                 what="checkpoint index path", example="model.safetensors.index.json")
    return index


def _stored_meta(first: Header) -> dict[str, Any]:
    """The ``offload_lab`` metadata :func:`save` put into a file's ``__metadata__``."""
    raw = first.metadata.get(_META_KEY)
    if not raw:
        return {}
    try:
        stored = json.loads(raw)
    except (ValueError, RecursionError):
        stored = None
    if not isinstance(stored, dict):
        raise SyntheticError(f"{str(first.path)!r} has unreadable {_META_KEY!r} metadata: {raw[:80]!r}")
    return stored


def _checkpoint_spec(p: Path, headers: list[Header], stored: dict[str, Any],
                     spec: ModelSpec | None) -> ModelSpec:
    if spec is not None:
        spec = copy.deepcopy(spec)
        spec.meta = {**stored, **spec.meta}
        return spec
    # name the groups when the arch is known: a 1-layer group is not found by name alone
    names = {n for h in headers for n in h.tensors}
    groups = None
    if stored.get("arch") in ARCHS:
        expected = ["blocks"] if stored["arch"] == "wan" else ["token_refiner.blocks", "blocks"]
        groups = [g for g in expected if any(n.startswith(g + ".") for n in names)] or None
    out = spec_from_headers(headers, stored.get("spec_name") or p.name.split(".")[0], groups)
    out.meta = dict(stored)
    return out


def _tensors_of(h: Header, mmap: bool):
    """``(name, tensor)`` of every tensor in one file: views of its pages, or fresh copies."""
    buf = None
    if mmap and h.tensors:
        # MAP_PRIVATE: pages stay file-backed until written; nothing is read here
        buf = torch.from_file(str(h.path), shared=False, size=h.data_start + max(
            t.end for t in h.tensors.values()), dtype=torch.uint8)
    # checked again: the file read_header validated may have been swapped for a FIFO since
    with open_binary(h.path, "safetensors file", None) as fh:
        for name, e in h.tensors.items():
            dt = getattr(torch, e.dtype)
            lo, hi = h.data_start + e.begin, h.data_start + e.end
            if buf is not None:
                t = buf[lo:hi]
            else:
                t = torch.empty(hi - lo, dtype=torch.uint8)
                fh.seek(lo)
                if hi > lo and fh.readinto(memoryview(t.numpy())) != hi - lo:
                    raise SyntheticError(f"{str(h.path)!r} is truncated inside tensor {name!r}")
            yield name, t.view(dt).view(e.shape)


def load(path: str | os.PathLike, mmap: bool = True, spec: ModelSpec | None = None) -> nn.Module:
    """Rebuild a model saved by :func:`save` (a file, a directory, or a sharded index).

    The architecture comes from the file headers and the ``offload_lab`` metadata :func:`save`
    stored (arch, scale, head split); ``spec`` overrides the header-derived spec (its names and
    shapes must match the file). With ``mmap=True`` every parameter is a view of the file's
    pages (a private, copy-on-write mapping: no anonymous memory until written, and writes
    never reach the file); ``mmap=False`` reads ordinary anonymous copies. A file that is not
    a valid checkpoint raises :class:`~offload_lab.model.spec.SpecError`.

    >>> import tempfile
    >>> from offload_lab import catalog, synthetic
    >>> m = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.02, layers=2)
    >>> m2 = synthetic.load(synthetic.save(m, tempfile.mkdtemp()))
    >>> all((a == b).all() for a, b in zip(m.state_dict().values(), m2.state_dict().values()))
    True
    """
    p = Path(path)
    headers = read_checkpoint(p)
    spec = _checkpoint_spec(p, headers, _stored_meta(headers[0]), spec)
    model = construct(dims_of(spec), {g.name: g.num_layers for g in spec.groups})
    want = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    seen = set()
    for h in headers:
        for name, t in _tensors_of(h, mmap):
            if name not in want:
                raise SyntheticError(f"{str(h.path)!r} holds tensor {name!r}, which the rebuilt {spec.name!r} model does not have")
            if want[name] != tuple(t.shape):
                raise SyntheticError(f"tensor {name!r} has shape {tuple(t.shape)} in {str(h.path)!r}; the model expects {want[name]}")
            set_tensor(model, name, t)
            seen.add(name)
    missing = sorted(set(want) - seen)
    if missing:
        raise SyntheticError(f"{str(p)!r} lacks tensors the model needs: {missing[:5]}")
    model.eval()
    meta = copy.deepcopy(spec.meta)
    meta.setdefault("arch", arch_of(spec))
    meta.setdefault("spec_name", spec.name)
    meta["checkpoint"] = str(p)
    model.offload_spec_meta = meta
    return model
