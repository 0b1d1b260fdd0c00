"""What fits, and what is fastest without spending what it does not need: search the plan
space with the simulator.

:func:`recommend` plans a spec many ways — resident count and pattern (``leading`` /
``strided``), prefetch depth, pin order, pin budget up to what the host can spend, forced tiers
— predicts each plan's step on a device profile, keeps only plans that fit the host and the
device, and returns a :class:`Recommendation`: the best plan, every plan tried, the Pareto
front and why the best wins.

**The objective.** The fastest step sets the pace; among the plans within ``tolerance`` of it
(default 1 %) the best pins the fewest host bytes (the plan's own ``ledger["pinned_bytes"]``),
then holds the smallest device peak, then keeps the fewest layers resident. On a card where
compute hides every copy that is a plan that pins nothing and streams most layers: pinning
buys nothing there.

**The search** is pruned by two monotonicities of the model: a step never gets slower when a
streamed layer becomes resident (one copy fewer) nor when a pageable layer becomes pinned (a
faster copy that does not block the host). So for each residency pattern and prefetch depth
the largest resident count whose device peak fits is planned at the largest pin budget (pin
orders only when that budget cannot pin every streamed layer) — that finds the pace; the same
points are planned pinning nothing, and with nothing resident. Where a plan that pins nothing
keeps the pace, the fewest residents that still keep it are found by bisection per pattern and
depth; else the smallest pin budget that keeps it, by bisection along the pin order. Smaller
budgets and forced tiers are planned once, around the best, to draw the front.

>>> import offload_lab
>>> rec = recommend(offload_lab.catalog.load("wan2.1-t2v-14b"), device="rtx4090-pcie4",
...                 host="64GiB", device_memory="24GiB")
>>> rec.best.ledger["device_peak_bytes"] <= 24 * 2**30, rec.best.ledger["pinned_bytes"]  # compute-bound
(True, 0)
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import textwrap
import warnings
from dataclasses import dataclass, field
from html import escape
from typing import Any

import pandas as pd

from offload_lab.checks import check_int
from offload_lab.model.spec import ModelSpec
from offload_lab.planning.device import activation_bytes, in_flight_bytes, parse_device_memory
from offload_lab.planning.errors import PlanError, PlanWarning
from offload_lab.planning.grants import store_bytes
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.placement import resident_sets
from offload_lab.planning.planner import Plan, plan, resolve_plan_host
from offload_lab.simulation.engine import _run_engine
from offload_lab.simulation.errors import ProfileError, SimError
from offload_lab.simulation.layers import _Layer
from offload_lab.simulation.profile import DeviceProfile, names
from offload_lab.units import format_bytes
from offload_lab.vocabulary import RESIDENCIES

__all__ = ["Recommendation", "recommend", "RecommendError", "PREFETCHES", "SEARCH_ORDERS", "COLUMNS",
           "TOLERANCE", "step_text"]

#: prefetch depths searched: past 4 layers ahead a deeper queue only holds more device memory
PREFETCHES = (0, 1, 2, 3, 4)
SEARCH_ORDERS = ("execution", "strided", "largest", "reverse")
RESIDENCY_PATTERNS = RESIDENCIES
#: share of the full budget drawn on the front (the full budget is searched anyway)
_BUDGET_SHARES = (0.0, 0.25, 0.5, 0.75)
#: default share of the fastest step within which a plan keeps the pace (then the smallest
#: footprint wins: fewest pinned bytes, smallest device peak, fewest resident layers)
TOLERANCE = 0.01
#: at most this many (pattern, depth, order) points are bisected for the smallest pin budget
_BUDGET_SEARCHES = 6
COLUMNS = ["id", "residency", "resident", "resident_layers", "prefetch", "order", "pin_budget", "tier",
           "step_s", "pinned_bytes", "net_anonymous_bytes", "device_peak_bytes", "fits_host",
           "fits_device", "fits", "front", "best"]


class RecommendError(SimError):
    """Inputs :func:`recommend` cannot search with (no device memory size, a bad value)."""


class _Timer:
    """Predicted seconds per step of a plan on one profile; compute times cached per layer
    (the FLOPs model is the costly part of preparing a plan for the engine)."""

    def __init__(self, spec: ModelSpec, profile: DeviceProfile, tokens: Any, passes: int):
        self.spec, self.profile, self.tokens, self.passes = spec, profile, tokens, passes
        self.compute = {(g.name, layer.index): profile.compute_seconds(spec, g.name, layer.index, tokens)
                        for g in spec.groups for layer in g.layers}
        self.copies: dict[tuple[str, int, int], tuple[float, float]] = {}

    def _copy(self, tier: str, nbytes: int, mapped: int) -> tuple[float, float]:
        key = (tier, nbytes, mapped)
        if key not in self.copies:
            pr = self.profile
            self.copies[key] = (pr.copy_seconds(tier, nbytes, mapped), pr.copy_seconds(tier, nbytes, mapped, cold=True))
        return self.copies[key]

    def step_seconds(self, p: Plan) -> float:
        info: dict[tuple[str, int], _Layer] = {}
        df = p.layers
        for g, i, tier, b, m, s in zip(df["group"], df["layer"], df["tier"], df["bytes"], df["mapped_bytes"],
                                       df["streamed"]):
            g, i, tier, b, m, s = str(g), int(i), str(tier), int(b), int(m), bool(s)
            warm, cold = self._copy(tier, b, m) if s else (0.0, 0.0)
            info[(g, i)] = _Layer(g, i, tier, b, m, s, self.compute[(g, i)], warm, cold,
                                  self.profile.blocks_host(tier), lid=len(info))
        streamed = {g: p.streamed_layers(g) for g in self.spec.group_names}
        prefetch = {g: int(p.prefetch) for g in self.spec.group_names}
        # two steps: the first pays cold mapped pages; the second is the steady state
        _, bounds, _ = _run_engine(self.spec, streamed, prefetch, info, self.profile, 2, self.passes, frames=False)
        last = bounds.iloc[-1]
        return float(last["end_s"] - last["start_s"])


@dataclass(eq=False, repr=False)
class Recommendation:
    """The search's answer: ``best`` (a :class:`~offload_lab.Plan`, or ``None`` when nothing fits),
    ``tried`` (one row per plan, columns :data:`COLUMNS`), ``front`` (the Pareto-optimal rows:
    no other plan is at least as fast with no more pinned host bytes and no larger device peak),
    ``explanation`` (why the best wins and what bounds its step) and the inputs.
    ``step_s`` figures are per step: ``calls_per_step`` forwards (2 with classifier-free
    guidance); :func:`step_text` prints one as "per call × calls = per step".

    A pipeline's recommendation is its top-ranked component's, with every component's own
    recommendation in ``components`` (name -> Recommendation, rank order).

    ``plan_at(id)`` rebuilds any plan tried; ``confirm(model, fn)`` runs the best and a baseline.
    """

    spec: ModelSpec
    """The model searched."""
    profile: DeviceProfile
    """The device profile the plans were simulated on."""
    host: HostMemory
    """The host memory the plans had to fit."""
    device_memory: int
    """Device bytes the plans' estimated peak had to fit."""
    tokens: Any
    """Video tokens (or the resolution) simulated."""
    calls_per_step: int
    """Forwards per step (2 with classifier-free guidance)."""
    best: Plan | None
    """The fastest plan that fits, or None when none does."""
    tried: pd.DataFrame
    """One row per plan tried, columns ``COLUMNS``."""
    explanation: str
    """Why the best wins and what bounds its step."""
    plans: list[Plan] = field(default_factory=list)
    """The plans tried, by row of ``tried``."""
    search_s: float = 0.0
    """Seconds the search took."""
    tolerance: float = TOLERANCE
    """Relative slack on the fastest step within which the fewest pinned bytes win."""
    components: dict[str, Recommendation] = field(default_factory=dict)
    """For a pipeline: each searched component's recommendation, by name."""

    @property
    def front(self) -> pd.DataFrame:
        t = self.tried
        return t.loc[t["front"].astype(bool)].sort_values("step_s").reset_index(drop=True)

    @property
    def fits(self) -> bool:
        return self.best is not None

    def plan_at(self, plan_id: int) -> Plan:
        """The plan of row ``id`` of :attr:`tried`.

        >>> import offload_lab
        >>> rec = recommend(offload_lab.catalog.load("wan2.1-t2v-1.3b"), "h200", host="64GiB")
        >>> rec.plan_at(int(rec.best_row["id"])) is rec.best
        True
        """
        plan_id = check_int("plan id", plan_id, minimum=0, maximum=len(self.plans) - 1, error=RecommendError,
                            note="a row of this recommendation")
        return self.plans[plan_id]

    @property
    def best_row(self) -> pd.Series | None:
        hit = self.tried.loc[self.tried["best"].astype(bool)]
        return None if hit.empty else hit.iloc[0]

    def summary(self) -> str:
        """A few lines for a terminal: the best plan, the front, the explanation.

        >>> import offload_lab
        >>> rec = recommend(offload_lab.catalog.load("wan2.1-t2v-1.3b"), "h200", host="64GiB")
        >>> rec.summary().splitlines()[1]
        'best: 0 resident (leading), prefetch 1, order execution: 0.607 s/step (1 call), pinned 0 B, device peak 1.16 GiB'
        """
        head = (f"{self.spec.name} on {self.profile.name} (simulated): device memory "
                f"{format_bytes(self.device_memory)}, host available {format_bytes(self.host.available)}, "
                f"{len(self.tried)} plans tried, {int(self.tried['fits'].sum())} fit")
        lines = [head]
        if self.best is not None:
            b = self.best_row
            lines.append(f"best: {_describe(b, self.calls_per_step)}")
            lines.append(f"  {self.best.summary()}")
            lines.append("front (step time vs pinned host bytes vs device peak):")
            for _, r in self.front.iterrows():
                lines.append(f"  #{int(r['id'])}: {_describe(r, self.calls_per_step)}")
        lines.append(textwrap.fill(self.explanation, 100))
        if len(self.components) > 1:
            lines.append("components (rank order; each searched against what the ones before it left):")
            for name, c in self.components.items():
                what = "nothing fits" if c.best is None else _describe(c.best_row, c.calls_per_step)
                lines.append(f"  {name}: {what}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        if self.best is None:
            return f"Recommendation({self.spec.name!r} on {self.profile.name!r}: nothing fits)"
        return (f"Recommendation({self.spec.name!r} on {self.profile.name!r}: "
                f"{_describe(self.best_row, self.calls_per_step)})")

    def _repr_html_(self) -> str:
        front = self.front[["id", "residency", "resident_layers", "prefetch", "order", "tier", "step_s",
                            "pinned_bytes", "device_peak_bytes"]].copy()
        for c in ("pinned_bytes", "device_peak_bytes"):
            front[c] = [format_bytes(int(v)) for v in front[c]]
        front["step_s"] = [step_text(float(v), self.calls_per_step) for v in front["step_s"]]
        return (f"<p><b>{escape(repr(self))}</b></p><p>{escape(self.explanation)}</p>"
                + front.to_html(index=False, escape=True))

    def to_engine(self, name: str) -> Any:
        """The best plan as engine ``name``'s nearest settings, its cost simulated on this
        recommendation's device (:func:`offload_lab.engines.to_engine`)."""
        if self.best is None:
            raise RecommendError(f"nothing fits {self.profile.name} here, so there is no plan to export to {name!r}")
        # looked up at run time: the engines package builds on recommend, not the reverse
        engines = importlib.import_module("offload_lab.engines")
        return engines.to_engine(self.best, name, device=self.profile, tokens=self.tokens, calls=self.calls_per_step)

    def confirm(self, model: Any, fn: Any, steps: int = 3, warmup: int = 1, baseline: Plan | None = None,
                backend: str = "auto") -> Any:
        """Run the best plan and a baseline on the real backend; predicted vs measured for both.

        See :func:`offload_lab.simulation.confirm.confirm`.
        """
        from offload_lab.simulation.confirm import confirm

        return confirm(self, model, fn, steps=steps, warmup=warmup, baseline=baseline, backend=backend)


def step_text(step_s: float, calls: int, guidance: int | None = None) -> str:
    """A step time with its calls spelled out, so a per-call and a per-step figure never pass
    for one another; ``guidance`` (the model's forwards per denoising step) adds what a
    guided step would take when it differs from ``calls``.

    >>> step_text(30.52, 2)
    '15.260 s per call × 2 calls = 30.520 s/step'
    >>> step_text(15.26, 1, guidance=2)
    '15.260 s/step (1 call; 2 calls with guidance: ≈ 30.520 s)'
    """
    if calls == 1:
        text = f"{step_s:.3f} s/step (1 call"
        if guidance and guidance != 1:
            text += f"; {guidance} calls with guidance: ≈ {step_s * guidance:.3f} s"
        return text + ")"
    text = f"{step_s / calls:.3f} s per call × {calls} calls = {step_s:.3f} s/step"
    if guidance and guidance != calls:
        text += f" ({guidance} calls with guidance: ≈ {step_s / calls * guidance:.3f} s)"
    return text


def _describe(r: pd.Series, calls: int = 1) -> str:
    tier = "" if r["tier"] in (None, "") or pd.isna(r["tier"]) else f", tier {r['tier']}"
    return (f"{int(r['resident_layers'])} resident ({r['residency']}), prefetch {int(r['prefetch'])}, "
            f"order {r['order']}{tier}: {step_text(float(r['step_s']), calls)}, "
            f"pinned {format_bytes(int(r['pinned_bytes']))}, "
            f"device peak {format_bytes(int(r['device_peak_bytes']))}")


# -- inputs ---------------------------------------------------------------------------------------
def _profile(device: Any) -> DeviceProfile:
    if isinstance(device, DeviceProfile):
        return device
    if isinstance(device, str):
        return DeviceProfile.load(device)
    raise RecommendError(f"device {device!r:.80} is not a DeviceProfile; accepted: a DeviceProfile or a shipped "
                         f"name {names()}")


def _device_memory(profile: DeviceProfile, device_memory: Any) -> int:
    if device_memory is not None:
        return parse_device_memory(device_memory)
    if profile.memory_bytes is None:
        raise RecommendError(f"device profile {profile.name!r} has no memory size (memory_bytes is None); "
                             f"accepted: device_memory='24GiB' (or a profile with memory_bytes)")
    return int(profile.memory_bytes)


def _tolerance(tolerance: Any) -> float:
    if (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance)
            or not 0 <= tolerance < 1):
        raise RecommendError(f"tolerance = {tolerance!r}; accepted: a share of the fastest step in [0, 1), "
                             f"e.g. 0.01 for 1 %")
    return float(tolerance)


def _passes(calls_per_step: Any) -> int:
    return check_int("calls_per_step", calls_per_step, minimum=1, maximum=64, error=RecommendError,
                     note="forwards per step: 2 with classifier-free guidance")


# -- the search ----------------------------------------------------------------------------------
class _Search:
    def __init__(self, spec: ModelSpec, profile: DeviceProfile, host: HostMemory, device_memory: int,
                 tokens: Any, passes: int, pin_budget: Any, tolerance: float = TOLERANCE):
        self.spec, self.host, self.device_memory, self.tokens = spec, host, device_memory, tokens
        self.pin_budget, self.tolerance = pin_budget, tolerance
        self.timer = _Timer(spec, profile, tokens, passes)
        self.sizes = {(g.name, layer.index): store_bytes(layer)[0] for g in spec.groups for layer in g.layers}
        self.fixed = spec.non_layer_bytes + activation_bytes(spec, tokens)
        self.rows: list[dict[str, Any]] = []
        self.plans: list[Plan] = []
        self.seen: dict[tuple, int] = {}

    def peak(self, residency: str, k: int, prefetch: int) -> int:
        """The planner's device peak for ``resident=k`` without building the plan."""
        sets = resident_sets(self.spec, k, residency)
        total = self.fixed
        for g in self.spec.groups:
            res = sets[g.name][0]
            total += sum(self.sizes[(g.name, i)] for i in res)
            total += in_flight_bytes([self.sizes[(g.name, i)] for i in range(g.num_layers) if i not in res], prefetch)
        return total

    def max_resident(self, residency: str, prefetch: int) -> int | None:
        """Largest per-group resident count whose peak fits (the peak grows with the count:
        a layer made resident adds its bytes and takes at most its bytes out of the window)."""
        top = max(g.num_layers for g in self.spec.groups)
        if self.peak(residency, 0, prefetch) > self.device_memory:
            return None
        lo, hi = 0, top
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.peak(residency, mid, prefetch) <= self.device_memory:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def run(self, residency: str, k: int, prefetch: int, order: str, budget: Any, tier: str | None) -> int | None:
        """Plan and time one point; returns its row id (None when the planner refuses it)."""
        top = max(g.num_layers for g in self.spec.groups)
        if k >= top:  # every layer resident: pattern, prefetch, order and tier do not matter
            residency, prefetch, order, tier = "leading", 0, "execution", None
        key = (residency, k, prefetch, order, budget, tier)
        if key in self.seen:
            return self.seen[key]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PlanWarning)
                p = plan(self.spec, pin_budget=budget, resident=k, residency=residency, order=order,
                         prefetch=prefetch, tier=tier, host=self.host, device_memory=self.device_memory,
                         tokens=self.tokens)
        except PlanError:
            return None  # e.g. a forced tier this spec cannot take
        try:
            step = self.timer.step_seconds(p)
        except ProfileError:
            return None  # a tier the profile has no bandwidth for
        led = p.ledger
        rid = len(self.rows)
        self.rows.append({
            "id": rid, "residency": residency, "resident": k, "resident_layers": p.tier_counts["resident"],
            "prefetch": prefetch, "order": order, "pin_budget": led["budget"], "tier": tier or "",
            "step_s": step, "pinned_bytes": int(led["pinned_bytes"]),
            "net_anonymous_bytes": int(led["net_anonymous_bytes"]),
            "device_peak_bytes": int(led["device_peak_bytes"]), "fits_host": bool(led["fits"]),
            "fits_device": bool(led["device_fits"]), "fits": bool(p.fits), "front": False, "best": False,
        })
        self.plans.append(p)
        self.seen[key] = rid
        return rid

    def limit(self) -> float:
        """The slowest step that still keeps the pace: the fastest fitting step × (1 + tolerance)."""
        steps = [r["step_s"] for r in self.rows if r["fits"]]
        return min(steps) * (1 + self.tolerance) if steps else -math.inf

    def keeps(self, rid: int | None, limit: float) -> bool:
        """Whether row ``rid`` fits and keeps the pace (a float-rounding hair of slack)."""
        return rid is not None and self.rows[rid]["fits"] and self.rows[rid]["step_s"] <= limit * (1 + 1e-12)


def recommend(spec: Any, device: DeviceProfile | str = "rtx4090-pcie4", host: Any = None,
              device_memory: int | str | None = None, tokens: int | str | None = None,
              calls_per_step: int = 1, pin_budget: int | str | None = None,
              tolerance: float = TOLERANCE) -> Recommendation:
    """Search the plan space of ``spec`` on ``device``: the plan that keeps the pace of the
    fastest one that fits and spends the least.

    - ``spec``: a :class:`~offload_lab.ModelSpec`, or a list of
      :class:`~offload_lab.Component` (every component is searched, in rank order, each against
      the host bytes and device memory the ones before it left; the answer is the top-ranked
      component's, the others are in ``components``);
    - ``device``: a :class:`DeviceProfile` or a shipped name; ``device_memory`` overrides its
      ``memory_bytes`` (one of the two is needed);
    - ``host``: as for :func:`~offload_lab.plan` (``"64GiB"``: a host with that much available);
      ``pin_budget`` caps the pins (default: all the host can spend);
    - ``tokens`` sizes compute and activations; ``calls_per_step`` is forwards per step (2 with
      classifier-free guidance): every ``step_s`` is per step, that many calls;
    - ``tolerance``: plans within this share of the fastest step keep the pace (default 0.01);
      among them the best pins the fewest host bytes, then has the smallest device peak, then
      the fewest resident layers (``0``: the fastest, ties broken the same way).

    Every step time is simulated. When no plan fits the device, ``best`` is ``None`` and the
    explanation says what the smallest plan would need.

    >>> import offload_lab
    >>> rec = recommend(offload_lab.catalog.load("wan2.1-t2v-1.3b"), "h200", host="64GiB")
    >>> rec.best.ledger["pinned_bytes"], rec.best.tier_counts["resident"]   # compute hides every copy
    (0, 0)
    >>> fast = recommend(offload_lab.catalog.load("wan2.1-t2v-1.3b"), "h200", host="64GiB", tolerance=0)
    >>> bool(fast.best_row["step_s"] == fast.tried["step_s"].min())   # the fastest, then the least spent
    True
    """
    import time

    t0 = time.perf_counter()
    tol = _tolerance(tolerance)
    if isinstance(spec, (list, tuple)):
        return _recommend_pipeline(spec, device, host, device_memory, tokens, calls_per_step, pin_budget, tol, t0)
    if not isinstance(spec, ModelSpec):
        raise RecommendError(f"spec {spec!r:.80} is not a ModelSpec or a list of Components; accepted: "
                             f"catalog.load(name), spec_of(model), or [Component(...), ...]")
    profile = _profile(device)
    mem = _device_memory(profile, device_memory)
    passes = _passes(calls_per_step)
    host = resolve_plan_host(host)
    if pin_budget is not None:
        pin_budget = plan(spec, pin_budget=pin_budget, host=host).params["pin_budget"]  # validates
    if tokens is not None:
        from offload_lab.simulation.engine import _check_bounds

        _check_bounds(spec, 1, 1, 0, tokens)
    s = _Search(spec, profile, host, mem, tokens, passes, pin_budget, tol)
    _explore(s)
    tried = pd.DataFrame(s.rows, columns=COLUMNS).astype({"fits": bool, "front": bool, "best": bool})
    best = _choose(tried, tol)
    if best is not None:
        tried.loc[best, "best"] = True
        tried["front"] = _pareto(tried)
        tried.loc[best, "front"] = True  # within the tolerance it may trail a faster plan it out-saves
    from offload_lab.simulation.explain import explain

    rec = Recommendation(spec, profile, host, mem, tokens, passes, None if best is None else s.plans[best],
                         tried, "", s.plans, tolerance=tol)
    rec.explanation = explain(rec, s)
    rec.search_s = time.perf_counter() - t0
    return rec


def _recommend_pipeline(comps: Any, device: Any, host: Any, device_memory: Any, tokens: Any, calls_per_step: int,
                        pin_budget: Any, tol: float, t0: float) -> Recommendation:
    """Every component in rank order, each against what the ones before it left: host headroom
    less their pinned and new anonymous bytes, the pin budget less their pins, device memory
    less what they keep there (non-layer + resident) and their largest transient (in flight +
    activations), so the pipeline's peak (Σ kept + the largest transient) fits whatever each
    chose. The top-ranked component takes ``calls_per_step``; the others one call."""
    import time

    from offload_lab.planning.pipeline import Component, _tokens_for

    if not comps or not all(isinstance(c, Component) for c in comps):
        raise RecommendError(f"spec {comps!r:.80} is not a list of Components; accepted: a ModelSpec or "
                             f"[Component(name, spec, uses), ...]")
    names = [c.name for c in comps]
    if len(set(names)) != len(names):
        raise RecommendError(f"component names {names} repeat; accepted: unique names")
    ranked = sorted(comps, key=lambda c: -c.score)  # stable, as plan_pipeline ranks them
    profile = _profile(device)
    mem = _device_memory(profile, device_memory)
    host0 = resolve_plan_host(host)
    budget = None if pin_budget is None else plan(ranked[0].spec, pin_budget=pin_budget,
                                                  host=host0).params["pin_budget"]
    out: dict[str, Recommendation] = {}
    used_host = kept = transient = pinned = 0
    for i, c in enumerate(ranked):
        h = dataclasses.replace(host0, pinned_bytes=host0.pinned_bytes + used_host)
        left = mem - kept - transient
        b = None if budget is None else max(0, budget - pinned)
        if left <= 0:
            left = 1  # nothing fits: the component's own search says what it would need
        out[c.name] = r = recommend(c.spec, profile, host=h, device_memory=left, tokens=_tokens_for(c.spec, tokens),
                                    calls_per_step=calls_per_step if i == 0 else 1, pin_budget=b, tolerance=tol)
        if r.best is None:
            continue
        led = r.best.ledger
        pinned += int(led["pinned_bytes"])
        used_host += max(int(led["pinned_bytes"]), int(led["net_anonymous_bytes"]))
        kept += int(led["device_non_layer_bytes"]) + int(led["device_resident_bytes"])
        transient = max(transient, int(led["device_in_flight_bytes"]) + int(led["device_activation_bytes"]))
    top = out[ranked[0].name]
    top.components = out
    top.search_s = time.perf_counter() - t0
    return top


def _explore(s: _Search) -> None:
    """The walk of the module doc: the pace, the points that spend nothing, the least that
    keeps the pace, then budgets and forced tiers around the best for the front."""
    full = s.pin_budget
    top = max(g.num_layers for g in s.spec.groups)
    most: dict[tuple[str, int], int] = {}
    # 1. the pace: per pattern and depth, the most residents that fit at the full budget
    for residency in RESIDENCY_PATTERNS:
        for pf in PREFETCHES:
            k = s.max_resident(residency, pf)
            if k is None:
                continue
            most[(residency, pf)] = k
            rid = s.run(residency, k, pf, "execution", full, None)
            if rid is None:
                continue
            p = s.plans[rid]
            if any(p.layers["streamed"] & (p.layers["tier"] != "pinned")):
                for order in SEARCH_ORDERS[1:]:
                    s.run(residency, k, pf, order, full, None)
    # 2. the same points pinning nothing, and nothing resident (the smallest footprints)
    for (residency, pf), k in most.items():
        s.run(residency, k, pf, "execution", 0, None)
        s.run(residency, 0, pf, "execution", 0, None)
    limit = s.limit()
    if limit == -math.inf:
        return
    # 3. the least that keeps the pace
    free = [(res, pf) for (res, pf), k in most.items() if s.keeps(s.run(res, k, pf, "execution", 0, None), limit)]
    if free:
        _fewest_residents(s, free, most, limit)
    else:
        _smallest_budget(s, most, limit)
    # 4. the front around the best: shares of the full budget, forced tiers, a resident fewer
    best = _choose(pd.DataFrame(s.rows, columns=COLUMNS), s.tolerance)
    if best is None:
        return
    b = s.rows[best]
    args = (b["residency"], b["resident"], b["prefetch"], b["order"])
    if b["resident_layers"] < sum(g.num_layers for g in s.spec.groups):
        spend = full if full is not None else s.host.spendable
        for share in _BUDGET_SHARES:
            s.run(*args, int(spend * share), None)
        for tier in ("pinned", "pageable", "mapped"):
            s.run(*args, full, tier)
        if b["resident"] > 0:
            s.run(b["residency"], b["resident"] - 1, b["prefetch"], b["order"], b["pin_budget"], None)
    if b["resident"] < top:
        s.run(b["residency"], b["resident"] + 1, b["prefetch"], b["order"], b["pin_budget"], None)
    # 5. the best's twin that pins nothing is always tried, so a pinning best has beaten it
    if b["pinned_bytes"] > 0:
        s.run(b["residency"], b["resident"], b["prefetch"], b["order"], 0, None)


def _fewest_residents(s: _Search, free: list[tuple[str, int]], most: dict[tuple[str, int], int],
                      limit: float) -> None:
    """Per (pattern, depth) whose most-resident point keeps the pace pinning nothing, the fewest
    residents that still keep it (bisection: fewer residents never make a step faster). Points
    whose empty device peak cannot beat the smallest peak found are skipped."""
    found = math.inf
    for res, pf in sorted(free, key=lambda x: s.peak(x[0], 0, x[1])):
        if s.peak(res, 0, pf) >= found:
            continue
        lo, hi = 0, most[(res, pf)]
        if s.keeps(s.run(res, 0, pf, "execution", 0, None), limit):
            hi = 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if s.keeps(s.run(res, mid, pf, "execution", 0, None), limit):
                hi = mid
            else:
                lo = mid
        rid = s.run(res, hi, pf, "execution", 0, None)
        if rid is not None:
            found = min(found, s.rows[rid]["device_peak_bytes"])


def _smallest_budget(s: _Search, most: dict[tuple[str, int], int], limit: float) -> None:
    """Nothing that pins nothing keeps the pace: per point that keeps it at the full budget
    (the fastest few), the fewest pins along its pin order that still keep it (bisection:
    a pin fewer never makes a step faster)."""
    pts = [r for r in s.rows if r["pin_budget"] == (s.pin_budget if s.pin_budget is not None
                                                    else s.host.spendable) and not r["tier"]
           and s.keeps(r["id"], limit) and (r["residency"], r["prefetch"]) in most]
    pts = sorted(pts, key=lambda r: (r["step_s"], r["id"]))[:_BUDGET_SEARCHES]
    for r in pts:
        layers = s.plans[r["id"]].layers
        ranked = layers.loc[layers["pin_rank"].notna()].sort_values("pin_rank")
        cum = [0, *[int(x) for x in ranked["bytes"].cumsum()]]
        args = (r["residency"], r["resident"], r["prefetch"], r["order"])
        lo, hi = 0, len(cum) - 1  # 0 pins does not keep the pace (else a free point would)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if s.keeps(s.run(*args, cum[mid], None), limit):
                hi = mid
            else:
                lo = mid
        s.run(*args, cum[hi], None)


def _choose(tried: pd.DataFrame, tolerance: float = TOLERANCE) -> int | None:
    """The row that keeps the pace (within ``tolerance`` of the fastest fitting step) and spends
    the least: fewest pinned bytes, then smallest device peak, then fewest resident layers."""
    ok = tried.loc[tried["fits"].astype(bool)]
    if ok.empty:
        return None
    limit = ok["step_s"].min() * (1 + tolerance) * (1 + 1e-12)
    keep = ok[ok["step_s"] <= limit]
    pick = keep.sort_values(["pinned_bytes", "device_peak_bytes", "resident_layers", "prefetch", "step_s",
                             "id"]).iloc[0]
    return int(pick["id"])


def _pareto(tried: pd.DataFrame) -> list[bool]:
    pts = [(r.step_s, r.pinned_bytes, r.device_peak_bytes) if r.fits else None
           for r in tried.itertuples(index=False)]
    out = []
    for i, a in enumerate(pts):
        if a is None:
            out.append(False)
            continue
        dominated = any(b is not None and j != i and all(x <= y for x, y in zip(b, a)) and
                        (b != a or j < i) for j, b in enumerate(pts))
        out.append(not dominated)
    return out
