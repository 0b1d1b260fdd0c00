"""The planner: where each layer's weights live between uses, and why.

:func:`plan` decides per layer a tier — ``resident`` (kept on the device), ``pinned``,
``pageable`` or ``mapped`` (zero-copy views of the checkpoint file) — with a pin rank and a
reason, checks the whole plan against the host's memory, and predicts the startup peak.
:func:`plan_pipeline` does the same for several components sharing one host.

>>> import offload_lab
>>> from offload_lab import catalog
>>> spec = catalog.load("minimax-h3")
>>> p = plan(spec, host=HostMemory(available=int(7.32 * 2**30)))
>>> p.ledger["spendable"] < 5.33 * 2**30, int(p.layers["pin_rank"].notna().sum())
(True, 4)
>>> p.layers.iloc[2]["reason"]
'pinned: rank 1, 1.20 GiB of 5.32 GiB left'

The rules, in the order they are applied:

1. **Per-layer bytes**: the packed host store (one buffer per dtype, each tensor slice aligned
   to :data:`STORE_ALIGNMENT` bytes) and how many of those bytes are checkpoint views.
2. **Budget**: ``budget = min(pin_budget, host.spendable)``.
3. **Grant order**: components by uses × bytes (largest first); inside a model the groups in
   init order (largest group first); streamed layers first, in the ``order`` policy, then
   resident layers in index order.
4. **First fit**: a layer is pinned when its bytes fit what is left of the budget, else pageable
   — a later, smaller layer can still be pinned.
5. **Net anonymous cost**: only bytes copied out of a file mapping into anonymous memory are new
   (pinned and pageable stores of mapped bytes); a store that replaces an anonymous original is
   a wash; the ``mapped`` tier costs nothing. If the net new bytes exceed available − reserve:
   demote pageable checkpoint-view layers to ``mapped`` from the tail of the grant order, then
   give back pins from the tail of the pin order; if it still does not fit, ``ledger["fits"]``
   is False, every reason says so and a :class:`PlanWarning` is issued.

In a pipeline (:func:`plan_pipeline`) components are planned in rank order, each against the
budget and the headroom the higher-ranked ones left, so a lower-ranked component demotes its own
copies and gives back its own pins before anything of a higher-ranked one moves: a DiT's
pageable copy serves 100 passes per request, an encoder's pin one. (Within one plan the budget
never exceeds the headroom, so give-back is what keeps a *later* component's pins within what
the earlier components' copies left.)

A layer counts as a *checkpoint view* when any of its bytes are mapped (H3: every tensor but
the fused QKV). In the ``mapped`` tier its mapped tensors are served from the file's pages and
its other tensors stay in the anonymous memory they already occupy (no new bytes either way).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from offload_lab.model.spec import ModelSpec
from offload_lab.planning.errors import PlanError, PlanSizeError, PlanWarning, check_choice
from offload_lab.planning.grants import (
    STORE_ALIGNMENT,
    _build_unit,
    _jsonable,
    _Outcome,
    _parse,
    _solve,
    _Unit,
    store_bytes,
)
from offload_lab.planning.hostmem import HostMemory, HostMemoryError, resolve_host, rounded_size
from offload_lab.planning.options import FORCED_TIERS, ORDERS, RESIDENCIES, STRATEGIES, TIERS
from offload_lab.units import SizeError, format_bytes
from offload_lab.views.keyed import PlanTable

if TYPE_CHECKING:
    from offload_lab.planning.pipeline import PipelinePlan

__all__ = [
    "TIERS", "FORCED_TIERS", "ORDERS", "RESIDENCIES", "STRATEGIES", "STORE_ALIGNMENT",
    "Plan", "PlanError", "PlanSizeError", "PlanWarning", "plan", "store_bytes", "pinned_footprint",
]

LAYER_COLUMNS = ["group", "layer", "tier", "bytes", "mapped_bytes", "streamed", "pin_rank", "reason"]
_FORMAT = "offload-lab/plan"
#: names that moved to offload_lab.planning.pipeline, still importable from here
_MOVED = {"Component", "PipelinePlan", "plan_pipeline"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from offload_lab.planning import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- Plan ----------------------------------------------------------------------------------------
@dataclass(eq=False, repr=False)
class Plan:
    """The decision per layer, the budget ledger and the group init order.

    >>> from offload_lab import catalog
    >>> p = plan(catalog.load("wan2.1-t2v-14b"), pin_budget="8GiB", host=HostMemory(available="64GiB"))
    >>> p.tier_of("blocks", 0), p.tier_of("blocks", 39)
    ('pinned', 'pageable')
    """

    spec: ModelSpec
    layers: pd.DataFrame
    ledger: dict[str, Any]
    init_order: list[str]
    prefetch: int
    params: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    host: HostMemory | None = None
    grant_order: list[str] = field(default_factory=list)

    # -- queries -------------------------------------------------------------------------
    def _row(self, group: str, layer: int) -> pd.Series:
        df = self.layers
        hit = df[(df["group"] == group) & (df["layer"] == layer)]
        if hit.empty:
            raise PlanError(
                f"layer {group}.{layer} is not in this plan; groups: "
                f"{ {g: int((df['group'] == g).sum()) for g in self.spec.group_names} }"
            )
        return hit.iloc[0]

    def tier_of(self, group: str, layer: int) -> str:
        """Tier of one layer: ``plan.tier_of("blocks", 3) -> "pinned"``."""
        return str(self._row(group, layer)["tier"])

    def reason_of(self, group: str, layer: int) -> str:
        """Why one layer got its tier."""
        return str(self._row(group, layer)["reason"])

    def _placement(self) -> list[tuple[str, int, bool, int]]:
        """(group, layer, streamed, bytes) per row; plain tuples, since widgets call the
        queries below on every slider move and pandas masks cost ~1 ms each."""
        df = self.layers
        return list(zip(df["group"], (int(i) for i in df["layer"]),
                        (bool(s) for s in df["streamed"]), (int(b) for b in df["bytes"])))

    def streamed_layers(self, group: str) -> list[int]:
        """Indices of the group's streamed layers, in execution order."""
        self.spec.group(group)  # names the groups when this one does not exist
        return sorted(i for g, i, s, _ in self._placement() if g == group and s)

    def resident_layers(self, group: str) -> list[int]:
        """Indices of the group's resident layers, in index order."""
        self.spec.group(group)
        return sorted(i for g, i, s, _ in self._placement() if g == group and not s)

    @property
    def tier_counts(self) -> dict[str, int]:
        counts = self.layers["tier"].value_counts()
        return {t: int(counts.get(t, 0)) for t in TIERS}

    @property
    def fits(self) -> bool:
        """True when the plan fits the host and (when ``device_memory`` was given) the device."""
        return bool(self.ledger["fits"]) and bool(self.ledger.get("device_fits", True))

    @property
    def device_peak(self) -> int:
        """Predicted steady-state device bytes (an estimate; see :mod:`offload_lab.planning.device`)."""
        if "device_peak_bytes" not in self.ledger:  # a plan saved before the device model
            from offload_lab.planning.device import device_parts

            return device_parts(self.spec, self._placement(), self.prefetch, None, None)["device_peak_bytes"]
        return int(self.ledger["device_peak_bytes"])

    def startup_peak(self, strategy: str = "grouped") -> int:
        """Predicted device bytes at the startup peak.

        ``grouped``: every group's layers are replaced by host stores first (largest group
        first), then non-layer tensors move to the device once, then prefetch is armed — the
        peak is non-layer + resident layers + the first ``prefetch`` streamed layers of each
        group in flight. ``naive``: in declared order each group is offloaded and then the whole
        model moved, so groups not yet offloaded are transiently on the device; the peak is the
        largest of non-layer + resident layers of the groups already offloaded + every layer of
        the groups not yet offloaded, and never below the grouped steady state.

        >>> from offload_lab import catalog
        >>> p = plan(catalog.load("minimax-h3"), host=HostMemory(available="64GiB"))
        >>> p.startup_peak("naive") > 60 * 2**30 > p.startup_peak("grouped")
        True
        """
        check_choice(strategy, "strategy", STRATEGIES)
        non_layer = self.spec.non_layer_bytes
        rows = sorted(self._placement(), key=lambda r: r[1])  # execution order in each group
        parts = {}
        for g in self.spec.group_names:
            mine = [r for r in rows if r[0] == g]
            resident = sum(b for _, _, s, b in mine if not s)
            in_flight = sum([b for _, _, s, b in mine if s][: self.prefetch])
            parts[g] = (resident, in_flight, sum(b for *_, b in mine))
        steady = non_layer + sum(p[0] + p[1] for p in parts.values())
        if strategy == "grouped":
            return steady
        peak = steady
        names = self.spec.group_names
        for i in range(len(names)):
            # prefetch is armed only after every group is offloaded, so not counted here
            done = sum(parts[g][0] for g in names[: i + 1])
            pending = sum(parts[g][2] for g in names[i + 1:])
            peak = max(peak, non_layer + done + pending)
        return peak

    # -- printing --------------------------------------------------------------------------
    def table(self) -> pd.DataFrame:
        """The layers with sizes formatted, for printing in a notebook or a terminal.

        A DataFrame (:class:`~offload_lab.views.keyed.PlanTable`) whose printed form keeps
        layer, tier, pin rank and reason in view on a narrow terminal; ``mapped`` is the bytes
        a ``mapped`` layer reads from its checkpoint file (empty for the other tiers).
        """
        df = self.layers
        return PlanTable({
            "group": df["group"], "layer": df["layer"], "tier": df["tier"],
            "size": [format_bytes(b) for b in df["bytes"]],
            # a pinned or pageable store is a copy: what it read from the file is not mapped any more
            "mapped": [format_bytes(b) if t == "mapped" else "" for b, t in zip(df["mapped_bytes"], df["tier"])],
            "streamed": df["streamed"],
            "pin rank": ["" if pd.isna(r) else str(int(r)) for r in df["pin_rank"]],
            "reason": df["reason"],
        })

    def summary(self) -> str:
        t = self.tier_counts
        led = self.ledger
        tiers = ", ".join(f"{n} {k}" for k, n in t.items() if n)
        fit = "fits" if led["fits"] else "DOES NOT FIT"
        staging = (f" + {format_bytes(led['staging_bytes'])} staging buffers"
                   if led.get("staging_bytes") else "")
        dev = ""
        if led.get("device_memory") is not None:
            dev = (f"; device peak {format_bytes(led['device_peak_bytes'])} (estimate) of "
                   f"{format_bytes(led['device_memory'])}, "
                   f"{'fits' if led['device_fits'] else 'DOES NOT FIT the device'}")
        return (f"{len(self.layers)} layers: {tiers}; pinned {format_bytes(led['pinned_bytes'])}{staging} "
                f"of budget {format_bytes(led['budget'])}; net new anonymous "
                f"{format_bytes(led['net_anonymous_bytes'])}; {fit}{dev}")

    def __repr__(self) -> str:
        return f"Plan({self.spec.name!r}, {self.summary()})"

    def _repr_html_(self) -> str:
        from html import escape  # a spec name can come from a directory name or a shared plan

        return f"<p><code>{escape(repr(self))}</code></p>" + self.table().to_html(index=False, escape=True)

    # -- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-able, spec included; ``Plan.from_dict(p.to_dict())`` gives the same plan."""
        layers = []
        for r in self.layers.itertuples(index=False):
            layers.append({
                "group": str(r.group), "layer": int(r.layer), "tier": str(r.tier),
                "bytes": int(r.bytes), "mapped_bytes": int(r.mapped_bytes),
                "streamed": bool(r.streamed),
                "pin_rank": None if pd.isna(r.pin_rank) else int(r.pin_rank),
                "reason": str(r.reason),
            })
        return {
            "format": _FORMAT, "version": 1, "spec": self.spec.to_dict(),
            "params": _jsonable(self.params), "ledger": _plain(self.ledger),
            "init_order": list(self.init_order), "prefetch": int(self.prefetch),
            "warnings": list(self.warnings),
            "host": None if self.host is None else self.host.to_dict(),
            "grant_order": list(self.grant_order), "layers": layers,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        if not isinstance(d, dict) or d.get("format") != _FORMAT:
            raise PlanError(f"not an offload-lab plan (expected format {_FORMAT!r})")
        return cls(
            spec=ModelSpec.from_dict(d["spec"]), layers=_layers_frame(d["layers"]),
            ledger=dict(d["ledger"]), init_order=list(d["init_order"]),
            prefetch=int(d["prefetch"]), params=dict(d["params"]),
            warnings=list(d.get("warnings", [])),
            host=None if d.get("host") is None else HostMemory.from_dict(d["host"]),
            grant_order=list(d.get("grant_order", [])),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """A plan from the JSON text :meth:`to_json` wrote (too deep nesting is a PlanError).

        >>> Plan.from_json("[" * 100_000)
        Traceback (most recent call last):
        ...
        offload_lab.planning.errors.PlanError: plan JSON is not valid JSON: nested too deeply
        """
        from offload_lab.reading import InputFileError, parse_json

        try:
            data = parse_json(text, "plan JSON")
        except InputFileError as e:
            raise PlanError(str(e)) from None
        return cls.from_dict(data)


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (bool(v) if isinstance(v, bool) else int(v) if isinstance(v, int) else v)
            for k, v in d.items()}


def _add_device(p: Plan, tokens: Any, device_memory: int | None) -> list[str]:
    """Put the device part in ``p``'s ledger; when it does not fit, say so in every reason and
    return the warning (the host side's misfit works the same way)."""
    from offload_lab.planning.device import device_parts, misfit_note

    p.ledger.update(device_parts(p.spec, p._placement(), p.prefetch, tokens, device_memory))
    if p.ledger["device_fits"]:
        return []
    note = misfit_note(p.ledger)
    p.layers["reason"] = [f"{r}; does not fit the device" for r in p.layers["reason"]]
    msg = f"{p.spec.name}: {note}; accepted: fewer resident layers, a smaller prefetch or more device memory"
    p.warnings.append(msg)
    return [msg]


def _layers_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=LAYER_COLUMNS)
    return df.astype({
        "group": "object", "layer": "int64", "tier": "object", "bytes": "int64",
        "mapped_bytes": "int64", "streamed": "bool", "pin_rank": "Int64", "reason": "object",
    }).reset_index(drop=True)


def _resolve_host(host: Any) -> HostMemory:
    try:
        return resolve_host(host)
    except SizeError as e:
        raise PlanSizeError(f"host: {e}") from None
    except HostMemoryError as e:
        raise PlanError(str(e)) from None


def _budget(host: HostMemory, pin_budget: Any) -> tuple[int, int | None, list[str]]:
    """``(budget, the user's budget in bytes or None, a note when the host capped it)``."""
    user = None if pin_budget is None else _parse(pin_budget, "pin_budget")
    spend = host.spendable
    if user is None or user <= spend:
        return (spend if user is None else user), user, []
    return spend, user, [f"pin_budget {format_bytes(user)} is more than the host can spend "
                         f"({format_bytes(spend)}); capped"]


def _finish(unit: _Unit, ledger: dict[str, Any], params: dict[str, Any], msgs: list[str],
            host: HostMemory) -> Plan:
    layers = _layers_frame([
        {"group": r.group, "layer": r.index, "tier": r.tier, "bytes": r.bytes,
         "mapped_bytes": r.mapped, "streamed": r.streamed, "pin_rank": r.pin_rank,
         "reason": r.reason}
        for r in unit.rows
    ])
    return Plan(unit.spec, layers, ledger, unit.init_order, unit.prefetch, params, msgs, host,
                [r.name for r in unit.grant_order])


def _check_forced_pinned(unit: _Unit, budget: int) -> None:
    if unit.tier != "pinned":
        return
    smallest = min((r.bytes for r in unit.rows if r.streamed), default=None)
    if smallest is not None and smallest > budget:
        raise PlanError(
            f"tier 'pinned' is forced but no streamed layer of {unit.spec.name!r} fits the pin "
            f"budget {format_bytes(budget)} (the smallest is {format_bytes(smallest)}); accepted: "
            f"a larger pin_budget or host, or tier 'pageable', 'mapped' or None"
        )


def _ledger(host: HostMemory, out: _Outcome) -> dict[str, Any]:
    ledger = {
        "available": host.available, "reserve": host.reserve, "spendable": host.spendable,
        "budget": out.budget, "pinned_bytes": out.pinned, "net_anonymous_bytes": out.net,
        "fits": out.fits, "headroom": out.headroom, "staging_bytes": out.staging,
        "staging": {g: {"buffers": k, "buffer_bytes": b} for g, (k, b) in out.staging_groups.items()},
    }
    if host.ranks > 1:  # this rank's share of a node that several ranks plan against
        ledger.update(ranks=host.ranks, local_rank=host.local_rank, node_spendable=host.node_spendable,
                      split=host.split_note())
    return ledger


def _emit(msgs: list[str]) -> None:
    for m in msgs:
        warnings.warn(m, PlanWarning, stacklevel=3)


def plan(
    spec: ModelSpec,
    pin_budget: int | str | None = None,
    resident: int | float | Sequence[int | str] | dict[str, Any] = 0,
    residency: str = "leading",
    order: str | Sequence[int | str] = "execution",
    prefetch: int = 1,
    tier: str | None = None,
    staging: bool = False,
    host: HostMemory | dict | str | int | None = None,
    device_memory: int | str | None = None,
    tokens: int | str | None = None,
) -> Plan:
    """Plan where each layer of ``spec`` lives between uses (the rules are in the module doc).

    - ``pin_budget``: bytes or a size string; ``None`` = everything the host can spend. The
      budget used is ``min(pin_budget, host.spendable)``.
    - ``resident``: layers kept on the device — a count (applied to each group, capped at its
      size; an error when larger than every group), a fraction in (0, 1] of each group (1.0 = all), layer
      ids (``[0, 1]`` for single-group models, ``["blocks.0"]``), or ``{group: any of those}``.
    - ``residency``: ``"leading"`` (first k) or ``"strided"`` (the streamed layers spread evenly).
    - ``order``: who gets pins first among streamed layers — ``"execution"``, ``"reverse"``,
      ``"largest"``, ``"strided"`` (bit-reversal order: 0, the middle, the quarters, ...; the first
      2, 4, 8, ... are evenly spaced, other prefixes nearly so), or an explicit
      list of layer ids (unlisted streamed layers follow in execution order). Groups are taken
      in init order (largest first); ``largest`` and explicit lists order across groups.
    - ``prefetch``: streamed layers in flight ahead of the running one (0 = load at use).
    - ``tier``: force every streamed layer to ``"pinned"`` | ``"pageable"`` | ``"mapped"``; still
      subject to the budget and the fit check (layers that cannot take it say why, and a
      :class:`PlanWarning` counts them). With a forced ``pageable`` or ``mapped`` tier resident
      layers' host copies are not pinned either.
    - ``staging``: layers that do not get a pin of their own are ``staged`` — moved through K
      = prefetch + 1 pinned staging buffers per group, each the size of the group's largest
      staged layer, charged to the pin budget and to net anonymous memory before any layer is
      pinned — when those buffers fit and more than K streamed layers would go without a pin;
      else they are pageable or mapped as without it. ``tier="staged"`` forces it for every
      streamed layer (no layer is then pinned).
    - ``host``: a :class:`HostMemory` (``None`` probes this machine; ``"64GiB"`` is a
      hypothetical host with that much available).
    - ``device_memory``: the device's memory size (``"24GiB"``); the ledger always holds the
      estimated device peak (``device_peak_bytes`` and its parts), and with a size a plan whose
      peak exceeds it has ``device_fits`` False, says so in every reason and warns. ``None``
      checks nothing. ``tokens`` (an int or ``"480p"``) sizes the activation estimate (default:
      the spec's smallest resolution).

    >>> from offload_lab import catalog
    >>> p = plan(catalog.load("minimax-h3"), resident=35, residency="strided",
    ...          host=HostMemory(available="64GiB"))
    >>> p.streamed_layers("blocks")[:4], p.reason_of("blocks", 0).split(";")[0]
    ([1, 5, 8, 11], 'resident: strided 35 of 50')
    """
    from offload_lab.planning.device import parse_device_memory

    unit = _build_unit(spec.name if isinstance(spec, ModelSpec) else "spec", spec, resident,
                       residency, order, prefetch, tier, staging)
    device_memory = parse_device_memory(device_memory)
    host = _resolve_host(host)
    budget, user, capped = _budget(host, pin_budget)
    _check_forced_pinned(unit, budget)
    (out,), msgs = _solve([unit], budget, host.headroom)
    msgs = capped + msgs
    ledger = _ledger(host, out)
    params = {"pin_budget": user, **unit.params}
    if device_memory is not None:
        params["device_memory"] = device_memory
    if tokens is not None:
        params["tokens"] = tokens
    p = _finish(unit, ledger, params, msgs, host)
    _add_device(p, tokens, device_memory)  # appends its warning to p.warnings
    _emit(p.warnings)
    return p


def pinned_footprint(p: Plan | PipelinePlan, rounding: str = "exact") -> int:
    """Host bytes the plan's pins really lock: ``"exact"`` (offload-lab allocates each store at
    its size) or ``"pow2"`` (a caching allocator rounding each layer's store — one allocation
    per layer, as the runtime makes it — up to a power of two).

    >>> from offload_lab import catalog
    >>> p = plan(catalog.load("minimax-h3"), pin_budget="41.22GiB", host=HostMemory(available="64GiB"))
    >>> pinned_footprint(p) == p.ledger["pinned_bytes"], pinned_footprint(p, "pow2") // 2**30
    (True, 68)
    """
    from offload_lab.planning.pipeline import PipelinePlan

    if isinstance(p, PipelinePlan):
        return sum(pinned_footprint(c, rounding) for c in p.components.values())
    rounded_size(0, rounding)  # names the accepted modes on a bad one
    df = p.layers
    return sum(rounded_size(int(b), rounding) for b in df.loc[df["pin_rank"].notna(), "bytes"])
