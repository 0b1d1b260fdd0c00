"""Pinned staging buffers: how a ``staged`` layer reaches the device at close to pinned speed.

A group's staged layers stay in pageable or mapped memory. A host worker copies the next one
into a free staging buffer (page-locked on the cuda backend), the copy stream copies it on to
the device, and the buffer goes back to the pool once that copy is done: on the cuda backend
the buffer keeps the copy's event and whoever takes it next waits for that event first.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

import torch

from offload_lab.record.runtime.stores import exact_pinned, unpin

__all__ = ["StagingBuffer", "StagingPool", "staging_size"]


def staging_size(prefetch: int, layer_bytes: list[int]) -> tuple[int, int]:
    """``(buffers, bytes each)`` for a group whose staged layers have ``layer_bytes``.

    K = prefetch + 1 (one buffer being filled while ``prefetch`` copies are in flight), never
    more than there are staged layers; each buffer holds the largest of them.

    >>> staging_size(1, [100, 300, 200])
    (2, 300)
    >>> staging_size(4, [100]), staging_size(1, [])
    ((1, 100), (0, 0))
    """
    if not layer_bytes:
        return 0, 0
    return min(int(prefetch) + 1, len(layer_bytes)), max(layer_bytes)


@dataclass
class StagingBuffer:
    """One staging buffer: its bytes, and (cuda) the event of the last copy that read it."""

    data: torch.Tensor
    event: Any = None


class StagingPool:
    """K staging buffers of one size for one group; ``acquire`` blocks until one is free.

    ``pin`` page-locks each buffer at its exact size (cuda backend). ``close`` unpins them and
    is safe to call twice.

    >>> pool = StagingPool("blocks", 2, 1024, pin=False)
    >>> b = pool.acquire(); pool.release(b); pool.count, pool.allocated_bytes
    (2, 2048)
    >>> pool.close(); pool.allocated_bytes
    0
    """

    def __init__(self, group: str, count: int, nbytes: int, pin: bool):
        self.group, self.count, self.nbytes = group, int(count), int(nbytes)
        self.pinned_bytes = 0
        self._free: queue.Queue = queue.Queue()
        self._raws: list[torch.Tensor] = []
        self._closed = False
        for _ in range(self.count):
            if pin:
                raw, locked = exact_pinned(self.nbytes)
                self._raws.append(raw)
                self.pinned_bytes += locked
                data = raw[:self.nbytes]
            else:
                data = torch.empty(self.nbytes, dtype=torch.uint8)
            self._free.put(StagingBuffer(data))
        self._pinned = pin
        self.allocated_bytes = self.count * self.nbytes

    def acquire(self, cancelled: threading.Event | None = None) -> StagingBuffer | None:
        """A free buffer whose last copy has finished; None once ``cancelled`` is set."""
        while True:
            try:
                buf = self._free.get(timeout=0.05)
            except queue.Empty:
                if cancelled is not None and cancelled.is_set():
                    return None
                continue
            if buf.event is not None:
                buf.event.synchronize()  # the copy engine may still be reading it
                buf.event = None
            return buf

    def release(self, buf: StagingBuffer, event: Any = None) -> None:
        buf.event = event
        self._free.put(buf)

    def close(self) -> None:
        if self._closed:
            return
        if self._pinned and torch.cuda.is_available():
            torch.cuda.synchronize()
        while self._raws:
            unpin(self._raws.pop())
        self._free = queue.Queue()
        self.pinned_bytes = self.allocated_bytes = 0
        self._closed = True
