"""Other engines' offload settings as plans (offload_lab.engines): the plans themselves, held
against real diffusers group offloading on the CPU, the side-by-side frame, the CLI and the
export of a plan as an engine's settings."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import offload_lab
from offload_lab import HostMemory, catalog, engines
from offload_lab.cli.app import main
from offload_lab.engines import EngineError
from offload_lab.errors import OffloadLabError
from offload_lab.planning.errors import PlanWarning
from offload_lab.simulation.errors import SimError

pytest.importorskip("diffusers")
from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_pipeline  # noqa: E402

HOST = "64GiB"


def _pow2(n: int) -> int:
    """What torch's caching host allocator locks for an n-byte block."""
    return 0 if n == 0 else 1 << (n - 1).bit_length()


@pytest.fixture(scope="module")
def tiny():
    """A tiny random Wan transformer of its own (diffusers' hooks change it, so not the shared one)."""
    return tiny_wan_pipeline(layers=6).transformer


@pytest.fixture(scope="module")
def inputs(tiny):
    g = torch.Generator().manual_seed(0)
    return dict(hidden_states=torch.randn(1, 16, 2, 8, 8, generator=g), timestep=torch.tensor([500]),
                encoder_hidden_states=torch.randn(1, 12, tiny.config.text_dim, generator=g), return_dict=False)


def test_names_cover_the_engines():
    assert {"diffusers-group", "diffusers-model", "sglang-layerwise", "offload-lab"} <= set(engines.names())
    assert offload_lab.engines is engines


def test_diffusers_stream_pins_every_block_as_the_caching_allocator_rounds_it(tiny):
    spec = offload_lab.spec_of(tiny)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        p = engines.as_plan(spec, "diffusers-group", num_blocks_per_group=2, use_stream=True, host=HOST)
    assert isinstance(p, offload_lab.Plan)
    assert set(p.layers["tier"]) == {"pinned"} and p.layers["streamed"].all() and p.fits
    info = p.params["engine"]
    # diffusers forces one block per group when streams are on, and says so
    assert info["settings"]["num_blocks_per_group"] == 1
    assert any("num_blocks_per_group=2 to 1" in n for n in info["notes"])
    # diffusers pins each parameter and buffer of every block group with tensor.pin_memory():
    # one caching-allocator block per tensor, each rounded up to a power of two
    locked = sum(_pow2(t.numel() * t.element_size())
                 for b in tiny.blocks for t in [*b.parameters(), *b.buffers()])
    assert engines.pinned_bytes(p) == locked > p.ledger["pinned_bytes"]
    # the group after each one is onloaded from that group's first block, on the side stream
    assert [o["at"] for o in engines.onloads(p)] == ["blocks.0"] + [f"blocks.{i}" for i in range(5)]
    assert p.params["issue"] == "before-compute" and p.prefetch == 1
    assert "diffusers group blocks_2_2" in p.reason_of("blocks", 2)
    assert "tensor.pin_memory()" in p.reason_of("blocks", 2)


def test_cpu_twin_real_diffusers_group_offload_bytes_and_order(tiny, inputs, tmp_path):
    """Real ``enable_group_offload`` (block_level, 2 blocks a group) observed on the CPU. cpu → cpu
    moves nothing, so the groups go to disk (``offload_to_disk_path``): each onload then reads
    a group's file into new tensors, which the observer sees arrive."""
    from safetensors import safe_open

    spec = offload_lab.spec_of(tiny)
    with torch.no_grad():
        ref = tiny(**inputs)[0]
    tiny.enable_group_offload(onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                              offload_type="block_level", num_blocks_per_group=2,
                              offload_to_disk_path=str(tmp_path))
    with offload_lab.observe(tiny, backend="cpu") as obs, torch.no_grad():
        for _ in range(2):
            with obs.step():
                out = tiny(**inputs)[0]
    assert torch.equal(out, ref)
    run = obs.build_run()
    p = engines.as_plan(spec, "diffusers-group", num_blocks_per_group=2, offload_to_disk_path=str(tmp_path),
                        host=HOST)
    onl = engines.onloads(p)
    assert [o["layers"] for o in onl] == [[0, 1], [2, 3], [4, 5]]
    # bytes per step: every block arrives once per forward, with the bytes the plan predicts
    # (the first step: later ones can reuse a freed address, which hides a copy on the CPU)
    assert int(run.steps["bytes_moved"].iloc[0]) == sum(o["bytes"] for o in onl)
    # the files diffusers wrote hold exactly the predicted groups' bytes
    files = []
    for f in sorted(tmp_path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            files.append(sum(h.get_tensor(k).numel() * h.get_tensor(k).element_size() for k in h.keys()))
    pred = sorted(o["bytes"] for o in onl)
    assert len(files) == len(onl) + 1  # and one file for the unmatched group (non-layer weights)
    assert sorted(b for b in files if b in pred) == pred
    # order: a group's blocks arrive together at its first block, before that block computes,
    # and nothing of the next group arrives before the group's last block has computed
    ev = run.events[run.events["step"] == 0]
    copies = ev[(ev["kind"] == "copy") & (ev["bytes"] > 0)].groupby("layer")["start_s"].min()
    compute = ev[ev["kind"] == "compute"].groupby("layer")
    for o in onl:
        first, last = o["layers"][0], o["layers"][-1]
        assert all(copies[i] <= compute["start_s"].min()[first] for i in o["layers"])
        if last + 1 in copies.index:
            assert copies[last + 1] >= compute["end_s"].max()[last]
    assert p.prefetch == 1  # two blocks on the device at once, as diffusers holds a group


def test_sglang_reuses_the_planner_and_locks_per_layer_buffers():
    spec = catalog.load("wan2.1-t2v-14b")
    p = engines.as_plan(spec, "sglang-layerwise", pin_cpu_memory=True, dit_offload_prefetch_size=2, host="20GiB")
    ours = offload_lab.plan(spec, prefetch=2, host=HostMemory(available="20GiB"))
    assert p.layers["tier"].tolist() == ours.layers["tier"].tolist()
    assert p.layers["pin_rank"].tolist() == ours.layers["pin_rank"].tolist()
    assert 0 < p.tier_counts["pinned"] < 40  # the per-layer grants of a budget smaller than the model
    per_layer = [_pow2(sum(t.nbytes for t in lay.tensors)) for lay in spec.group("blocks").layers]  # all bf16
    pinned = p.layers["pin_rank"].notna().tolist()
    assert engines.pinned_bytes(p) == sum(b for b, k in zip(per_layer, pinned) if k)
    off = engines.as_plan(spec, "sglang-layerwise", host=HOST)
    assert set(off.layers["tier"]) == {"pageable"} and engines.pinned_bytes(off) == 0


def test_diffusers_pins_regardless_of_the_host_and_says_it_does_not_fit():
    spec = catalog.load("wan2.1-t2v-14b")
    with pytest.warns(PlanWarning, match="does not fit the host"):
        p = engines.as_plan(spec, "diffusers-group", use_stream=True, host="32GiB")
    assert p.tier_counts["pinned"] == 40 and not p.fits
    assert all(r.endswith("does not fit the host") for r in p.layers["reason"])


def test_model_offload_and_sequential():
    spec = catalog.load("wan2.1-t2v-14b")
    whole = engines.as_plan(spec, "diffusers-model", host=HOST, device_memory="24GiB")
    assert whole.tier_counts["resident"] == 40 and not whole.fits  # 28 GB do not fit a 24 GiB card
    seq = engines.as_plan(spec, "diffusers-model", mode="sequential", host=HOST, device_memory="24GiB")
    assert set(seq.layers["tier"]) == {"pageable"} and seq.prefetch == 0 and seq.fits
    assert "AlignDevicesHook" in seq.reason_of("blocks", 0)


def test_engine_plan_round_trips_and_simulates_in_its_issue_order():
    spec = catalog.load("wan2.1-t2v-1.3b")
    p = engines.as_plan(spec, "diffusers-group", use_stream=True, host=HOST)
    back = offload_lab.Plan.from_json(p.to_json())
    assert back.params["engine"]["name"] == "diffusers-group" and engines.pinned_bytes(back) == engines.pinned_bytes(p)
    run = offload_lab.simulate(back, "h200", steps=2)
    assert run.meta["issue"] == "before-compute" and run.meta["evidence"]["status"] == "held-out"


def test_diffusers_per_group_sync_exposes_host_time_between_groups():
    """diffusers' offload_() waits for the compute stream (use_stream without record_stream, and
    without streams): the plan names each group's last layer, and the simulator's host then has
    no lead, so host work per layer lands between blocks instead of hiding behind them."""
    spec = catalog.load("wan2.1-t2v-1.3b")
    p = engines.as_plan(spec, "diffusers-group", use_stream=True, host=HOST)
    assert p.params["sync_after"] == {"blocks": list(range(30))}
    two = engines.as_plan(spec, "diffusers-group", num_blocks_per_group=2, host=HOST)
    assert two.params["sync_after"] == {"blocks": list(range(1, 30, 2))}
    assert any("copied back to the host" in e["what"] for e in two.params["engine"]["extra_copies"])
    assert "sync_after" not in engines.as_plan(spec, "diffusers-group", use_stream=True, record_stream=True,
                                               host=HOST).params
    # no idle speed-up, so the difference is the host time alone
    slow_host = dataclasses.replace(offload_lab.DeviceProfile.load("h200"), hook_s=0.002, idle_speedup=0.0)
    nosync = offload_lab.Plan.from_json(p.to_json())
    del nosync.params["sync_after"]
    synced = offload_lab.simulate(p, slow_host, steps=2, warmup=1).steps["wall_s"].mean()
    free = offload_lab.simulate(nosync, slow_host, steps=2, warmup=1).steps["wall_s"].mean()
    # 30 hooks of 2 ms: hidden behind ~20 ms blocks without the sync, exposed with it
    assert synced - free == pytest.approx(30 * 0.002, rel=0.15)
    nosync.params["sync_after"] = {"blocks": [99]}
    with pytest.raises(SimError, match="99"):
        offload_lab.simulate(nosync, "h200", steps=1)


@pytest.mark.parametrize("call, words", [
    (lambda s: engines.as_plan(s, "vllm"), ["'vllm'", "diffusers-group", "sglang-layerwise"]),
    (lambda s: engines.as_plan(s, "diffusers-group", streams=True), ["'streams'", "use_stream"]),
    (lambda s: engines.as_plan(s, "diffusers-group", offload_type="block"), ["'block'", "leaf_level"]),
    (lambda s: engines.as_plan(s, "diffusers-group", num_blocks_per_group=0), ["num_blocks_per_group=0", "≥ 1"]),
    (lambda s: engines.as_plan(s, "diffusers-group", record_stream=True), ["record_stream=True", "use_stream=True"]),
    (lambda s: engines.as_plan(s, "sglang-layerwise", pin_cpu_memory="yes"), ["'yes'", "True or False"]),
    (lambda s: engines.compare(s, "a100"), ["'a100'", "h200"]),
])
def test_bad_engines_and_settings_are_one_line_errors(call, words):
    with pytest.raises(EngineError) as e:
        call(catalog.load("wan2.1-t2v-1.3b"))
    assert isinstance(e.value, OffloadLabError) and "\n" not in str(e.value)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_compare_frame_and_figure():
    spec = catalog.load("wan2.1-t2v-14b")
    df = engines.compare(spec, "rtx4090-pcie4", host=HOST, device_memory="24GiB", calls=2)
    assert list(df.columns) == engines.COLUMNS and len(df) == len(engines.grid())
    assert set(df["engine"]) == set(engines.names())
    model = df[(df["engine"] == "diffusers-model") & (df["settings"] == "defaults")].iloc[0]
    assert not model["fits"] and model["device_peak_bytes"] > 24 * 2**30
    stream = df[(df["engine"] == "diffusers-group") & (df["settings"] == "use_stream=True")].iloc[0]
    plain = df[(df["engine"] == "diffusers-group") & (df["settings"] == "defaults")].iloc[0]
    assert stream["step_s"] < plain["step_s"] and stream["pinned_bytes"] > 28 * 10**9 and plain["pinned_bytes"] == 0
    assert set(df["evidence"]) <= {"held-out", "unconfirmed", "derived"}
    fig = engines.figure(df)
    assert sum(len(t.x) for t in fig.data) == len(df)
    assert engines.figure(df).to_dict() == fig.to_dict()  # a pure function of the frame


def test_cli_prints_one_row_per_engine_setting(capsys):
    rc = main(["engines", "wan2.1-t2v-14b", "--device", "rtx4090-pcie4", "--host-available", "64GiB",
               "--device-memory", "24GiB"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    head = next(i for i, line in enumerate(out) if line.startswith("engine "))
    for col in ("step_s", "evidence", "pinned", "device peak", "fits"):
        assert col in out[head]
    rows = out[head + 1: head + 1 + len(engines.grid())]
    assert [r.split()[0] for r in rows] == [e for e, _ in engines.grid()]
    with pytest.raises(SystemExit) as e:
        main(["engines", "wan2.1-t2v-14b", "--device", "rtx4090-pcie4", "--engine", "vllm"])
    assert e.value.code == 2 and "'vllm'" in capsys.readouterr().err


def test_recommendation_to_engine_code_flags_and_what_is_lost():
    spec = catalog.load("wan2.1-t2v-14b")
    rec = offload_lab.recommend(spec, "rtx4090-pcie4", host=HOST, device_memory="24GiB")
    d = rec.to_engine("diffusers-group")
    assert "enable_group_offload(" in d.code and d.cannot_express and "step_s" in d.costs
    assert d.costs["device"] == "rtx4090-pcie4" and d.nearest.params["engine"]["name"] == "diffusers-group"
    s = rec.to_engine("sglang-layerwise")
    assert "--dit-layerwise-offload" in s.flags and s.code.startswith("--dit-layerwise-offload") and s.cannot_express
    assert "cannot express" in str(s)


def test_plan_to_engine_lists_pin_grants_and_mixed_tiers():
    spec = catalog.load("wan2.1-t2v-14b")
    p = offload_lab.plan(spec, pin_budget="16GiB", resident=2, host=HostMemory(available=HOST))
    d = p.to_engine("diffusers-group", device="h200")
    lost = " | ".join(d.cannot_express)
    assert "resident layers" in lost and "mixed tiers" in lost
    assert d.costs["engine_step_s"] > 0 and d.costs["pinned_bytes"] == engines.pinned_bytes(p)
    s = p.to_engine("sglang-layerwise")
    assert "--pin-cpu-memory" in s.flags and "per-layer pin grants" in " ".join(s.cannot_express)
    # a diffusers plan exported back to diffusers is expressed without loss
    own = engines.as_plan(spec, "diffusers-group", use_stream=True, host="256GiB")
    again = own.to_engine("diffusers-group")
    assert again.settings["use_stream"] is True and again.cannot_express == []


def test_the_command_line_offers_exactly_the_modelled_engines():
    from offload_lab import engines, vocabulary

    assert tuple(engines.names()) == vocabulary.ENGINES
