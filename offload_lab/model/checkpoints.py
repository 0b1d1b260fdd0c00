"""Safetensors checkpoints read from their headers only: one file, a directory, or a sharded index.

This is the one reader of safetensors headers in the package: :meth:`ModelSpec.from_safetensors`
and the synthetic models' loader both go through it. A header is validated in full before
anything trusts it: every tensor's dtype, shape and ``data_offsets`` agree (numel × dtype size
equals the span), spans lie inside the file and do not overlap, names appear once across all
shards, and an index may only name regular files beside it. Every refusal is a one-line
:class:`~offload_lab.model.spec.SpecError` naming the file and, where there is one, the tensor.

>>> import tempfile, torch
>>> from pathlib import Path
>>> from safetensors.torch import save_file
>>> p = Path(tempfile.mkdtemp()) / "m.safetensors"
>>> save_file({"blocks.0.w": torch.zeros(2, 3), "blocks.1.w": torch.zeros(2, 3)}, str(p))
>>> h = read_header(p)
>>> h.tensors["blocks.1.w"].dtype, h.tensors["blocks.1.w"].shape, h.tensors["blocks.1.w"].nbytes
('float32', (2, 3), 24)
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from offload_lab.checks import is_int
from offload_lab.model.spec import ModelSpec, SpecError, TensorSpec, spec_from_named
from offload_lab.reading import InputFileError, open_binary, read_bytes

__all__ = [
    "ST_DTYPES", "TensorEntry", "Header", "read_header", "read_checkpoint",
    "spec_from_headers",
]

# safetensors dtype code -> (dtype name as torch prints it without "torch.", bytes per element)
ST_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U8": ("uint8", 1), "BOOL": ("bool", 1),
}
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors format's own limit
MAX_DIMS = 32
# a span is bounded by the file, but a zero-size dimension lets the others grow without one:
# cap each at 2**48 so no later product of dimensions (FLOPs, scaling) leaves exact integers
MAX_DIM = 2**48
_INDEX_LIMIT = 64 * 2**20


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors header; ``begin``/``end`` are offsets into the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    """A validated safetensors header: the tensors, where the data section starts, the metadata."""

    path: Path
    tensors: dict[str, TensorEntry]
    data_start: int
    metadata: dict[str, str]


def _where(path: Path) -> str:
    return repr(str(path))


def _no_dup_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


class _Duplicate(Exception):
    pass


def _parse_json(raw: bytes | str, where: str, what: str) -> object:
    try:
        return json.loads(raw, object_pairs_hook=_no_dup_keys)
    except _Duplicate as e:
        raise SpecError(f"{where} has a corrupt {what}: name {e.args[0]!r} appears twice") from None
    except RecursionError:
        raise SpecError(f"{where} has a corrupt {what}: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, and ints past the digit limit
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecError(f"{where} has a corrupt {what} (not JSON: {msg})") from None


def _open_regular(path: Path, what: str) -> tuple[IO[bytes], int]:
    """``(file, size)`` of a regular file (any size: only its header is read); FIFOs, devices
    and directories are refused without being opened (:mod:`offload_lab.reading`)."""
    try:
        fh = open_binary(path, what, None)
    except InputFileError as e:
        raise SpecError(str(e)) from None
    return fh, os.fstat(fh.fileno()).st_size


def _read_exact(fh: IO[bytes], n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        b = fh.read(min(n - got, 1 << 24))
        if not b:
            break
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def _entry(where: str, name: str, info: object, data_len: int) -> TensorEntry:
    """One header entry, checked: dtype known, dims and offsets ints in range, span = shape."""
    def bad(why: str) -> SpecError:
        return SpecError(f"{where}: tensor {name!r} {why}")

    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        shown = repr(info)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise bad(f"has a malformed header entry {shown}; expected an object with "
                  f"dtype, shape and data_offsets")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(code, str) or code not in ST_DTYPES:
        raise bad(f"has a malformed header entry: dtype {code!r}; accepted: {sorted(ST_DTYPES)}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise bad(f"has shape {_short(shape)}; expected a list of at most {MAX_DIMS} dimensions")
    for s in shape:
        if not is_int(s) or s < 0:
            raise bad(f"has dimension {s!r} in shape {_short(shape)}; accepted: ints ≥ 0")
        if s > MAX_DIM:
            raise bad(f"has dimension {s} in its shape, past the limit of {MAX_DIM}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(x) for x in offsets):
        raise bad(f"has data_offsets {_short(offsets)}; expected [begin, end], two ints")
    begin, end = offsets
    if begin < 0 or end < begin:
        raise bad(f"has data_offsets [{begin}, {end}]; expected 0 ≤ begin ≤ end")
    if end > data_len:
        raise bad(f"ends at byte {end} of the data section but only {data_len} bytes are "
                  f"present: the file is truncated")
    dtype, size = ST_DTYPES[code]
    want = math.prod(shape) * size
    if want != end - begin:
        raise bad(f"spans {end - begin} bytes but shape {list(shape)} of {dtype} needs {want}")
    return TensorEntry(name, dtype, tuple(shape), begin, end)


def _short(x: object) -> str:
    s = repr(x)
    return s if len(s) <= 60 else s[:57] + "..."


def read_header(path: str | os.PathLike) -> Header:
    """The validated header of one safetensors file, reading only the header bytes.

    >>> read_header("/nonexistent.safetensors")
    Traceback (most recent call last):
    ...
    offload_lab.model.spec.SpecError: no such safetensors file: '/nonexistent.safetensors'; accepted: a regular file
    """
    path = Path(path)
    where = _where(path)
    fd, size = _open_regular(path, "safetensors file")
    try:
        head = _read_exact(fd, 8)
        if len(head) < 8:
            raise SpecError(f"{where} is truncated: {len(head)} bytes, no safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise SpecError(f"{where} has a corrupt safetensors header: declares {n} header "
                            f"bytes but the file has {size} bytes")
        raw = _read_exact(fd, n)
    except OSError as e:
        raise SpecError(f"cannot read safetensors file {where}: {e.strerror or e}") from None
    finally:
        fd.close()
    header = _parse_json(raw, where, "safetensors header")
    if not isinstance(header, dict):
        raise SpecError(f"{where} has a corrupt safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SpecError(f"{where} has a corrupt safetensors header: __metadata__ must map "
                        f"strings to strings")
    data_len = size - 8 - n
    tensors = {name: _entry(where, name, info, data_len) for name, info in header.items()}
    spans = sorted((t.begin, t.end, t.name) for t in tensors.values() if t.end > t.begin)
    for (_, end_a, a), (begin_b, _, b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise SpecError(f"{where}: tensor {b!r} overlaps tensor {a!r} in the data section")
    return Header(path, tensors, 8 + n, metadata)


def _inside(directory: Path, p: Path) -> bool:
    try:
        return p.resolve().is_relative_to(directory.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        return False


def _index_shards(index: Path) -> tuple[list[Path], dict[str, str]]:
    """The shard files an index names, each a file inside the index's directory, and its map."""
    where = _where(index)
    try:
        raw = read_bytes(index, "safetensors index", _INDEX_LIMIT)
    except InputFileError as e:
        raise SpecError(str(e)) from None
    data = _parse_json(raw, where, "safetensors index")
    wmap = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wmap, dict):
        raise SpecError(f"{where} is not a safetensors index (expected JSON with a 'weight_map' object)")
    for name, shard in wmap.items():
        if not isinstance(shard, str) or not shard:
            raise SpecError(f"{where}: tensor {name!r} maps to {_short(shard)}; expected a shard file name")
    if not wmap:
        raise SpecError(f"{where} has an empty 'weight_map': it names no tensors or shards")
    files = []
    for shard in sorted(set(wmap.values())):
        p = index.parent / shard
        # checked before anything touches the target, so the error says nothing about it
        if Path(shard).is_absolute() or not _inside(index.parent, p):
            raise SpecError(f"{where} names shard {shard!r} outside its directory; shards must "
                            f"be files beside the index")
        files.append(p)
    return files, wmap


def _files(p: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The files of a checkpoint (the file itself, a directory's index or files, or an index's
    shards) and the index's ``weight_map`` when there is one."""
    if p.is_dir():
        indexes = sorted(p.glob("*.safetensors.index.json"))
        if indexes:
            return _index_shards(indexes[0])
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise SpecError(f"directory {_where(p)} holds no .safetensors files or index")
        for f in files:
            if not _inside(p, f):
                raise SpecError(f"{_where(f)} links outside its directory {_where(p)}; refused")
        return files, None
    if p.name.endswith(".index.json"):
        return _index_shards(p)
    if not p.exists() and not p.is_symlink():
        raise SpecError(f"no such safetensors file or directory: {_where(p)}")
    return [p], None


def read_checkpoint(path: str | os.PathLike) -> list[Header]:
    """The validated headers of every file of a checkpoint; a tensor name appears in one only.

    ``path`` is one ``.safetensors`` file, a ``*.safetensors.index.json`` (its ``weight_map``
    may only name regular files inside its directory), or a directory holding an index or
    ``*.safetensors`` files.

    An index's ``weight_map`` must agree with its shards: each tensor lies in the shard it names.

    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from safetensors.torch import save_file
    >>> d = Path(tempfile.mkdtemp())
    >>> save_file({"a": torch.zeros(2)}, str(d / "x-1.safetensors"))
    >>> save_file({"a": torch.zeros(2)}, str(d / "x-2.safetensors"))
    >>> read_checkpoint(d)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    offload_lab.model.spec.SpecError: tensor 'a' is in both ... and ...
    """
    files, wmap = _files(Path(path))
    headers = [read_header(f) for f in files]
    owner: dict[str, Path] = {}
    for h in headers:
        for name in h.tensors:
            if name in owner:
                raise SpecError(f"tensor {name!r} is in both {_where(owner[name])} and "
                                f"{_where(h.path)}; a checkpoint holds each tensor once")
            owner[name] = h.path
    for name, shard in (wmap or {}).items():
        if owner.get(name) != files[0].parent / shard:
            raise SpecError(f"the index in {_where(files[0].parent)} places tensor {name!r} in "
                            f"{shard!r}, which does not hold it")
    return headers


def spec_from_headers(headers: list[Header], name: str, groups: list[str] | None = None) -> ModelSpec:
    """The spec of validated headers; every tensor is a checkpoint view (``mapped``).

    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from safetensors.torch import save_file
    >>> p = Path(tempfile.mkdtemp()) / "m.safetensors"
    >>> save_file({f"blocks.{i}.w": torch.zeros(4, 4) for i in range(3)}, str(p))
    >>> spec_from_headers(read_checkpoint(p), "m").layers[["layer", "bytes"]].values.tolist()
    [[0, 64], [1, 64], [2, 64]]
    """
    tensors = [TensorSpec(t.name, t.shape, t.dtype, mapped=True)
               for h in headers for t in h.tensors.values()]
    return spec_from_named(tensors, name, groups)
