"""A plan as the engine needs it: checked against its spec, one record per layer with its times."""

from __future__ import annotations

from dataclasses import dataclass

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


def _frame_plan(spec: ModelSpec, plan: Plan) -> tuple[pd.DataFrame, dict[str, list[int]], dict[str, int]]:
    """Check ``plan`` against ``spec``; return its layers, streamed order and prefetch per group."""
    layers = plan.layers
    spec_groups = [g.name for g in spec.groups]
    plan_groups = list(dict.fromkeys(layers["group"].astype(str)))
    if set(plan_groups) != set(spec_groups):
        raise SimError(f"plan does not match spec {spec.name!r}: plan groups {plan_groups}, "
                       f"spec groups {spec_groups}; make the plan with plan(spec, ...) for this spec")
    if plan.spec.name != spec.name:
        raise SimError(f"plan was made for spec {plan.spec.name!r}, not {spec.name!r}")
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
            if got != layer.bytes and got != store_bytes(layer)[0]:
                raise SimError(f"plan does not match spec {spec.name!r}: layer {layer.name} has "
                               f"{got} bytes in the plan and {layer.bytes} in the spec")
    bad = sorted(set(layers["tier"].astype(str)) - {"resident", "pinned", "staged", "pageable", "mapped"})
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
        warm = cold = stage = 0.0
        if is_streamed and tier == "staged":
            try:
                stage = profile.stage_seconds(nbytes, stage_threads)
            except ProfileError as e:
                raise ProfileError(f"{e}; the plan stages {g}.{i}") from None
        if is_streamed:
            try:
                warm = profile.copy_seconds(tier, nbytes, mb)
                cold = profile.copy_seconds(tier, nbytes, mb, cold=True)
            except ProfileError as e:
                raise ProfileError(f"{e}; the plan streams {g}.{i} from tier {tier!r}") from None
        compute = profile.compute_seconds(spec, g, i, tokens)
        info[(g, i)] = Layer(g, i, tier, nbytes, mb, is_streamed, compute, warm, cold, profile.blocks_host(tier),
                              lid=len(info), stage=stage, floor=min(profile.curve_floor(g), compute))
    return layers, streamed, prefetch, info, used_tiers

