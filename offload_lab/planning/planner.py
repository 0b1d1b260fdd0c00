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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from offload_lab.model.spec import LayerSpec, ModelSpec
from offload_lab.planning.hostmem import HostMemory, rounded_size
from offload_lab.units import SizeError, format_bytes, parse_size

__all__ = [
    "TIERS", "FORCED_TIERS", "ORDERS", "RESIDENCIES", "STRATEGIES", "STORE_ALIGNMENT",
    "Plan", "PipelinePlan", "Component", "PlanError", "PlanSizeError", "PlanWarning",
    "plan", "plan_pipeline", "store_buffers", "store_bytes", "pinned_footprint",
]

TIERS = ("resident", "pinned", "pageable", "mapped")
FORCED_TIERS = ("pinned", "pageable", "mapped")
ORDERS = ("execution", "reverse", "largest", "strided")
RESIDENCIES = ("leading", "strided")
STRATEGIES = ("grouped", "naive")
STORE_ALIGNMENT = 256  # bytes; each tensor slice of a packed store starts on this boundary
LAYER_COLUMNS = ["group", "layer", "tier", "bytes", "mapped_bytes", "streamed", "pin_rank", "reason"]
_FORMAT = "offload-lab/plan"
_PIPELINE_FORMAT = "offload-lab/pipeline-plan"
_OVER = "host would exceed available − reserve"


class PlanError(ValueError):
    """An argument the planner cannot use; the message names it and what is accepted."""


class PlanSizeError(PlanError, SizeError):
    """A size argument of the planner that is not a byte count (both a PlanError and a SizeError)."""


class PlanWarning(UserWarning):
    """A plan that does not fit the host, or a forced tier that could not be honoured."""


# -- per-layer bytes ----------------------------------------------------------------------------
def _align(n: int) -> int:
    return -(-n // STORE_ALIGNMENT) * STORE_ALIGNMENT


def store_buffers(layer: LayerSpec) -> dict[str, int]:
    """Bytes of each per-dtype buffer of a layer's packed host store (slices aligned).

    >>> from offload_lab import catalog
    >>> store_buffers(catalog.load("minimax-h3").group("blocks").layers[0])
    {'bfloat16': 1291143680}
    """
    out: dict[str, int] = {}
    for t in layer.tensors:
        out[t.dtype] = out.get(t.dtype, 0) + _align(t.nbytes)
    return out


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
def _parse(value: Any, what: str) -> int:
    try:
        return parse_size(value, what)
    except SizeError as e:
        raise PlanSizeError(str(e)) from None


def _check_choice(value: Any, what: str, accepted: Sequence[str], hint: str = "") -> str:
    if not isinstance(value, str) or value not in accepted:
        raise PlanError(f"{what} {value!r} is not one of {', '.join(map(repr, accepted))}{hint}")
    return value


def _check_prefetch(prefetch: Any) -> int:
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise PlanError(
            f"prefetch {prefetch!r} is not a layer count; expected an int ≥ 0 "
            f"(0 = load at use, 1 = one layer ahead, ...)"
        )
    return prefetch


def _check_tier(tier: Any) -> str | None:
    if tier is None:
        return None
    if tier == "resident":
        raise PlanError(
            "tier 'resident' cannot be forced; keep layers on the device with resident=... "
            "(a count, a fraction or layer ids); tier accepts 'pinned', 'pageable', 'mapped' or None"
        )
    return _check_choice(tier, "tier", FORCED_TIERS, " (or None for the planner's choice)")


def _layer_id(item: Any, spec: ModelSpec, what: str) -> tuple[str, int]:
    """``3`` (single-group models), ``"3"`` or ``"blocks.3"`` -> (group, index)."""
    names = spec.group_names
    accepted = (f"layer ids as ints (single-group models) or names such as "
                f"'{names[-1]}.0' (groups: {names})")
    if isinstance(item, str) and item.strip().isdigit():
        item = int(item)
    if isinstance(item, bool) or not isinstance(item, (int, str)):
        raise PlanError(f"{what} entry {item!r} is not a layer id; expected {accepted}")
    if isinstance(item, int):
        if len(names) != 1:
            raise PlanError(
                f"{what} entry {item!r} is ambiguous in {spec.name!r}, which has groups {names}; "
                f"name the layer, e.g. '{names[-1]}.{item}'"
            )
        group, index = names[0], item
    else:
        group, _, idx = item.rpartition(".")
        if not group or not idx.isdigit():
            raise PlanError(f"{what} entry {item!r} is not a layer id; expected {accepted}")
        if group not in names:
            raise PlanError(f"{what} entry {item!r} names group {group!r}, not in {names}")
        index = int(idx)
    n = spec.group(group).num_layers
    if not 0 <= index < n:
        raise PlanError(
            f"{what} entry {item!r} is out of range: group {group!r} has layers 0..{n - 1}"
        )
    return group, index


# -- residency -----------------------------------------------------------------------------------
def _strided_resident(n: int, k: int) -> list[int]:
    """k of n resident with the streamed n − k spread evenly (stream j sits at ⌊(j + ½)·n/m⌋)."""
    m = n - k
    streamed = {(2 * j + 1) * n // (2 * m) for j in range(m)} if m else set()
    return [i for i in range(n) if i not in streamed]


def _count_of(value: Any, n: int, what: str) -> int | None:
    """A count or fraction for a group of n layers; None when ``value`` is not one."""
    if isinstance(value, bool):
        raise PlanError(f"{what} {value!r} is a bool; expected a count, a fraction in (0, 1] "
                        f"or layer ids")
    if isinstance(value, int):
        if value < 0:
            raise PlanError(f"{what} {value!r} is negative; expected a count 0..{n}, a fraction "
                            f"in (0, 1] or layer ids")
        return value
    if isinstance(value, float):
        if value == 0:
            return 0
        if not 0 < value <= 1:
            raise PlanError(
                f"{what} {value!r} is not a fraction in (0, 1]; write a count as an int "
                f"(0..{n}) or list layer ids"
            )
        return int(round(value * n))
    return None


def _resident_sets(
    spec: ModelSpec, resident: Any, residency: str
) -> dict[str, tuple[set[int], str]]:
    """{group: (resident indices, how)} where ``how`` reads like ``"leading 35 of 50"``."""
    out: dict[str, tuple[set[int], str]] = {g.name: (set(), "") for g in spec.groups}
    accepted = ("a count, a fraction in (0, 1], layer ids (3 or 'blocks.3'), or a dict "
                "{group: count | fraction | indices}")
    if resident is None:
        return out

    def place(n: int, k: int) -> tuple[set[int], str]:
        idx = list(range(k)) if residency == "leading" else _strided_resident(n, k)
        return set(idx), f"{residency} {k} of {n}"

    if isinstance(resident, dict):
        for group, value in resident.items():
            if group not in out:
                raise PlanError(f"resident names group {group!r}, not in {spec.group_names}")
            n = spec.group(group).num_layers
            k = _count_of(value, n, f"resident[{group!r}]")
            if k is None:
                if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                    raise PlanError(f"resident[{group!r}] {value!r} is not {accepted}")
                idx = set()
                for item in value:
                    if isinstance(item, bool) or not isinstance(item, int):
                        raise PlanError(
                            f"resident[{group!r}] entry {item!r} is not a layer index 0..{n - 1}"
                        )
                    if not 0 <= item < n:
                        raise PlanError(
                            f"resident[{group!r}] entry {item!r} is out of range: "
                            f"group {group!r} has layers 0..{n - 1}"
                        )
                    if item in idx:
                        raise PlanError(f"resident[{group!r}] lists layer {item} twice")
                    idx.add(item)
                out[group] = (idx, f"listed ({len(idx)} of {n})")
            elif k > n:
                raise PlanError(
                    f"resident[{group!r}] {value!r} is more than the group's {n} layers; "
                    f"expected 0..{n}"
                )
            else:
                out[group] = place(n, k)
        return out

    sizes = {g.name: g.num_layers for g in spec.groups}
    biggest = max(sizes.values())
    k = _count_of(resident, biggest, "resident")
    if k is not None:
        if isinstance(resident, float) and resident > 0:
            # a fraction applies to each group's own size
            return {g: place(n, int(round(resident * n))) for g, n in sizes.items()}
        if k > biggest:
            raise PlanError(
                f"resident {resident!r} is more than the {biggest} layers of the largest group "
                f"({', '.join(f'{g}: {n}' for g, n in sizes.items())}); expected a count 0..{biggest}"
            )
        # a count applies to each group, capped at the group's size
        return {g: place(n, min(k, n)) for g, n in sizes.items()}
    if isinstance(resident, (str, bytes)) or not isinstance(resident, Iterable):
        raise PlanError(f"resident {resident!r} is not {accepted}")
    chosen: dict[str, set[int]] = {g: set() for g in sizes}
    for item in resident:
        group, index = _layer_id(item, spec, "resident")
        if index in chosen[group]:
            raise PlanError(f"resident lists layer {group}.{index} twice")
        chosen[group].add(index)
    return {g: (idx, f"listed ({len(idx)} of {sizes[g]})" if idx else "") for g, idx in chosen.items()}


# -- ordering policies ---------------------------------------------------------------------------
def _spread(m: int) -> list[int]:
    """0..m-1 so that every prefix is spread evenly (van der Corput order)."""
    out: list[int] = []
    seen: set[int] = set()
    i = 0
    while len(out) < m:
        # radical inverse of i in base 2, as a fraction num / den
        num, den, x = 0, 1, i
        while x:
            num, den, x = num * 2 + (x & 1), den * 2, x >> 1
        pos = num * m // den
        if pos not in seen:
            seen.add(pos)
            out.append(pos)
        i += 1
    return out


def _streamed_order(
    spec: ModelSpec, init_order: list[str], streamed: dict[str, list[int]], order: Any,
    byte_of: dict[tuple[str, int], int],
) -> list[tuple[str, int]]:
    """The order in which streamed layers are offered pins."""
    default = [(g, i) for g in init_order for i in streamed[g]]
    if isinstance(order, str):
        _check_choice(order, "order", ORDERS, " or an explicit list of layer ids such as [3, 1] "
                      "or ['blocks.3']")
        if order == "execution":
            return default
        if order == "reverse":
            return [(g, i) for g in init_order for i in reversed(streamed[g])]
        if order == "largest":
            # sorted() is stable: ties keep group init order then index order
            return sorted(default, key=lambda key: -byte_of[key])
        return [(g, streamed[g][p]) for g in init_order for p in _spread(len(streamed[g]))]
    if not isinstance(order, (list, tuple)):
        raise PlanError(
            f"order {order!r} is not one of {', '.join(map(repr, ORDERS))} or a list of layer ids "
            f"such as [3, 1] or ['blocks.3']"
        )
    listed: list[tuple[str, int]] = []
    streamed_sets = {g: set(v) for g, v in streamed.items()}
    for item in order:
        key = _layer_id(item, spec, "order")
        if key in listed:
            raise PlanError(f"order lists layer {key[0]}.{key[1]} twice")
        if key[1] not in streamed_sets[key[0]]:
            raise PlanError(
                f"order lists layer {key[0]}.{key[1]}, which is resident; list only streamed "
                f"layers (resident layers are granted after them, in index order)"
            )
        listed.append(key)
    taken = set(listed)
    # unlisted streamed layers follow in execution order, so a partial list is enough
    return listed + [key for key in default if key not in taken]


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
class _Unit:
    """One component being planned: its spec, rows and grant order."""

    name: str
    spec: ModelSpec
    tier: str | None
    prefetch: int
    params: dict[str, Any]
    init_order: list[str]
    rows: list[_Row]  # in spec order
    grant_order: list[_Row]


def _build_unit(
    name: str, spec: ModelSpec, resident: Any, residency: str, order: Any, prefetch: int,
    tier: Any,
) -> _Unit:
    if not isinstance(spec, ModelSpec):
        raise PlanError(f"spec {spec!r} is not a ModelSpec; build one with spec_of(), "
                        f"ModelSpec.from_safetensors() or catalog.load()")
    if not spec.groups:
        raise PlanError(f"spec {spec.name!r} has no layer group; the planner needs at least one")
    _check_choice(residency, "residency", RESIDENCIES)
    prefetch = _check_prefetch(prefetch)
    tier = _check_tier(tier)
    sets = _resident_sets(spec, resident, residency)
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
    s_order = _streamed_order(spec, init_order, streamed, order, byte_of)
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
        "resident": _jsonable(resident), "residency": residency, "order": _jsonable(order),
        "prefetch": prefetch, "tier": tier,
    }
    return _Unit(name, spec, tier, prefetch, params, init_order, rows, grant)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    return value


@dataclass
class _Outcome:
    """What one unit got: the budget and headroom left at its turn, its pins and new bytes."""

    budget: int
    headroom: int
    pinned: int
    net: int
    fits: bool


def _grant(unit: _Unit, left: int, rank: int) -> int:
    """First-fit pin grants down the unit's grant order; returns the last rank used."""
    forced = unit.tier
    note = f"; tier {forced!r} forced" if forced else ""
    for row in unit.grant_order:
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
            if forced in ("pageable", "mapped"):
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
        else:
            # first fit: keep walking, a later, smaller layer may still fit what is left
            row.tier = "pageable"
            row.reason = (f"pageable: {format_bytes(row.bytes)} > {format_bytes(left)} left "
                          f"of the pin budget{note}")
    return rank


def _fit(unit: _Unit, headroom: int) -> tuple[int, str | None]:
    """Demote, then give back, until the unit's new anonymous bytes fit ``headroom``.

    Returns ``(net new bytes, why it does not fit or None)``.
    """
    order = unit.grant_order
    net = sum(r.cost for r in order)
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
    # 2. then pins, from the tail of the pin order; giving back a pin of anonymous originals
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


def _solve(units: list[_Unit], budget: int, headroom: int) -> tuple[list[_Outcome], list[str]]:
    """Plan units in rank order, each against the budget and headroom the ones before left.

    Higher-ranked components keep what they were granted: a lower-ranked component demotes its
    own copies and gives back its own pins first. Rows are updated in place.
    """
    messages: list[str] = []
    outcomes: list[_Outcome] = []
    rank = 0
    for unit in units:
        rank = _grant(unit, budget, rank)
        net, why = _fit(unit, headroom)
        pinned = sum(r.bytes for r in unit.rows if r.pin_rank is not None)
        outcomes.append(_Outcome(budget, headroom, pinned, net, why is None))
        budget -= pinned
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
        return bool(self.ledger["fits"])

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
        _check_choice(strategy, "strategy", STRATEGIES)
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
        """The layers with sizes formatted, for printing in a notebook or a terminal."""
        df = self.layers
        return pd.DataFrame({
            "group": df["group"], "layer": df["layer"], "tier": df["tier"],
            "size": [format_bytes(b) for b in df["bytes"]],
            "mapped": [format_bytes(b) for b in df["mapped_bytes"]],
            "streamed": df["streamed"],
            "pin rank": ["" if pd.isna(r) else str(int(r)) for r in df["pin_rank"]],
            "reason": df["reason"],
        })

    def summary(self) -> str:
        t = self.tier_counts
        led = self.ledger
        tiers = ", ".join(f"{n} {k}" for k, n in t.items() if n)
        fit = "fits" if led["fits"] else "DOES NOT FIT"
        return (f"{len(self.layers)} layers: {tiers}; pinned {format_bytes(led['pinned_bytes'])} "
                f"of budget {format_bytes(led['budget'])}; net new anonymous "
                f"{format_bytes(led['net_anonymous_bytes'])}; {fit}")

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
        return cls.from_dict(json.loads(text))


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (bool(v) if isinstance(v, bool) else int(v) if isinstance(v, int) else v)
            for k, v in d.items()}


def _layers_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=LAYER_COLUMNS)
    return df.astype({
        "group": "object", "layer": "int64", "tier": "object", "bytes": "int64",
        "mapped_bytes": "int64", "streamed": "bool", "pin_rank": "Int64", "reason": "object",
    }).reset_index(drop=True)


def _resolve_host(host: Any) -> HostMemory:
    if host is None:
        return HostMemory.probe()
    if isinstance(host, HostMemory):
        return host
    if isinstance(host, dict):
        return HostMemory.from_dict(host)
    if isinstance(host, (int, float, str)) and not isinstance(host, bool):
        # "64GiB" is shorthand for a hypothetical host with that much available
        try:
            return HostMemory(available=host)
        except SizeError as e:
            raise PlanSizeError(f"host: {e}") from None
    raise PlanError(
        f"host {host!r} is not a HostMemory; expected None (probe this machine), a HostMemory, "
        f"its to_dict(), or an available size such as '64GiB'"
    )


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
    return {
        "available": host.available, "reserve": host.reserve, "spendable": host.spendable,
        "budget": out.budget, "pinned_bytes": out.pinned, "net_anonymous_bytes": out.net,
        "fits": out.fits, "headroom": out.headroom,
    }


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
    host: HostMemory | dict | str | int | None = None,
) -> Plan:
    """Plan where each layer of ``spec`` lives between uses (the rules are in the module doc).

    - ``pin_budget``: bytes or a size string; ``None`` = everything the host can spend. The
      budget used is ``min(pin_budget, host.spendable)``.
    - ``resident``: layers kept on the device — a count (applied to each group, capped at its
      size; an error when larger than every group), a fraction in (0, 1] of each group (1.0 = all), layer
      ids (``[0, 1]`` for single-group models, ``["blocks.0"]``), or ``{group: any of those}``.
    - ``residency``: ``"leading"`` (first k) or ``"strided"`` (the streamed layers spread evenly).
    - ``order``: who gets pins first among streamed layers — ``"execution"``, ``"reverse"``,
      ``"largest"``, ``"strided"`` (every prefix spread evenly over the group), or an explicit
      list of layer ids (unlisted streamed layers follow in execution order). Groups are taken
      in init order (largest first); ``largest`` and explicit lists order across groups.
    - ``prefetch``: streamed layers in flight ahead of the running one (0 = load at use).
    - ``tier``: force every streamed layer to ``"pinned"`` | ``"pageable"`` | ``"mapped"``; still
      subject to the budget and the fit check (layers that cannot take it say why, and a
      :class:`PlanWarning` counts them). With a forced ``pageable`` or ``mapped`` tier resident
      layers' host copies are not pinned either.
    - ``host``: a :class:`HostMemory` (``None`` probes this machine; ``"64GiB"`` is a
      hypothetical host with that much available).

    >>> from offload_lab import catalog
    >>> p = plan(catalog.load("minimax-h3"), resident=35, residency="strided",
    ...          host=HostMemory(available="64GiB"))
    >>> p.streamed_layers("blocks")[:4], p.reason_of("blocks", 0).split(";")[0]
    ([1, 5, 8, 11], 'resident: strided 35 of 50')
    """
    unit = _build_unit(spec.name if isinstance(spec, ModelSpec) else "spec", spec, resident,
                       residency, order, prefetch, tier)
    host = _resolve_host(host)
    budget, user, capped = _budget(host, pin_budget)
    _check_forced_pinned(unit, budget)
    (out,), msgs = _solve([unit], budget, host.headroom)
    msgs = capped + msgs
    ledger = _ledger(host, out)
    params = {"pin_budget": user, **unit.params}
    _emit(msgs)
    return _finish(unit, ledger, params, msgs, host)


def pinned_footprint(p: Plan | PipelinePlan, rounding: str = "exact") -> int:
    """Host bytes the plan's pins really lock: ``"exact"`` (offload-lab allocates each store at
    its size) or ``"pow2"`` (a caching allocator rounding each layer's store — one allocation
    per layer, as the runtime makes it — up to a power of two).

    >>> from offload_lab import catalog
    >>> p = plan(catalog.load("minimax-h3"), pin_budget="41.22GiB", host=HostMemory(available="64GiB"))
    >>> pinned_footprint(p) == p.ledger["pinned_bytes"], pinned_footprint(p, "pow2") // 2**30
    (True, 68)
    """
    if isinstance(p, PipelinePlan):
        return sum(pinned_footprint(c, rounding) for c in p.components.values())
    rounded_size(0, rounding)  # names the accepted modes on a bad one
    df = p.layers
    return sum(rounded_size(int(b), rounding) for b in df.loc[df["pin_rank"].notna(), "bytes"])


# -- pipelines -------------------------------------------------------------------------------------
@dataclass
class Component:
    """A model in a pipeline with its forward passes per request (``uses``) and plan options.

    >>> from offload_lab import catalog
    >>> Component("dit", catalog.load("wan2.1-t2v-1.3b"), uses=100).uses
    100
    """

    name: str
    spec: ModelSpec
    uses: int = 1
    resident: Any = 0
    residency: str = "leading"
    order: Any = "execution"
    prefetch: int = 1
    tier: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PlanError(f"component name {self.name!r} must be a non-empty string")
        if isinstance(self.uses, bool) or not isinstance(self.uses, int) or self.uses < 1:
            raise PlanError(
                f"component {self.name!r} uses {self.uses!r}; expected an int ≥ 1 (forward "
                f"passes per request: steps × guidance passes for a DiT, 1 for an encoder)"
            )

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
            "ledger": _plain(self.ledger), "warnings": list(self.warnings),
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
    components: Sequence[Component], host: HostMemory | dict | str | int | None = None,
    pin_budget: int | str | None = None,
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

    >>> from offload_lab import catalog
    >>> pp = plan_pipeline([Component("enc", catalog.load("wan2.1-t2v-1.3b"), uses=1),
    ...                     Component("dit", catalog.load("wan2.1-t2v-14b"), uses=100)],
    ...                    host=HostMemory(available="64GiB"), pin_budget="28GiB")
    >>> list(pp.components), pp["dit"].tier_counts["pinned"], pp["enc"].tier_counts["pinned"]
    (['dit', 'enc'], 40, 21)
    """
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
    units = [
        _build_unit(c.name, c.spec, c.resident, c.residency, c.order, c.prefetch, c.tier)
        for c in ranked
    ]
    host = _resolve_host(host)
    budget, user, capped = _budget(host, pin_budget)
    for u in units:
        _check_forced_pinned(u, budget)
    outcomes, msgs = _solve(units, budget, host.headroom)
    msgs = capped + msgs
    plans: dict[str, Plan] = {}
    rows = []
    for i, (c, u, out) in enumerate(zip(ranked, units, outcomes), start=1):
        params = {"pin_budget": user, **u.params, "component": c.name, "uses": c.uses,
                  "rank": i}
        plans[c.name] = _finish(u, _ledger(host, out), params, msgs, host)
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
    }
    _emit(msgs)
    return PipelinePlan(plans, pd.DataFrame(rows, columns=_RANK_COLUMNS), ledger, msgs, host)
