"""Host stores: where one layer's weights live between uses, and how they come back.

A :class:`LayerStore` owns the host side of one layer in its tier and the bookkeeping to put
each parameter back exactly as it was. Where the tier needs memory of its own (page-locked for
``pinned`` on cuda; anonymous for ``pinned``/``pageable`` over checkpoint pages or device
originals) the layer is packed into one buffer per dtype; otherwise the originals are the
store. In the device buffers and in packed stores each parameter occupies its *strided
extent* (the span of its storage it addresses), so on the device it has its original strides.

A packed store *replaces* the original of a parameter that owns its storage alone (the storage
is exactly the parameter's extent, from offset 0, no other parameter or buffer of the model
overlaps it, and it is not checkpoint pages): that original is released, so the layer's
bytes are not held twice, and restore rebuilds it — a fresh storage of the same size on the
same device (page-locked only if the original was), the values copied back from the store,
the same shape, strides and offset. Every other original is kept and given back as it was
(same storage: views stay views of what they viewed, tensors sharing a storage still share
it); its bytes are alive through the other references anyway. Tied tensors stay tied.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from offload_lab.planning.planner import STORE_ALIGNMENT


def _copy(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool) -> None:
    """``dst.copy_(src)``, but host-to-host as one plain memcpy.

    On the cpu backend copies run on a copy-engine thread beside the compute thread; torch's
    own copy of a large tensor would start an OpenMP team of its own there, competing with the
    compute thread's team for the same cores. numpy's copy is one plain memcpy.
    """
    if (dst.device.type == src.device.type == "cpu" and dst.dtype == src.dtype
            and dst.is_contiguous() and src.is_contiguous() and dst.shape == src.shape):
        np.copyto(dst.reshape(-1).view(torch.uint8).numpy(), src.reshape(-1).view(torch.uint8).numpy())
    else:
        dst.copy_(src, non_blocking=non_blocking)


#: bytes per piece when several threads share one layer's host memcpy
_CHUNK = 16 << 20


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as a flat uint8 view (no copy)."""
    return t.detach().reshape(-1).view(torch.uint8)


def extent(t: torch.Tensor) -> int:
    """Elements of storage ``t`` addresses from its first element: its strided extent.

    >>> extent(torch.zeros(4, 3).t()), extent(torch.zeros(4, 6)[:, ::2]), extent(torch.zeros(0, 3))
    (12, 23, 0)
    """
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))


def flat_extent(t: torch.Tensor) -> torch.Tensor:
    """The strided extent of ``t`` as a flat contiguous view of its storage (no copy)."""
    return t.detach().as_strided((extent(t),), (1,), t.storage_offset())


StorageKey = tuple[str, int]


def storage_key(t: torch.Tensor) -> StorageKey:
    """The device and first byte of the storage under ``t``: the same for every view of it."""
    return str(t.device), t.untyped_storage().data_ptr()


def exclusive_storages(tensors: Iterable[torch.Tensor]) -> set[StorageKey]:
    """Keys of the storages that one of ``tensors`` owns alone: it spans the whole storage from
    offset 0, and no other of ``tensors`` (the same object twice counts once) has a storage
    overlapping it.

    Overlap is by address range rather than storage object, so two storages over the same
    memory (``torch.frombuffer`` twice, say) are both shared.

    >>> bank = torch.zeros(4, 3)
    >>> w, t = torch.zeros(3, 5), torch.zeros(5, 3).t()
    >>> keys = exclusive_storages([bank, bank[1], w, w, t, torch.zeros(8)[:4]])
    >>> sorted(k in keys for k in map(storage_key, (bank, w, t)))
    [False, True, True]
    """
    spans: list[tuple[str, int, int, bool]] = []
    seen: set[int] = set()
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        st = t.untyped_storage()
        lo, n = st.data_ptr(), st.nbytes()
        if n == 0:
            continue
        whole = t.storage_offset() == 0 and extent(t) * t.element_size() == n
        spans.append((str(t.device), lo, lo + n, whole))
    spans.sort()
    out: set[StorageKey] = set()
    reach: dict[str, int] = {}  # per device: the highest end of the spans sorted before this one
    for k, (dev, lo, hi, whole) in enumerate(spans):
        before = reach.get(dev, lo) > lo
        nxt = spans[k + 1] if k + 1 < len(spans) else None
        after = nxt is not None and nxt[0] == dev and nxt[1] < hi
        if whole and not before and not after:
            out.add((dev, lo))
        reach[dev] = max(reach.get(dev, hi), hi)
    return out


def _is_pinned(t: torch.Tensor) -> bool:
    # only cuda pins host memory here; asking before cuda is initialised would initialise it
    return t.device.type == "cpu" and torch.cuda.is_initialized() and t.is_pinned()


@dataclass
class ParamSlot:
    """One parameter of a layer: where its extent sits in the per-dtype buffers, and its original."""

    name: str
    param: nn.Parameter
    dtype: torch.dtype
    shape: torch.Size
    stride: tuple[int, ...]
    offset: int  # elements into the buffer of its dtype where its extent starts
    numel: int
    extent: int  # elements of storage the tensor spans (numel for a dense tensor)
    orig_device: torch.device
    orig_requires_grad: bool
    # the original tensor: restore gives it back (storage, offset, strides); None once released
    # (the packed store replaced it), when restore rebuilds it on orig_device
    orig_data: torch.Tensor | None
    orig_pinned: bool = False  # a released original was page-locked host memory

    def view_in(self, buf: torch.Tensor) -> torch.Tensor:
        """This parameter, with its original shape and strides, over its extent in ``buf``."""
        return buf.as_strided(self.shape, self.stride, buf.storage_offset() + self.offset)

    def region(self, buf: torch.Tensor) -> torch.Tensor:
        return buf[self.offset:self.offset + self.extent]

    def rebuild(self, buf: torch.Tensor) -> torch.Tensor:
        """A released original again: a fresh storage of its extent on its device (page-locked
        if it was), the values of its region in ``buf``, the original shape and strides."""
        fresh = torch.empty(self.extent, dtype=self.dtype, device=self.orig_device,
                            pin_memory=self.orig_pinned)
        _copy(fresh, self.region(buf), False)
        return fresh.as_strided(self.shape, self.stride, 0)


def exact_pinned(nbytes: int) -> tuple[torch.Tensor, int]:
    """A host buffer of ``nbytes`` page-locked at its own size; returns it and the locked bytes.

    torch's caching host allocator (``pin_memory=True``) rounds each block up to a power of
    two: a 1.20 GiB store would lock 2 GiB. Here the buffer is an anonymous mapping of its own
    (so no two registrations ever share a page) registered with ``cudaHostRegister``.
    """
    mm = mmap.mmap(-1, max(nbytes, 1))
    raw = torch.frombuffer(mm, dtype=torch.uint8)  # keeps the mapping alive while views exist
    locked = -(-len(mm) // mmap.PAGESIZE) * mmap.PAGESIZE
    err = torch.cuda.cudart().cudaHostRegister(raw.data_ptr(), len(mm), 0)
    code = int(getattr(err, "value", err))
    if code != 0:
        raise RuntimeError(f"cudaHostRegister of {len(mm)} bytes failed with CUDA error {code}")
    return raw, locked


def unpin(raw: torch.Tensor) -> None:
    """Undo :func:`exact_pinned`."""
    torch.cuda.cudart().cudaHostUnregister(raw.data_ptr())




@dataclass
class LayerStore:
    """The host side of one layer in one tier."""

    group: str
    index: int
    tier: str
    slots: list[ParamSlot]
    buffers: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)  # packed host stores
    pinned_bytes: int = 0  # page-locked bytes (cuda backend only), counted as really locked
    _raw: torch.Tensor | None = None  # the one registered mapping behind the pinned buffers
    _registered: bool = True
    pin_method: str | None = None
    # whether any parameter was rebound (until then each still holds its original tensor)
    _detached: bool = False
    _restored: bool = False

    @property
    def nbytes(self) -> int:
        return sum(n * dt.itemsize for dt, n in self.sizes().items())

    def sizes(self) -> dict[torch.dtype, int]:
        """Elements of each per-dtype buffer, alignment padding included."""
        out: dict[torch.dtype, int] = {}
        for s in self.slots:
            step = max(STORE_ALIGNMENT // s.dtype.itemsize, 1)
            end = -(-(s.offset + s.extent) // step) * step
            out[s.dtype] = max(out.get(s.dtype, 0), end)
        return out

    # -- build ---------------------------------------------------------------------------------
    @classmethod
    def from_module(cls, group: str, index: int, block: nn.Module, tier: str) -> LayerStore:
        slots: list[ParamSlot] = []
        offsets: dict[torch.dtype, int] = {}
        seen: set[int] = set()
        for name, p in block.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            off, n = offsets.get(p.dtype, 0), extent(p)
            slots.append(ParamSlot(name, p, p.dtype, p.shape, tuple(p.stride()), off, p.numel(), n,
                                   p.device, p.requires_grad, p.data))
            # each extent starts on the planner's alignment, so store bytes equal the plan's
            step = max(STORE_ALIGNMENT // p.dtype.itemsize, 1)
            offsets[p.dtype] = -(-(off + n) // step) * step
        return cls(group, index, tier, slots)

    def host_fill(self, pin: bool, file_backed: Callable[[torch.Tensor], bool],
                  exclusive: Collection[StorageKey] = ()) -> None:
        """Create the host side of this layer for its tier.

        A layer is packed into one buffer per dtype only where the tier needs memory of its
        own: page-locked memory (``pin``), or anonymous host memory for a ``pinned``/``pageable``
        layer whose originals are checkpoint pages (``file_backed``) or on a device.
        ``mapped``, ``staged`` and ``resident`` layers and anonymous host originals are their
        own store, so no memory is spent twice. An ``orig_data`` set beforehand (the naive
        init strategy moved the original to the device) is the host original and wins.

        Once packed, the store's reference to each original whose storage is in ``exclusive``
        (see :func:`exclusive_storages`; checkpoint pages never are released) is dropped:
        the original's memory is freed when the parameter is rebound. Every other original
        stays referenced and restore gives it back.
        """
        if pin:
            need = True
        elif self.tier in ("pinned", "pageable"):
            need = any(s.orig_data.device.type != "cpu" or file_backed(s.orig_data) for s in self.slots)
        else:
            need = any(s.orig_data.device.type != "cpu" for s in self.slots) and self.tier != "resident"
        if not need:
            return
        sizes = self.sizes()
        if pin:
            offsets, total = {}, 0
            for dt, n in sizes.items():
                offsets[dt] = total
                total = -(-(total + n * dt.itemsize) // STORE_ALIGNMENT) * STORE_ALIGNMENT
            try:
                self._raw, self.pinned_bytes = exact_pinned(total)
                self.pin_method = "exact (cudaHostRegister)"
            except RuntimeError as e:
                # some sandboxes refuse host registration: fall back to torch's pinned
                # allocator and count the power-of-two block it really locks
                self._raw = torch.empty(total, dtype=torch.uint8, pin_memory=True)
                self.pinned_bytes = 1 << max(total - 1, 0).bit_length()
                self.pin_method = f"caching allocator, power-of-two rounded ({e})"
                self._registered = False
            for dt, n in sizes.items():
                self.buffers[dt] = self._raw[offsets[dt]:offsets[dt] + n * dt.itemsize].view(dt)
        else:
            for dt, n in sizes.items():
                self.buffers[dt] = torch.empty(n, dtype=dt, device="cpu")
        for s in self.slots:
            s.region(self.buffers[s.dtype]).copy_(flat_extent(s.orig_data))
        # released only once every copy is in: restore after an interrupt above finds each
        # parameter still on its original
        for s in self.slots:
            o = s.orig_data
            if storage_key(o) in exclusive and not (o.device.type == "cpu" and file_backed(o)):
                s.orig_device, s.orig_pinned = o.device, _is_pinned(o)
                s.orig_data = None

    @property
    def released_bytes(self) -> int:
        """Bytes of the originals this store replaced (freed once the parameters are rebound)."""
        return sum(s.extent * s.dtype.itemsize for s in self.slots if s.orig_data is None)

    @property
    def released_device_bytes(self) -> int:
        """Of :attr:`released_bytes`, those of originals on a device (not host memory)."""
        return sum(s.extent * s.dtype.itemsize for s in self.slots
                   if s.orig_data is None and s.orig_device.type != "cpu")

    @property
    def kept_bytes(self) -> int:
        """Bytes of the originals kept beside a packed store (shared storages, checkpoint pages)."""
        if not self.buffers:
            return 0
        return sum(s.extent * s.dtype.itemsize for s in self.slots if s.orig_data is not None)

    # -- device side ---------------------------------------------------------------------------
    def alloc_device(self, device: torch.device) -> dict[torch.dtype, torch.Tensor]:
        return {dt: torch.empty(n, dtype=dt, device=device) for dt, n in self.sizes().items()}

    def copy_into(self, dev: dict[torch.dtype, torch.Tensor], non_blocking: bool) -> None:
        """Host store → device buffers: one copy per dtype (per extent where there is no packed store)."""
        if not self.buffers:
            for s in self.slots:
                _copy(s.region(dev[s.dtype]), flat_extent(s.orig_data), non_blocking)
            return
        for dt, buf in self.buffers.items():
            _copy(dev[dt], buf, non_blocking)

    def dtype_offsets(self) -> dict[torch.dtype, int]:
        """Byte offset of each dtype's region in a staging buffer of :attr:`nbytes` bytes."""
        out, pos = {}, 0
        for dt, n in self.sizes().items():
            out[dt] = pos
            pos += n * dt.itemsize  # n is already a multiple of the alignment in elements
        return out

    def stage_pairs(self, staging: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(destination, source)`` byte views that fill ``staging`` (uint8) with this layer."""
        offs = self.dtype_offsets()
        if self.buffers:
            return [(staging[offs[dt]:offs[dt] + buf.numel() * dt.itemsize], _bytes(buf))
                    for dt, buf in self.buffers.items()]
        pairs = []
        for s in self.slots:
            a = offs[s.dtype] + s.offset * s.dtype.itemsize
            pairs.append((staging[a:a + s.extent * s.dtype.itemsize], _bytes(flat_extent(s.orig_data))))
        return pairs

    def stage_into(self, staging: torch.Tensor, pool: Any = None) -> None:
        """Host memcpy of the layer into a staging buffer; ``pool`` (an executor) splits it."""
        pairs = self.stage_pairs(staging)
        if pool is None:
            for dst, src in pairs:
                _copy(dst, src, False)
            return
        chunks = []
        for dst, src in pairs:
            n = dst.numel()
            step = max(_CHUNK, 1)
            chunks += [(dst[a:a + step], src[a:a + step]) for a in range(0, n, step)]
        list(pool.map(lambda p: _copy(p[0], p[1], False), chunks))

    def copy_from_staging(self, dev: dict[torch.dtype, torch.Tensor], staging: torch.Tensor,
                          non_blocking: bool) -> None:
        """Staging buffer → device buffers: one copy per dtype."""
        offs = self.dtype_offsets()
        for dt, d in dev.items():
            src = staging[offs[dt]:offs[dt] + d.numel() * dt.itemsize].view(dt)
            _copy(d, src, non_blocking)

    def bind(self, dev: dict[torch.dtype, torch.Tensor]) -> None:
        """Point every parameter at its extent in ``dev``, with its original strides."""
        self._detached = True
        for s in self.slots:
            s.param.data = s.view_in(dev[s.dtype])

    def unbind(self, placeholders: dict[torch.dtype, torch.Tensor]) -> None:
        self._detached = True
        for s in self.slots:
            s.param.data = placeholders[s.dtype]

    # -- restore -------------------------------------------------------------------------------
    def restore(self) -> None:
        """Give every parameter its original tensor back: same storage, storage offset, strides,
        values, dtype, device and requires_grad; a released original is rebuilt from the
        packed store (same size, strides, offset, device and pinnedness; a new storage).

        Safe to call again after an interrupt cut it short, and on a store whose fill never
        finished (its parameters were never rebound, so they keep their originals).
        """
        if self._restored:
            return
        for s in self.slots:
            if self._detached:
                if s.orig_data is None:
                    # kept on the slot at once, so a retry rebinds it rather than copying again
                    s.orig_data = s.rebuild(self.buffers[s.dtype])
                s.param.data = s.orig_data
            s.param.requires_grad_(s.orig_requires_grad)
        # the page-locked buffers are let go only after every rebuild has read them
        if self._raw is not None:
            if self._registered:
                unpin(self._raw)
            self._raw, self.pinned_bytes = None, 0
        self._restored = True
        self.buffers = {}
