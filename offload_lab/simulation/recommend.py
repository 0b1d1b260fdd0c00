"""What fits, and what is fastest: search the plan space with the simulator.

:func:`recommend` plans a spec many ways — resident count and pattern (``leading`` /
``strided``), prefetch depth, pin order, pin budget up to what the host can spend, forced tiers
— predicts each plan's step on a device profile, keeps only plans that fit the host and the
device, and returns a :class:`Recommendation`: the best plan, every plan tried, the Pareto
front and why the best wins.

The search is pruned by two monotonicities of the model: a step never gets slower when a
streamed layer becomes resident (one copy fewer) nor when a pageable layer becomes pinned (a
faster copy that does not block the host). So for each residency pattern and prefetch depth
only the largest resident count whose device peak fits is planned, at the largest pin budget;
pin orders matter only when that budget cannot pin every streamed layer; smaller budgets and
forced tiers are planned once, around the best configuration, to draw the front.

>>> import offload_lab
>>> rec = recommend(offload_lab.catalog.load("wan2.1-t2v-14b"), device="rtx4090-pcie4",
...                 host="64GiB", device_memory="24GiB")
>>> rec.best.ledger["device_peak_bytes"] <= 24 * 2**30, 0 < rec.best.tier_counts["resident"] < 40
(True, True)
"""

from __future__ import annotations

import textwrap
import warnings
from dataclasses import dataclass, field
from html import escape
from typing import Any

import pandas as pd

from offload_lab.model.spec import ModelSpec
from offload_lab.planning.device import activation_bytes, in_flight_bytes, parse_device_memory
from offload_lab.planning.errors import PlanError, PlanWarning
from offload_lab.planning.grants import store_bytes
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.placement import resident_sets
from offload_lab.planning.planner import Plan, _resolve_host, plan
from offload_lab.simulation.engine import _run_engine
from offload_lab.simulation.errors import ProfileError, SimError
from offload_lab.simulation.layers import _Layer
from offload_lab.simulation.profile import DeviceProfile, names
from offload_lab.units import format_bytes

__all__ = ["Recommendation", "recommend", "RecommendError", "PREFETCHES", "SEARCH_ORDERS", "COLUMNS"]

#: prefetch depths searched: past 4 layers ahead a deeper queue only holds more device memory
PREFETCHES = (0, 1, 2, 3, 4)
SEARCH_ORDERS = ("execution", "strided", "largest", "reverse")
RESIDENCY_PATTERNS = ("leading", "strided")
#: share of the full budget drawn on the front (the full budget is searched anyway)
_BUDGET_SHARES = (0.0, 0.25, 0.5, 0.75)
#: plans within this share of the fastest step count as tied; the tie goes to the smaller footprint
_TIE = 0.001
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
        >>> rec.plan_at(0) is rec.best
        True
        """
        if isinstance(plan_id, bool) or not isinstance(plan_id, (int,)) or not 0 <= plan_id < len(self.plans):
            raise RecommendError(f"plan id {plan_id!r} is not a row of this recommendation; accepted: 0..{len(self.plans) - 1}")
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
        'best: 30 resident (leading), prefetch 0, order execution: 0.607 s/step, pinned 2.60 GiB, device peak 3.58 GiB'
        """
        head = (f"{self.spec.name} on {self.profile.name} (simulated): device memory "
                f"{format_bytes(self.device_memory)}, host available {format_bytes(self.host.available)}, "
                f"{len(self.tried)} plans tried, {int(self.tried['fits'].sum())} fit")
        lines = [head]
        if self.best is not None:
            b = self.best_row
            lines.append(f"best: {_describe(b)}")
            lines.append(f"  {self.best.summary()}")
            lines.append("front (step time vs pinned host bytes vs device peak):")
            for _, r in self.front.iterrows():
                lines.append(f"  #{int(r['id'])}: {_describe(r)}")
        lines.append(textwrap.fill(self.explanation, 100))
        return "\n".join(lines)

    def __repr__(self) -> str:
        if self.best is None:
            return f"Recommendation({self.spec.name!r} on {self.profile.name!r}: nothing fits)"
        return f"Recommendation({self.spec.name!r} on {self.profile.name!r}: {_describe(self.best_row)})"

    def _repr_html_(self) -> str:
        front = self.front[["id", "residency", "resident_layers", "prefetch", "order", "tier", "step_s",
                            "pinned_bytes", "device_peak_bytes"]].copy()
        for c in ("pinned_bytes", "device_peak_bytes"):
            front[c] = [format_bytes(int(v)) for v in front[c]]
        front["step_s"] = [f"{v:.3f}" for v in front["step_s"]]
        return (f"<p><b>{escape(repr(self))}</b></p><p>{escape(self.explanation)}</p>"
                + front.to_html(index=False, escape=True))

    def confirm(self, model: Any, fn: Any, steps: int = 3, warmup: int = 1, baseline: Plan | None = None,
                backend: str = "auto") -> Any:
        """Run the best plan and a baseline on the real backend; predicted vs measured for both.

        See :func:`offload_lab.simulation.confirm.confirm`.
        """
        from offload_lab.simulation.confirm import confirm

        return confirm(self, model, fn, steps=steps, warmup=warmup, baseline=baseline, backend=backend)


def _describe(r: pd.Series) -> str:
    tier = "" if r["tier"] in (None, "") or pd.isna(r["tier"]) else f", tier {r['tier']}"
    return (f"{int(r['resident_layers'])} resident ({r['residency']}), prefetch {int(r['prefetch'])}, "
            f"order {r['order']}{tier}: {r['step_s']:.3f} s/step, pinned {format_bytes(int(r['pinned_bytes']))}, "
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


def _passes(calls_per_step: Any) -> int:
    if isinstance(calls_per_step, bool) or not isinstance(calls_per_step, int) or not 1 <= calls_per_step <= 64:
        raise RecommendError(f"calls_per_step = {calls_per_step!r}; accepted: an int in [1, 64] (forwards "
                             f"per step: 2 with classifier-free guidance)")
    return calls_per_step


# -- the search ----------------------------------------------------------------------------------
class _Search:
    def __init__(self, spec: ModelSpec, profile: DeviceProfile, host: HostMemory, device_memory: int,
                 tokens: Any, passes: int, pin_budget: Any):
        self.spec, self.host, self.device_memory, self.tokens = spec, host, device_memory, tokens
        self.pin_budget = pin_budget
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


def recommend(spec: Any, device: DeviceProfile | str = "rtx4090-pcie4", host: Any = None,
              device_memory: int | str | None = None, tokens: int | str | None = None,
              calls_per_step: int = 1, pin_budget: int | str | None = None) -> Recommendation:
    """Search the plan space of ``spec`` on ``device`` and recommend the fastest plan that fits.

    - ``spec``: a :class:`~offload_lab.ModelSpec`, or a list of
      :class:`~offload_lab.Component` (the pipeline's top-ranked component — the one that moves
      the most bytes per request — is searched; the others keep their plans' options);
    - ``device``: a :class:`DeviceProfile` or a shipped name; ``device_memory`` overrides its
      ``memory_bytes`` (one of the two is needed);
    - ``host``: as for :func:`~offload_lab.plan` (``"64GiB"``: a host with that much available);
      ``pin_budget`` caps the pins (default: all the host can spend);
    - ``tokens`` sizes compute and activations; ``calls_per_step`` is forwards per step (2 with
      classifier-free guidance).

    Every step time is simulated. When no plan fits the device, ``best`` is ``None`` and the
    explanation says what the smallest plan would need.

    >>> import offload_lab
    >>> rec = recommend(offload_lab.catalog.load("wan2.1-t2v-1.3b"), "h200", host="64GiB")
    >>> rec.best.tier_counts["resident"]   # 141 GB holds the whole 2.6 GiB model
    30
    """
    import time

    t0 = time.perf_counter()
    if isinstance(spec, (list, tuple)):
        spec = _top_component(spec)
    if not isinstance(spec, ModelSpec):
        raise RecommendError(f"spec {spec!r:.80} is not a ModelSpec or a list of Components; accepted: "
                             f"catalog.load(name), spec_of(model), or [Component(...), ...]")
    profile = _profile(device)
    mem = _device_memory(profile, device_memory)
    passes = _passes(calls_per_step)
    host = _resolve_host(host)
    if pin_budget is not None:
        pin_budget = plan(spec, pin_budget=pin_budget, host=host).params["pin_budget"]  # validates
    if tokens is not None:
        from offload_lab.simulation.engine import _check_bounds

        _check_bounds(spec, 1, 1, 0, tokens)
    s = _Search(spec, profile, host, mem, tokens, passes, pin_budget)
    _explore(s)
    tried = pd.DataFrame(s.rows, columns=COLUMNS).astype({"fits": bool, "front": bool, "best": bool})
    best = _choose(tried)
    if best is not None:
        tried.loc[best, "best"] = True
        tried["front"] = _pareto(tried)
    from offload_lab.simulation.explain import explain

    rec = Recommendation(spec, profile, host, mem, tokens, passes, None if best is None else s.plans[best],
                         tried, "", s.plans)
    rec.explanation = explain(rec, s)
    rec.search_s = time.perf_counter() - t0
    return rec


def _top_component(comps: Any) -> ModelSpec:
    from offload_lab.planning.pipeline import Component

    if not comps or not all(isinstance(c, Component) for c in comps):
        raise RecommendError(f"spec {comps!r:.80} is not a list of Components; accepted: a ModelSpec or "
                             f"[Component(name, spec, uses), ...]")
    return max(comps, key=lambda c: c.score).spec


def _explore(s: _Search) -> None:
    """The pruned walk (module doc): per pattern and depth, the most residents that fit at the
    full budget; orders only when that budget leaves streamed layers unpinned; then budgets
    and forced tiers around the best."""
    full = s.pin_budget
    for residency in RESIDENCY_PATTERNS:
        for pf in PREFETCHES:
            k = s.max_resident(residency, pf)
            if k is None:
                continue
            rid = s.run(residency, k, pf, "execution", full, None)
            if rid is None:
                continue
            p = s.plans[rid]
            if any(p.layers["streamed"] & (p.layers["tier"] != "pinned")):
                for order in SEARCH_ORDERS[1:]:
                    s.run(residency, k, pf, order, full, None)
    tried = pd.DataFrame(s.rows, columns=COLUMNS)
    best = _choose(tried)
    if best is None:
        return
    b = s.rows[best]
    args = (b["residency"], b["resident"], b["prefetch"], b["order"])
    if b["resident_layers"] < sum(g.num_layers for g in s.spec.groups):
        spend = b["pin_budget"]
        for share in _BUDGET_SHARES:
            s.run(*args, int(spend * share), None)
        for tier in ("pinned", "pageable", "mapped"):
            s.run(*args, full, tier)
        # one resident fewer: the front shows what a layer of device memory buys
        if b["resident"] > 0:
            s.run(b["residency"], b["resident"] - 1, b["prefetch"], b["order"], full, None)


def _choose(tried: pd.DataFrame) -> int | None:
    ok = tried.loc[tried["fits"].astype(bool)]
    if ok.empty:
        return None
    fastest = ok["step_s"].min()
    tied = ok[ok["step_s"] <= fastest * (1 + _TIE)]
    # among ties the smallest footprint: device peak, then pinned bytes, then the shallower queue
    pick = tied.sort_values(["device_peak_bytes", "pinned_bytes", "prefetch", "id"]).iloc[0]
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

