"""Per-layer store bytes and the grant solver: first-fit pins down the grant order, then the
net-anonymous fit check that demotes copies and gives back pins (the rules are in
:mod:`offload_lab.planning.planner`).

>>> from offload_lab import catalog
>>> store_bytes(catalog.load("wan2.1-t2v-14b").group("blocks").layers[0])[0] // 2**20
670
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from offload_lab.checks import check_bool, check_int
from offload_lab.model.spec import LayerSpec, ModelSpec
from offload_lab.planning.errors import PlanError, PlanSizeError, check_choice
from offload_lab.planning.options import FORCED_TIERS, RESIDENCIES
from offload_lab.planning.placement import resident_sets, streamed_order
from offload_lab.units import SizeError, format_bytes, parse_size

__all__ = [
    "STORE_ALIGNMENT", "store_bytes", "staging_buffers", "parse_bytes", "Unit", "build_unit", "jsonable",
    "Outcome", "solve",
]

STORE_ALIGNMENT = 256  # bytes; each tensor slice of a packed store starts on this boundary
_OVER = "host would exceed available − reserve"


# -- per-layer bytes ----------------------------------------------------------------------------
def _align(n: int) -> int:
    return -(-n // STORE_ALIGNMENT) * STORE_ALIGNMENT


def store_bytes(layer: LayerSpec) -> tuple[int, int]:
    """``(bytes, mapped_bytes)`` of a layer's packed host store; mapped = checkpoint-view slices.

    >>> from offload_lab import catalog
    >>> store_bytes(catalog.load("minimax-h3").group("blocks").layers[0])
    (1291143680, 1059932672)
    """
    total = sum(_align(t.nbytes) for t in layer.tensors)
    mapped = sum(_align(t.nbytes) for t in layer.tensors if t.mapped)
    return total, mapped


# -- argument checks -----------------------------------------------------------------------------
def parse_bytes(value: Any, what: str) -> int:
    try:
        return parse_size(value, what)
    except SizeError as e:
        raise PlanSizeError(str(e)) from None


def _check_prefetch(prefetch: Any) -> int:
    return check_int("prefetch", prefetch, minimum=0, error=PlanError,
                     note="layers loaded ahead: 0 = load at use, 1 = one layer ahead, ...")


def _check_tier(tier: Any) -> str | None:
    if tier is None:
        return None
    if tier == "resident":
        raise PlanError(
            "tier 'resident' cannot be forced; keep layers on the device with resident=... "
            "(a count, a fraction or layer ids); tier accepts 'pinned', 'staged', 'pageable', 'mapped' or None"
        )
    return check_choice(tier, "tier", FORCED_TIERS, " (or None for the planner's choice)")


# -- the grant solver ----------------------------------------------------------------------------
@dataclass
class _Row:
    group: str
    index: int
    bytes: int
    mapped: int
    streamed: bool
    how: str = ""  # residency note for resident layers: "leading 35 of 50"
    tier: str = ""
    pin_rank: int | None = None
    reason: str = ""

    @property
    def name(self) -> str:
        return f"{self.group}.{self.index}"

    @property
    def cost(self) -> int:
        """New anonymous bytes: mapped bytes copied into a pinned or pageable store."""
        return self.mapped if (self.pin_rank is not None or self.tier == "pageable") else 0


@dataclass
class Unit:
    """One component being planned: its spec, rows and grant order."""

    name: str
    spec: ModelSpec
    tier: str | None
    prefetch: int
    params: dict[str, Any]
    init_order: list[str]
    rows: list[_Row]  # in spec order
    grant_order: list[_Row]
    use_staging: bool = False
    #: per group: (staging buffers, bytes each) once the grants are made
    staging: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def staging_bytes(self) -> int:
        return sum(k * b for k, b in self.staging.values())


def build_unit(
    name: str, spec: ModelSpec, resident: Any, residency: str, order: Any, prefetch: int,
    tier: Any, staging: Any = False,
) -> Unit:
    if not isinstance(spec, ModelSpec):
        raise PlanError(f"spec {spec!r} is not a ModelSpec; build one with spec_of(), "
                        f"ModelSpec.from_safetensors() or catalog.load()")
    if not spec.groups:
        raise PlanError(f"spec {spec.name!r} has no layer group; the planner needs at least one")
    check_choice(residency, "residency", RESIDENCIES)
    prefetch = _check_prefetch(prefetch)
    tier = _check_tier(tier)
    check_bool("staging", staging, error=PlanError)
    sets = resident_sets(spec, resident, residency)
    # init order: largest group first; sorted() is stable so equal groups keep declared order
    init_order = [g.name for g in sorted(spec.groups, key=lambda g: -g.bytes)]
    rows: list[_Row] = []
    by_key: dict[tuple[str, int], _Row] = {}
    for g in spec.groups:
        res_idx, how = sets[g.name]
        for layer in g.layers:
            b, m = store_bytes(layer)
            row = _Row(g.name, layer.index, b, m, layer.index not in res_idx,
                       how if layer.index in res_idx else "")
            rows.append(row)
            by_key[(g.name, layer.index)] = row
    streamed = {g: [r.index for r in rows if r.group == g and r.streamed] for g in init_order}
    byte_of = {k: r.bytes for k, r in by_key.items()}
    s_order = streamed_order(spec, init_order, streamed, order, byte_of)
    r_order = [(g, r.index) for g in init_order for r in rows if r.group == g and not r.streamed]
    grant = [by_key[k] for k in s_order + r_order]
    if tier == "mapped":
        streamed_rows = [r for r in rows if r.streamed]
        if streamed_rows and not any(r.mapped for r in streamed_rows):
            raise PlanError(
                f"tier 'mapped' is forced but no streamed layer of {spec.name!r} is a checkpoint "
                f"view (every layer has mapped_bytes == 0); accepted for this spec: 'pinned', "
                f"'pageable' or None"
            )
    params = {
        "resident": jsonable(resident), "residency": residency, "order": jsonable(order),
        "prefetch": prefetch, "tier": tier, "staging": staging or tier == "staged",
    }
    return Unit(name, spec, tier, prefetch, params, init_order, rows, grant,
                 use_staging=staging or tier == "staged")


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    return value


@dataclass
class Outcome:
    """What one unit got: the budget and headroom left at its turn, its pins and new bytes."""

    budget: int
    headroom: int
    pinned: int
    net: int
    fits: bool
    staging: int = 0
    staging_groups: dict[str, tuple[int, int]] = field(default_factory=dict)


def staging_buffers(prefetch: int, layer_bytes: list[int]) -> tuple[int, int]:
    """``(K, bytes each)`` of a group's staging buffers: K = prefetch + 1 (never more than the
    staged layers), each the size of the largest staged layer.

    >>> staging_buffers(1, [5, 9, 7]), staging_buffers(3, [])
    ((2, 9), (0, 0))
    """
    if not layer_bytes:
        return 0, 0
    return min(prefetch + 1, len(layer_bytes)), max(layer_bytes)


def _reserve_staging(unit: Unit, left: int) -> dict[str, int]:
    """Pin budget set aside for each group's staging buffers before any layer is pinned.

    A group stages when not all its streamed layers can have their own pin (or ``staged`` is
    forced) and K buffers the size of its largest streamed layer fit what is left; the charge
    is made exact once the grants say which layers are staged.
    """
    if not unit.use_staging or unit.tier not in (None, "staged"):
        return {}
    out: dict[str, int] = {}
    if unit.tier is None and _unpinned(unit, left) <= unit.prefetch + 1:
        # every streamed layer has a pin of its own, or too few are left without one for
        # staging buffers (which would take their pins) to pay off
        return out
    for g in unit.init_order:
        streamed = [r for r in unit.grant_order if r.group == g and r.streamed]
        if not streamed:
            continue
        k, b = staging_buffers(unit.prefetch, [r.bytes for r in streamed])
        if k * b <= left - sum(out.values()):
            out[g] = k * b
    return out


def _why_not_staged(unit: Unit, left: int, reserved: dict[str, int]) -> dict[str, str]:
    """Per group that asked for staging and got none: why, for its pageable layers' reasons.

    ``staging=True`` that stages nothing must say so: a plan that looks like one without staging
    would otherwise leave the reader guessing whether the option was read at all.
    """
    if not unit.use_staging or unit.tier is not None:
        return {}
    k_wanted = unit.prefetch + 1
    n = _unpinned(unit, left)
    out: dict[str, str] = {}
    spare = left - sum(reserved.values())
    for g in unit.init_order:
        streamed = [r for r in unit.grant_order if r.group == g and r.streamed]
        if not streamed or g in reserved:
            continue
        if n <= k_wanted:
            out[g] = (f"not staged: only {n} streamed layer{'s' if n != 1 else ''} without a pin, no "
                      f"more than the {k_wanted} staging buffers that would take their pins")
        else:
            k, b = staging_buffers(unit.prefetch, [r.bytes for r in streamed])
            out[g] = (f"not staged: {k} × {format_bytes(b)} staging buffers = {format_bytes(k * b)} > "
                      f"{format_bytes(spare)} of pin budget")
    return out


def _unpinned(unit: Unit, left: int) -> int:
    """Streamed layers first fit leaves without a pin of their own."""
    n = 0
    for r in unit.grant_order:
        if not r.streamed:
            continue
        if r.bytes <= left:
            left -= r.bytes
        else:
            n += 1
    return n


def _settle_staging(unit: Unit, reserved: dict[str, int]) -> int:
    """Charge each group's staging at its exact size; returns the reserved bytes given back."""
    back = 0
    unit.staging = {}
    for g, r in reserved.items():
        k, b = staging_buffers(unit.prefetch, [x.bytes for x in unit.rows
                                               if x.group == g and x.tier == "staged"])
        back += r - k * b
        if k:
            unit.staging[g] = (k, b)
            for x in unit.rows:
                if x.group == g and x.tier == "staged":
                    x.reason = (f"staged through {k} × {format_bytes(b)} pinned buffers"
                                f"{x.reason[len('staged'):]}")
    return back


def _grant(unit: Unit, left: int, rank: int) -> int:
    """First-fit pin grants down the unit's grant order; returns the last rank used."""
    forced = unit.tier
    note = f"; tier {forced!r} forced" if forced else ""
    reserved = _reserve_staging(unit, left)
    not_staged = _why_not_staged(unit, left, reserved)
    left -= sum(reserved.values())
    for row in unit.grant_order:
        if row.streamed and forced == "staged":
            if row.group in reserved:
                row.tier, row.reason = "staged", "staged: forced by tier 'staged'"
            else:
                row.tier = "pageable"
                row.reason = (f"pageable: tier 'staged' forced, but the staging buffers do not fit "
                              f"the {format_bytes(left)} left of the pin budget")
            continue
        if row.streamed and forced == "pageable":
            row.tier, row.reason = "pageable", "pageable: forced by tier 'pageable'"
            continue
        if row.streamed and forced == "mapped":
            if row.mapped:
                row.tier, row.reason = "mapped", "mapped: forced by tier 'mapped'"
            else:
                row.tier = "pageable"
                row.reason = "pageable: tier 'mapped' forced, but not a checkpoint view"
            continue
        if not row.streamed:
            row.tier = "resident"
            base = f"resident: {row.how}"
            if forced in ("pageable", "mapped", "staged"):
                row.reason = base  # a no-pin comparison pins nothing, resident copies included
            elif row.bytes <= left:
                rank += 1
                row.pin_rank = rank
                row.reason = (f"{base}; host copy pinned, rank {rank}, "
                              f"{format_bytes(row.bytes)} of {format_bytes(left)} left")
                left -= row.bytes
            else:
                row.reason = (f"{base}; host copy not pinned, {format_bytes(row.bytes)} > "
                              f"{format_bytes(left)} left of the pin budget")
            continue
        if row.bytes <= left:
            rank += 1
            row.tier, row.pin_rank = "pinned", rank
            row.reason = (f"pinned: rank {rank}, {format_bytes(row.bytes)} of "
                          f"{format_bytes(left)} left{note}")
            left -= row.bytes
        elif row.group in reserved:
            row.tier = "staged"
            row.reason = (f"staged: {format_bytes(row.bytes)} > {format_bytes(left)} left of the pin "
                          f"budget{note}")
        else:
            # first fit: keep walking, a later, smaller layer may still fit what is left
            row.tier = "pageable"
            row.reason = (f"pageable: {format_bytes(row.bytes)} > {format_bytes(left)} left "
                          f"of the pin budget{note}")
            if row.group in not_staged:
                row.reason += f"; {not_staged[row.group]}"
    _settle_staging(unit, reserved)
    return rank


def _fit(unit: Unit, headroom: int) -> tuple[int, str | None]:
    """Demote, then give back, until the unit's new anonymous bytes fit ``headroom``.

    Returns ``(net new bytes, why it does not fit or None)``.
    """
    order = unit.grant_order
    # staging buffers are new anonymous memory; a staged layer is read from its originals
    net = sum(r.cost for r in order) + unit.staging_bytes
    over = f"{_OVER} ({format_bytes(max(headroom, 0))} spendable)"
    # 1. pageable copies of checkpoint views go back to their mapping, least valuable
    # (latest in the grant order) first, and only as many as needed: a pageable copy cannot
    # be evicted, a mapping can and then faults from disk
    for row in reversed(order):
        if net <= headroom:
            break
        if row.streamed and row.tier == "pageable" and row.mapped:
            row.tier = "mapped"
            row.reason = f"mapped: demoted from pageable, {over}"
            net -= row.mapped
    # 2. then staging buffers: their layers stay where they are (mapped, or pageable originals)
    for g in sorted(unit.staging, key=lambda g: -unit.staging[g][0] * unit.staging[g][1]):
        if net <= headroom:
            break
        k, b = unit.staging.pop(g)
        net -= k * b
        for row in order:
            if row.group == g and row.tier == "staged":
                row.tier = "mapped" if row.mapped else "pageable"
                row.reason = f"{row.tier}: staging buffers given back, {over}"
    # 3. then pins, from the tail of the pin order; giving back a pin of anonymous originals
    # saves nothing (its store replaced them), so such pins are kept
    for row in sorted((r for r in order if r.pin_rank is not None), key=lambda r: -r.pin_rank):
        if net <= headroom:
            break
        if not row.mapped:
            continue
        row.pin_rank = None
        if row.streamed:
            row.tier = "mapped"
            row.reason = f"mapped: pin given back, {over}"
        else:
            row.reason = f"resident: {row.how}; host-copy pin given back, {over}"
        net -= row.mapped
    if net <= headroom:
        return net, None
    if headroom < 0:
        why = (f"the host is already {format_bytes(-headroom)} inside its reserve "
               f"(available − reserve − already pinned < 0)")
    else:
        why = (f"net new anonymous bytes {format_bytes(net)} > {format_bytes(headroom)} "
               f"available − reserve")
    for row in order:
        row.reason += f"; DOES NOT FIT: {why}"
    return net, why


def solve(units: list[Unit], budget: int, headroom: int) -> tuple[list[Outcome], list[str]]:
    """Plan units in rank order, each against the budget and headroom the ones before left.

    Higher-ranked components keep what they were granted: a lower-ranked component demotes its
    own copies and gives back its own pins first. Rows are updated in place.
    """
    messages: list[str] = []
    outcomes: list[Outcome] = []
    rank = 0
    for unit in units:
        rank = _grant(unit, budget, rank)
        net, why = _fit(unit, headroom)
        pinned = sum(r.bytes for r in unit.rows if r.pin_rank is not None)
        staging = unit.staging_bytes
        outcomes.append(Outcome(budget, headroom, pinned, net, why is None, staging,
                                 dict(unit.staging)))
        budget -= pinned + staging
        headroom -= net
        prefix = f"{unit.name}: " if len(units) > 1 else ""
        if why is not None:
            messages.append(f"{prefix}plan does not fit the host: {why}, even after demoting "
                            f"every pageable checkpoint view to mapped and giving back pins")
        streamed = [r for r in unit.rows if r.streamed]
        off = [r for r in streamed if unit.tier and r.tier != unit.tier]
        if off:
            messages.append(
                f"{prefix}tier {unit.tier!r} forced, but {len(off)} of {len(streamed)} streamed "
                f"layers are not {unit.tier} (e.g. {off[0].name}: {off[0].reason})"
            )
    return outcomes, messages
