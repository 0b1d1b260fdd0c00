"""Which CPU tensors lie in a file mapping: the zero-copy checkpoint views (``mapped`` tensors).

A host probe that reads ``/proc/self/maps``; specs (:mod:`offload_lab.model`) mark their mapped
tensors with it and the planner and the runtime ask it again. It imports nothing from
offload_lab, so every layer may use it.

>>> file_backed_checker("/nonexistent/maps")(object())
False
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["file_backed_checker", "is_file_backed"]


def _file_backed_ranges(maps_path: str | os.PathLike = "/proc/self/maps") -> list[tuple[int, int]]:
    """Sorted, merged ``[start, end)`` address ranges of file mappings (not memfd, /dev/zero, SysV)."""
    try:
        text = Path(maps_path).read_text()
    except OSError:
        return []
    ranges = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        addr, _perms, _offset, _dev, inode, path = parts
        path = path.strip()
        if inode == "0" or not path.startswith("/"):
            continue
        # memfd and SysV segments are shared anonymous memory, /dev/zero is anonymous too
        if path.startswith(("/memfd:", "/SYSV", "/dev/zero")):
            continue
        lo, _, hi = addr.partition("-")
        try:
            ranges.append((int(lo, 16), int(hi, 16)))
        except ValueError:
            continue
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def file_backed_checker(maps_path: str | os.PathLike = "/proc/self/maps") -> Callable[[Any], bool]:
    """A function telling whether a CPU tensor's bytes lie in a file mapping.

    ``/proc/self/maps`` is read once, now: use this when checking many tensors, and make a new
    checker after mapping new files. Where the file does not exist every answer is ``False``.

    >>> import torch
    >>> file_backed_checker()(torch.zeros(4))
    False
    """
    ranges = _file_backed_ranges(maps_path)
    starts = [lo for lo, _ in ranges]

    def inside(addr: int) -> bool:
        i = bisect.bisect_right(starts, addr) - 1
        return i >= 0 and ranges[i][0] <= addr < ranges[i][1]

    def check(tensor: Any) -> bool:
        try:
            if tensor.device.type != "cpu":
                return False
            nbytes = int(tensor.numel()) * int(tensor.element_size())
            ptr = int(tensor.data_ptr())
        except (AttributeError, RuntimeError):
            return False
        if nbytes == 0 or ptr == 0:
            return False
        # both ends: a view into a file mapping may straddle several merged map lines
        return inside(ptr) and inside(ptr + nbytes - 1)

    return check


def is_file_backed(tensor: Any) -> bool:
    """Whether a CPU tensor's storage lies in a file mapping (a zero-copy checkpoint view).

    ``False`` (never an error) for non-CPU tensors, empty tensors, or where ``/proc/self/maps``
    does not exist.

    >>> import torch
    >>> is_file_backed(torch.ones(3))
    False
    """
    return file_backed_checker()(tensor)
