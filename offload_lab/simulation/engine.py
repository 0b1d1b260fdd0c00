"""Predict a plan's timeline without running it: :class:`DeviceProfile`, :func:`simulate`, :func:`calibrate`.

The simulator is a discrete-event model of three actors, driven in the order the host thread
acts (every resource is FIFO, so one pass in host order is an exact event simulation):

* the **host thread** runs each layer's pre-hook (``hook_s``), issues copies (``issue_s`` each;
  ``pageable``/``mapped`` copies block it until they finish), launches the block's forward
  (``launch_s``);
* the **copy engine** runs one copy at a time (one host link, shared by the groups' copy
  streams): a copy starts when it is issued, the link is free and everything already launched
  on the compute stream has finished (the copy stream waits on the compute stream at issue);
  it lasts ``copy_latency_s + bytes / tier bandwidth``;
* the **compute stream** runs each layer for its compute time, after the previous layer and
  after the layer's copy (a ``wait`` row covers that gap).

It follows the runtime's semantics (``docs/internals.md``, "Runtime semantics"): per group,
prefetch depth ``p`` (0 included, capped at ``len(S) - 1``) over the group's streamed layers
``S`` in execution order, wrapping to the next forward; resident layers issue nothing and are
never copied in a step; groups run in declared order, each with its own prefetch; the first
``p`` copies of each group are issued when the manager is armed; the cuda backend synchronises
the device when a step begins and ends (so a wrap-around copy finishes between steps).

``compute_mode="sync"`` models the cpu backend instead: the host thread runs each block itself
and its pageable/mapped copies, while one copy-engine thread per group runs pinned copies; work
that overlaps shares the processor by the profile's ``contention`` (1.0: one processor, so
overlap saves nothing) and ``copy_priority`` (who gets it).

A simulated :class:`~offload_lab.record.run.Run` has the same frames as a measured one,
``backend == "sim"``, ``meta["simulated"] is True`` and a label ending in ``(simulated)``.

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
>>> run = simulate(spec, plan, DeviceProfile.load("h200"), steps=2)
>>> run.simulated, run.backend
(True, 'sim')
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from offload_lab.planning.planner import store_bytes
from offload_lab.record.run import Run
from offload_lab.shipped import data_dir, searched

__all__ = ["SimError", "ProfileError", "DeviceProfile", "simulate", "calibrate", "plan_of_run",
           "names", "BANDWIDTH_TIERS"]

#: bandwidth keys of a profile, in GB/s (1e9 bytes per second)
BANDWIDTH_TIERS = ("pinned", "pageable", "mapped_warm", "mapped_cold")
COMPUTE_MODES = ("async", "sync")
PROFILE_FORMAT = "offload-lab/device-profile"
#: (contention, copy_priority) assumed for a cpu run that cannot show its own: the two take
#: turns and the copy goes first. Fitted on this project's fixture runs (tests/data/runs, a
#: 2-core machine): a block's compute lasts as much longer as the copy beside it ran, while the
#: copy keeps its speed (a memcpy thread takes the memory bandwidth a small-batch block needs).
CPU_PRIOR = (1.0, 1.0)



class SimError(ValueError):
    """Input the simulator cannot use: a plan that does not fit the spec, a bad step count, ..."""


class ProfileError(SimError):
    """A device profile that is incomplete or impossible (missing tier, bandwidth <= 0, ...)."""


# -- device profiles ------------------------------------------------------------------------------
def _check_nonneg(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ProfileError(f"{name} = {value!r} is not a time; accepted: a finite number of seconds >= 0")
    return float(value)


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
    FLOPs from :func:`offload_lab.flops.layer_flops` over ``tflops`` (achieved TFLOP/s). Per-layer
    seconds measured at ``tokens`` are scaled by the FLOPs ratio when a run asks for other tokens.
    ``compute_mode`` is ``"async"`` (a GPU: the host launches and runs ahead; steps begin and end
    with a device synchronise, as the cuda backend does) or ``"sync"`` (the cpu backend: the host
    thread runs each block itself). In sync mode, while a copy-engine copy overlaps the host's
    work (a compute or a blocking copy) they share the machine: the copy runs at
    ``1 - contention * (1 - copy_priority)`` of its own speed and the host's work at
    ``1 - contention * copy_priority`` (``contention`` 0: no effect; 1: the two take turns, and
    ``copy_priority`` 0.5 splits evenly, 1 lets the copy run at full speed while the host waits);
    ``dispatch_s`` / ``wake_s`` (sync only) are thread hand-offs: an idle copy thread starting a
    queued copy, the host resuming after a wait. ``provenance`` says where the numbers come from:
    ``{"kind": "measured", "machine": ..., "date": ...}`` or ``{"kind": "estimated", "sources": [...]}``.

    >>> p = DeviceProfile("toy", {"pinned": 25.0}, compute_s={"blocks": 0.01})
    >>> DeviceProfile.from_dict(p.to_dict()) == p
    True
    >>> p.copy_seconds("pinned", 25_000_000)
    0.001
    """

    name: str
    bandwidths: dict[str, float]
    hook_s: float = 0.0
    launch_s: float = 0.0
    issue_s: float = 0.0
    copy_latency_s: float = 0.0
    step_head_s: float = 0.0
    step_tail_s: float = 0.0
    pageable_blocks_host: bool = True
    mapped_blocks_host: bool = True
    compute_s: dict[str, float] = field(default_factory=dict)
    tflops: float | None = None
    tokens: int | None = None
    compute_mode: str = "async"
    contention: float = 0.0
    copy_priority: float = 0.5
    dispatch_s: float = 0.0
    wake_s: float = 0.0
    provenance: dict[str, Any] = field(default_factory=lambda: {"kind": "estimated", "sources": []})
    notes: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProfileError(f"profile name {self.name!r} is not a non-empty string")
        if not isinstance(self.bandwidths, dict):
            raise ProfileError(f"bandwidths {self.bandwidths!r} is not a dict of tier -> GB/s; "
                               f"tiers: {list(BANDWIDTH_TIERS)}")
        bws = {}
        for tier, gbps in self.bandwidths.items():
            if tier not in BANDWIDTH_TIERS:
                raise ProfileError(f"profile {self.name!r}: unknown bandwidth tier {tier!r}; "
                                   f"accepted: {list(BANDWIDTH_TIERS)}")
            if (isinstance(gbps, bool) or not isinstance(gbps, (int, float))
                    or not math.isfinite(gbps) or gbps <= 0):
                raise ProfileError(f"profile {self.name!r}: bandwidth {tier} = {gbps!r} GB/s; "
                                   f"accepted: a finite number of GB/s > 0")
            bws[tier] = float(gbps)
        self.bandwidths = bws
        for attr in ("hook_s", "launch_s", "issue_s", "copy_latency_s", "step_head_s", "step_tail_s",
                     "dispatch_s", "wake_s"):
            setattr(self, attr, _check_nonneg(f"profile {self.name!r}: {attr}", getattr(self, attr)))
        self.compute_s = {str(k): _check_nonneg(f"profile {self.name!r}: compute_s[{k!r}]", v)
                          for k, v in dict(self.compute_s or {}).items()}
        if self.tflops is not None:
            t = self.tflops
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
                raise ProfileError(f"profile {self.name!r}: tflops = {t!r}; accepted: achieved TFLOP/s > 0 or None")
            self.tflops = float(t)
        if self.tokens is not None and (isinstance(self.tokens, bool) or not isinstance(self.tokens, int)
                                        or self.tokens <= 0):
            raise ProfileError(f"profile {self.name!r}: tokens = {self.tokens!r}; accepted: a positive int or None")
        if self.compute_mode not in COMPUTE_MODES:
            raise ProfileError(f"profile {self.name!r}: compute_mode {self.compute_mode!r}; "
                               f"accepted: {list(COMPUTE_MODES)}")
        for attr, what in (("contention", "0 = copies and compute do not slow each other, 1 = they take turns"),
                           ("copy_priority", "the copy's share of a contended machine")):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ProfileError(f"profile {self.name!r}: {attr} = {v!r}; accepted: a number in [0, 1] ({what})")
            setattr(self, attr, float(v))
        cn = self.contention
        for attr in ("dispatch_s", "wake_s"):
            if getattr(self, attr) and self.compute_mode != "sync":
                raise ProfileError(f"profile {self.name!r}: {attr} = {getattr(self, attr)!r} with compute_mode "
                                   f"{self.compute_mode!r}; thread hand-offs are modelled for 'sync' only (use 0)")
        if cn and self.compute_mode != "sync":
            raise ProfileError(f"profile {self.name!r}: contention = {cn!r} with compute_mode "
                               f"{self.compute_mode!r}; contention is modelled for 'sync' only (use 0)")
        self.pageable_blocks_host = bool(self.pageable_blocks_host)
        self.mapped_blocks_host = bool(self.mapped_blocks_host)
        if not isinstance(self.provenance, dict) or self.provenance.get("kind") not in ("measured", "estimated"):
            raise ProfileError(f"profile {self.name!r}: provenance {self.provenance!r} needs kind "
                               f"'measured' (with machine, date) or 'estimated' (with sources)")

    # -- what the engine asks -------------------------------------------------------------------
    def bandwidth(self, tier: str) -> float:
        """GB/s of ``tier`` (``mapped_cold`` falls back to ``mapped_warm``).

        >>> DeviceProfile("x", {"pinned": 20}).bandwidth("pageable")
        Traceback (most recent call last):
        ...
        offload_lab.simulation.engine.ProfileError: profile 'x' has no 'pageable' bandwidth; it has ['pinned']
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
        if tier == "mapped":
            mb = min(int(mapped_bytes), int(nbytes))
            t = mb / (self.bandwidth("mapped_cold" if cold else "mapped_warm") * 1e9)
            if nbytes > mb:
                t += (nbytes - mb) / (self.bandwidth("pageable") * 1e9)
        else:
            t = nbytes / (self.bandwidth(tier) * 1e9)
        return self.copy_latency_s + t

    def blocks_host(self, tier: str) -> bool:
        return (tier == "pageable" and self.pageable_blocks_host) or (tier == "mapped" and self.mapped_blocks_host)

    def compute_seconds(self, spec: Any, group: str, layer: int, tokens: int | str | None = None) -> float:
        """Seconds of one forward of ``group.layer``.

        >>> DeviceProfile("x", {"pinned": 1}, compute_s={"blocks": 0.02}).compute_seconds(None, "blocks", 3)
        0.02
        """
        for key in (f"{group}.{layer}", group):
            if key in self.compute_s:
                secs = self.compute_s[key]
                if tokens is not None and self.tokens is not None:
                    from offload_lab.model import flops

                    want = flops.resolve_tokens(spec, tokens)
                    if want != self.tokens:
                        base = flops.layer_flops(spec, group, self.tokens, layer=layer)
                        if base > 0:
                            secs *= flops.layer_flops(spec, group, want, layer=layer) / base
                return secs
        if self.tflops is None:
            known = sorted(self.compute_s)[:6]
            raise ProfileError(
                f"profile {self.name!r} has no compute time for layer {group}.{layer}: no "
                f"compute_s key {f'{group}.{layer}'!r} or {group!r} (keys: {known}{'...' if len(self.compute_s) > 6 else ''}) "
                f"and no tflops rate")
        from offload_lab.model import flops

        if tokens is None:
            tokens = self.tokens if self.tokens is not None else _default_tokens(spec)
        return flops.layer_flops(spec, group, tokens, layer=layer) / (self.tflops * 1e12)

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
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, path_or_text: str | os.PathLike) -> DeviceProfile:
        text = str(path_or_text)
        where = "device profile"
        if not text.lstrip().startswith("{"):
            where = f"device profile {text!r}"
            try:
                text = Path(path_or_text).read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise ProfileError(f"cannot read {where}: {e}") from None
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise ProfileError(f"{where} is not valid JSON: {e}") from None

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
        """Names of the shipped profiles (same as :func:`offload_lab.simulation.engine.names`)."""
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


def _default_tokens(spec: Any) -> int | str:
    table = (getattr(spec, "meta", None) or {}).get("tokens")
    if isinstance(table, dict) and table:
        # the smallest resolution: the catalog's everyday operating point (480p)
        return min(table, key=lambda k: table[k])
    if isinstance(table, int):
        return table
    raise SimError(f"spec {getattr(spec, 'name', spec)!r} names no token count; pass tokens=<int> "
                   f"or give the profile per-layer compute_s")


# -- the plan as the engine needs it --------------------------------------------------------------
@dataclass
class _Layer:
    group: str
    index: int
    tier: str
    nbytes: int
    mapped_bytes: int
    streamed: bool
    compute: float
    copy_warm: float
    copy_cold: float
    blocks: bool


def _frame_plan(spec: Any, plan: Any) -> tuple[pd.DataFrame, dict[str, list[int]], dict[str, int]]:
    """Check ``plan`` against ``spec``; return its layers, streamed order and prefetch per group."""
    layers = getattr(plan, "layers", None)
    need = {"group", "layer", "tier", "bytes", "streamed"}
    if not isinstance(layers, pd.DataFrame) or not need <= set(layers.columns):
        raise SimError(f"plan {type(plan).__name__} has no layers frame with columns {sorted(need)}; "
                       f"expected an offload_lab.Plan from offload_lab.plan(spec, ...)")
    spec_groups = [g.name for g in spec.groups]
    plan_groups = list(dict.fromkeys(layers["group"].astype(str)))
    if set(plan_groups) != set(spec_groups):
        raise SimError(f"plan does not match spec {spec.name!r}: plan groups {plan_groups}, "
                       f"spec groups {spec_groups}; make the plan with plan(spec, ...) for this spec")
    plan_spec = getattr(plan, "spec", None)
    if plan_spec is not None and getattr(plan_spec, "name", spec.name) != spec.name:
        raise SimError(f"plan was made for spec {plan_spec.name!r}, not {spec.name!r}")
    by_key = {(str(g), int(i)): int(b) for g, i, b in zip(layers["group"], layers["layer"], layers["bytes"])}
    for g in spec.groups:
        n_plan = int((layers["group"] == g.name).sum())
        if n_plan != g.num_layers:
            raise SimError(f"plan does not match spec {spec.name!r}: group {g.name!r} has "
                           f"{n_plan} layers in the plan and {g.num_layers} in the spec")
        for layer in g.layers:
            got = by_key.get((g.name, layer.index))
            if got is None:
                raise SimError(f"plan does not match spec {spec.name!r}: layer {layer.name} is not in the plan")
            # the planner counts packed-store bytes (tensor slices aligned); either count is fine
            if got not in (layer.bytes, store_bytes(layer)[0]):
                raise SimError(f"plan does not match spec {spec.name!r}: layer {layer.name} has "
                               f"{got} bytes in the plan and {layer.bytes} in the spec")
    bad = sorted(set(layers["tier"].astype(str)) - {"resident", "pinned", "pageable", "mapped"})
    if bad:
        raise SimError(f"plan has tier(s) {bad}; accepted: resident, pinned, pageable, mapped")
    streamed: dict[str, list[int]] = {}
    for g in spec_groups:
        if hasattr(plan, "streamed_layers"):
            streamed[g] = [int(i) for i in plan.streamed_layers(g)]
        else:
            sel = layers[(layers["group"] == g) & layers["streamed"].astype(bool)]
            streamed[g] = sorted(int(i) for i in sel["layer"])
    pf = getattr(plan, "prefetch", 1)
    prefetch = {g: int(pf[g] if isinstance(pf, dict) else pf) for g in spec_groups}
    for g, p in prefetch.items():
        if p < 0:
            raise SimError(f"plan prefetch {p!r} for group {g!r}; accepted: an int >= 0")
    return layers, streamed, prefetch


def _prepare(spec: Any, plan: Any, profile: DeviceProfile, tokens: int | str | None):
    layers, streamed, prefetch = _frame_plan(spec, plan)
    info: dict[tuple[str, int], _Layer] = {}
    # a copy moves the bytes the plan counts: the runtime packs each tensor slice on the
    # planner's alignment and copies (and records) the whole store, so a simulated run's
    # bytes are a measured run's
    spec_mapped = {(layer.group, layer.index): layer.mapped_bytes for layer in spec.iter_layers()}
    has_mapped = "mapped_bytes" in layers.columns
    used_tiers = set()
    for row in layers.itertuples(index=False):
        g, i, tier = str(row.group), int(row.layer), str(row.tier)
        nbytes = int(row.bytes)
        mb = int(row.mapped_bytes) if has_mapped else spec_mapped[(g, i)]
        is_streamed = bool(row.streamed)
        if is_streamed and tier == "resident":
            raise SimError(f"plan marks {g}.{i} streamed but tier 'resident'")
        if not is_streamed and tier != "resident":
            raise SimError(f"plan marks {g}.{i} not streamed but tier {tier!r}")
        if is_streamed:
            used_tiers.add(tier)
        warm = cold = 0.0
        if is_streamed:
            try:
                warm = profile.copy_seconds(tier, nbytes, mb)
                cold = profile.copy_seconds(tier, nbytes, mb, cold=True)
            except ProfileError as e:
                raise ProfileError(f"{e}; the plan streams {g}.{i} from tier {tier!r}") from None
        info[(g, i)] = _Layer(g, i, tier, nbytes, mb, is_streamed,
                              profile.compute_seconds(spec, g, i, tokens), warm, cold, profile.blocks_host(tier))
    return layers, streamed, prefetch, info, used_tiers


# -- the engine ----------------------------------------------------------------------------------
def simulate(spec: Any, plan: Any, profile: DeviceProfile | str, steps: int = 3,
             tokens: int | str | None = None, label: str | None = None, warmup: int = 0,
             passes: int = 1) -> Run:
    """Simulate ``steps`` steps of ``plan`` on ``profile`` and return a simulated :class:`Run`.

    One step is ``passes`` forwards through every group in declared order (a measured step is
    one call of ``fn``; pass ``passes=spec.meta["guidance_passes"]`` for a denoising step with
    classifier-free guidance). ``tokens`` (an int or a resolution such as ``"480p"``) feeds the
    FLOPs compute model; the first ``warmup`` steps are dropped like a measured run's.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> plan = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="64GiB"))
    >>> run = simulate(spec, plan, "rtx4090-pcie4", steps=2)
    >>> run.label
    'rtx4090-pcie4 · 30 pageable · prefetch 1 (simulated)'
    """
    if isinstance(profile, str):
        profile = DeviceProfile.load(profile)
    if not isinstance(profile, DeviceProfile):
        raise SimError(f"profile {profile!r:.80} is not a DeviceProfile; accepted: a DeviceProfile or a "
                       f"shipped name {names()}")
    for what, v, lo in (("steps", steps, 1), ("passes", passes, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise SimError(f"{what} = {v!r}; accepted: an int >= {lo}")
    if warmup >= steps:
        raise SimError(f"warmup = {warmup} drops every one of steps = {steps}; accepted: 0 <= warmup < steps")
    layers, streamed, prefetch, info, _ = _prepare(spec, plan, profile, tokens)
    events, bounds, mem = _run_engine(spec, streamed, prefetch, info, profile, steps, passes)

    tiers = layers["tier"].astype(str).value_counts()
    tier_s = ", ".join(f"{int(tiers[t])} {t}" for t in ("resident", "pinned", "pageable", "mapped") if t in tiers)
    pf = sorted(set(prefetch.values()))
    auto = f"{profile.name} · {tier_s} · prefetch {pf[0] if len(pf) == 1 else pf}"
    label = auto if label is None else str(label)
    if "simulated" not in label.lower():
        label += " (simulated)"
    params = dict(getattr(plan, "params", {}) or {})
    ledger = getattr(plan, "ledger", None)
    if ledger:
        params["ledger"] = dict(ledger)
    resident = layers[layers["tier"] == "resident"]
    meta = {
        "run": f"sim-{uuid.uuid4().hex[:8]}",
        "label": label,
        "backend": "sim",
        "simulated": True,
        "device_name": f"{profile.name} (simulated)",
        "model": spec.name,
        "model_bytes": int(spec.total_bytes),
        "groups": [g.name for g in spec.groups],
        "plan": params,
        "prefetch": prefetch[spec.groups[0].name] if len(pf) == 1 else prefetch,
        "passes": passes,
        "tokens": tokens,
        "steps": steps,
        "init_strategy": "grouped",
        "init": {"resident_layers": int(len(resident)), "resident_bytes": int(resident["bytes"].sum())},
        "profile": profile.to_dict(),
    }
    return Run.build(events, bounds, layers, memory=mem, meta=meta, warmup=warmup)


class _RunPlan:
    """The plan a recorded run was made under, as far as the simulator needs it."""

    def __init__(self, spec: Any, layers: pd.DataFrame, prefetch: int, params: dict[str, Any]):
        self.spec, self.layers, self.prefetch, self.params = spec, layers, prefetch, params
        self.ledger = None

    def streamed_layers(self, group: str) -> list[int]:
        df = self.layers
        return sorted(int(i) for i in df[(df["group"] == group) & df["streamed"]]["layer"])


def plan_of_run(run: Run) -> tuple[Any, Any]:
    """``(spec, plan)`` that :func:`simulate` accepts, rebuilt from a run's ``layers`` and meta.

    The spec has one tensor per layer (two where part of it is a checkpoint view) with the
    layer's bytes: enough for copies, and for compute keyed ``"group.layer"`` (a calibrated
    profile), not for the FLOPs model, which needs the real tensor shapes.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> plan = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="64GiB"))
    >>> run = simulate(spec, plan, "h200", steps=2)
    >>> again = simulate(*plan_of_run(run), calibrate(run), steps=2)
    >>> round(again.step_time / run.step_time, 4)
    1.0
    """
    from offload_lab.model.spec import GroupSpec, LayerSpec, ModelSpec, TensorSpec

    if not isinstance(run, Run):
        raise SimError(f"plan_of_run needs an offload_lab.Run, got {type(run).__name__}")
    df = run.layers.reset_index(drop=True)
    if not len(df):
        raise SimError(f"run {run.label!r} has no layers frame to rebuild its plan from")
    groups = [g for g in (run.meta.get("groups") or []) if g in set(df["group"])] or \
        list(dict.fromkeys(df["group"].astype(str)))
    gspecs = []
    for g in groups:
        rows = df[df["group"] == g].sort_values("layer")
        if rows["layer"].tolist() != list(range(len(rows))):
            raise SimError(f"run {run.label!r}: group {g!r} has layers {rows['layer'].tolist()[:8]}..., "
                           f"expected 0..{len(rows) - 1}")
        layers = []
        for r in rows.itertuples(index=False):
            n, m = int(r.bytes), min(int(r.mapped_bytes), int(r.bytes))
            ts = [TensorSpec(f"{g}.{int(r.layer)}.view", (m,), "uint8", True)] if m else []
            if n > m:
                ts.append(TensorSpec(f"{g}.{int(r.layer)}.store", (n - m,), "uint8"))
            layers.append(LayerSpec(g, int(r.layer), ts))
        gspecs.append(GroupSpec(g, layers))
    rest = int(run.meta.get("model_bytes", 0) or 0) - int(df["bytes"].sum())
    non_layer = [TensorSpec("non_layer", (rest,), "uint8")] if rest > 0 else []
    spec = ModelSpec(str(run.meta.get("model") or "run"), gspecs, non_layer, {})
    frame = df.assign(streamed=df["streamed"].astype(bool))
    prefetch = run.meta.get("prefetch", 1)
    return spec, _RunPlan(spec, frame, prefetch if isinstance(prefetch, (int, dict)) else 1,
                          dict(run.meta.get("plan") or {}))


_ROW_COLUMNS = ["step", "group", "layer", "kind", "stream", "tier", "bytes", "start_s", "end_s"]


def _frame(rows: list[tuple]) -> pd.DataFrame:
    """Event rows (tuples in ``_ROW_COLUMNS`` order, appended in host order) as one frame."""
    cols = list(zip(*rows)) if rows else [[] for _ in _ROW_COLUMNS]
    df = pd.DataFrame(dict(zip(_ROW_COLUMNS, cols)))
    df.insert(0, "run", "")
    return df


class _Walk:
    """What both engines share: the execution order and the runtime's issue rule.

    Copies of a group are numbered ``q = use * len(S) + position in S`` over the run (``use``
    counts forwards); the runtime always issues a prefix of that numbering, so "issue
    everything up to q" is its rule. A group keeps at most ``len(S) - 1`` copies ahead: a
    layer's next use is never issued before its current use is released (the runtime's depth).
    """

    def __init__(self, spec: Any, streamed: dict[str, list[int]], prefetch: dict[str, int],
                 info: dict[tuple[str, int], _Layer], passes: int):
        self.groups = [g.name for g in spec.groups]
        self.seq = {g: [info[(g, i)] for i in streamed[g]] for g in self.groups}
        self.depth = {g: min(prefetch[g], max(len(self.seq[g]) - 1, 0)) for g in self.groups}
        self.issued = {g: -1 for g in self.groups}
        self.passes = passes
        self.seen_mapped: set[tuple[str, int]] = set()
        # one forward: (group, layer info, position in S or -1, len(S), depth), groups in declared order
        self.order = []
        for g in spec.groups:
            pos = {i: k for k, i in enumerate(streamed[g.name])}
            for i in range(g.num_layers):
                self.order.append((g.name, info[(g.name, i)], pos.get(i, -1), len(self.seq[g.name]),
                                   self.depth[g.name]))

    def copy_of(self, g: str, q: int) -> tuple[_Layer, int, float]:
        """The layer, the step that uses it, and the copy's seconds (cold on a mapped first use)."""
        S = self.seq[g]
        lay = S[q % len(S)]
        dur = lay.copy_warm
        if lay.tier == "mapped" and (g, lay.index) not in self.seen_mapped:
            self.seen_mapped.add((g, lay.index))
            dur = lay.copy_cold
        return lay, q // len(S) // self.passes, dur


def _run_engine(spec: Any, streamed: dict[str, list[int]], prefetch: dict[str, int],
                info: dict[tuple[str, int], _Layer], prof: DeviceProfile, steps: int, passes: int):
    walk = _Walk(spec, streamed, prefetch, info, passes)
    rows: list[tuple] = []
    mem: list[tuple[float, int]] = []
    engine = _engine_sync if prof.compute_mode == "sync" else _engine_async
    bounds = engine(walk, prof, steps, rows, mem)
    return _frame(rows), pd.DataFrame(bounds, columns=["step", "start_s", "end_s"]), \
        _memory_frame(spec, info, mem)


def _engine_async(walk: _Walk, prof: DeviceProfile, steps: int, rows: list[tuple],
                  mem: list[tuple[float, int]]) -> list[tuple[int, float, float]]:
    """A GPU: the host launches and runs ahead; one link; copies wait on the compute stream."""
    hook_s, launch_s, issue_s = prof.hook_s, prof.launch_s, prof.issue_s
    head_s, tail_s = prof.step_head_s, prof.step_tail_s
    add, madd = rows.append, mem.append
    t = 0.0            # host thread clock
    stream_free = 0.0  # end of the last thing launched on the compute stream
    link_free = 0.0    # the host link, shared by the groups' copy streams
    copy_end: dict[tuple[str, int], float] = {}
    issued = walk.issued

    def issue_upto(g: str, last: int) -> None:
        nonlocal t, link_free
        while issued[g] < last:
            q = issued[g] = issued[g] + 1
            lay, step, dur = walk.copy_of(g, q)
            t += issue_s
            # the copy stream first waits on the compute stream
            start = max(t, link_free, stream_free)
            end = link_free = start + dur
            copy_end[(g, q)] = end
            add((step, g, lay.index, "copy", "copy", lay.tier, lay.nbytes, start, end))
            madd((start, lay.nbytes))
            if lay.blocks:
                add((step, g, lay.index, "host_block", "host", lay.tier, lay.nbytes, t, end))
                t = end

    for g in walk.groups:  # arm
        issue_upto(g, walk.depth[g] - 1)
    bounds = []
    for step in range(steps):
        # the cuda backend synchronises the device before marking a step's start
        t = start_step = max(t, stream_free, link_free)
        t += head_s
        for pss in range(walk.passes):
            use = step * walk.passes + pss
            for g, lay, k, nS, depth in walk.order:
                t += hook_s
                i = lay.index
                begin = ready = max(t, stream_free)
                if k >= 0:
                    # pre-hook: this layer's copy if not issued yet, then the next `depth`
                    # streamed layers, wrapping to the next forward; resident layers issue nothing
                    q = use * nS + k
                    if issued[g] < q + depth:
                        issue_upto(g, q + depth)
                        begin = ready = max(t, stream_free)
                    ce = copy_end.pop((g, q))
                    if ce > ready:
                        add((step, g, i, "wait", "compute", lay.tier, 0, ready, ce))
                        begin = ce
                end = stream_free = begin + lay.compute
                add((step, g, i, "compute", "compute", lay.tier, 0, begin, end))
                t += launch_s
                if k >= 0:
                    madd((end, -lay.nbytes))
        # the end marker is recorded on the compute stream after the host's tail work; then
        # the host synchronises the device
        end_step = max(t + tail_s, stream_free)
        bounds.append((step, start_step, end_step))
        t = max(end_step, link_free)
    return bounds


def _engine_sync(walk: _Walk, prof: DeviceProfile, steps: int, rows: list[tuple],
                 mem: list[tuple[float, int]]) -> list[tuple[int, float, float]]:
    """The cpu backend: the host thread runs each block and its pageable/mapped copies itself;
    one copy-engine thread per group runs pinned copies beside it.

    Work that runs at the same time shares the machine: while an engine copy and the host's
    compute or blocking copy overlap, the copy runs at ``1 - contention * (1 - copy_priority)``
    and the host's work at ``1 - contention * copy_priority`` of their own speeds (several
    engines' copies split theirs evenly). Hook overhead and waiting do not compete.
    Thread hand-offs cost ``dispatch_s`` (an idle engine thread picking up a copy) and
    ``wake_s`` (the host resuming after waiting for a copy).
    """
    c = prof.contention
    # speeds while an engine copy and the host's work overlap
    copy_rate, host_rate_shared = 1.0 - c * (1.0 - prof.copy_priority), 1.0 - c * prof.copy_priority
    add, madd = rows.append, mem.append
    issued = walk.issued
    t = 0.0
    # per group: FIFO of [q, remaining seconds, start, layer, step]; the head runs from its start
    # (an idle engine thread starts a copy dispatch_s after it is queued; a busy one right after
    # the copy before)
    queues: dict[str, list[list]] = {g: [] for g in walk.groups}
    done: set[tuple[str, int]] = set()
    eps = 1e-15

    def run(work: float, compete: bool, until: tuple[str, int] | None = None) -> None:
        """Advance the clock by ``work`` seconds of host work, or until a copy is done."""
        nonlocal t
        while until is not None or work > eps:
            if until is not None and until in done:
                return
            heads = [g for g in walk.groups if queues[g]]
            active = [g for g in heads if queues[g][0][2] <= t + eps]
            later = [queues[g][0][2] for g in heads if queues[g][0][2] > t + eps]
            if not heads and until is not None:
                raise AssertionError(f"waiting on copy {until} that was never issued")
            host = compete and until is None
            rate = (copy_rate if host else 1.0) / (1.0 + c * (len(active) - 1)) if active else 1.0
            dt = min([queues[g][0][1] / rate if rate > 0 else math.inf for g in active]
                     + [x - t for x in later] or [math.inf])
            if until is None:
                host_rate = host_rate_shared if host and active else 1.0
                if host_rate > 0:
                    dt = min(dt, work / host_rate)
                work -= dt * host_rate
            t += dt
            for g in active:
                job = queues[g][0]
                job[1] -= dt * rate
                if job[1] <= eps:
                    queues[g].pop(0)
                    q, _, start, lay, step = job
                    done.add((g, q))
                    add((step, g, lay.index, "copy", "copy", lay.tier, lay.nbytes, start, t))
                    if queues[g]:
                        queues[g][0][2] = t

    def issue_upto(g: str, last: int) -> None:
        while issued[g] < last:
            q = issued[g] = issued[g] + 1
            lay, step, dur = walk.copy_of(g, q)
            run(prof.issue_s, False)
            madd((t, lay.nbytes))
            if lay.blocks:
                start = t
                run(dur, True)
                done.add((g, q))
                add((step, g, lay.index, "copy", "copy", lay.tier, lay.nbytes, start, t))
                add((step, g, lay.index, "host_block", "host", lay.tier, lay.nbytes, start, t))
            else:
                queues[g].append([q, dur, math.inf if queues[g] else t + prof.dispatch_s, lay, step])

    for g in walk.groups:
        issue_upto(g, walk.depth[g] - 1)
    bounds = []
    for step in range(steps):
        start_step = t
        run(prof.step_head_s, False)
        for pss in range(walk.passes):
            use = step * walk.passes + pss
            for g, lay, k, nS, depth in walk.order:
                run(prof.hook_s, False)
                if k >= 0:
                    q = use * nS + k
                    issue_upto(g, q + depth)
                    if (g, q) not in done:
                        w0 = t
                        run(0.0, False, until=(g, q))
                        run(prof.wake_s, False)  # the waiting host thread is woken
                        add((step, g, lay.index, "wait", "compute", lay.tier, 0, w0, t))
                    done.discard((g, q))
                begin = t
                run(lay.compute, True)
                add((step, g, lay.index, "compute", "compute", lay.tier, 0, begin, t))
                if k >= 0:
                    madd((t, -lay.nbytes))
        run(prof.step_tail_s, False)
        bounds.append((step, start_step, t))
    return bounds


def _memory_frame(spec: Any, info: dict[tuple[str, int], _Layer], mem: list[tuple[float, int]]) -> pd.DataFrame:
    """Device bytes over time: non-layer tensors and resident layers, plus streamed layers in flight."""
    base = int(spec.non_layer_bytes) + sum(v.nbytes for v in info.values() if v.tier == "resident")
    pinned = sum(v.nbytes for v in info.values() if v.tier == "pinned")
    mapped = sum(v.mapped_bytes for v in info.values() if v.tier == "mapped")
    anon = sum(v.nbytes for v in info.values() if v.tier == "pageable") + \
        sum(v.nbytes - v.mapped_bytes for v in info.values() if v.tier == "mapped")
    t = np.fromiter((m[0] for m in mem), dtype="float64", count=len(mem))
    d = np.fromiter((m[1] for m in mem), dtype="int64", count=len(mem))
    t = np.concatenate([[0.0], t])
    d = np.concatenate([[base], d])
    order = np.argsort(t, kind="stable")
    n = len(t)
    return pd.DataFrame({
        "t_s": t[order], "device_bytes": np.cumsum(d[order]),
        "pinned_bytes": np.full(n, pinned, dtype="int64"), "anon_bytes": np.full(n, anon, dtype="int64"),
        "mapped_bytes": np.full(n, mapped, dtype="int64"),
    })


# -- calibration ---------------------------------------------------------------------------------
def calibrate(run: Run | list[Run], name: str | None = None, contention: float | None = None,
              copy_priority: float | None = None, tokens: int | None = None,
              match_steps: bool = True) -> DeviceProfile:
    """Fit a :class:`DeviceProfile` to a measured run, or to several runs of one model and machine.

    - **Bandwidth** per tier: the median of ``bytes / seconds`` over its copies; ``mapped_cold``
      from each mapped layer's first copy when a run starts at the manager's first step (warm-up
      usually drops it). A mapped layer's non-view bytes are credited to the pageable rate when
      the runs have one.
    - **Compute**: each layer's median forward time (``compute_s["group.layer"]``).
    - **Host**: ``hook_s`` is the median gap between consecutive computes that is neither a host
      block nor a wait; ``step_head_s`` the step's wall time outside its layers; on cpu runs,
      ``dispatch_s`` (a queued copy's start after the host began waiting for it) and ``wake_s``
      (the host resuming after the copy ended), medians over the waits.
    - **Steps** (``match_steps``, default on): what the parts leave unexplained of the median
      step (non-layer work, interpreter pauses, scheduling noise) is added to ``step_head_s``, so
      the profile reproduces the median step of the runs it was fitted on.
    - **Blocking**: whether pageable / mapped copies left ``host_block`` rows.
    - **Contention** (cpu runs, ``compute_mode="sync"``): a copy-engine thread and the host's
      work share the machine. How much longer the host's work lasts per second of overlap with
      an engine copy (``contention * copy_priority``), and the copy per second of overlap with
      the host's work (``contention * (1 - copy_priority)``), are fitted from the same layer
      seen both alone and overlapped (e.g. a prefetch-0 and a prefetch-1 run passed together).
      A side without that contrast takes :data:`CPU_PRIOR`; ``contention`` given here (with
      ``copy_priority``, else the prior's) overrides both sides. Durations are de-rated to what
      each takes alone.

    ``provenance`` is ``measured`` with the backend, device, creation time and label of the runs.
    ``tokens`` (default: the runs' ``meta["tokens"]``) is the video token count the runs used, so
    that :func:`simulate` can scale the per-layer seconds to other token counts by FLOPs.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> sim = simulate(spec, plan, "h200", steps=3)
    >>> fit = calibrate(sim)
    >>> fit.provenance["kind"], round(simulate(spec, plan, fit, steps=3).step_time / sim.step_time, 6)
    ('measured', 1.0)

    Not fitted: ``launch_s`` and ``issue_s`` (folded into ``hook_s``), ``copy_latency_s`` (folded
    into the bandwidths) and ``step_tail_s`` (folded into ``step_head_s``).
    """
    runs = [run] if isinstance(run, Run) else list(run) if isinstance(run, (list, tuple)) else None
    if not runs or not all(isinstance(r, Run) for r in runs):
        raise SimError(f"calibrate needs an offload_lab.Run or a non-empty list of them, got {run!r:.80}")
    backends = {r.backend for r in runs}
    models = {r.meta.get("model") for r in runs}
    if len(backends) > 1 or len(models) > 1:
        raise SimError(f"calibrate takes runs of one model on one backend; got backends {sorted(backends)} "
                       f"and models {sorted(map(str, models))}")
    backend = runs[0].backend
    sim_prof = runs[0].meta.get("profile") or {}
    sync = backend == "cpu" or (backend == "sim" and sim_prof.get("compute_mode") == "sync")
    if not sync and (contention or copy_priority is not None):
        raise SimError(f"contention = {contention!r}, copy_priority = {copy_priority!r} for a {backend!r} "
                       f"run; both are modelled for cpu runs only (leave them None)")
    if contention is None and copy_priority is not None:
        raise SimError(f"copy_priority = {copy_priority!r} without contention; pass contention= too "
                       f"(a number in [0, 1]), or neither to fit both from the runs")
    parts = [_observe(r, sync) for r in runs]
    cat = {k: np.concatenate([p[k] for p in parts]) for k in ("comp_d", "comp_o", "copy_d", "copy_o",
                                                              "copy_bytes", "copy_mb", "copy_first",
                                                              "copy_engine")}
    cat["comp_key"] = [k for p in parts for k in p["comp_key"]]
    # (run, step) of each compute, as one number
    cat["comp_step"] = np.concatenate([p["comp_step"] + n * 1_000_000 for n, p in enumerate(parts)])
    cat["copy_key"] = [k for p in parts for k in p["copy_key"]]
    cat["copy_tier"] = np.concatenate([p["copy_tier"] for p in parts])

    c, prio, how = 0.0, 0.5, "none"
    comp_d, copy_d = cat["comp_d"], cat["copy_d"]
    if sync:
        eng = cat["copy_engine"]
        if contention is not None:
            c = float(contention)
            prio = float(copy_priority) if copy_priority is not None else CPU_PRIOR[1]
            s_h, s_k, how = c * prio, c * (1.0 - prio), "given"
        else:
            # how much longer the host's work (computes, blocking copies) and the engine's copies
            # last per second of overlap with each other
            s_h = _fit_stretch(np.concatenate([comp_d, copy_d[~eng]]),
                               np.concatenate([cat["comp_o"], cat["copy_o"][~eng]]),
                               [("c",) + k for k in cat["comp_key"]]
                               + [("b",) + k for k, e in zip(cat["copy_key"], eng) if not e])
            s_k = _fit_stretch(copy_d[eng], cat["copy_o"][eng], [k for k, e in zip(cat["copy_key"], eng) if e])
            fitted = [n for n, v in (("host", s_h), ("copy", s_k)) if v is not None]
            how = ("fitted" if len(fitted) == 2 else f"{fitted[0]} side fitted, other prior" if fitted
                   else "prior (no run shows the same layer both alone and overlapped)")
            s_h = s_h if s_h is not None else CPU_PRIOR[0] * CPU_PRIOR[1]
            s_k = s_k if s_k is not None else CPU_PRIOR[0] * (1.0 - CPU_PRIOR[1])
            c = min(1.0, s_h + s_k)
            prio = s_h / (s_h + s_k) if s_h + s_k > 0 else 0.5
        comp_d = comp_d - s_h * cat["comp_o"]
        copy_d = copy_d - np.where(eng, s_k, s_h) * cat["copy_o"]

    bandwidths: dict[str, float] = {}
    tiers = cat["copy_tier"]
    nbytes = cat["copy_bytes"]
    gbps = nbytes / np.maximum(copy_d, 1e-12) / 1e9
    for tier in ("pinned", "pageable"):
        sel = tiers == tier
        if sel.any():
            bandwidths[tier] = float(np.median(gbps[sel]))
    msel = tiers == "mapped"
    if msel.any():
        mb = cat["copy_mb"][msel]
        secs = copy_d[msel]
        if "pageable" in bandwidths:
            secs = secs - (nbytes[msel] - mb) / (bandwidths["pageable"] * 1e9)
        else:
            mb = nbytes[msel]  # no pageable rate known: credit the whole copy to the mapped rate
        rate = mb / np.maximum(secs, 1e-12) / 1e9
        first = cat["copy_first"][msel]
        if first.any() and (~first).any():
            bandwidths["mapped_warm"] = float(np.median(rate[~first]))
            bandwidths["mapped_cold"] = float(np.median(rate[first]))
        else:
            bandwidths["mapped_warm"] = float(np.median(rate))

    names_ = [f"{g}.{i}" for g, i in cat["comp_key"]]
    per_layer = pd.Series(comp_d).groupby(names_).median()
    # medians per layer miss what a disturbed step spreads over all its layers; scale them so a
    # step's compute adds up to the median step's (1.0 on a quiet run)
    per_step = pd.Series(comp_d).groupby(cat["comp_step"]).sum()
    typical = pd.Series(per_layer.reindex(names_).to_numpy()).groupby(cat["comp_step"]).sum()
    k = float(np.median(per_step.to_numpy() / typical.to_numpy())) if float(typical.min()) > 0 else 1.0
    compute_s = {str(name_): max(0.0, float(v) * k) for name_, v in per_layer.items()}
    gaps = [_fit_host_gaps(r.events, r.steps) for r in runs]
    hook_s = float(np.median([g[0] for g in gaps]))
    head_s = float(np.median([g[1] for g in gaps]))
    dispatch = np.concatenate([p["dispatch"] for p in parts])
    wake = np.concatenate([p["wake"] for p in parts])
    block_tiers = set().union(*(p["block_tiers"] for p in parts))
    copy_tiers = set(tiers.tolist())
    if tokens is None:
        t = runs[0].meta.get("tokens")
        tokens = t if isinstance(t, int) and not isinstance(t, bool) and t > 0 else None
    labels = [r.label for r in runs]
    prof = DeviceProfile(
        name=name or f"calibrated-{backend}",
        bandwidths=bandwidths,
        hook_s=hook_s,
        step_head_s=head_s,
        dispatch_s=float(np.median(dispatch)) if sync and len(dispatch) else 0.0,
        wake_s=float(np.median(wake)) if sync and len(wake) else 0.0,
        pageable_blocks_host=("pageable" in block_tiers) if "pageable" in copy_tiers else True,
        mapped_blocks_host=("mapped" in block_tiers) if "mapped" in copy_tiers else True,
        compute_s=compute_s,
        tokens=tokens,
        compute_mode="sync" if sync else "async",
        contention=float(c),
        copy_priority=float(prio),
        provenance={"kind": "measured", "backend": backend,
                    "machine": runs[0].meta.get("device_name") or backend,
                    "date": max(str(r.meta.get("created", "")) for r in runs) or None,
                    "runs": [r.meta.get("run") for r in runs], "labels": labels,
                    "steps": int(sum(len(r.steps) for r in runs)),
                    "contention": how},
        notes=f"calibrated from {', '.join(repr(x) for x in labels)}",
    )
    return _match_steps(prof, runs) if match_steps else prof


def _median_step(spec: Any, plan: Any, prof: DeviceProfile, steps: int, warmup: int, passes: int) -> float:
    """``simulate(...).step_time`` without building the Run's frames (calibration loops on it)."""
    _, streamed, prefetch, info, _ = _prepare(spec, plan, prof, None)
    _, bounds, _ = _run_engine(spec, streamed, prefetch, info, prof, steps, passes)
    kept = bounds.iloc[warmup:]
    return float((kept["end_s"] - kept["start_s"]).median())


def _match_steps(prof: DeviceProfile, runs: list[Run]) -> DeviceProfile:
    """Put what the model leaves unexplained of the runs' median step into ``step_head_s``.

    The other fits explain a step from its parts; time they miss (non-layer work, interpreter
    pauses, a shared machine's scheduling) is still paid once per step. Simulating each run's
    own plan and moving the median residual into the per-step head makes the profile reproduce
    the median steps it was fitted on; other plans then test the fit. A few rounds, since in
    sync mode head time also lets a copy thread progress.
    """
    for _ in range(4):
        resid = []
        for r in runs:
            spec, plan = plan_of_run(r)
            warm = int(r.meta.get("warmup_dropped", 0) or 0)
            got = _median_step(spec, plan, prof, steps=len(r.steps) + warm, warmup=warm,
                               passes=_passes_of(r))
            resid.append(r.step_time - got)
        delta = float(np.median(resid))
        head = max(0.0, prof.step_head_s + delta)
        if abs(head - prof.step_head_s) <= 1e-4 * max(r.step_time for r in runs):
            break
        prof = prof.replace(step_head_s=head)
    return prof


def _passes_of(run: Run) -> int:
    """Forwards per step, as the run shows them (each layer computes twice in a CFG step).

    Step matching must simulate the same number, or the missing forwards would be booked as
    per-step head time and counted again when the profile is simulated with ``passes``.
    """
    comp = run.events[run.events["kind"] == "compute"]
    if not len(comp):
        return 1
    return max(1, int(round(comp.groupby(["step", "group", "layer"]).size().median())))


def _observe(run: Run, sync: bool) -> dict[str, Any]:
    """One run's compute and copy durations, how long each overlapped competing work, and keys."""
    ev = run.events
    if not len(ev) or not len(run.steps):
        raise SimError(f"run {run.label!r} has no events or no measured steps to calibrate from")
    kinds = ev["kind"].astype(str).to_numpy()
    comp = ev[kinds == "compute"]
    if not len(comp):
        raise SimError(f"run {run.label!r} has no compute rows to calibrate from")
    copies = ev[(kinds == "copy") & (ev["dur_s"].to_numpy() > 0)]
    blocks = ev[kinds == "host_block"]
    blocked = set(zip(blocks["step"], blocks["group"], blocks["layer"]))
    on_engine = np.array([k not in blocked for k in zip(copies["step"], copies["group"], copies["layer"])],
                         dtype=bool)
    if sync:
        # a copy-engine copy competes with the host's computes and blocking copies, and they with it
        eng = copies[on_engine]
        o_comp = _overlap(comp, eng)
        o_copy = np.where(on_engine, _overlap(copies, pd.concat([comp, blocks])), _overlap(copies, eng))
    else:
        o_comp, o_copy = np.zeros(len(comp)), np.zeros(len(copies))
    mb_of = {(str(g), int(i)): int(b) for g, i, b in
             zip(run.layers["group"], run.layers["layer"], run.layers["mapped_bytes"])}
    nbytes = copies["bytes"].to_numpy().astype("float64")
    mb = np.array([mb_of.get((str(g), int(i)), 0) for g, i in zip(copies["group"], copies["layer"])],
                  dtype="float64")
    mb = np.where(mb > 0, np.minimum(mb, nbytes), nbytes)
    # a mapped layer's first copy faults its pages in only when the run starts at the first step
    from_start = int(run.meta.get("warmup_dropped", 0) or 0) == 0
    first = (~copies.duplicated(["group", "layer"], keep="first")).to_numpy() & from_start
    dispatch, wake = _handoffs(ev, copies[on_engine]) if sync else (np.zeros(0), np.zeros(0))
    return {
        "dispatch": dispatch, "wake": wake,
        "comp_d": comp["dur_s"].to_numpy(dtype="float64"), "comp_o": o_comp,
        "comp_key": list(zip(comp["group"].astype(str), comp["layer"].astype(int))),
        "comp_step": comp["step"].to_numpy(dtype="int64"),
        "copy_d": copies["dur_s"].to_numpy(dtype="float64"), "copy_o": o_copy,
        "copy_key": list(zip(copies["group"].astype(str), copies["layer"].astype(int))),
        "copy_tier": copies["tier"].astype(str).to_numpy(), "copy_bytes": nbytes, "copy_mb": mb,
        "copy_engine": on_engine,
        "copy_first": first, "block_tiers": set(blocks["tier"].astype(str)),
    }


def _handoffs(ev: pd.DataFrame, eng: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Thread hand-off times around the waits for engine copies (cpu backend), one per step.

    ``dispatch``: from the host starting to wait to its copy starting, when the engine thread
    was idle (its previous copy had ended before the wait began). ``wake``: from the copy's end
    to the end of the wait. Each is averaged within a step (the caller takes the median over
    steps), since a step's time adds its hand-offs up and their tail is long on a busy machine.
    """
    waits = ev[ev["kind"] == "wait"]
    if not len(waits) or not len(eng):
        return np.zeros(0), np.zeros(0)
    keys = ["step", "group", "layer"]
    e = eng[keys + ["start_s", "end_s"]].sort_values("start_s").copy()
    e["prev_end"] = e.groupby("group")["end_s"].shift(1).fillna(-np.inf)
    m = waits[keys + ["start_s", "end_s"]].merge(e, on=keys, suffixes=("_w", "_c"))
    waited = m["end_s_c"] > m["start_s_w"]
    idle = waited & (m["prev_end"] <= m["start_s_w"]) & (m["start_s_c"] >= m["start_s_w"])
    # a step pays the sum of its hand-offs: the median over steps of their per-step mean
    dispatch = (m["start_s_c"] - m["start_s_w"])[idle].groupby(m["step"][idle]).mean().to_numpy()
    wake = (m["end_s_w"] - m["end_s_c"])[waited].clip(lower=0).groupby(m["step"][waited]).mean().to_numpy()
    return dispatch, wake


def _overlap(q: pd.DataFrame, ref: pd.DataFrame) -> np.ndarray:
    """For each interval of ``q``, how long it overlaps the union of ``ref``'s intervals."""
    a = q["start_s"].to_numpy(dtype="float64")
    b = q["end_s"].to_numpy(dtype="float64")
    if not len(ref) or not len(q):
        return np.zeros(len(q))
    order = np.argsort(ref["start_s"].to_numpy())
    rs = ref["start_s"].to_numpy(dtype="float64")[order]
    re_ = ref["end_s"].to_numpy(dtype="float64")[order]
    ms, me = [rs[0]], [re_[0]]
    for s0, e0 in zip(rs[1:], re_[1:]):
        if s0 > me[-1]:
            ms.append(s0)
            me.append(e0)
        elif e0 > me[-1]:
            me[-1] = e0
    ms_a, me_a = np.asarray(ms), np.asarray(me)
    before = np.concatenate([[0.0], np.cumsum(me_a - ms_a)])

    def covered(x: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(ms_a, x, side="right") - 1
        inside = np.where(idx >= 0, np.minimum(x, me_a[np.maximum(idx, 0)]) - ms_a[np.maximum(idx, 0)], 0.0)
        return np.where(idx >= 0, before[np.maximum(idx, 0)] + inside, 0.0)

    return np.maximum(covered(b) - covered(a), 0.0)


def _fit_stretch(d: np.ndarray, o: np.ndarray, keys: list[tuple]) -> float | None:
    """How much longer an interval lasts per second it overlapped competing work; None if unseen.

    Per key (one layer's computes, or its copies) seen at least twice nearly alone (overlap
    under 10 % of its typical length) and twice well overlapped (over half): (median overlapped
    length − median alone length) / median overlap. The answer is the median over such keys,
    needing 8 intervals in all and keys that agree (interquartile range under 0.3); anything
    less is noise, and the caller's prior is better. Medians, not a regression on the overlap:
    a copy that ran entirely inside a compute overlapped for exactly as long as it lasted, so
    its noise would pass for contention.
    """
    df = pd.DataFrame({"d": d, "o": o, "k": [hash(k) for k in keys]})
    if len(df) < 8:
        return None
    df["med"] = df.groupby("k")["d"].transform("median")
    per_key, used = [], 0
    for _, g in df.groupby("k"):
        alone, over = g[g["o"] <= 0.1 * g["med"]], g[g["o"] >= 0.5 * g["med"]]
        if len(alone) >= 2 and len(over) >= 2:
            per_key.append((over["d"].median() - alone["d"].median()) / over["o"].median())
            used += len(alone) + len(over)
    if used < 8:
        return None
    q1, q3 = np.percentile(per_key, [25, 75])
    if q3 - q1 > 0.3:
        return None
    return float(min(max(np.median(per_key), 0.0), 1.0))


def _fit_host_gaps(ev: pd.DataFrame, steps: pd.DataFrame) -> tuple[float, float]:
    """Per-layer host overhead and per-step host time outside the layers, from the events.

    Between two consecutive computes of a step, what is not a host block or a wait is the next
    layer's hook/issue/launch overhead (``hook_s``: the median over steps of a step's mean). A Run keeps each step's wall
    time but not its start, so the time outside the layers is ``wall - (last compute end - first
    compute start)`` less what the first layer's pre-hook spent blocked or waiting (the busy time
    in that window just before the first compute); it is all put in ``step_head_s``.
    """
    busy_ev = ev[ev["kind"].isin(("host_block", "wait"))]
    b_s = busy_ev["start_s"].to_numpy()
    b_e = busy_ev["end_s"].to_numpy()
    busy_all = list(zip(b_s.tolist(), b_e.tolist()))
    comp = ev[ev["kind"] == "compute"]
    gaps: list[float] = []
    outside: list[float] = []
    wall = dict(zip(steps["step"].astype(int), steps["wall_s"].astype(float)))
    for s, c in comp.groupby("step", sort=True):
        if int(s) not in wall:
            continue
        starts = np.sort(c["start_s"].to_numpy())
        ends = np.sort(c["end_s"].to_numpy())
        c0, c1 = float(starts[0]), float(ends[-1])
        w = wall[int(s)] - (c1 - c0)
        pairs = sorted(zip(c["start_s"].tolist(), c["end_s"].tolist()))
        near = [(a, b) for a, b in busy_all if b > c0 - w and a < c1]
        step_gaps = [max(0.0, s1 - e0 - _busy_within(near, e0, s1))
                     for (_, e0), (s1, _) in zip(pairs, pairs[1:])]
        if step_gaps:
            gaps.append(float(np.mean(step_gaps)))
        outside.append(w - _busy_within(near, c0 - w, c0))
    hook = float(np.median(gaps)) if gaps else 0.0
    head = max(0.0, float(np.median(outside)) - hook) if outside else 0.0
    return hook, head


def _busy_within(busy: list[tuple[float, float]], a: float, b: float) -> float:
    """Length of the union of ``busy`` intervals inside ``[a, b]``."""
    if b <= a:
        return 0.0
    clipped = sorted((max(s, a), min(e, b)) for s, e in busy if e > a and s < b)
    total, cs, ce = 0.0, None, None
    for s, e in clipped:
        if ce is None or s > ce:
            if ce is not None:
                total += ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    return total + (ce - cs) if ce is not None else 0.0
