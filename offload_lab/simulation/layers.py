"""A plan as the engine needs it: checked against its spec, one record per layer with its times."""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

import pandas as pd

from offload_lab.model.spec import ModelSpec
from offload_lab.planning.planner import Plan, store_bytes
from offload_lab.simulation.errors import ProfileError, SimError
from offload_lab.simulation.profile import DeviceProfile


@dataclass
class Layer:
    """One layer as the engine reads it: its tier, bytes and times on the profile."""

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
    lid: int = -1
    stage: float = 0.0  # staged: the host memcpy into a staging buffer
    floor: float = 0.0  # the part of ``compute`` that is the curve's launch floor


#: how many (spec, profile, tokens) preparations are kept: the dashboard simulates the same
#: spec on one or two profiles again and again, with a new plan each time
_CACHE_SIZE = 16
_spec_cache: OrderedDict[int, tuple[Any, dict[tuple[str, int], tuple[str, int, int, int]]]] = OrderedDict()
_compute_cache: OrderedDict[tuple, tuple[Any, Any, dict[tuple[str, int], tuple[float, float]]]] = OrderedDict()


def _remember(cache: OrderedDict, key: Any, value: Any) -> Any:
    cache[key] = value
    if len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return value


def _spec_facts(spec: ModelSpec) -> dict[tuple[str, int], tuple[str, int, int, int]]:
    """Per layer of ``spec``: its name, bytes, packed-store bytes and mapped bytes, kept per spec
    object (the entry holds the spec, so its id is not reused while it is cached)."""
    hit = _spec_cache.get(id(spec))
    if hit is not None and hit[0] is spec:
        _spec_cache.move_to_end(id(spec))
        return hit[1]
    facts = {(layer.group, layer.index): (layer.name, layer.bytes, store_bytes(layer)[0], layer.mapped_bytes)
             for layer in spec.iter_layers()}
    return _remember(_spec_cache, id(spec), (spec, facts))[1]


def _layer_compute(spec: ModelSpec, profile: DeviceProfile, tokens: int | str | None) -> dict[tuple[str, int], tuple[float, float]]:
    """Per layer, ``(compute seconds, curve floor)`` on ``profile`` at ``tokens``, kept per spec
    object and per value of what those read on the profile (a profile changed in place is a
    new key)."""
    key = (id(spec), type(profile), repr(profile.compute_s), repr(profile.compute_curve), profile.tflops,
           profile.tokens, tokens if isinstance(tokens, (int, str, type(None))) else repr(tokens))
    hit = _compute_cache.get(key)
    if hit is not None and hit[0] is spec:
        _compute_cache.move_to_end(key)
        return hit[2]
    out = {}
    for g in spec.groups:
        floor = profile.curve_floor(g.name)
        for layer in g.layers:
            c = profile.compute_seconds(spec, g.name, layer.index, tokens)
            out[(g.name, layer.index)] = (c, min(floor, c))
    return _remember(_compute_cache, key, (spec, profile, out))[2]


def _frame_plan(spec: ModelSpec, plan: Plan) -> tuple[pd.DataFrame, dict[str, list[int]], dict[str, int]]:
    """Check ``plan`` against ``spec``; return its layers, streamed order and prefetch per group."""
    layers = plan.layers
    spec_groups = [g.name for g in spec.groups]
    groups = [str(g) for g in layers["group"].tolist()]
    plan_groups = list(dict.fromkeys(groups))
    if set(plan_groups) != set(spec_groups):
        raise SimError(f"plan does not match spec {spec.name!r}: plan groups {plan_groups}, "
                       f"spec groups {spec_groups}; make the plan with plan(spec, ...) for this spec")
    if plan.spec.name != spec.name:
        raise SimError(f"plan was made for spec {plan.spec.name!r}, not {spec.name!r}")
    by_key = {(g, int(i)): int(b) for g, i, b in zip(groups, layers["layer"].tolist(), layers["bytes"].tolist())}
    counts = Counter(groups)
    facts = _spec_facts(spec)
    for g in spec.groups:
        n_plan = counts.get(g.name, 0)
        if n_plan != g.num_layers:
            raise SimError(f"plan does not match spec {spec.name!r}: group {g.name!r} has "
                           f"{n_plan} layers in the plan and {g.num_layers} in the spec")
    for key, (name, nbytes, packed, _) in facts.items():
        got = by_key.get(key)
        if got is None:
            raise SimError(f"plan does not match spec {spec.name!r}: layer {name} is not in the plan")
        # the planner counts packed-store bytes (tensor slices aligned); either count is fine
        if got != nbytes and got != packed:
            raise SimError(f"plan does not match spec {spec.name!r}: layer {name} has "
                           f"{got} bytes in the plan and {nbytes} in the spec")
    bad = sorted(set(str(t) for t in layers["tier"].tolist()) - {"resident", "pinned", "staged", "pageable", "mapped"})
    if bad:
        raise SimError(f"plan has tier(s) {bad}; accepted: resident, pinned, staged, pageable, mapped")
    streamed = {g: [int(i) for i in plan.streamed_layers(g)] for g in spec_groups}
    pf = plan.prefetch
    prefetch = {g: int(pf[g] if isinstance(pf, dict) else pf) for g in spec_groups}
    for g, p in prefetch.items():
        if p < 0:
            raise SimError(f"plan prefetch {p!r} for group {g!r}; accepted: an int >= 0")
    return layers, streamed, prefetch


def prepare(spec: ModelSpec, plan: Plan, profile: DeviceProfile, tokens: int | str | None,
            stage_threads: int = 1) -> tuple[pd.DataFrame, dict[str, list[int]], dict[str, int],
                                             dict[tuple[str, int], Layer], set[str]]:
    """``(layers frame, streamed indices per group, prefetch per group, Layer per (group, index),
    the tiers the plan copies from)``: the plan checked against its spec and timed on ``profile``."""
    layers, streamed, prefetch = _frame_plan(spec, plan)
    info: dict[tuple[str, int], Layer] = {}
    # a copy moves the bytes the plan counts: the runtime packs each tensor slice on the
    # planner's alignment and copies (and records) the whole store, so a simulated run's
    # bytes are a measured run's
    facts = _spec_facts(spec)
    compute_of = _layer_compute(spec, profile, tokens)
    n = len(layers)
    mapped_col = layers["mapped_bytes"].tolist() if "mapped_bytes" in layers.columns else [None] * n
    used_tiers = set()
    blocks = {t: profile.blocks_host(t) for t in ("resident", "pinned", "staged", "pageable", "mapped")}
    for g, i, tier, nbytes, mb, is_streamed in zip(
            layers["group"].tolist(), layers["layer"].tolist(), layers["tier"].tolist(), layers["bytes"].tolist(),
            mapped_col, layers["streamed"].tolist()):
        g, i, tier, nbytes, is_streamed = str(g), int(i), str(tier), int(nbytes), bool(is_streamed)
        mb = int(mb) if mb is not None else facts[(g, i)][3]
        if is_streamed and tier == "resident":
            raise SimError(f"plan marks {g}.{i} streamed but tier 'resident'")
        if not is_streamed and tier != "resident":
            raise SimError(f"plan marks {g}.{i} not streamed but tier {tier!r}")
        if is_streamed:
            used_tiers.add(tier)
        warm = cold = stage = 0.0
        if is_streamed and tier == "staged":
            try:
                stage = profile.stage_seconds(nbytes, stage_threads)
            except ProfileError as e:
                raise ProfileError(f"{e}; the plan stages {g}.{i}") from None
        if is_streamed:
            try:
                warm = profile.copy_seconds(tier, nbytes, mb)
                cold = profile.copy_seconds(tier, nbytes, mb, cold=True) if tier == "mapped" else warm
            except ProfileError as e:
                raise ProfileError(f"{e}; the plan streams {g}.{i} from tier {tier!r}") from None
        compute, floor = compute_of[(g, i)]
        info[(g, i)] = Layer(g, i, tier, nbytes, mb, is_streamed, compute, warm, cold, blocks[tier],
                              lid=len(info), stage=stage, floor=floor)
    return layers, streamed, prefetch, info, used_tiers
