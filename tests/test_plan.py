"""The planner: each of its rules (module doc of offload_lab.planning.planner) has a test that fails without it."""

from __future__ import annotations

import json
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offload_lab import catalog
from offload_lab.model.spec import GroupSpec, LayerSpec, ModelSpec, TensorSpec
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.pipeline import Component, PipelinePlan, plan_pipeline
from offload_lab.planning.planner import (
    ORDERS,
    STORE_ALIGNMENT,
    TIERS,
    Plan,
    PlanError,
    PlanWarning,
    pinned_footprint,
    plan,
    store_bytes,
)
from offload_lab.units import SizeError

KiB, MiB, GiB = 2**10, 2**20, 2**30
H3_BLOCK = 1_291_143_680
H3_BLOCK_MAPPED = H3_BLOCK - 231_211_008  # every tensor but the fused QKV is a checkpoint view


# -- helpers ------------------------------------------------------------------------------------
def make_layer(group: str, index: int, nbytes: int, mapped: int = 0) -> LayerSpec:
    """A layer of ``nbytes`` whose first ``mapped`` bytes are checkpoint views."""
    tensors = []
    if mapped:
        tensors.append(TensorSpec(f"{group}.{index}.view", (mapped,), "uint8", mapped=True))
    if nbytes - mapped:
        tensors.append(TensorSpec(f"{group}.{index}.anon", (nbytes - mapped,), "uint8"))
    return LayerSpec(group, index, tensors)


def make_spec(sizes=None, *, groups=None, mapped=0.0, non_layer=0, name="toy") -> ModelSpec:
    """Groups of layers of given bytes; ``mapped`` is a fraction of each layer, or per-group lists.

    >>> make_spec([4 * MiB, 2 * MiB], mapped=1.0).layers["mapped_bytes"].tolist()
    [4194304, 2097152]
    """
    groups = groups if groups is not None else {"blocks": sizes}
    out = []
    for g, layer_sizes in groups.items():
        layers = []
        for i, b in enumerate(layer_sizes):
            m = mapped[g][i] if isinstance(mapped, dict) else int(b * mapped) // 256 * 256
            layers.append(make_layer(g, i, b, m))
        out.append(GroupSpec(g, layers))
    nl = [TensorSpec("head.weight", (non_layer,), "uint8")] if non_layer else []
    return ModelSpec(name, out, nl)


def host_with(headroom: int, pinned: int = 0) -> HostMemory:
    """A host with exactly ``headroom`` bytes of available − reserve − pinned (reserve 2 GiB)."""
    h = HostMemory(available=headroom + 2 * GiB + pinned, pinned_bytes=pinned)
    assert h.reserve == 2 * GiB and h.headroom == headroom
    return h


BIG = host_with(30 * GiB)  # room for any toy plan's anonymous bytes


def tiers(p: Plan, group: str = "blocks") -> list[str]:
    return p.layers[p.layers["group"] == group]["tier"].tolist()


def pinned_set(p: Plan, group: str = "blocks") -> set[int]:
    df = p.layers
    return set(df[(df["group"] == group) & df["pin_rank"].notna()]["layer"].tolist())


def quiet(*args, **kwargs) -> Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        return plan(*args, **kwargs)


@pytest.fixture(scope="module")
def h3() -> ModelSpec:
    return catalog.load("minimax-h3")


@pytest.fixture(scope="module")
def wan14() -> ModelSpec:
    return catalog.load("wan2.1-t2v-14b")


# -- 1. per-layer bytes ----------------------------------------------------------------------------
def test_per_layer_bytes_and_mapped_bytes_come_from_the_spec():
    spec = make_spec([4 * MiB, 2 * MiB], mapped={"blocks": [3 * MiB, 0]})
    p = plan(spec, host=BIG)
    assert p.layers["bytes"].tolist() == [4 * MiB, 2 * MiB]
    assert p.layers["mapped_bytes"].tolist() == [3 * MiB, 0]


def test_store_slices_are_aligned_in_the_packed_store():
    layer = LayerSpec("blocks", 0, [
        TensorSpec("blocks.0.a", (10,), "bfloat16", mapped=True),  # 20 B -> one aligned slice
        TensorSpec("blocks.0.b", (STORE_ALIGNMENT,), "uint8"),
    ])
    assert store_bytes(layer) == (2 * STORE_ALIGNMENT, STORE_ALIGNMENT)


def test_h3_layer_bytes_match_the_reference(h3):
    p = plan(h3, host=HostMemory(available="128GiB"))
    blocks = p.layers[p.layers["group"] == "blocks"]
    assert set(blocks["bytes"]) == {H3_BLOCK}
    assert set(blocks["mapped_bytes"]) == {H3_BLOCK_MAPPED}
    ref = p.layers[p.layers["group"] == "token_refiner.blocks"]
    assert set(ref["bytes"]) == {770_725_376}


# -- 2. budget = min(user budget, spendable) --------------------------------------------------------
def test_budget_is_the_user_budget_when_smaller():
    p = plan(make_spec([MiB] * 4), pin_budget="2MiB", host=BIG)
    assert p.ledger["budget"] == 2 * MiB
    assert pinned_set(p) == {0, 1}
    assert p.params["pin_budget"] == 2 * MiB


def test_budget_is_capped_at_spendable_and_says_so():
    spec = make_spec([MiB] * 4)
    host = host_with(3 * MiB)
    with pytest.warns(PlanWarning, match=r"pin_budget 1.00 GiB is more than the host can spend"):
        p = plan(spec, pin_budget="1GiB", host=host)
    assert p.ledger["budget"] == host.spendable == 3 * MiB
    assert pinned_set(p) == {0, 1, 2}


def test_no_budget_means_everything_spendable_minus_already_pinned():
    host = host_with(3 * MiB, pinned=GiB)
    p = plan(make_spec([MiB] * 4), host=host)
    assert p.ledger["budget"] == p.ledger["spendable"] == 3 * MiB


def test_host_shorthand_and_probe():
    p = plan(make_spec([MiB] * 2), host="64GiB")
    assert p.host.available == 64 * GiB and p.host.source == "hypothetical"
    probed = plan(make_spec([MiB] * 2))  # host=None probes this machine
    assert probed.host.source == "probe"


# -- 3. grant order: streamed before resident ------------------------------------------------------
def test_streamed_layers_get_pins_before_resident_ones():
    # layer 0 is resident and comes first in execution, but it only moves once per stage
    p = plan(make_spec([MiB] * 3), pin_budget="1MiB", resident=1, host=BIG)
    assert p.tier_of("blocks", 0) == "resident"
    assert pinned_set(p) == {1}
    assert p.grant_order == ["blocks.1", "blocks.2", "blocks.0"]


def test_resident_layers_get_host_copy_pins_from_what_is_left():
    p = plan(make_spec([MiB] * 3), pin_budget="3MiB", resident=1, host=BIG)
    assert p.layers["pin_rank"].tolist() == [3, 1, 2]
    assert p.reason_of("blocks", 0) == "resident: leading 1 of 3; host copy pinned, rank 3, 1.00 MiB of 1.00 MiB left"
    assert p.tier_of("blocks", 0) == "resident"


# -- 4. first fit ------------------------------------------------------------------------------------
def test_first_fit_a_later_smaller_layer_is_still_pinned():
    p = plan(make_spec([3 * MiB, 3 * MiB, 1 * MiB]), pin_budget="4MiB", host=BIG)
    assert tiers(p) == ["pinned", "pageable", "pinned"]
    assert p.layers["pin_rank"].tolist()[0] == 1 and p.layers["pin_rank"].tolist()[2] == 2
    assert p.reason_of("blocks", 0) == "pinned: rank 1, 3.00 MiB of 4.00 MiB left"
    assert p.reason_of("blocks", 1) == "pageable: 3.00 MiB > 1.00 MiB left of the pin budget"
    assert p.reason_of("blocks", 2) == "pinned: rank 2, 1.00 MiB of 1.00 MiB left"


# -- ordering policies ----------------------------------------------------------------------------
@pytest.mark.parametrize("order, pinned, grant", [
    ("execution", {0, 1}, [0, 1, 2, 3, 4, 5, 6, 7]),
    ("reverse", {6, 7}, [7, 6, 5, 4, 3, 2, 1, 0]),
    ("strided", {0, 4}, [0, 4, 2, 6, 1, 5, 3, 7]),
    ([3, 1], {1, 3}, [3, 1, 0, 2, 4, 5, 6, 7]),
    (["blocks.5", "6"], {5, 6}, [5, 6, 0, 1, 2, 3, 4, 7]),
])
def test_ordering_policies_choose_who_is_pinned(order, pinned, grant):
    p = plan(make_spec([MiB] * 8), pin_budget="2MiB", order=order, host=BIG)
    assert pinned_set(p) == pinned
    assert p.grant_order == [f"blocks.{i}" for i in grant]
    # order never changes execution: streamed layers are reported in index order
    assert p.streamed_layers("blocks") == list(range(8))


def test_largest_first_policy():
    p = plan(make_spec([MiB, 4 * MiB, 2 * MiB, 4 * MiB]), pin_budget="8MiB", order="largest", host=BIG)
    assert p.grant_order == ["blocks.1", "blocks.3", "blocks.2", "blocks.0"]
    assert pinned_set(p) == {1, 3}


def test_strided_policy_spreads_pins_over_the_streamed_layers():
    p = plan(make_spec([MiB] * 10), pin_budget="3MiB", order="strided", host=BIG)
    assert pinned_set(p) == {0, 5, 2}


def test_groups_are_granted_in_init_order_largest_first():
    spec = make_spec(groups={"small": [MiB] * 2, "big": [2 * MiB] * 3})
    p = plan(spec, pin_budget="4MiB", host=BIG)
    assert p.init_order == ["big", "small"]
    assert p.grant_order[:3] == ["big.0", "big.1", "big.2"]
    assert pinned_set(p, "big") == {0, 1} and pinned_set(p, "small") == set()


def test_explicit_order_crosses_groups():
    spec = make_spec(groups={"small": [MiB] * 2, "big": [2 * MiB] * 3})
    p = plan(spec, pin_budget="3MiB", order=["small.1", "big.2"], host=BIG)
    assert p.grant_order[:2] == ["small.1", "big.2"]
    assert pinned_set(p, "small") == {1} and pinned_set(p, "big") == {2}


# -- 5. net anonymous cost -------------------------------------------------------------------------
def test_stores_of_anonymous_originals_are_a_wash():
    # no checkpoint views: pinned and pageable stores replace what is there, so nothing is new
    spec = make_spec([GiB] * 4, mapped=0.0)
    p = quiet(spec, pin_budget="2GiB", host=host_with(512 * MiB))
    assert p.ledger["net_anonymous_bytes"] == 0 and p.ledger["fits"]
    assert tiers(p) == ["pageable"] * 4  # budget capped to 0.5 GiB: no 1 GiB layer fits
    p = plan(spec, host=host_with(3 * GiB))
    assert tiers(p) == ["pinned", "pinned", "pinned", "pageable"]
    assert p.ledger["net_anonymous_bytes"] == 0


def test_only_mapped_bytes_copied_out_are_new():
    spec = make_spec([4 * MiB] * 2, mapped={"blocks": [3 * MiB, 1 * MiB]})
    p = plan(spec, pin_budget="4MiB", host=BIG)
    assert tiers(p) == ["pinned", "pageable"]
    assert p.ledger["net_anonymous_bytes"] == 3 * MiB + 1 * MiB


def test_mapped_tier_costs_nothing():
    spec = make_spec([4 * MiB] * 2, mapped=1.0)
    p = plan(spec, tier="mapped", host=BIG)
    assert tiers(p) == ["mapped", "mapped"]
    assert p.ledger["net_anonymous_bytes"] == 0


# -- demotion to mapped, then give-back from the tail ---------------------------------------------
BLOCK = 64 * MiB


def test_pageable_checkpoint_views_are_demoted_from_the_tail_first():
    # 4 mapped layers, budget for 2 pins, room for 3 layers of new bytes: only the last
    # pageable layer has to go back to its mapping; both pins stay
    spec = make_spec([BLOCK] * 4, mapped=1.0)
    p = plan(spec, pin_budget=2 * BLOCK, host=host_with(3 * BLOCK))
    assert tiers(p) == ["pinned", "pinned", "pageable", "mapped"]
    assert p.reason_of("blocks", 3).startswith("mapped: demoted from pageable, host would exceed available − reserve")
    assert p.ledger["net_anonymous_bytes"] == 3 * BLOCK and p.ledger["fits"]


def test_in_one_plan_the_budget_cap_keeps_pins_within_the_host():
    # the upstream scenario: a budget for two pins, a host with room for 1.5 layers; the budget
    # is capped at what the host can spend, so one pin is granted and the rest stay mapped
    spec = make_spec([BLOCK] * 4, mapped=1.0)
    p = quiet(spec, pin_budget=2 * BLOCK, host=host_with(int(1.5 * BLOCK)))
    assert tiers(p) == ["pinned", "mapped", "mapped", "mapped"]
    assert p.ledger["budget"] == int(1.5 * BLOCK) and p.ledger["fits"]


def test_demotion_then_give_back_from_the_tail_of_the_pin_order():
    # the DiT's one layer is larger than the budget, so it is a pageable copy taking 2 blocks of
    # the 3.5 the host has; the encoder is then granted 3 pins from the untouched budget, but
    # only 1.5 blocks of host are left: it demotes its pageable layer, then gives back its pins
    # from the tail (layer 2, then layer 1) until it fits
    dit = make_spec([4 * BLOCK], mapped=0.5, name="dit")
    enc = make_spec([BLOCK] * 4, mapped=1.0, name="enc")
    pp = plan_pipeline([Component("enc", enc), Component("dit", dit, uses=100)],
                       host=host_with(int(3.5 * BLOCK)))
    assert tiers(pp["dit"]) == ["pageable"]  # the higher-ranked plan is never changed
    assert tiers(pp["enc"]) == ["pinned", "mapped", "mapped", "mapped"]
    over = "host would exceed available − reserve (96.00 MiB spendable)"
    assert pp["enc"].reason_of("blocks", 3) == f"mapped: demoted from pageable, {over}"
    assert pp["enc"].reason_of("blocks", 2) == f"mapped: pin given back, {over}"
    assert pp["enc"].reason_of("blocks", 1) == f"mapped: pin given back, {over}"
    assert pp["enc"].ledger["headroom"] == int(1.5 * BLOCK)
    assert pp["enc"].ledger["net_anonymous_bytes"] == BLOCK
    assert pp.ledger["fits"] and pp.ledger["net_anonymous_bytes"] == 3 * BLOCK


def test_give_back_follows_pin_order_not_index_order():
    dit = make_spec([4 * BLOCK], mapped=0.5, name="dit")
    enc = make_spec([BLOCK] * 4, mapped=1.0, name="enc")
    pp = plan_pipeline([Component("enc", enc, order="reverse"), Component("dit", dit, uses=100)],
                       host=host_with(int(3.5 * BLOCK)))
    assert pinned_set(pp["enc"]) == {3}  # rank 1 (layer 3) kept; ranks 3, 2 given back


def test_pins_of_anonymous_layers_are_kept_since_giving_them_back_saves_nothing():
    dit = make_spec([4 * BLOCK], mapped=0.5, name="dit")
    enc = make_spec([BLOCK] * 3, mapped={"blocks": [BLOCK, BLOCK, 0]}, name="enc")
    pp = plan_pipeline([Component("enc", enc), Component("dit", dit, uses=100)],
                       host=host_with(int(3.5 * BLOCK)))
    # rank 3 (layer 2) is an anonymous original: a wash, kept; ranks 2 and 1 are copies
    assert tiers(pp["enc"]) == ["pinned", "mapped", "pinned"]


def test_partially_mapped_layers_can_be_demoted_to_mapped():
    spec = make_spec([BLOCK] * 2, mapped=0.5)
    p = plan(spec, pin_budget=0, host=host_with(BLOCK // 2))
    assert tiers(p) == ["pageable", "mapped"]
    assert p.ledger["net_anonymous_bytes"] == BLOCK // 2


def test_a_plan_that_still_does_not_fit_says_so_everywhere():
    spec = make_spec([BLOCK] * 3, mapped=0.0)
    host = host_with(-GiB)  # already a GiB inside the reserve: nothing can make it fit
    with pytest.warns(PlanWarning, match=r"plan does not fit the host: the host is already 1.00 GiB inside its reserve"):
        p = plan(spec, host=host)
    assert p.ledger["fits"] is False
    assert all("DOES NOT FIT" in r for r in p.layers["reason"])
    assert p.warnings and "does not fit" in p.warnings[-1]
    assert "DOES NOT FIT" in repr(p)


def test_a_plan_that_fits_emits_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        p = plan(make_spec([BLOCK] * 4, mapped=1.0), pin_budget=2 * BLOCK, host=host_with(3 * BLOCK))
    assert p.warnings == []


# -- residency ---------------------------------------------------------------------------------------
def test_resident_leading_count():
    p = plan(make_spec([MiB] * 5), resident=2, host=BIG)
    assert tiers(p)[:2] == ["resident", "resident"]
    assert p.streamed_layers("blocks") == [2, 3, 4]
    assert p.resident_layers("blocks") == [0, 1]
    assert p.reason_of("blocks", 0).startswith("resident: leading 2 of 5")


def test_resident_strided_spreads_the_streamed_layers():
    p = plan(make_spec([MiB] * 10), resident=5, residency="strided", host=BIG)
    assert p.streamed_layers("blocks") == [1, 3, 5, 7, 9]
    assert p.reason_of("blocks", 0).startswith("resident: strided 5 of 10")


def test_resident_fraction_and_explicit_and_dict():
    spec = make_spec([MiB] * 10)
    assert plan(spec, resident=0.3, host=BIG).resident_layers("blocks") == [0, 1, 2]
    assert plan(spec, resident=[7, "blocks.2"], host=BIG).resident_layers("blocks") == [2, 7]
    assert plan(spec, resident={"blocks": [4]}, host=BIG).resident_layers("blocks") == [4]
    assert plan(spec, resident={"blocks": 2}, residency="strided", host=BIG).resident_layers("blocks") == [2, 7]


def test_resident_count_applies_to_each_group_capped():
    spec = make_spec(groups={"small": [MiB] * 2, "big": [MiB] * 5})
    p = plan(spec, resident=3, host=BIG)
    assert p.resident_layers("small") == [0, 1] and p.resident_layers("big") == [0, 1, 2]
    assert p.reason_of("small", 0).startswith("resident: leading 2 of 2")


def test_h3_operating_point_35_resident_strided(h3):
    p = plan(h3, resident=35, residency="strided", host=HostMemory(available="128GiB"))
    streamed = p.streamed_layers("blocks")
    assert len(streamed) == 15
    gaps = {b - a for a, b in zip(streamed, streamed[1:])}
    assert gaps <= {3, 4}  # spread evenly over 50 layers
    resident = p.layers[(p.layers["group"] == "blocks") & (p.layers["tier"] == "resident")]
    assert len(resident) == 35
    assert resident["reason"].str.startswith("resident: strided 35 of 50").all()
    leading = plan(h3, resident=35, host=HostMemory(available="128GiB"))
    assert leading.reason_of("blocks", 0).startswith("resident: leading 35 of 50")
    assert leading.streamed_layers("blocks") == list(range(35, 50))


# -- forced tiers ----------------------------------------------------------------------------------
def test_forced_pageable_pins_nothing():
    p = plan(make_spec([MiB] * 4, mapped=1.0), tier="pageable", resident=1, host=BIG)
    assert tiers(p) == ["resident", "pageable", "pageable", "pageable"]
    assert p.ledger["pinned_bytes"] == 0
    assert p.reason_of("blocks", 1) == "pageable: forced by tier 'pageable'"


def test_forced_pinned_is_still_subject_to_the_budget():
    with pytest.warns(PlanWarning, match=r"tier 'pinned' forced, but 2 of 4 streamed layers are not pinned"):
        p = plan(make_spec([MiB] * 4), tier="pinned", pin_budget="2MiB", host=BIG)
    assert tiers(p) == ["pinned", "pinned", "pageable", "pageable"]
    assert "tier 'pinned' forced" in p.reason_of("blocks", 3)


def test_forced_pageable_is_still_subject_to_the_fit_check():
    spec = make_spec([BLOCK] * 4, mapped=1.0)
    with pytest.warns(PlanWarning, match="tier 'pageable' forced, but 2 of 4"):
        p = plan(spec, tier="pageable", host=host_with(2 * BLOCK))
    assert tiers(p) == ["pageable", "pageable", "mapped", "mapped"]


def test_forced_mapped_only_where_the_layer_is_a_checkpoint_view():
    spec = make_spec([MiB] * 3, mapped={"blocks": [MiB, 0, MiB // 2]})
    with pytest.warns(PlanWarning, match="tier 'mapped' forced, but 1 of 3"):
        p = plan(spec, tier="mapped", host=BIG)
    assert tiers(p) == ["mapped", "pageable", "mapped"]
    assert "not a checkpoint view" in p.reason_of("blocks", 1)


def test_all_pinned_vs_all_pageable_comparison_on_wan(wan14):
    host = HostMemory(available="128GiB")
    pinned = plan(wan14, tier="pinned", host=host)
    pageable = plan(wan14, tier="pageable", host=host)
    assert set(tiers(pinned)) == {"pinned"} and set(tiers(pageable)) == {"pageable"}


# -- startup peak -------------------------------------------------------------------------------
def _two_groups(large_second: bool) -> ModelSpec:
    small, big = ("small", [10 * MiB] * 2), ("big", [100 * MiB] * 4)
    order = [small, big] if large_second else [big, small]
    return make_spec(groups=dict(order), non_layer=5 * MiB)


def test_startup_peak_grouped_and_naive_exact():
    late = plan(_two_groups(large_second=True), host=BIG)
    early = plan(_two_groups(large_second=False), host=BIG)
    # grouped: non-layer + the first prefetched layer of each group
    assert late.startup_peak("grouped") == early.startup_peak("grouped") == (5 + 10 + 100) * MiB
    # naive: after the first group is offloaded the whole rest of the model is moved to the
    # device (prefetch is armed later); never below the grouped steady state
    assert late.startup_peak("naive") == (5 + 400) * MiB
    assert early.startup_peak("naive") == early.startup_peak("grouped")
    assert late.init_order == early.init_order == ["big", "small"]


def test_startup_peak_counts_resident_layers_and_prefetch_depth():
    spec = _two_groups(large_second=True)
    p = plan(spec, resident=1, prefetch=2, host=BIG)
    # small: 2 resident (capped), nothing streamed; big: 1 resident + 2 in flight
    assert p.startup_peak() == (5 + 20 + 100 + 200) * MiB
    assert plan(spec, prefetch=0, host=BIG).startup_peak() == 5 * MiB
    assert p.startup_peak("naive") >= p.startup_peak("grouped")


def test_h3_startup_peak_is_lower_grouped_when_the_large_group_is_declared_second(h3):
    assert h3.group_names == ["token_refiner.blocks", "blocks"]
    host = HostMemory(available="128GiB")
    p = plan(h3, host=host)
    assert p.init_order == ["blocks", "token_refiner.blocks"]
    grouped, naive = p.startup_peak("grouped"), p.startup_peak("naive")
    assert grouped == h3.non_layer_bytes + 770_725_376 + H3_BLOCK
    assert naive == h3.non_layer_bytes + 50 * H3_BLOCK
    assert grouped < 3 * GiB < 60 * GiB < naive
    swapped = ModelSpec("h3-swapped", list(reversed(h3.groups)), h3.non_layer)
    q = plan(swapped, host=host)
    # declaration order only matters naively: with the large group first, naive is harmless
    assert q.startup_peak("grouped") == q.startup_peak("naive") == grouped


# -- scenarios from the reference ------------------------------------------------------------------
def test_h3_with_5_32_gib_spendable_pins_four_layers_per_layer(h3):
    host = HostMemory(available=int(7.32 * GiB))
    assert 5.31 * GiB < host.spendable < 5.33 * GiB
    p = plan(h3, host=host)
    assert pinned_set(p) == {0, 1, 2, 3}
    assert pinned_set(p, "token_refiner.blocks") == set()
    assert p.ledger["fits"]
    assert p.ledger["pinned_bytes"] == 4 * H3_BLOCK <= p.ledger["budget"]
    # the old whole-component grant asks for the whole DiT's layers at once and gets nothing
    assert h3.layer_bytes > host.spendable


def format_gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def test_h3_on_a_60_gb_host_pins_34_layers_at_exact_size(h3):
    # RTX 5090 box: 41.22 GiB spendable after the reserve
    host = HostMemory(available=int(41.22 * GiB / 0.95) + 1)
    assert format_gib(host.spendable) == "41.22"
    p = plan(h3, host=host)
    assert len(pinned_set(p)) == 34 and pinned_set(p, "token_refiner.blocks") == set()
    assert format_gib(p.ledger["pinned_bytes"]) == "40.88"
    assert pinned_footprint(p) == p.ledger["pinned_bytes"] <= host.available - host.reserve
    assert p.ledger["net_anonymous_bytes"] <= host.available - host.reserve and p.ledger["fits"]
    # the same 34 stores rounded up to 2 GiB each by a power-of-two allocator would not fit
    assert pinned_footprint(p, "pow2") == 34 * 2 * GiB > host.available - host.reserve


def test_pow2_footprint_rounds_each_layer_store_once():
    # the runtime pins one allocation per layer, its dtype buffers inside it: 3 MiB of float32
    # and 1 MiB of bfloat16 lock 4 MiB, not 4 MiB + 1 MiB as two rounded buffers would
    layer = LayerSpec("blocks", 0, [TensorSpec("blocks.0.a", (3 * MiB // 4,), "float32"),
                                    TensorSpec("blocks.0.b", (MiB // 2,), "bfloat16")])
    p = plan(ModelSpec("mixed", [GroupSpec("blocks", [layer])], []), host=BIG)
    assert p.ledger["pinned_bytes"] == pinned_footprint(p) == 4 * MiB
    assert pinned_footprint(p, "pow2") == 4 * MiB


# -- Plan object --------------------------------------------------------------------------------------
def test_layers_frame_has_the_contract_columns_and_dtypes():
    p = plan(make_spec([MiB] * 3), pin_budget="1MiB", host=BIG)
    assert list(p.layers.columns) == ["group", "layer", "tier", "bytes", "mapped_bytes", "streamed",
                                      "pin_rank", "reason"]
    assert str(p.layers["pin_rank"].dtype) == "Int64"
    assert p.layers["pin_rank"].isna().tolist() == [False, True, True]
    assert set(p.ledger) >= {"available", "reserve", "spendable", "budget", "pinned_bytes",
                             "net_anonymous_bytes", "fits"}


def test_to_dict_round_trips_through_json():
    spec = make_spec(groups={"a": [MiB] * 2, "b": [2 * MiB] * 3}, mapped=0.5, non_layer=MiB)
    p = plan(spec, pin_budget="3MiB", resident={"b": 1}, order=["a.1"], prefetch=2, host=BIG)
    q = Plan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert q.layers.equals(p.layers)
    assert q.ledger == p.ledger and q.init_order == p.init_order and q.params == p.params
    assert q.spec.to_dict() == spec.to_dict() and q.prefetch == 2
    assert q.startup_peak("naive") == p.startup_peak("naive")
    assert Plan.from_json(p.to_json()).grant_order == p.grant_order
    with pytest.raises(PlanError, match="not an offload-lab plan"):
        Plan.from_dict({"format": "something"})


def test_params_are_the_arguments_to_rerun_the_plan():
    spec = make_spec([MiB] * 4)
    p = plan(spec, pin_budget="2MiB", resident=(1,), order=("blocks.3",), host=BIG)
    assert p.params == {"pin_budget": 2 * MiB, "resident": [1], "residency": "leading",
                        "order": ["blocks.3"], "prefetch": 1, "tier": None,
                        "staging": False}
    again = plan(spec, **p.params, host=p.host)
    assert again.layers.equals(p.layers)


def test_queries_table_and_repr():
    p = plan(make_spec([3 * MiB, MiB]), pin_budget="1MiB", host=BIG)
    assert p.tier_of("blocks", 1) == "pinned"
    with pytest.raises(PlanError, match=r"layer blocks.7 is not in this plan"):
        p.tier_of("blocks", 7)
    with pytest.raises(ValueError, match="group 'nope' is not in"):
        p.streamed_layers("nope")
    t = p.table()
    assert t["size"].tolist() == ["3.00 MiB", "1.00 MiB"]
    assert t["pin rank"].tolist() == ["", "1"]
    r = repr(p)
    assert "Plan('toy'" in r and "1 pinned, 1 pageable" in r and "fits" in r
    assert "<table" in p._repr_html_()


# -- pipelines ------------------------------------------------------------------------------------------
def test_pipeline_ranks_by_uses_times_bytes_and_shares_one_budget():
    enc = make_spec([4 * MiB] * 4, name="enc")       # bigger, but used once per request
    dit = make_spec([MiB] * 4, name="dit")           # 100 uses
    pp = plan_pipeline([Component("enc", enc, uses=1), Component("dit", dit, uses=100)],
                       host=BIG, pin_budget="8MiB")
    assert list(pp.components) == ["dit", "enc"]
    assert pp.ranking["component"].tolist() == ["dit", "enc"]
    assert pp.ranking["reason"].iloc[0] == "rank 1: 100 uses × 4.00 MiB = 400.00 MiB moved per request"
    assert pinned_set(pp["dit"]) == {0, 1, 2, 3}
    assert pinned_set(pp["enc"]) == {0}  # what the DiT left: 4 MiB
    assert pp.ledger["pinned_bytes"] == 8 * MiB == pp.ledger["budget"]
    assert pp["enc"].ledger["budget"] == 4 * MiB
    assert pp["enc"].layers["pin_rank"].dropna().tolist() == [5]  # ranks are global


def test_pipeline_lower_ranked_component_gives_way():
    enc = make_spec([BLOCK] * 2, mapped=1.0, name="enc")
    dit = make_spec([BLOCK] * 2, mapped=1.0, name="dit")
    pp = plan_pipeline([Component("enc", enc), Component("dit", dit, uses=50)],
                       host=host_with(3 * BLOCK))
    assert tiers(pp["dit"]) == ["pinned", "pinned"]
    assert tiers(pp["enc"]) == ["pinned", "mapped"]
    assert "demoted from pageable" in pp["enc"].reason_of("blocks", 1)
    assert pp.ledger["fits"] and pp.ledger["net_anonymous_bytes"] == 3 * BLOCK


def test_pipeline_components_can_carry_their_own_plan_options():
    dit = make_spec([MiB] * 4, name="dit")
    pp = plan_pipeline([Component("dit", dit, uses=10, resident=2, residency="strided", prefetch=2)],
                       host=BIG)
    assert pp["dit"].streamed_layers("blocks") == [1, 3] and pp["dit"].prefetch == 2
    assert pp["dit"].params["component"] == "dit" and pp["dit"].params["uses"] == 10


def test_pipeline_round_trip_table_and_repr():
    pp = plan_pipeline([Component("a", make_spec([MiB] * 2)), Component("b", make_spec([MiB] * 3), 2)],
                       host=BIG)
    back = PipelinePlan.from_dict(json.loads(json.dumps(pp.to_dict())))
    assert back.ranking.equals(pp.ranking) and back.ledger == pp.ledger
    assert back["a"].layers.equals(pp["a"].layers)
    assert pp.table()["component"].tolist() == ["b"] * 3 + ["a"] * 2
    assert "PipelinePlan(" in repr(pp) and pinned_footprint(pp) == pp.ledger["pinned_bytes"]


@pytest.mark.parametrize("components, match", [
    ([], "components is empty"),
    (["dit"], "'dit' is not a Component"),
])
def test_pipeline_bad_components(components, match):
    with pytest.raises(PlanError, match=match):
        plan_pipeline(components, host=BIG)


def test_pipeline_refuses_duplicate_names_and_bad_uses():
    spec = make_spec([MiB])
    with pytest.raises(PlanError, match=r"\['x'\] appear more than once"):
        plan_pipeline([Component("x", spec), Component("x", spec)], host=BIG)
    with pytest.raises(PlanError, match=r"component 'x': uses = 0; accepted: an int ≥ 1"):
        Component("x", spec, uses=0)


# -- bad input -------------------------------------------------------------------------------------------
SPEC = make_spec([MiB] * 4)
TWO = make_spec(groups={"a": [MiB] * 2, "blocks": [MiB] * 4})


@pytest.mark.parametrize("budget, words", [
    ("-1GiB", ["'-1GiB'", "not a size", "8GiB"]),
    (-5, ["-5", "negative"]),
    ("plenty", ["'plenty'", "not a size"]),
    ("8", ["'8'", "ambiguous", "'8GiB'"]),
    ("4 furlongs", ["unknown unit", "GiB"]),
    ([1], ["type list"]),
])
def test_bad_pin_budgets(budget, words):
    with pytest.raises(PlanError) as e:
        plan(SPEC, pin_budget=budget, host=BIG)
    assert isinstance(e.value, SizeError)
    assert "pin_budget" in str(e.value)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("kwargs, words", [
    ({"tier": "fast"}, ["tier 'fast'", "'pinned', 'staged', 'pageable', 'mapped'"]),
    ({"tier": "resident"}, ["resident=", "'pinned'"]),
    ({"order": "random"}, ["order 'random'", "'execution', 'reverse', 'largest', 'strided'", "['blocks.3']"]),
    ({"order": 3}, ["order 3", "list of layer ids"]),
    ({"residency": "middle"}, ["residency 'middle'", "'leading', 'strided'"]),
    ({"prefetch": -1}, ["prefetch = -1", "≥ 0"]),
    ({"prefetch": 1.5}, ["prefetch = 1.5"]),
    ({"resident": 5}, ["resident 5", "4 layers", "0..4"]),
    ({"resident": -1}, ["resident -1", "negative"]),
    ({"resident": 1.5}, ["resident 1.5", "(0, 1]"]),
    ({"resident": True}, ["resident True", "bool"]),
    ({"resident": "half"}, ["resident 'half'", "a count, a fraction"]),
    ({"resident": [9]}, ["resident entry 9", "0..3"]),
    ({"resident": [1, 1]}, ["blocks.1 twice"]),
    ({"resident": {"nope": 1}}, ["group 'nope'", "['blocks']"]),
    ({"resident": {"blocks": 9}}, ["resident['blocks'] 9", "0..4"]),
    ({"order": ["blocks.9"]}, ["'blocks.9'", "out of range", "0..3"]),
    ({"order": ["nope.1"]}, ["'nope.1'", "group 'nope'"]),
    ({"order": ["x"]}, ["'x' is not a layer id", "'blocks.0'"]),
    ({"order": [1.5]}, ["1.5 is not a layer id"]),
    ({"order": [2, "blocks.2"]}, ["blocks.2 twice"]),
    ({"order": [0], "resident": 1}, ["blocks.0, which is resident"]),
    ({"tier": "mapped"}, ["tier 'mapped' is forced", "no streamed layer", "checkpoint view", "'pageable'"]),
    ({"tier": "pinned", "pin_budget": "512KiB"}, ["tier 'pinned' is forced", "512.00 KiB", "1.00 MiB"]),
])
def test_bad_arguments_name_the_value_and_what_is_accepted(kwargs, words):
    with pytest.raises(PlanError) as e:
        plan(SPEC, host=BIG, **kwargs)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_layer_ids_are_ambiguous_without_a_group_in_multi_group_models():
    with pytest.raises(PlanError, match=r"order entry 3 is ambiguous.*groups \['a', 'blocks'\].*'blocks.3'"):
        plan(TWO, order=[3], host=BIG)
    with pytest.raises(PlanError, match="resident entry 1 is ambiguous"):
        plan(TWO, resident=[1], host=BIG)
    with pytest.raises(PlanError, match=r"resident 5 is more than the 4 layers of the largest group"):
        plan(TWO, resident=5, host=BIG)


def test_bad_host_and_strategy():
    with pytest.raises(PlanError, match=r"host \[1\] is not a HostMemory"):
        plan(SPEC, host=[1])
    with pytest.raises(SizeError, match="host: available 'big'"):
        plan(SPEC, host="big")
    with pytest.raises(PlanError, match=r"strategy 'lazy' is not one of 'grouped', 'naive'"):
        plan(SPEC, host=BIG).startup_peak("lazy")
    with pytest.raises(PlanError, match="is not a ModelSpec"):
        plan("wan", host=BIG)
    with pytest.raises(ValueError, match=r"rounding 'pow3' is not one of"):
        pinned_footprint(plan(SPEC, host=BIG), "pow3")


# -- invariants (hypothesis) ------------------------------------------------------------------------------
@st.composite
def scenarios(draw):
    groups = {}
    mapped = {}
    for g in ["a", "b"][: draw(st.integers(1, 2))]:
        n = draw(st.integers(1, 8))
        groups[g] = [draw(st.integers(1, 64)) * KiB for _ in range(n)]
        mapped[g] = [draw(st.sampled_from([0, b // 2, b])) for b in groups[g]]
    spec = make_spec(groups=groups, mapped=mapped, non_layer=draw(st.integers(0, 3)) * KiB)
    total = sum(sum(v) for v in groups.values())
    kwargs = {
        "pin_budget": draw(st.integers(0, total)),
        "resident": draw(st.one_of(st.integers(0, min(len(v) for v in groups.values())),
                                   st.floats(0.05, 0.95))),
        "residency": draw(st.sampled_from(["leading", "strided"])),
        "order": draw(st.sampled_from(ORDERS)),
        "prefetch": draw(st.integers(0, 3)),
        "staging": draw(st.booleans()),
        "tier": draw(st.sampled_from([None, None, "staged"])),
    }
    headroom = draw(st.integers(-total // 4, total))
    return spec, kwargs, host_with(headroom)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_plan_invariants(case):
    spec, kwargs, host = case
    p = quiet(spec, host=host, **kwargs)
    df = p.layers
    led = p.ledger
    # tiers are one of the four
    assert set(df["tier"]) <= set(TIERS)
    # pinned bytes never exceed the budget, which never exceeds what the host can spend
    pinned = df[df["pin_rank"].notna()]
    assert led["pinned_bytes"] == int(pinned["bytes"].sum()) <= led["budget"] <= host.spendable
    assert pinned["pin_rank"].is_unique
    # staging: K = prefetch + 1 (at most the staged layers) buffers of the largest staged layer
    # per group, and layer pins plus staging buffers never exceed the budget
    want = {}
    for g in spec.group_names:
        staged = df[(df["group"] == g) & (df["tier"] == "staged")]
        if len(staged):
            want[g] = {"buffers": min(p.prefetch + 1, len(staged)), "buffer_bytes": int(staged["bytes"].max())}
    assert led["staging"] == want
    assert led["staging_bytes"] == sum(w["buffers"] * w["buffer_bytes"] for w in want.values())
    assert led["pinned_bytes"] + led["staging_bytes"] <= led["budget"]
    if not (kwargs["staging"] or kwargs["tier"] == "staged"):
        assert not want
    if kwargs["tier"] == "staged":
        assert pinned.empty
    # resident layers are never streamed, and every streamed layer is off the device
    assert ((df["tier"] == "resident") == ~df["streamed"]).all()
    for g in spec.group_names:
        assert not set(p.streamed_layers(g)) & set(p.resident_layers(g))
    # first fit: every streamed layer that did not get a pin was larger than what was left
    by_name = {f"{r.group}.{r.layer}": r for r in df.itertuples(index=False)}
    left = led["budget"]
    for g in spec.group_names:  # staging was set aside first: K buffers of the largest streamed layer
        rows = df[(df["group"] == g) & df["streamed"]]
        if ((rows["tier"] == "staged") | rows["reason"].str.contains("staging buffers given back")).any():
            left -= min(p.prefetch + 1, len(rows)) * int(rows["bytes"].max())
    for name in p.grant_order:
        r = by_name[name]
        had_pin = not _is_na(r.pin_rank) or "pin given back" in r.reason
        if had_pin:
            assert r.bytes <= left
            left -= r.bytes
        elif r.streamed and kwargs["tier"] is None:  # a forced tier pins no streamed layer
            assert r.bytes > left, (name, r.reason)
    # the ledger's net new bytes are exactly the mapped bytes copied into stores
    cost = sum(r.mapped_bytes for r in df.itertuples(index=False)
               if not _is_na(r.pin_rank) or r.tier == "pageable") + led["staging_bytes"]
    assert led["net_anonymous_bytes"] == cost
    assert led["fits"] == (cost <= host.headroom)
    if not led["fits"]:
        # nothing left to demote or give back, and everyone is told
        assert not any(r.mapped_bytes and (r.tier == "pageable" or not _is_na(r.pin_rank))
                       for r in df.itertuples(index=False))
        assert p.warnings and all("DOES NOT FIT" in s for s in df["reason"])
    # the startup peak never goes below the grouped steady state
    assert p.startup_peak("naive") >= p.startup_peak("grouped") >= spec.non_layer_bytes


def _is_na(v) -> bool:
    import pandas as pd

    return v is None or v is pd.NA or (isinstance(v, float) and pd.isna(v))


def test_resident_fraction_one_means_every_layer():
    p = plan(SPEC, host=BIG, resident=1.0)
    assert not p.layers["streamed"].any() and set(p.layers["tier"]) == {"resident"}


# -- sizes that overflow a float ----------------------------------------------------------------------
@pytest.mark.parametrize("size", ["1e400", "1e308GiB", 1e400])
def test_huge_pin_budget_or_host_is_one_line_size_error(size):
    with pytest.raises(SizeError, match="too large|not finite") as e:
        plan(SPEC, pin_budget=size, host=BIG)
    assert isinstance(e.value, PlanError)
    with pytest.raises(SizeError, match="too large|not finite"):
        plan(SPEC, host=size)


# -- what a person sees --------------------------------------------------------------------------
def test_printed_table_keeps_layer_tier_pin_rank_and_reason_at_80_columns(monkeypatch):
    import pandas as pd

    monkeypatch.setenv("COLUMNS", "80")
    p = plan(catalog.load("wan2.1-t2v-14b"), pin_budget="8GiB", host=HostMemory(available="64GiB"))
    t = p.table()
    assert isinstance(t, pd.DataFrame) and list(t.columns) == [
        "group", "layer", "tier", "size", "mapped", "streamed", "pin rank", "reason"]
    with pd.option_context("display.width", 80):
        text = str(t)
        assert repr(t) == text
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert lines[0].split() == ["group", "layer", "tier", "pin", "rank", "reason"]
    assert "pinned: rank 1, 670.23 MiB" in lines[1] and lines[1].split()[1:5] == ["blocks", "0", "pinned", "1"]
    assert "pageable: 670.23 MiB >" in lines[13]
    assert "size, mapped, streamed left out to fit 80 columns" in lines[-1]
    with pd.option_context("display.width", 160, "display.max_columns", 20):  # room for all, reasons whole
        wide = str(t).splitlines()
    assert wide[0].split()[:4] == ["group", "layer", "tier", "size"] and len(wide) == 41
    assert wide[13].endswith("pageable: 670.23 MiB > 149.22 MiB left of the pin budget")
    # a slice is still the same kind of table; the frame itself keeps every column
    assert type(t.iloc[[0, 12]]) is type(t) and "670.23 MiB" in t.to_string()
    # mapped is what a mapped layer reads from its file; a pinned or pageable store is a copy
    assert set(t["mapped"]) == {""}
    m = plan(catalog.load("wan2.1-t2v-14b"), tier="mapped", host=HostMemory(available="64GiB")).table()
    assert set(m["mapped"]) == {"670.23 MiB"}


def test_staging_that_stages_nothing_says_why():
    # K = prefetch + 1 = 2 buffers of 3 MiB do not fit a 4 MiB budget
    p = plan(make_spec([3 * MiB] * 4), pin_budget="4MiB", staging=True, host=BIG)
    assert "staged" not in set(p.layers["tier"])
    assert p.reason_of("blocks", 1) == ("pageable: 3.00 MiB > 1.00 MiB left of the pin budget; not staged: "
                                        "2 × 3.00 MiB staging buffers = 6.00 MiB > 4.00 MiB of pin budget")
    # too few layers left without a pin for buffers (which would take their pins) to pay off
    q = plan(make_spec([MiB] * 4), pin_budget="3MiB", staging=True, host=BIG)
    assert q.reason_of("blocks", 3).endswith("not staged: only 1 streamed layer without a pin, no more "
                                             "than the 2 staging buffers that would take their pins")
    # without staging asked for, the reason is as before
    r = plan(make_spec([3 * MiB] * 4), pin_budget="4MiB", host=BIG)
    assert r.reason_of("blocks", 1) == "pageable: 3.00 MiB > 1.00 MiB left of the pin budget"
