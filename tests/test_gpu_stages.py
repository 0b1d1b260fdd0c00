"""The GPU evidence stages of scripts/gpu_stages*.py, run on the cpu at a tiny width.

Each stage's logic is the GPU one; only the manager's backend (``cpu``) and the width differ.
The checks compare what a stage saved with truths computed here independently: tensor shapes,
the safetensors library's own reader, a rebuilt model's weights, powers of two.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import psutil
import pytest
import torch

import offload_lab
from offload_lab import catalog

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
CPU = torch.device("cpu")
SCALE = 0.01


@pytest.fixture(scope="module")
def stages():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpu_stages

        yield gpu_stages
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def facts(stages):
    return stages.machine_facts()


def _stage(stages, facts, name, out):
    return stages.Stage(name, out, facts, backend="cpu")


def test_machine_facts_without_cuda_are_none_not_faked(facts):
    cuda = torch.cuda.is_available()
    assert (facts["gpu"] is not None) == cuda
    assert (facts["gpu_memory_bytes"] is not None) == cuda
    assert facts["host_cores"] == os.cpu_count()
    assert facts["host_memory_bytes"] == psutil.virtual_memory().total


def _h3_main_block_bytes() -> int:
    # MiniMax-H3 main block from its public shapes (bf16): two norms, fused QKV, q/k norms, out
    # projection, SwiGLU fc1 (fused) and fc2, the adaLN projection with its bias
    h, attn, ffn, t = 5376, 7168, 14336, 2688
    elems = 2 * h + 3 * attn * h + 2 * 128 + h * attn + 2 * ffn * h + h * ffn + 18 * h * t + 18 * h
    return 2 * elems


def test_h3_layout_from_the_catalog_allocates_nothing_and_fits_the_disk(stages):
    from gpu_stages_h3 import layout

    lay = layout(1.0)
    main = _h3_main_block_bytes()
    refiner = main - 2 * (18 * 5376 * 2688 + 18 * 5376)  # a refiner block has no adaLN
    assert lay["groups"] == {"token_refiner.blocks": 2, "blocks": 50}
    assert len(lay["pinned"]) == 10 and len(lay["mapped"]) == 7  # 15 streamed main blocks + 2 refiner
    assert lay["pinned_bytes"] == 2 * refiner + 8 * main
    assert lay["mapped_bytes"] == 7 * main
    assert lay["file_bytes"] == lay["pinned_bytes"] + lay["mapped_bytes"]  # every tensor 256-byte sized
    assert lay["file_bytes"] < 32 * 2**30  # well under the 64 GiB disk
    # the model in bf16: the catalog's bytes less half of its fp32 non-block tensors
    assert abs(lay["model_bytes"] / catalog.load("minimax-h3").total_bytes - 1) < 1e-3


def test_tight_host_spends_exactly_the_pins(stages):
    from gpu_stages_h3 import tight_host

    for want in (4 << 20, 50 * 2**30):  # under and past the 2 GiB reserve floor's reach
        h = tight_host(want)
        assert want <= h.headroom < want + 2**20


def test_h3_stage_plans_measures_and_maps_a_real_safetensors_file(stages, facts, tmp_path):
    from gpu_check import fast_build
    from gpu_stages_h3 import stage_h3
    from safetensors import safe_open

    st = _stage(stages, facts, "h3", tmp_path)
    stage_h3(st, CPU, scale=SCALE, ckpt_dir=tmp_path / "ckpt")
    st.finish()
    notes = json.loads((tmp_path / "h3.json").read_text())
    assert notes["machine"] == json.loads(json.dumps(facts, default=str))
    assert "skipped" not in notes and "error" not in notes

    (zp,) = tmp_path.glob("h3-01-*.zip")
    run = offload_lab.Run.load(zp)
    assert run.meta["machine"]["host_cores"] == os.cpu_count()
    assert run.meta["backend"] == "cpu" and run.meta["simulated"] is False
    assert sorted(run.meta["groups"]) == ["blocks", "token_refiner.blocks"]
    lay = run.layers.set_index(["group", "layer"])
    main = lay.loc["blocks"]
    assert (main["tier"] == "resident").sum() == 35
    streamed = main[main["tier"] != "resident"].index.tolist()
    # strided: the 15 streamed blocks spread over the group, never two neighbours
    assert len(streamed) == 15 and min(b - a for a, b in zip(streamed, streamed[1:])) >= 2
    tiers = run.layers[run.layers["tier"] != "resident"]["tier"].value_counts().to_dict()
    assert tiers == {"pinned": 10, "mapped": 7}
    assert set(lay.loc["token_refiner.blocks", "tier"]) == {"pinned"}
    assert len(run.steps) == st.steps and (run.steps["bytes_moved"] > 0).all()

    # the file: a real safetensors file (its own library reads it) holding exactly the streamed
    # layers' tensors, with the weights a fresh build of the same model draws
    path = Path(notes["checkpoint"]["path"])
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        ref = fast_build(catalog.load("minimax-h3"), CPU, scale=SCALE)
        names = {n for n, _ in ref.named_parameters()}
        want = {n for n in names if any(n.startswith(f"{g}.{i}.") for g, i in
                                        [(k.rsplit(".", 1)[0], k.rsplit(".", 1)[1]) for k in
                                         notes["layout"]["pinned"] + notes["layout"]["mapped"]])}
        assert keys == want
        some = sorted(keys)[::7]
        assert all(torch.equal(f.get_tensor(k), ref.get_parameter(k).detach()) for k in some)
    mapped = run.layers[run.layers["tier"] == "mapped"]
    assert (mapped["mapped_bytes"] == mapped["bytes"]).all()  # wholly views of the file's pages
    assert (run.layers[run.layers["tier"] == "resident"]["mapped_bytes"] == 0).all()

    # mapped by the planner's own rule: the host the plan was made for affords no copy of them
    reasons = offload_lab.Plan.from_dict(run.meta["plan_full"]).layers.set_index(["group", "layer"])["reason"]
    assert all(reasons[(g, i)].startswith("mapped: demoted from pageable") for g, i in zip(mapped["group"], mapped["layer"]))
    plan = notes["plan"]
    assert plan["ledger"]["fits"] and plan["ledger"]["pinned_bytes"] == notes["layout"]["pinned_bytes"]
    peaks = notes["startup_peak"]
    for init in ("grouped", "naive"):
        assert abs(peaks[init]["error"]) < 0.05
    # naive init moves the whole model before the next group is offloaded: a higher peak
    assert peaks["naive"]["measured_bytes"] > peaks["grouped"]["measured_bytes"]


def test_h3_stage_skips_with_a_note_on_a_host_too_small(stages, facts, tmp_path):
    from gpu_stages_h3 import stage_h3

    st = _stage(stages, facts, "h3", tmp_path)
    stage_h3(st, CPU, scale=1.0, ckpt_dir=tmp_path / "ckpt", host=offload_lab.HostMemory(available="64GiB"))
    st.finish()
    notes = json.loads((tmp_path / "h3.json").read_text())
    assert "64.0 GiB available" in notes["skipped"] and notes["runs"] == []
    assert notes["host_check"]["needed_bytes"] > 64 * 2**30  # the 66 GB model alone is more
    assert list((tmp_path / "ckpt").iterdir()) == []  # nothing built, nothing written


def test_pin_memory_stage_counts_the_stores_bytes(stages, facts, tmp_path):
    from gpu_stages_pin import stage_pin_memory

    st = _stage(stages, facts, "pin_memory", tmp_path)
    stage_pin_memory(st, CPU, scale=SCALE, layers=4, repeats=2)
    st.finish()
    notes = json.loads((tmp_path / "pin_memory.json").read_text())
    assert notes["machine"]["host_memory_bytes"] == psutil.virtual_memory().total
    blocks = notes["blocks"]
    model = stages._model("wan2.1-t2v-14b", CPU, layers=4, scale=SCALE)[0]
    for b, store in zip(model.blocks, blocks["store_bytes"]):
        raw = [p.numel() * p.element_size() for p in b.parameters()]
        assert sum(raw) <= store < sum(raw) + 256 * len(raw)  # each slice padded to 256 bytes
    assert blocks["store_bytes"] == blocks["plan_bytes"]
    assert blocks["predicted_locked_exact"] == sum(blocks["store_bytes"])
    assert blocks["predicted_locked_pow2"] == sum(1 << math.ceil(math.log2(n)) for n in blocks["store_bytes"])
    methods = notes["methods"]
    assert set(methods) == {"pageable", "torch pin_memory()", "exact registered store"}
    for m in methods.values():
        assert m["requested_bytes"] == sum(blocks["store_bytes"])
        assert len(m["gbps"]) == 2 and all(0 < g < 1e4 for g in m["gbps"])
        assert m["pinned"] is False  # nothing can be pinned without CUDA, and nothing says it was
        assert m["proc_status_delta"].get("VmLck", 0) == 0
    assert methods["exact registered store"]["locked_bytes_counted"] == 0
    assert "no_cuda" in notes


def test_diffusers_bare_reports_both_timings(stages, facts, tmp_path):
    pytest.importorskip("diffusers")
    from gpu_stages_bare import stage_diffusers_bare

    st = _stage(stages, facts, "diffusers_bare", tmp_path)
    stage_diffusers_bare(st, CPU, scale=0.02, layers=3, steps=2, rounds=1)
    st.finish()
    notes = json.loads((tmp_path / "diffusers_bare.json").read_text())["diffusers_bare"]
    assert len(notes["bare_s"]) == 1 and len(notes["bare_s"][0]) == 2
    assert len(notes["observed_s"][0]) == 2
    assert notes["bare_median_s"] > 0 and notes["observed_median_s"] > 0
    assert notes["observer_overhead"] == pytest.approx(notes["observed_median_s"] / notes["bare_median_s"] - 1)
    (zp,) = tmp_path.glob("diffusers_bare-01-*.zip")
    run = offload_lab.Run.load(zp)
    assert run.backend == "observe" and len(run.steps) == 2
    assert run.meta["machine"]["host_cores"] == os.cpu_count()
    # the observer timed every block of each step, under diffusers' hooks
    compute = run.events[run.events["kind"] == "compute"]
    assert compute.groupby("step")["layer"].nunique().tolist() == [3, 3]
    assert run.meta["observed_system"] == "diffusers group offload observed round 1"


def test_run_stages_saves_json_and_refuses_what_it_cannot_shrink(stages, tmp_path):
    assert stages.run_stages(["pin_memory"], tmp_path, CPU, scale=SCALE) == 0
    notes = json.loads((tmp_path / "pin_memory.json").read_text())
    assert notes["wall_s"] > 0 and "error" not in notes
    with pytest.raises(ValueError, match="scale 0.01 is only for the stages"):
        stages.run_stages(["tokens"], tmp_path, CPU, scale=SCALE)
    with pytest.raises(ValueError, match="unknown stage"):
        stages.run_stages(["h4"], tmp_path, CPU)


def test_gpu_check_names_an_unknown_stage(stages, capsys):
    import gpu_check

    with pytest.raises(SystemExit):
        gpu_check.main(["--out", "unused", "--stage", "h3,pin-memory"])
    assert "['pin-memory'] unknown" in capsys.readouterr().err


def test_first_runs_its_parts_in_order_within_the_budget_and_names_what_it_skipped(stages, tmp_path):
    from gpu_first import ISSUE_CONFIGS, ORDER, run_first

    # a budget no part fits: nothing runs, and first.json says each part was skipped, in order
    res = run_first(tmp_path / "none", CPU, budget_s=0.5, scale=SCALE)
    assert res["ran"] == [] and res["skipped"] == res["order"]
    assert res["order"] == [p for p in ORDER if p not in stages.STAGES or p in stages.SCALED]
    assert json.loads((tmp_path / "none" / "first.json").read_text())["skipped"] == res["order"]

    # smoke and the issue-order experiment fit; the evidence stages' estimates do not
    out = tmp_path / "first"
    big = {name: 10_000.0 for name in stages.SCALED}
    res = run_first(out, CPU, budget_s=3_000, scale=SCALE, tokens=64, steps=1, warmup=0,
                    estimates={"smoke": 1.0, "issue_order": 1.0, **big})
    assert res["ran"] == ["smoke", "issue_order"] and res["failed"] == []
    assert res["skipped"] == [p for p in stages.STAGES if p in stages.SCALED]
    assert list(res["wall_s"]) == ["smoke", "issue_order"]
    smoke = json.loads((out / "smoke.json").read_text())
    assert all(smoke["identical"].values()) and all(smoke["restored"].values())
    runs = {offload_lab.Run.load(p).label: offload_lab.Run.load(p) for p in sorted(out.glob("staged-14B_*.zip"))}
    assert sorted(runs) == sorted(f"14B {c}" for c in ISSUE_CONFIGS)
    issues = {label: r.meta["issue"] for label, r in runs.items()}
    assert issues["14B pageable before-compute"] == "before-compute"
    assert issues["14B pageable after-compute"] == "after-compute"
    for r in runs.values():
        assert r.meta["machine"]["host_cores"] == os.cpu_count()  # the full facts, not a summary
        assert r.meta["gpu_check"]["bit_identical_to_pinned"] is True
        assert r.meta["model"] == "wan2.1-t2v-14b" and len(r.layers) == 4
    assert not list(out.glob("pin_memory*")) and not list(out.glob("h3*"))
    with pytest.raises(ValueError, match="budget_s=0"):
        run_first(tmp_path / "x", CPU, budget_s=0)
