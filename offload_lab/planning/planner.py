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

from collections.abc import Sequence
from typing import Any

from offload_lab.model.spec import ModelSpec
from offload_lab.planning.device import parse_device_memory
from offload_lab.planning.errors import PlanError, PlanSizeError, PlanWarning
from offload_lab.planning.grants import STORE_ALIGNMENT, build_unit, solve, store_bytes
from offload_lab.planning.hostmem import HostMemory, rounded_size
from offload_lab.planning.options import FORCED_TIERS, ORDERS, RESIDENCIES, STRATEGIES, TIERS

# moved to offload_lab.planning.pipeline, still importable from here
from offload_lab.planning.pipeline import Component, PipelinePlan, plan_pipeline  # noqa: F401
from offload_lab.planning.solver import (
    Plan,
    add_device,
    budget_of,
    check_forced_pinned,
    emit_warnings,
    finish_plan,
    ledger_of,
    resolve_plan_host,
)

__all__ = [
    "TIERS", "FORCED_TIERS", "ORDERS", "RESIDENCIES", "STRATEGIES", "STORE_ALIGNMENT",
    "Plan", "PlanError", "PlanSizeError", "PlanWarning", "plan", "store_bytes", "pinned_footprint",
    "resolve_plan_host",
]

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
    unit = build_unit(spec.name if isinstance(spec, ModelSpec) else "spec", spec, resident,
                       residency, order, prefetch, tier, staging)
    device_memory = parse_device_memory(device_memory)
    host = resolve_plan_host(host)
    budget, user, capped = budget_of(host, pin_budget)
    check_forced_pinned(unit, budget)
    (out,), msgs = solve([unit], budget, host.headroom)
    msgs = capped + msgs
    ledger = ledger_of(host, out)
    params = {"pin_budget": user, **unit.params}
    if device_memory is not None:
        params["device_memory"] = device_memory
    if tokens is not None:
        params["tokens"] = tokens
    p = finish_plan(unit, ledger, params, msgs, host)
    add_device(p, tokens, device_memory)  # appends its warning to p.warnings
    emit_warnings(p.warnings)
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
    if isinstance(p, PipelinePlan):
        return sum(pinned_footprint(c, rounding) for c in p.components.values())
    rounded_size(0, rounding)  # names the accepted modes on a bad one
    df = p.layers
    return sum(rounded_size(int(b), rounding) for b in df.loc[df["pin_rank"].notna(), "bytes"])
