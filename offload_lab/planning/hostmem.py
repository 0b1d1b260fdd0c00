"""Host memory: what this machine (or a hypothetical one) can spend on weight stores.

The planner never asks the OS directly; it reads a :class:`HostMemory` snapshot, so that a plan
for "a 32 GiB host" is made exactly like a plan for this machine. The reserve rule:

* ``available`` = min(psutil available, cgroup limit − usage) — a container's limit is what the
  OOM killer enforces, not the machine's free memory;
* ``reserve`` = max(5 % of available, 2 GiB) — headroom the plan never spends;
* ``spendable`` = max(0, available − reserve − pinned_bytes), where ``pinned_bytes`` are pins
  already granted (to other components, or earlier) that ``available`` does not yet reflect;
* under ``torchrun`` (or an initialised process group) the ranks of one node share its host:
  ``shared_by`` ranks split the node's headroom (evenly, or by explicit weights) and each rank
  plans against its own share, so that the pins of all of a node's ranks fit the node.

>>> host = HostMemory(available="64GiB")
>>> format_bytes(host.reserve), format_bytes(host.spendable)
('3.20 GiB', '60.80 GiB')

Also here: :func:`process_memory` (this process's anonymous / file / shmem / locked resident
bytes), :func:`is_file_backed` and :func:`file_backed_checker` (is a CPU tensor a view of a file
mapping?), :func:`rounded_size` (count what is really page-locked) and :func:`resolve_host`
(the one reading of a ``host=`` argument that every surface accepts).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offload_lab.checks import check_int, is_number
from offload_lab.errors import OffloadLabError
from offload_lab.filemaps import file_backed_checker, is_file_backed  # re-exported: a host fact
from offload_lab.units import format_bytes, parse_size

__all__ = [
    "RESERVE_FRACTION", "RESERVE_FLOOR", "ROUNDINGS", "HostMemory", "HostMemoryError",
    "resolve_host", "process_memory", "cgroup_memory", "is_file_backed", "file_backed_checker",
    "rounded_size", "local_ranks",
]

RESERVE_FRACTION = 0.05
RESERVE_FLOOR = 2 * 2**30
ROUNDINGS = ("exact", "pow2")

# /proc/self/status field -> our key (values are in kB)
_STATUS_FIELDS = {
    "RssAnon": "anon_bytes",
    "RssFile": "file_bytes",
    "RssShmem": "shmem_bytes",
    "VmLck": "locked_bytes",
}
# cgroup v1 reports "no limit" as a huge number near 2**63 rounded down to a page
_V1_UNLIMITED = 2**60


class HostMemoryError(OffloadLabError, ValueError):
    """A host-memory description, ledger entry or rounding mode that cannot be used."""


def _size(value: Any, what: str) -> int:
    return parse_size(value, what)


@dataclass
class HostMemory:
    """A snapshot of host memory: measured (:meth:`probe`) or hypothetical.

    Sizes accept ints or strings such as ``"32GiB"``.

    >>> HostMemory(available="32GiB").spendable == 30 * 2**30
    True
    >>> HostMemory(available="43.39GiB").reserve > 2 * 2**30   # 5 % beats the 2 GiB floor
    True
    """

    available: int
    """Bytes this process can still get: min(what the OS reports available, cgroup limit −
    usage) when probed, or a hypothetical size."""
    total: int | None = None
    """The host's total memory, when known."""
    cgroup_limit: int | None = None
    """The memory limit of this process's cgroup, when there is one."""
    anon_bytes: int = 0
    """This process's resident anonymous memory (``RssAnon``) when probed."""
    file_bytes: int = 0
    """This process's resident file-backed memory (``RssFile``: mapped checkpoint pages, ...)."""
    shmem_bytes: int = 0
    """This process's resident shared memory (``RssShmem``)."""
    locked_bytes: int = 0
    """Memory this process has locked (``VmLck``) when probed."""
    pinned_bytes: int = 0
    """Pins already granted but not yet allocated (so ``available`` does not reflect them): subtracted from what can be spent."""
    source: str = "hypothetical"
    """Where the numbers come from: ``"probe"`` (measured) or ``"hypothetical"``."""
    shared_by: Any = None
    """The ranks sharing this node's headroom: a count (even split) or one weight per rank (None: detected from the launcher)."""
    local_rank: int | None = None
    """This rank's index among ``shared_by`` (None: detected from the launcher)."""

    def __post_init__(self) -> None:
        self.available = _size(self.available, "available")
        self.shared_by, self.local_rank = _resolve_share(self.shared_by, self.local_rank)
        for name in ("total", "cgroup_limit"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, _size(value, name))
        for name in ("anon_bytes", "file_bytes", "shmem_bytes", "locked_bytes", "pinned_bytes"):
            setattr(self, name, _size(getattr(self, name), name))
        if self.total is not None and self.total < self.available:
            raise HostMemoryError(
                f"total {format_bytes(self.total)} is less than available "
                f"{format_bytes(self.available)}; total must be ≥ available (or None)"
            )
        if not isinstance(self.source, str) or not self.source:
            raise HostMemoryError(
                f"source {self.source!r} must be a non-empty string such as 'probe' or 'hypothetical'"
            )

    # -- the reserve rule ----------------------------------------------------------------
    @property
    def reserve(self) -> int:
        """max(5 % of available, 2 GiB): never spent, so the OOM killer is never invited."""
        return max(int(self.available * RESERVE_FRACTION), RESERVE_FLOOR)

    @property
    def node_headroom(self) -> int:
        """available − reserve − pinned_bytes of the whole node, before it is shared by ranks."""
        return self.available - self.reserve - self.pinned_bytes

    @property
    def ranks(self) -> int:
        """How many ranks share this host (1: a single process)."""
        return len(self.shared_by)

    @property
    def share(self) -> float:
        """This rank's fraction of the node's headroom (1.0 for a single process).

        >>> HostMemory(available="64GiB", shared_by=[3, 1], local_rank=1).share
        0.25
        """
        return self.shared_by[self.local_rank] / sum(self.shared_by)

    @property
    def headroom(self) -> int:
        """This rank's share of available − reserve − pinned_bytes, unclamped: negative when the
        host is already inside its reserve (then no plan fits, and the planner says so).

        >>> node = HostMemory(available="64GiB")
        >>> HostMemory(available="64GiB", shared_by=4, local_rank=3).headroom == node.headroom // 4
        True
        """
        node = self.node_headroom
        if node <= 0 or self.ranks == 1:
            return node
        # integer arithmetic: the ranks' shares never sum to more than the node's headroom
        w = [int(round(x * 1_000_000)) for x in self.shared_by]
        return node * w[self.local_rank] // sum(w)

    @property
    def node_spendable(self) -> int:
        """max(0, node headroom): what all the ranks sharing this host can spend together."""
        return max(0, self.node_headroom)

    @property
    def spendable(self) -> int:
        """max(0, available − reserve − pinned_bytes): the most a pin budget can be."""
        return max(0, self.headroom)

    # -- measuring -----------------------------------------------------------------------
    @classmethod
    def probe(cls, pinned_bytes: int | str = 0, shared_by: Any = None,
              local_rank: int | None = None) -> HostMemory:
        """Measure this machine now (``source="probe"``).

        ``pinned_bytes``: pins already granted that are not yet allocated (so ``available``
        does not reflect them). ``shared_by`` / ``local_rank``: the ranks sharing this node
        (default: detected from ``torchrun`` or the process group). Ranks should probe before
        any of them pins, so that each sees the same node.

        >>> host = HostMemory.probe()
        >>> host.source, host.available > 0
        ('probe', True)
        """
        import psutil

        vm = psutil.virtual_memory()
        available = int(vm.available)
        limit, cg_available = cgroup_memory()
        if cg_available is not None:
            available = min(available, cg_available)
        proc = process_memory()
        return cls(
            available=available, total=max(int(vm.total), available), cgroup_limit=limit,
            pinned_bytes=pinned_bytes, source="probe", shared_by=shared_by, local_rank=local_rank, **proc,
        )

    # -- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-able; ``reserve`` and ``spendable`` are included for readers, ignored on load.

        >>> HostMemory.from_dict(HostMemory(available="8GiB").to_dict()).available
        8589934592
        """
        out = {
            "available": self.available, "total": self.total, "cgroup_limit": self.cgroup_limit,
            "anon_bytes": self.anon_bytes, "file_bytes": self.file_bytes,
            "shmem_bytes": self.shmem_bytes, "locked_bytes": self.locked_bytes,
            "pinned_bytes": self.pinned_bytes, "source": self.source,
            "reserve": self.reserve, "spendable": self.spendable,
        }
        if self.ranks > 1:  # a single process's snapshot reads as it always has
            out.update(shared_by=list(self.shared_by), local_rank=self.local_rank,
                       node_spendable=self.node_spendable)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostMemory:
        if not isinstance(d, dict) or "available" not in d:
            raise HostMemoryError(
                f"host-memory dict {d!r} has no 'available'; expected the output of HostMemory.to_dict()"
            )
        keys = ("available", "total", "cgroup_limit", "anon_bytes", "file_bytes", "shmem_bytes",
                "locked_bytes", "pinned_bytes", "source", "shared_by", "local_rank")
        values = {k: d[k] for k in keys if d.get(k) is not None}
        # a host saved before ranks were recorded was one process on its own host; never
        # re-detect ranks from this process's environment when reading a saved snapshot
        values.setdefault("shared_by", 1)
        values.setdefault("local_rank", 0)
        return cls(**values)

    def __repr__(self) -> str:
        extra = f", pinned={format_bytes(self.pinned_bytes)}" if self.pinned_bytes else ""
        if self.ranks > 1:
            extra += f", rank {self.local_rank} of {self.ranks} sharing the node"
        return (
            f"HostMemory(available={format_bytes(self.available)}, "
            f"reserve={format_bytes(self.reserve)}, spendable={format_bytes(self.spendable)}"
            f"{extra}, source={self.source!r})"
        )


HOST_ACCEPTED = ("None (probe this machine), a HostMemory, its to_dict(), or an available size "
                 "such as '64GiB'")


def resolve_host(host: Any, probe: bool = True) -> HostMemory | None:
    """A ``host=`` argument as a :class:`HostMemory`: ``None`` probes this machine (or stays
    ``None`` with ``probe=False``), a dict is read by :meth:`HostMemory.from_dict`, and a size
    (``"64GiB"``) is a hypothetical host with that much available.

    >>> resolve_host("64GiB").available == 64 * 2**30, resolve_host(None, probe=False)
    (True, None)
    """
    if host is None:
        return HostMemory.probe() if probe else None
    if isinstance(host, HostMemory):
        return host
    if isinstance(host, dict):
        return HostMemory.from_dict(host)
    if isinstance(host, (int, float, str)) and not isinstance(host, bool):
        return HostMemory(available=host)
    raise HostMemoryError(f"host {host!r:.60} is not a HostMemory; expected {HOST_ACCEPTED}")


# -- ranks sharing one node ------------------------------------------------------------------
SHARED_BY_ACCEPTED = ("None (the local world size: 1 outside torchrun), a rank count ≥ 1, or one "
                      "weight > 0 per local rank such as [2, 1, 1]")


def local_ranks() -> tuple[int, int]:
    """``(local rank, local world size)`` of this process: from ``torchrun``'s environment
    (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``), else an initialised default process group (all its
    ranks taken as one node), else ``(0, 1)``.

    >>> import os
    >>> local_ranks() if "LOCAL_WORLD_SIZE" not in os.environ else (0, 1)
    (0, 1)
    """
    env = os.environ
    if env.get("LOCAL_WORLD_SIZE", "").isdigit() and env.get("LOCAL_RANK", "").isdigit():
        return int(env["LOCAL_RANK"]), max(1, int(env["LOCAL_WORLD_SIZE"]))
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # torch is optional for planning
        pass
    return 0, 1


def _resolve_share(shared_by: Any, local_rank: Any) -> tuple[list[float], int]:
    """``(one weight per local rank, this rank)`` from the two ``HostMemory`` fields."""
    detected_rank, detected_size = local_ranks() if shared_by is None or local_rank is None else (0, 1)
    if shared_by is None:
        shared_by = detected_size
    if isinstance(shared_by, bool) or not isinstance(shared_by, (int, list, tuple)):
        raise HostMemoryError(f"shared_by {shared_by!r:.60} is not a rank count; expected {SHARED_BY_ACCEPTED}")
    if isinstance(shared_by, int):
        if shared_by < 1:
            raise HostMemoryError(f"shared_by {shared_by} is not a rank count; expected {SHARED_BY_ACCEPTED}")
        weights = [1.0] * shared_by
    else:
        if not shared_by or any(not is_number(w) or not w > 0 for w in shared_by):
            raise HostMemoryError(f"shared_by {list(shared_by)!r:.80} is not one weight > 0 per local rank; "
                                  f"expected {SHARED_BY_ACCEPTED}")
        weights = [float(w) for w in shared_by]
    if local_rank is None:
        local_rank = detected_rank if detected_size == len(weights) else 0
    local_rank = check_int("local_rank", local_rank, minimum=0, maximum=len(weights) - 1, error=HostMemoryError,
                           note=f"one of the {len(weights)} rank(s) sharing the host")
    return weights, local_rank


# -- /proc and cgroup readers ------------------------------------------------------------------
def process_memory(status_path: str | os.PathLike = "/proc/self/status") -> dict[str, int]:
    """This process's resident memory by kind, in bytes (zeros where the file does not exist).

    >>> sorted(process_memory())
    ['anon_bytes', 'file_bytes', 'locked_bytes', 'shmem_bytes']
    """
    out = dict.fromkeys(_STATUS_FIELDS.values(), 0)
    try:
        text = Path(status_path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in _STATUS_FIELDS:
            parts = rest.split()
            if parts and parts[0].isdigit():
                unit = parts[1].lower() if len(parts) > 1 else "kb"
                out[_STATUS_FIELDS[key]] = int(parts[0]) * (1024 if unit == "kb" else 1)
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _inactive_file(stat_path: Path, key: str) -> int:
    try:
        for line in stat_path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def cgroup_memory(
    root: str | os.PathLike = "/sys/fs/cgroup", proc_cgroup: str | os.PathLike = "/proc/self/cgroup"
) -> tuple[int | None, int | None]:
    """``(limit, limit − usage)`` of the tightest memory cgroup this process is in, or
    ``(None, None)`` where there is no limit (or no cgroup filesystem).

    Both cgroup v2 (``memory.max`` / ``memory.current``) and v1 (``memory.limit_in_bytes`` /
    ``memory.usage_in_bytes``) are read, at this process's cgroup and each ancestor. Inactive
    file cache (``memory.stat``) is not counted as used: the kernel drops it before it OOM-kills,
    just as psutil's ``available`` counts it free.

    >>> cgroup_memory(root="/nonexistent")
    (None, None)
    """
    root = Path(root)
    rel_v2, rel_v1 = "/", "/"
    try:
        for line in Path(proc_cgroup).read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            if parts[0] == "0" and parts[1] == "":
                rel_v2 = parts[2] or "/"
            elif "memory" in parts[1].split(","):
                rel_v1 = parts[2] or "/"
    except OSError:
        pass
    candidates = []  # (directory, limit file, usage file, memory.stat key)
    for base, rel, files in (
        (root, rel_v2, ("memory.max", "memory.current", "inactive_file")),
        (root / "memory", rel_v1, ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                   "total_inactive_file")),
    ):
        # a limit set on any ancestor binds too: check this cgroup and every parent
        parts = [p for p in rel.split("/") if p and p != ".."]
        for i in range(len(parts) + 1):
            candidates.append((base.joinpath(*parts[:i]), *files))
    best: tuple[int | None, int | None] = (None, None)
    for d, limit_name, usage_name, stat_key in candidates:
        limit = _read_int(d / limit_name)  # "max" (v2 unlimited) reads as None
        if limit is None or limit >= _V1_UNLIMITED:
            continue
        usage = _read_int(d / usage_name)
        if usage is None:
            continue
        usage = max(0, usage - _inactive_file(d / "memory.stat", stat_key))
        free = max(0, limit - usage)
        if best[1] is None or free < best[1]:
            best = (limit, free)
    return best


# -- what is really page-locked -----------------------------------------------------------------
def rounded_size(nbytes: int, rounding: str = "exact") -> int:
    """Bytes a host allocator really locks for a request of ``nbytes``.

    ``"exact"``: what offload-lab allocates. ``"pow2"``: a caching host allocator that rounds each
    block up to a power of two (torch's pinned-memory cache does) — how a 1.20 GiB store costs 2 GiB.

    >>> rounded_size(1_291_143_680, "pow2") == 2 * 2**30
    True
    """
    if rounding not in ROUNDINGS:
        raise HostMemoryError(f"rounding {rounding!r} is not one of {list(ROUNDINGS)}")
    nbytes = int(nbytes)
    if nbytes < 0:
        raise HostMemoryError(f"nbytes {nbytes} is negative; expected a byte count ≥ 0")
    if rounding == "exact" or nbytes == 0:
        return nbytes
    return 1 << (nbytes - 1).bit_length()
