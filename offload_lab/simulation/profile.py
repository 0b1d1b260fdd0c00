"""Device profiles: what a machine does with a plan (link bandwidth per tier, host costs, compute).

:class:`DeviceProfile` is plain data, saved as JSON; :func:`names` lists the shipped ones
(``data/devices/*.json``), which :meth:`DeviceProfile.load` finds by name.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offload_lab import vocabulary
from offload_lab.checks import check_choice, check_int, check_number, is_number
from offload_lab.model import flops
from offload_lab.reading import json_document
from offload_lab.shipped import data_dir, searched
from offload_lab.simulation.errors import ProfileError, SimError
from offload_lab.simulation.regimes import check_regimes
from offload_lab.writing import atomic_write

__all__ = ["DeviceProfile", "names", "default_tokens", "BANDWIDTH_TIERS", "COMPUTE_MODES", "PROFILE_FORMAT"]

#: bandwidth keys of a profile, in GB/s (1e9 bytes per second)
BANDWIDTH_TIERS = vocabulary.BANDWIDTH_TIERS
COMPUTE_MODES = vocabulary.COMPUTE_MODES
PROVENANCE_KINDS = vocabulary.PROVENANCE_KINDS
PROFILE_FORMAT = "offload-lab/device-profile"


_SECONDS = (check_number, {"minimum": 0, "accepted": "a finite number of seconds ≥ 0"})
_RATE = (check_number, {"above": 0, "optional": True, "accepted": "GB/s > 0 or None"})


def _flag(name: str, value: Any, error: type[Exception]) -> bool:
    # profiles written before these were checked may hold 0/1; any truth value reads as a flag
    return bool(value)


def _share(note: str, hi: float = 1.0) -> tuple[Callable[..., Any], dict[str, Any]]:
    return check_number, {"minimum": 0, "maximum": hi, "note": note}


#: each scalar field of a profile and what it accepts: a checker of :mod:`offload_lab.checks`
#: and its bounds, applied in this order by ``__post_init__`` (which stores the checked value)
_FIELD_RULES: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    **dict.fromkeys(("hook_s", "launch_s", "issue_s", "copy_latency_s", "step_head_s", "step_tail_s",
                     "dispatch_s", "wake_s"), _SECONDS),
    "tflops": (check_number, {"above": 0, "optional": True, "accepted": "achieved TFLOP/s > 0 or None"}),
    "tokens": (check_int, {"minimum": 1, "optional": True, "accepted": "a positive int or None"}),
    "step_error": (check_number, {"minimum": 0, "below": 1, "optional": True,
                                  "note": "a relative error: 0.05 = ±5 %"}),
    "compute_mode": (check_choice, {"choices": COMPUTE_MODES}),
    "contention": _share("0 = copies and compute do not slow each other, 1 = they take turns"),
    "copy_priority": _share("the copy's share of a contended machine"),
    "copy_slowdown": _share("0.1 = a block 10 % longer with a copy beside it throughout"),
    "idle_speedup": _share("0.08 = a block 8 % faster after an idle gap as long as itself", 0.5),
    "idle_tau_s": (check_number, {"above": 0, "accepted": "seconds > 0",
                                  "note": "the idle gap at which a block has gained 63 % of idle_speedup"}),
    "memory_bytes": (check_int, {"minimum": 1, "optional": True,
                                 "accepted": "a positive int of bytes or None (unknown)"}),
    "host_memcpy_gbps": _RATE,
    "host_memcpy_max_gbps": _RATE,
    "pageable_blocks_host": (_flag, {}),
    "mapped_blocks_host": (_flag, {}),
}
#: fields modelled for one compute mode only: a non-zero value under the other is refused
_MODE_ONLY = {
    "copy_slowdown": ("async", "it is modelled for 'async' (a GPU) only; the cpu backend has contention"),
    "idle_speedup": ("async", "it is modelled for 'async' (a GPU) only; the cpu backend has contention"),
    "dispatch_s": ("sync", "thread hand-offs are modelled for 'sync' only (use 0)"),
    "wake_s": ("sync", "thread hand-offs are modelled for 'sync' only (use 0)"),
    "contention": ("sync", "contention is modelled for 'sync' only (use 0)"),
}


@dataclass
class DeviceProfile:
    """What a machine does with a plan: link bandwidth per tier, host costs, compute speed.

    ``bandwidths`` maps tiers to GB/s (1e9 bytes/s): ``pinned``, ``pageable``, ``mapped_warm``
    (checkpoint pages already in the page cache), ``mapped_cold`` (pages faulted from disk; the
    first copy of each mapped layer in a run; falls back to ``mapped_warm``). A tier a plan uses
    must be present. Host costs are seconds per layer: ``hook_s`` (pre/post-hook bookkeeping),
    ``launch_s`` (launching one block's kernels; unused in ``"sync"`` mode), ``issue_s`` (issuing
    one copy); ``copy_latency_s`` is a fixed cost of each copy on the copy engine.
    ``step_head_s`` / ``step_tail_s`` are host time per step before the first and after the last
    layer (non-layer work, the step markers).

    Compute is ``compute_s`` (seconds per forward, keyed ``"group.layer"`` or ``"group"``), else
    ``compute_curve`` (``{kind: [floor_s, tflops]}``, a kind being a group name or ``"*"``):
    ``floor_s + FLOPs / tflops`` per forward, a launch/latency floor plus a rate that the
    block saturates as tokens grow (fitted by :func:`calibrate` from runs at two or more token
    counts, or from a short run of a truncated model), else FLOPs over ``tflops`` alone.
    Per-layer seconds measured at ``tokens`` are scaled to other tokens by the curve's ratio
    when the layer's kind has one, else by the FLOPs ratio. ``step_error`` is the profile's
    held-out relative error of a median step over all its measured runs (e.g. 0.05); a simulated
    run's ± band is the held-out error of its own regime (``regimes``), not this.
    ``compute_mode`` is ``"async"`` (a GPU: the host launches and runs ahead; steps begin and end
    with a device synchronise, as the cuda backend does) or ``"sync"`` (the cpu backend: the host
    thread runs each block itself). In sync mode, while a copy-engine copy overlaps the host's
    work (a compute or a blocking copy) they share the machine: the copy runs at
    ``1 - contention * (1 - copy_priority)`` of its own speed and the host's work at
    ``1 - contention * copy_priority`` (``contention`` 0: no effect; 1: the two take turns, and
    ``copy_priority`` 0.5 splits evenly, 1 lets the copy run at full speed while the host waits);
    ``dispatch_s`` / ``wake_s`` (sync only) are thread hand-offs: an idle copy thread starting a
    queued copy, the host resuming after a wait. ``host_memcpy_gbps`` is one thread's host
    memcpy rate (GB/s) into a staging buffer and ``host_memcpy_max_gbps`` the ceiling of
    several threads (None: no ceiling); a ``staged`` layer needs the first. ``provenance`` says where the numbers come from:
    ``{"kind": "measured", "machine": ..., "date": ...}`` or ``{"kind": "estimated", "sources": [...]}``.
    Two effects on a GPU block's time (``"async"`` mode only; both 0 by default), applied to
    the part above the compute curve's floor (the rate-bound part; the launch floor is what a
    small block costs whatever the clocks): ``copy_slowdown``, how much longer a block runs per
    fraction of it overlapped by a copy (the copy engine's writes share the device memory the
    block reads: 0.1 = 10 % longer when a copy runs beside it throughout), and ``idle_speedup``,
    how much faster a block runs after the compute stream idled before it, scaled by
    ``1 - exp(-idle / idle_tau_s)`` (a GPU that rests between blocks holds higher clocks under
    its power limit: 0.09 = 9 % faster after an idle gap much longer than ``idle_tau_s``).
    :func:`calibrate` fits them from runs that show the same layer with and without them.
    ``memory_bytes`` is the device's memory size (what :func:`offload_lab.recommend` plans
    against when no ``device_memory`` is given; ``None`` when unknown). ``regimes`` is the
    per-regime held-out table of the measured runs of this device (``{}``: none), from which
    every simulated run's ``meta["evidence"]`` is looked up (:mod:`offload_lab.simulation.evidence`).

    >>> p = DeviceProfile("toy", {"pinned": 25.0}, compute_s={"blocks": 0.01})
    >>> DeviceProfile.from_dict(p.to_dict()) == p
    True
    >>> p.copy_seconds("pinned", 25_000_000)
    0.001
    """

    name: str
    """The profile's name (``"h200"``)."""
    bandwidths: dict[str, float]
    """GB/s per tier: ``pinned``, ``pageable``, ``mapped_warm``, ``mapped_cold``."""
    hook_s: float = 0.0
    """Host seconds per layer of pre/post-hook bookkeeping."""
    launch_s: float = 0.0
    """Host seconds to launch one block's kernels (unused in ``"sync"`` mode)."""
    issue_s: float = 0.0
    """Host seconds to issue one copy."""
    copy_latency_s: float = 0.0
    """Fixed seconds of each copy on the copy engine."""
    step_head_s: float = 0.0
    """Host seconds per step before the first layer."""
    step_tail_s: float = 0.0
    """Host seconds per step after the last layer."""
    pageable_blocks_host: bool = True
    """Whether a pageable copy holds the host thread until it is done."""
    mapped_blocks_host: bool = True
    """Whether a copy from a mapped checkpoint holds the host thread until it is done."""
    compute_s: dict[str, float] = field(default_factory=dict)
    """Seconds per forward, keyed ``"group.layer"`` or ``"group"``."""
    tflops: float | None = None
    """Compute rate (TFLOP/s) when neither ``compute_s`` nor ``compute_curve`` has the layer."""
    tokens: int | None = None
    """Tokens at which ``compute_s`` was measured (scaled to other token counts)."""
    compute_curve: dict[str, list[float]] = field(default_factory=dict)
    """``{kind: [floor_s, tflops]}``: a forward takes ``floor_s + FLOPs / tflops``."""
    step_error: float | None = None
    """Held-out relative error of a median step (e.g. 0.05), carried by simulated runs as a ± band."""
    compute_mode: str = "async"
    """``"async"`` (a GPU: the host runs ahead) or ``"sync"`` (the cpu backend: the host runs each block)."""
    contention: float = 0.0
    """Sync mode: how much a copy and the host's work slow each other (0: not at all, 1: they take turns)."""
    copy_priority: float = 0.5
    """Sync mode: the copy's share of a contended machine (0.5: even, 1: the copy runs at full speed)."""
    dispatch_s: float = 0.0
    """Sync mode: seconds for an idle copy thread to start a queued copy."""
    wake_s: float = 0.0
    """Sync mode: seconds for the host to resume after a wait."""
    host_memcpy_gbps: float | None = None
    """One thread's host memcpy rate (GB/s) into a staging buffer; a ``staged`` layer needs it."""
    host_memcpy_max_gbps: float | None = None
    """The memcpy ceiling of several threads, GB/s (None: no ceiling)."""
    provenance: dict[str, Any] = field(default_factory=lambda: {"kind": "estimated", "sources": []})
    """Where the numbers come from: ``{"kind": "measured", ...}`` or ``{"kind": "estimated", "sources": [...]}``."""
    notes: str = ""
    """Free text shown with the profile."""
    memory_bytes: int | None = None
    """The device's memory size (None: unknown); what ``recommend`` plans against by default."""
    copy_slowdown: float = 0.0
    """Async mode: how much longer a block runs per fraction of it overlapped by a copy (0.1 = 10 %)."""
    idle_speedup: float = 0.0
    """Async mode: how much faster a block runs after the compute stream idled (0.09 = 9 %)."""
    idle_tau_s: float = 0.0063
    """Async mode: the idle time scale of ``idle_speedup``, scaled by ``1 - exp(-idle / idle_tau_s)``."""
    regimes: dict[str, Any] = field(default_factory=dict)
    """Held-out error per regime (device, issue order, streamed tiers), from the measured runs."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProfileError(f"profile name {self.name!r} is not a non-empty string")
        where = f"profile {self.name!r}"
        if not isinstance(self.bandwidths, dict):
            raise ProfileError(f"bandwidths {self.bandwidths!r} is not a dict of tier -> GB/s; "
                               f"tiers: {list(BANDWIDTH_TIERS)}")
        for tier in self.bandwidths:
            if tier not in BANDWIDTH_TIERS:
                raise ProfileError(f"{where}: unknown bandwidth tier {tier!r}; accepted: {list(BANDWIDTH_TIERS)}")
        self.bandwidths = {tier: check_number(f"{where}: bandwidth {tier}", gbps, above=0, error=ProfileError,
                                              accepted="a finite number of GB/s > 0")
                           for tier, gbps in self.bandwidths.items()}
        self.compute_s = {str(k): check_number(f"{where}: compute_s[{k!r}]", v, minimum=0, error=ProfileError,
                                               accepted="a finite number of seconds ≥ 0")
                          for k, v in dict(self.compute_s or {}).items()}
        self.compute_curve = {str(k): _check_curve(self.name, k, v) for k, v in dict(self.compute_curve or {}).items()}
        for attr, (check, rule) in _FIELD_RULES.items():
            setattr(self, attr, check(f"{where}: {attr}", getattr(self, attr), error=ProfileError, **rule))
        for attr, (mode, why) in _MODE_ONLY.items():
            if getattr(self, attr) and self.compute_mode != mode:
                raise ProfileError(f"{where}: {attr} = {getattr(self, attr)!r} with compute_mode "
                                   f"{self.compute_mode!r}; {why}")
        self.regimes = check_regimes(self.name, self.regimes)
        self.pageable_blocks_host = bool(self.pageable_blocks_host)
        self.mapped_blocks_host = bool(self.mapped_blocks_host)
        if not isinstance(self.provenance, dict) or self.provenance.get("kind") not in PROVENANCE_KINDS:
            raise ProfileError(f"{where}: provenance {self.provenance!r} needs kind "
                               f"'measured' (with machine, date) or 'estimated' (with sources)")

    # -- what the engine asks -------------------------------------------------------------------
    def bandwidth(self, tier: str) -> float:
        """GB/s of ``tier`` (``mapped_cold`` falls back to ``mapped_warm``).

        >>> DeviceProfile("x", {"pinned": 20}).bandwidth("pageable")
        Traceback (most recent call last):
        ...
        offload_lab.simulation.errors.ProfileError: profile 'x' has no 'pageable' bandwidth; it has ['pinned']
        """
        if tier == "mapped_cold" and tier not in self.bandwidths:
            tier = "mapped_warm"
        try:
            return self.bandwidths[tier]
        except KeyError:
            raise ProfileError(f"profile {self.name!r} has no {tier!r} bandwidth; "
                               f"it has {sorted(self.bandwidths)}") from None

    def copy_seconds(self, tier: str, nbytes: int, mapped_bytes: int = 0, cold: bool = False) -> float:
        """Seconds the copy engine spends on one layer of ``tier``.

        A ``mapped`` layer copies its checkpoint-view bytes at the mapped rate and the rest
        (tensors re-laid out at load time, so anonymous memory) at the ``pageable`` rate.
        """
        if tier == "staged":  # the device copy is from a pinned staging buffer
            tier = "pinned"
        if tier == "mapped":
            mb = min(int(mapped_bytes), int(nbytes))
            t = mb / (self.bandwidth("mapped_cold" if cold else "mapped_warm") * 1e9)
            if nbytes > mb:
                t += (nbytes - mb) / (self.bandwidth("pageable") * 1e9)
        else:
            t = nbytes / (self.bandwidth(tier) * 1e9)
        return self.copy_latency_s + t

    def stage_seconds(self, nbytes: int, threads: int = 1) -> float:
        """Seconds of the host memcpy of ``nbytes`` into a staging buffer with ``threads`` threads.

        >>> DeviceProfile("x", {"pinned": 50}, host_memcpy_gbps=5, host_memcpy_max_gbps=8).stage_seconds(8e9, 4)
        1.0
        """
        if self.host_memcpy_gbps is None:
            raise ProfileError(f"profile {self.name!r} has no host_memcpy_gbps (the host memcpy rate a "
                               f"staged layer needs); accepted: GB/s > 0, e.g. from calibrate() on a staged run")
        rate = self.host_memcpy_gbps * max(int(threads), 1)
        if self.host_memcpy_max_gbps is not None:
            rate = min(rate, self.host_memcpy_max_gbps)
        return nbytes / (rate * 1e9)

    def blocks_host(self, tier: str) -> bool:
        return (tier == "pageable" and self.pageable_blocks_host) or (tier == "mapped" and self.mapped_blocks_host)

    def curve_floor(self, group: str) -> float:
        """The launch/latency floor of ``group``'s compute curve (0 without a curve)."""
        curve = self.compute_curve.get(group) or self.compute_curve.get("*")
        return float(curve[0]) if curve else 0.0

    def curve_seconds(self, group: str, flops_: float) -> float | None:
        """Seconds of a forward of ``flops_`` FLOPs on the compute curve of ``group``'s kind, else None."""
        curve = self.compute_curve.get(group) or self.compute_curve.get("*")
        if curve is None:
            return None
        return curve[0] + flops_ / (curve[1] * 1e12)

    def compute_seconds(self, spec: Any, group: str, layer: int, tokens: int | str | None = None) -> float:
        """Seconds of one forward of ``group.layer``.

        >>> DeviceProfile("x", {"pinned": 1}, compute_s={"blocks": 0.02}).compute_seconds(None, "blocks", 3)
        0.02
        """
        for key in (f"{group}.{layer}", group):
            if key in self.compute_s:
                secs = self.compute_s[key]
                if tokens is not None and self.tokens is not None:
                    want = flops.resolve_tokens(spec, tokens)
                    if want != self.tokens:
                        base = flops.layer_flops(spec, group, self.tokens, layer=layer)
                        new = flops.layer_flops(spec, group, want, layer=layer)
                        cb, cn = self.curve_seconds(group, base), self.curve_seconds(group, new)
                        # the curve's ratio keeps the launch floor, which a FLOPs ratio scales away
                        if cb and cn is not None:
                            secs *= cn / cb
                        elif base > 0:
                            secs *= new / base
                return secs
        if self.tflops is None and not (self.compute_curve.get(group) or self.compute_curve.get("*")):
            known = sorted(self.compute_s)[:6]
            raise ProfileError(
                f"profile {self.name!r} has no compute time for layer {group}.{layer}: no "
                f"compute_s key {f'{group}.{layer}'!r} or {group!r} (keys: {known}{'...' if len(self.compute_s) > 6 else ''}), "
                f"no compute_curve for {group!r} or '*', and no tflops rate")
        if tokens is None:
            tokens = self.tokens if self.tokens is not None else default_tokens(spec)
        fl = flops.layer_flops(spec, group, tokens, layer=layer)
        on_curve = self.curve_seconds(group, fl)
        if on_curve is not None:
            return on_curve
        return fl / (self.tflops * 1e12)

    # -- JSON ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {"format": PROFILE_FORMAT, "version": 1}
        d.update(dataclasses.asdict(self))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceProfile:
        if not isinstance(d, dict) or d.get("format", PROFILE_FORMAT) != PROFILE_FORMAT:
            raise ProfileError(f"not a device profile (expected format {PROFILE_FORMAT!r}): {str(d)[:80]}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known - {"format", "version"})
        if unknown:
            raise ProfileError(f"device profile {d.get('name')!r} has unknown keys {unknown}; accepted: {sorted(known)}")
        if "name" not in d or "bandwidths" not in d:
            raise ProfileError(f"device profile needs 'name' and 'bandwidths'; got keys {sorted(d)}")
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The profile as JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            atomic_write(path, text + "\n", what="profile path", example="profile.json")
        return text

    @classmethod
    def from_json(cls, path_or_text: str | os.PathLike) -> DeviceProfile:
        return cls.from_dict(json_document(path_or_text, "device profile", ProfileError))

    @classmethod
    def load(cls, name: str | os.PathLike) -> DeviceProfile:
        """A shipped profile by name (case-insensitive), or a profile JSON file by path.

        >>> DeviceProfile.load("h200").provenance["kind"] in ("measured", "estimated")
        True
        """
        if isinstance(name, os.PathLike) or (isinstance(name, str) and name.endswith(".json")
                                             and Path(name).exists()):
            return cls.from_json(Path(name))
        if not isinstance(name, str):
            raise ProfileError(f"profile name must be a string or a path, got {name!r}; names: {names()}")
        key = name.strip().lower().removesuffix(".json")
        if key not in names():
            raise ProfileError(f"unknown device profile {name!r}; names: {names()}")
        return cls.from_json(_devices_dir() / f"{key}.json")

    @staticmethod
    def names() -> list[str]:
        """Names of the shipped profiles (same as :func:`offload_lab.simulation.names`)."""
        return names()

    def replace(self, **changes: Any) -> DeviceProfile:
        """A copy with some fields changed (validated again).

        >>> DeviceProfile("x", {"pinned": 20}).replace(bandwidths={"pinned": 40}).bandwidths
        {'pinned': 40.0}
        """
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        bw = ", ".join(f"{k} {v:.3g}" for k, v in self.bandwidths.items())
        comp = (f"{len(self.compute_s)} compute times" if self.compute_s else "") + \
               (f"{' + ' if self.compute_s else ''}{self.tflops:.4g} TFLOP/s" if self.tflops else "")
        return (f"DeviceProfile({self.name!r}, {self.provenance.get('kind')}, GB/s: {bw}; "
                f"{comp or 'no compute model'}; {self.compute_mode})")


def _check_curve(name: str, kind: Any, v: Any) -> list[float]:
    """A compute curve entry ``[floor_s, tflops]``: a floor >= 0 s and a rate > 0 TFLOP/s."""
    ok = (isinstance(v, (list, tuple)) and len(v) == 2
          and all(is_number(x) for x in v)
          and v[0] >= 0 and v[1] > 0)
    if not ok:
        raise ProfileError(f"profile {name!r}: compute_curve[{kind!r}] = {v!r}; accepted: "
                           f"[floor seconds >= 0, TFLOP/s > 0]")
    return [float(v[0]), float(v[1])]


def _devices_dir() -> Path:
    d = data_dir("devices")
    if d is None:
        raise ProfileError(f"no device profiles found; looked for *.json in {searched('devices')}")
    return d


def names() -> list[str]:
    """Names of the shipped device profiles, sorted.

    >>> "h200" in names()
    True
    """
    return sorted(p.stem for p in _devices_dir().glob("*.json"))


def default_tokens(spec: Any) -> int | str:
    table = (getattr(spec, "meta", None) or {}).get("tokens")
    if isinstance(table, dict) and table:
        # the smallest resolution: the catalog's everyday operating point (480p)
        return min(table, key=lambda k: table[k])
    if isinstance(table, int):
        return table
    raise SimError(f"spec {getattr(spec, 'name', spec)!r} names no token count; pass tokens=<int> "
                   f"or give the profile per-layer compute_s")

