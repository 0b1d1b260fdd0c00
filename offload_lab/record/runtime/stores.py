"""Host stores: where one layer's weights live between uses, and how they come back.

A :class:`LayerStore` owns the host copy of one layer in its tier — one packed buffer per dtype
for ``pinned`` and ``pageable``, the checkpoint's own file pages for ``mapped`` — and the
bookkeeping to put each parameter back exactly as it was.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
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


@dataclass
class ParamSlot:
    """One parameter of a layer: where it sits in the packed stores, and how it looked before."""

    name: str
    param: nn.Parameter
    dtype: torch.dtype
    shape: torch.Size
    offset: int  # elements into the packed buffer of its dtype
    numel: int
    orig_device: torch.device
    orig_requires_grad: bool
    orig_data: torch.Tensor | None = None  # kept only where the original must outlive offload


def _exact_pinned(nbytes: int) -> tuple[torch.Tensor, int]:
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


def _unpin(raw: torch.Tensor) -> None:
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
        """Elements of each per-dtype packed buffer, alignment padding included."""
        out: dict[torch.dtype, int] = {}
        for s in self.slots:
            step = max(STORE_ALIGNMENT // s.dtype.itemsize, 1)
            end = -(-(s.offset + s.numel) // step) * step
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
            off = offsets.get(p.dtype, 0)
            slots.append(ParamSlot(name, p, p.dtype, p.shape, off, p.numel(), p.device, p.requires_grad))
            # each slice starts on the planner's alignment, so store bytes equal the plan's
            step = max(STORE_ALIGNMENT // p.dtype.itemsize, 1)
            offsets[p.dtype] = -(-(off + p.numel()) // step) * step
        return cls(group, index, tier, slots)

    def host_fill(self, pin: bool, keep_original: Callable[[torch.Tensor], bool]) -> None:
        """Create the host copy of this layer for its tier.

        ``mapped`` keeps each parameter's original tensor (a view of the checkpoint's pages) as
        its store, and so does ``resident`` unless the plan granted its host copy a pin (the
        planner grants resident layers' host copies pins after every streamed layer's). Otherwise the layer is packed into one buffer per dtype; an original for which
        ``keep_original`` is false (plain anonymous host memory) is dropped, since the packed
        copy replaces it and so costs no new anonymous memory; file-backed or device originals
        are kept for restore. An ``orig_data`` set beforehand (the naive init strategy's) wins.
        """
        if self.tier == "staged" and all(
                (s.orig_data if s.orig_data is not None else s.param.data).device.type == "cpu"
                for s in self.slots):
            # a staged layer is gathered into a staging buffer straight from its originals
            # (anonymous or checkpoint pages): no packed store, so no new anonymous memory
            for s in self.slots:
                if s.orig_data is None:
                    s.orig_data = s.param.data
            return
        if self.tier == "mapped" or (self.tier == "resident" and not pin):
            # no host copy: a resident layer without a pin grant is copied to the device once,
            # straight from its originals
            for s in self.slots:
                if s.orig_data is None:
                    s.orig_data = s.param.data
            return
        sizes = self.sizes()
        if pin:
            offsets, total = {}, 0
            for dt, n in sizes.items():
                offsets[dt] = total
                total = -(-(total + n * dt.itemsize) // STORE_ALIGNMENT) * STORE_ALIGNMENT
            try:
                self._raw, self.pinned_bytes = _exact_pinned(total)
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
            src = s.param.data
            self.buffers[s.dtype][s.offset:s.offset + s.numel].view(s.shape).copy_(src)
            if s.orig_data is None and keep_original(src):
                s.orig_data = src

    # -- device side ---------------------------------------------------------------------------
    def alloc_device(self, device: torch.device) -> dict[torch.dtype, torch.Tensor]:
        return {dt: torch.empty(n, dtype=dt, device=device) for dt, n in self.sizes().items()}

    def copy_into(self, dev: dict[torch.dtype, torch.Tensor], non_blocking: bool) -> None:
        """Host store → device buffers: one copy per dtype (per tensor where there is no packed store)."""
        if not self.buffers:
            for s in self.slots:
                _copy(dev[s.dtype][s.offset:s.offset + s.numel].view(s.shape), s.orig_data, non_blocking)
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
            pairs.append((staging[a:a + s.numel * s.dtype.itemsize], _bytes(s.orig_data)))
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
        self._detached = True
        for s in self.slots:
            s.param.data = dev[s.dtype][s.offset:s.offset + s.numel].view(s.shape)

    def unbind(self, placeholders: dict[torch.dtype, torch.Tensor]) -> None:
        self._detached = True
        for s in self.slots:
            s.param.data = placeholders[s.dtype]

    # -- restore -------------------------------------------------------------------------------
    def restore(self) -> None:
        """Put every parameter back: same values, dtype, device and requires_grad.

        Safe to call again after an interrupt cut it short, and on a store whose fill never
        finished (its parameters were never rebound, so they keep their originals).
        """
        if self._restored:
            return
        if self._raw is not None:
            if self._registered:
                _unpin(self._raw)
            self._raw, self.pinned_bytes = None, 0
        for s in self.slots:
            if not self._detached:
                pass  # still its original tensor
            elif s.orig_data is not None:
                s.param.data = s.orig_data
            else:
                # the packed store replaced the original: view it back (or copy to its device)
                view = self.buffers[s.dtype][s.offset:s.offset + s.numel].view(s.shape)
                s.param.data = view if s.orig_device.type == "cpu" else view.to(s.orig_device)
            s.param.requires_grad_(s.orig_requires_grad)
        self._restored = True
        self.buffers = {}
