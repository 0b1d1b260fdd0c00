"""Pipelines: several components (a DiT, a text encoder, a VAE) planned against one host and
one pin budget, ranked by how many bytes each moves per request.

>>> from offload_lab import catalog
>>> Component("enc", catalog.load("wan2.1-t2v-1.3b")).uses
1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from offload_lab.checks import check_int
from offload_lab.model.pipeline import PipelineSpec
from offload_lab.model.spec import ModelSpec
from offload_lab.planning.device import misfit_note, parse_device_memory
from offload_lab.planning.errors import PlanError
from offload_lab.planning.grants import build_unit, solve
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.solver import (
    Plan,
    add_device,
    budget_of,
    check_forced_pinned,
    emit_warnings,
    finish_plan,
    ledger_of,
    plain_ledger,
    resolve_plan_host,
)
from offload_lab.units import format_bytes

__all__ = ["Component", "PipelinePlan", "plan_pipeline"]

_PIPELINE_FORMAT = "offload-lab/pipeline-plan"


# -- pipelines -------------------------------------------------------------------------------------
@dataclass
class Component:
    """A model in a pipeline with its forward passes per request (``uses``) and plan options.

    >>> from offload_lab import catalog
    >>> Component("dit", catalog.load("wan2.1-t2v-1.3b"), uses=100).uses
    100
    """

    name: str
    """The component's name in the pipeline (``"transformer"``, ``"text_encoder"``)."""
    spec: ModelSpec
    """Its layer groups and tensor sizes."""
    uses: int = 1
    """Forward passes per request: steps × guidance passes for a DiT, 1 for an encoder; ranks the components for the pin budget."""
    resident: Any = 0
    """Layers kept on the device, as ``plan(resident=...)``: a count per group, a fraction or layer ids."""
    residency: str = "leading"
    """Which layers a resident count keeps: ``"leading"`` or ``"strided"``."""
    order: Any = "execution"
    """Who gets pins first, as ``plan(order=...)``: a policy or layer ids."""
    prefetch: int = 1
    """Streamed layers in flight ahead of the running one (0 = load at use)."""
    tier: str | None = None
    """Force every streamed layer into one tier (None: the planner's choice)."""
    staging: bool = False
    """Layers without a pin of their own go through pinned staging buffers when those fit."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PlanError(f"component name {self.name!r} must be a non-empty string")
        check_int(f"component {self.name!r}: uses", self.uses, minimum=1, error=PlanError,
                  note="forward passes per request: steps × guidance passes for a DiT, 1 for an encoder")

    @property
    def score(self) -> int:
        return self.uses * self.spec.layer_bytes


@dataclass(eq=False, repr=False)
class PipelinePlan:
    """Plans of several components sharing one host and one pin budget.

    ``components`` (name -> Plan) is in rank order; ``ranking`` has one row per component.
    """

    components: dict[str, Plan]
    ranking: pd.DataFrame
    ledger: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    host: HostMemory | None = None

    def __getitem__(self, name: str) -> Plan:
        if name not in self.components:
            raise PlanError(f"component {name!r} is not in this pipeline: {list(self.components)}")
        return self.components[name]

    def merged(self) -> Plan:
        """One plan over every component (groups prefixed by component), for one manager.

        Layers, ranks and reasons are the components' own; the ledger is the pipeline's; prefetch
        is the largest any component asked for.

        >>> from offload_lab import catalog
        >>> from offload_lab.model.pipeline import component_from_tensors
        >>> spec = catalog.load("wan2.1-t2v-1.3b")
        >>> c = component_from_tensors("transformer", spec.tensors())
        >>> pp = plan_pipeline([Component("transformer", c.spec, uses=4)], host=HostMemory(available="64GiB"))
        >>> pp.merged().spec.group_names
        ['transformer.blocks']
        """
        plans = list(self.components.values())
        first = plans[0]
        spec = ModelSpec("+".join(self.components), [g for p in plans for g in p.spec.groups],
                         [t for p in plans for t in p.spec.non_layer],
                         {"components": {n: p.spec.group_names for n, p in self.components.items()}})
        layers = pd.concat([p.layers for p in plans], ignore_index=True)
        params = {**first.params, "components": {n: plain_ledger(p.params) for n, p in self.components.items()},
                  "prefetch": max(int(p.prefetch) for p in plans)}
        return Plan(spec, layers, dict(self.ledger), [g for p in plans for g in p.init_order],
                    max(int(p.prefetch) for p in plans), params, list(self.warnings), self.host,
                    [g for p in plans for g in p.grant_order])

    def table(self) -> pd.DataFrame:
        """All components' layers, sizes formatted, with a ``component`` column first."""
        frames = [p.table().assign(component=n) for n, p in self.components.items()]
        df = pd.concat(frames, ignore_index=True)
        return df[["component"] + [c for c in df.columns if c != "component"]]

    def __repr__(self) -> str:
        led = self.ledger
        parts = "; ".join(f"{n}: {p.summary()}" for n, p in self.components.items())
        fit = "fits" if led["fits"] else "DOES NOT FIT"
        return (f"PipelinePlan(pinned {format_bytes(led['pinned_bytes'])} of "
                f"{format_bytes(led['budget'])}, {fit}; {parts})")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": _PIPELINE_FORMAT, "version": 1,
            "components": {n: p.to_dict() for n, p in self.components.items()},
            "ranking": [{k: (int(v) if k in ("rank", "uses", "bytes", "score") else v)
                         for k, v in row.items()} for row in self.ranking.to_dict("records")],
            "ledger": plain_ledger(self.ledger), "warnings": list(self.warnings),
            "host": None if self.host is None else self.host.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelinePlan:
        if not isinstance(d, dict) or d.get("format") != _PIPELINE_FORMAT:
            raise PlanError(f"not an offload-lab pipeline plan (expected format {_PIPELINE_FORMAT!r})")
        return cls(
            {n: Plan.from_dict(p) for n, p in d["components"].items()},
            pd.DataFrame(d["ranking"], columns=_RANK_COLUMNS), dict(d["ledger"]),
            list(d.get("warnings", [])),
            None if d.get("host") is None else HostMemory.from_dict(d["host"]),
        )


_RANK_COLUMNS = ["rank", "component", "uses", "bytes", "score", "reason"]


def plan_pipeline(
    components: Sequence[Component] | PipelineSpec, host: HostMemory | dict | str | int | None = None,
    pin_budget: int | str | None = None, tier: str | None = None, prefetch: int = 1,
    device_memory: int | str | None = None, tokens: int | str | None = None,
) -> PipelinePlan:
    """Plan several components against one host and one pin budget.

    Components are ranked by uses × layer bytes, largest first (a 100-pass DiT before a
    once-per-request encoder; ties keep the order given). Each is then planned in that order
    against the pin budget and the host headroom (available − reserve) that the ones before it
    left: its pins come first-fit from what is left of the shared budget, and if its new
    anonymous bytes do not fit what is left of the host, *it* demotes its pageable copies and
    gives back its pins — a higher-ranked plan is never changed for a lower-ranked one. Pin
    ranks are global across the pipeline. Each component's ledger shows the budget and
    ``headroom`` it was given; the pipeline's ledger has the totals.

    Device memory: every component's non-layer tensors and resident layers stay on the device,
    and one component runs at a time, so the pipeline's ``device_peak_bytes`` (an estimate) is
    Σ (non-layer + resident) + the largest (in flight + activations) of any component.
    ``tokens`` sizes the activations of the components whose spec knows that resolution (the
    others get their own default). With ``device_memory`` a pipeline that does not fit says so.
    ``components`` may be a :class:`~offload_lab.model.pipeline.PipelineSpec` (``spec_of(pipe)``):
    each of its components is planned with its uses per request, and ``tier`` / ``prefetch``
    apply to each (a forced ``mapped`` tier only where the component's weights are file views).

    >>> from offload_lab import catalog
    >>> pp = plan_pipeline([Component("enc", catalog.load("wan2.1-t2v-1.3b"), uses=1),
    ...                     Component("dit", catalog.load("wan2.1-t2v-14b"), uses=100)],
    ...                    host=HostMemory(available="64GiB"), pin_budget="28GiB")
    >>> list(pp.components), pp["dit"].tier_counts["pinned"], pp["enc"].tier_counts["pinned"]
    (['dit', 'enc'], 40, 21)
    """
    if isinstance(components, PipelineSpec):
        comps = [Component(n, c.spec, uses=components.uses(n), prefetch=prefetch,
                           tier=tier if tier != "mapped" or c.spec.mapped_bytes else None)
                 for n, c in components.components.items()]
    else:
        comps = list(components)
    if not comps:
        raise PlanError("components is empty; expected at least one Component(name, spec, uses)")
    for c in comps:
        if not isinstance(c, Component):
            raise PlanError(f"component {c!r} is not a Component(name, spec, uses)")
    names = [c.name for c in comps]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PlanError(f"component names must be unique; {dupes} appear more than once")
    ranked = sorted(comps, key=lambda c: -c.score)  # stable: ties keep the order given
    device_memory = parse_device_memory(device_memory)
    units = [
        build_unit(c.name, c.spec, c.resident, c.residency, c.order, c.prefetch, c.tier, c.staging)
        for c in ranked
    ]
    host = resolve_plan_host(host)
    budget, user, capped = budget_of(host, pin_budget)
    for u in units:
        check_forced_pinned(u, budget)
    outcomes, msgs = solve(units, budget, host.headroom)
    msgs = capped + msgs
    plans: dict[str, Plan] = {}
    rows = []
    for i, (c, u, out) in enumerate(zip(ranked, units, outcomes), start=1):
        params = {"pin_budget": user, **u.params, "component": c.name, "uses": c.uses,
                  "rank": i}
        plans[c.name] = finish_plan(u, ledger_of(host, out), params, list(msgs), host)
        add_device(plans[c.name], _tokens_for(c.spec, tokens), None)
        rows.append({
            "rank": i, "component": c.name, "uses": c.uses, "bytes": c.spec.layer_bytes,
            "score": c.score,
            "reason": (f"rank {i}: {c.uses} use{'s' if c.uses != 1 else ''} × "
                       f"{format_bytes(c.spec.layer_bytes)} = "
                       f"{format_bytes(c.score)} moved per request"),
        })
    ledger = {
        "available": host.available, "reserve": host.reserve, "spendable": host.spendable,
        "budget": budget, "pinned_bytes": sum(o.pinned for o in outcomes),
        "net_anonymous_bytes": sum(o.net for o in outcomes),
        "fits": all(o.fits for o in outcomes), "headroom": host.headroom,
        **_pipeline_device(list(plans.values()), device_memory),
        "staging_bytes": sum(o.staging for o in outcomes),
    }
    if not ledger["device_fits"]:
        msgs = [*msgs, f"pipeline: {misfit_note(ledger)}; accepted: fewer resident layers, a smaller "
                       f"prefetch or more device memory"]
    if host.ranks > 1:  # this rank's share of a node that several ranks plan against
        ledger.update(ranks=host.ranks, local_rank=host.local_rank, node_spendable=host.node_spendable)
    emit_warnings(msgs)
    return PipelinePlan(plans, pd.DataFrame(rows, columns=_RANK_COLUMNS), ledger, msgs, host)


def _tokens_for(spec: ModelSpec, tokens: int | str | None) -> int | str | None:
    """``tokens`` when ``spec`` can use it, else ``None`` (the spec's own default)."""
    if tokens is None or not isinstance(tokens, str):
        return tokens
    table = spec.meta.get("tokens") or {}
    return tokens if isinstance(table, dict) and tokens.strip().lower() in {k.lower() for k in table} else None


def _pipeline_device(plans: list[Plan], device_memory: int | None) -> dict[str, Any]:
    """The pipeline's device ledger: what stays (non-layer + resident of every component) plus the
    largest transient (in flight + activations) of the one component running."""
    stay = sum(p.ledger["device_non_layer_bytes"] + p.ledger["device_resident_bytes"] for p in plans)
    moving = max((p.ledger["device_in_flight_bytes"] + p.ledger["device_activation_bytes"] for p in plans),
                 default=0)
    peak = stay + moving
    return {
        "device_memory": device_memory, "device_peak_bytes": int(peak),
        "device_non_layer_bytes": sum(p.ledger["device_non_layer_bytes"] for p in plans),
        "device_resident_bytes": sum(p.ledger["device_resident_bytes"] for p in plans),
        "device_in_flight_bytes": max((p.ledger["device_in_flight_bytes"] for p in plans), default=0),
        "device_activation_bytes": max((p.ledger["device_activation_bytes"] for p in plans), default=0),
        "device_fits": True if device_memory is None else bool(peak <= device_memory),
    }
