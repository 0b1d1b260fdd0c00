"""Device memory in the plan: the estimated device peak, its parts, the fit check, bad input,
device profiles' memory size, and predicted vs measured in a real run's meta."""

import warnings

import pytest
import torch

import offload_lab
from offload_lab import HostMemory, catalog, synthetic
from offload_lab.planning.device import activation_bytes
from offload_lab.planning.errors import PlanSizeError, PlanWarning
from offload_lab.planning.grants import store_bytes
from offload_lab.planning.pipeline import Component, plan_pipeline
from offload_lab.simulation.errors import ProfileError

GiB = 2**30
HOST = HostMemory(available="64GiB")


@pytest.fixture(scope="module")
def wan14():
    return catalog.load("wan2.1-t2v-14b")


def test_peak_is_the_sum_of_its_parts_at_real_sizes(wan14):
    p = offload_lab.plan(wan14, resident=10, prefetch=2, host=HOST, device_memory="24GiB", tokens="480p")
    led = p.ledger
    sizes = [store_bytes(layer)[0] for layer in wan14.group("blocks").layers]
    assert led["device_resident_bytes"] == sum(sizes[:10])
    assert led["device_in_flight_bytes"] == 3 * sizes[10]  # prefetch 2 + the running layer
    assert led["device_non_layer_bytes"] == wan14.non_layer_bytes
    # S × (4d + f) × 2 bytes: Wan2.1-14B d = 5120, f = 13824, 480p = 32760 + 512 text tokens
    assert led["device_activation_bytes"] == (32760 + 512) * (4 * 5120 + 13824) * 2
    assert led["device_peak_bytes"] == sum(led[k] for k in ("device_non_layer_bytes", "device_resident_bytes",
                                                            "device_in_flight_bytes", "device_activation_bytes"))
    assert led["device_fits"] and p.fits and p.device_peak == led["device_peak_bytes"]


def test_in_flight_window_takes_the_largest_consecutive_layers():
    h3 = catalog.load("minimax-h3")
    p = offload_lab.plan(h3, prefetch=1, host=HOST)
    by_group = {}
    for g in h3.groups:
        sizes = [store_bytes(layer)[0] for layer in g.layers]
        by_group[g.name] = max(sizes[i] + sizes[(i + 1) % len(sizes)] for i in range(len(sizes)))
    assert p.ledger["device_in_flight_bytes"] == sum(by_group.values())


def test_more_tokens_more_activation(wan14):
    assert activation_bytes(wan14, "720p") > activation_bytes(wan14, "480p") > 0
    assert activation_bytes(wan14, 1000) == (1000 + 512) * (4 * 5120 + 13824) * 2


def test_no_device_memory_keeps_todays_plan(wan14):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        a = offload_lab.plan(wan14, resident=40, host=HOST)
    b = offload_lab.plan(wan14, resident=40, host=HOST, device_memory="1TiB")
    assert a.layers.equals(b.layers) and a.fits and a.ledger["device_memory"] is None


def test_a_plan_that_does_not_fit_the_device_says_so(wan14):
    with pytest.warns(PlanWarning, match="exceeds device memory 24.00 GiB"):
        p = offload_lab.plan(wan14, resident=40, host=HOST, device_memory="24GiB")
    assert not p.fits and p.ledger["fits"] and not p.ledger["device_fits"]
    assert p.ledger["device_resident_bytes"] > 26 * GiB
    assert all(r.endswith("does not fit the device") for r in p.layers["reason"])
    assert "DOES NOT FIT the device" in p.summary()
    back = offload_lab.Plan.from_json(p.to_json())
    assert back.ledger == p.ledger and not back.fits


@pytest.mark.parametrize("bad", ["nonsense", "-5GiB", 0, -1, "0GiB"])
def test_bad_device_memory_is_one_line_naming_the_value(wan14, bad):
    with pytest.raises(PlanSizeError) as e:
        offload_lab.plan(wan14, host=HOST, device_memory=bad)
    msg = str(e.value)
    assert "\n" not in msg and repr(bad) in msg and "accepted" in msg


def test_pipeline_peak_keeps_every_component_and_one_running(wan14):
    enc = catalog.load("wan2.1-t2v-1.3b")
    pp = plan_pipeline([Component("dit", wan14, uses=100, resident=5), Component("enc", enc, resident=30)],
                       host=HOST, device_memory="24GiB")
    dit, e = pp["dit"].ledger, pp["enc"].ledger
    stay = sum(x["device_non_layer_bytes"] + x["device_resident_bytes"] for x in (dit, e))
    moving = max(x["device_in_flight_bytes"] + x["device_activation_bytes"] for x in (dit, e))
    assert pp.ledger["device_peak_bytes"] == stay + moving and pp.ledger["device_fits"]
    with pytest.warns(PlanWarning, match="pipeline: device peak"):
        pp = plan_pipeline([Component("dit", wan14, uses=100, resident=40)], host=HOST, device_memory="8GiB")
    assert not pp.ledger["device_fits"]


def test_shipped_profiles_carry_their_memory_size():
    sizes = {n: offload_lab.DeviceProfile.load(n).memory_bytes for n in offload_lab.DeviceProfile.names()}
    assert sizes["rtx4090-pcie4"] == 24 * GiB and sizes["rtx5090-pcie5"] == 32 * GiB
    recorded = {r.meta["cuda"]["total_memory"] for r in offload_lab.shipped_runs() if r.meta.get("cuda")}
    assert recorded == {sizes["h200"]} and 139 * GiB < sizes["h200"]  # as the H200 runs recorded it
    for n in sizes:
        prof = offload_lab.DeviceProfile.load(n)
        assert any("memory_bytes" in s for s in prof.provenance.get("sources", []) + prof.provenance.get("method", []))
        assert offload_lab.DeviceProfile.from_dict(prof.to_dict()) == prof


@pytest.mark.parametrize("bad", [-1, 0, 1.5, True, "24GiB"])
def test_profile_memory_bytes_must_be_a_positive_int(bad):
    with pytest.raises(ProfileError, match="memory_bytes"):
        offload_lab.DeviceProfile("x", {"pinned": 1.0}, memory_bytes=bad)


def test_run_meta_puts_predicted_and_measured_device_peak_side_by_side():
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=4)
    inputs = synthetic.example_inputs(model, tokens=32)
    with torch.no_grad():
        before = model(**inputs)
    spec = offload_lab.spec_of(model)
    p = offload_lab.plan(spec, resident=1, prefetch=1, host=HOST, device_memory="1GiB", tokens=32)
    run = offload_lab.profile(model, lambda: model(**inputs), p, steps=2, backend="cpu")
    d = run.meta["device_peak"]
    assert d["predicted_bytes"] == p.device_peak and d["device_memory"] == GiB
    # the cpu backend's device holds weights only: the estimate less its activation part
    assert d["measured_bytes"] == d["predicted_bytes"] - d["predicted_activation_bytes"]
    back = offload_lab.Run.load(run.save(pytest.importorskip("tempfile").mkdtemp() + "/r.zip"))
    assert back.meta["device_peak"] == d
    with torch.no_grad():
        assert torch.equal(model(**inputs), before)  # leaving the manager restored every parameter


@pytest.mark.parametrize("tier", ["pinned", "pageable", "staged"])
@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_after_compute_keeps_the_device_within_the_planned_layers(tier, prefetch):
    # A GPU host runs ahead of the device; in the after-compute order a freed buffer comes back
    # only once the compute that read it ran, so the runtime (and the simulator) hold the host
    # before a group would pass prefetch + 1 layers. The simulated high-water mark of the layer
    # weights is then the planner's: non-layer + resident + the largest prefetch + 1 in flight.
    spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    plan = offload_lab.plan(spec, tier=tier, prefetch=prefetch, resident=5, host=offload_lab.HostMemory(available="256GiB"))
    led = plan.ledger
    planned = spec.non_layer_bytes + led["device_resident_bytes"] + led["device_in_flight_bytes"]
    run = offload_lab.simulate(plan, "h200", steps=2, issue="after-compute")
    assert int(run.memory["device_bytes"].max()) == planned
    # holding the host costs a pinned or pageable plan no step time against the order that
    # cannot run ahead; a staged layer's host memcpy waits for its device buffer too, which at
    # prefetch 0 or 1 shows (docs/simulator.md)
    before = offload_lab.simulate(plan, "h200", steps=2, issue="before-compute")
    if tier != "staged" or prefetch >= 2:
        assert run.step_time <= before.step_time * 1.001
