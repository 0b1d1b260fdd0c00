#!/usr/bin/env python3
"""Every GPU measurement of offload-lab, as one command (under 8 minutes on an H200).

    PYTHONPATH=. python3 scripts/gpu_check.py --out DIR

Builds a Wan2.1-T2V-1.3B-shaped synthetic DiT at full width in bf16 and profiles it with
32,760 tokens (480p) on the cuda backend under: no offload (all resident), all streamed
pinned / pageable / mapped (from a saved checkpoint), prefetch 0/1/2; then the same model with
few tokens (copy-bound), and a T2V-14B-shaped model all-pinned vs all-pageable when the time
budget allows. Every Run is saved under DIR (also bundled as ``gpu_runs.tar``), with a
comparison table (``comparison.csv``) and the simulator's predictions from a profile
calibrated on the pinned run (``sim_accuracy.csv``). Needs only torch, pandas, pyarrow, psutil
and safetensors. Without CUDA it exits with a clear message.

``--stage first`` runs what a first session on a GPU should: the smoke checks, the issue-order
experiment, then as many evidence stages as fit ``--budget-s`` (``scripts/gpu_first.py``).
``--stage evidence`` (or a comma-separated list of its stages) runs the measurements the
simulator's accuracy still lacks instead: see ``scripts/gpu_stages.py`` for the stages, their
times and which to skip when short of time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_stages import STAGES, run_stages  # noqa: E402


def fast_build(spec, dev, seed: int = 0, **kw):
    """A synthetic model of ``spec`` in bf16 on the host, weights drawn by ``dev``'s RNG.

    ``synthetic.build`` draws every tensor on the CPU (deterministic everywhere, but minutes
    for 14 B parameters); here the architecture is built on ``meta`` and each tensor drawn on
    the GPU with the same scaling rule, then brought to host memory.
    """
    import math

    import torch

    from offload_lab import synthetic

    model = synthetic.build(spec, dtype=torch.bfloat16, device="meta", **kw)
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, p in list(model.named_parameters()):
        x = torch.randn(p.shape, generator=g, device=dev, dtype=torch.float32)
        leaf = name.rsplit(".", 1)[-1]
        shape = tuple(p.shape)
        if leaf == "modulation":
            x = x / math.sqrt(shape[-1])
        elif len(shape) == 1 and leaf == "weight":
            x = 1 + 0.05 * x
        elif leaf == "bias" or len(shape) < 2:
            x = 0.02 * x
        else:
            x = x / math.sqrt(math.prod(shape) // shape[0])
        synthetic._set_tensor(model, name, x.to(p.dtype).cpu())
    return model.eval()


def smoke(dev, log=print, backend: str = "cuda") -> dict:
    """Correctness of the cuda backend on small models: outputs bit-identical to the model
    run wholly on the GPU, for every tier and prefetch depth, with the device peak (the
    allocator's high-water mark) against the planner's estimate; the model restored after; the
    startup peak of grouped vs naive init on a two-group model against the planner.
    ``backend="cpu"`` rehearses the checks without a GPU (``--stage first``'s cpu test)."""
    import tempfile

    import torch

    import offload_lab
    from offload_lab import HostMemory, catalog, synthetic

    host = HostMemory(available="64GiB")
    results: dict = {"identical": {}, "restored": {}, "released": {}, "startup_peak": {}, "device_peak": {}}
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.1, layers=6, dtype=torch.bfloat16)
    inputs = synthetic.example_inputs(model, tokens=512, device=dev)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    layout = {k: (v.shape, v.stride(), v.storage_offset(), v.dtype, v.requires_grad)
              for k, v in model.state_dict(keep_vars=True).items()}
    with torch.no_grad():
        ref = model.to(dev)(**inputs)
        model.to("cpu")

    cases = [(t, p) for t in ("pinned", "pageable") for p in (0, 1, 2, 3)] + [("resident", 1)]
    with tempfile.TemporaryDirectory() as tmp:
        synthetic.save(model, f"{tmp}/ckpt")
        mapped = synthetic.load(f"{tmp}/ckpt", mmap=True)
        for tier, p in cases + [("mapped", 1)]:
            m = mapped if tier == "mapped" else model
            sp = offload_lab.spec_of(m)
            plan = (offload_lab.plan(sp, resident=sp.groups[0].num_layers, host=host) if tier == "resident"
                    else offload_lab.plan(sp, tier=tier, prefetch=p, host=host))
            with offload_lab.offload(m, plan, backend=backend) as mgr, torch.no_grad():
                outs = []
                for _ in range(2):
                    with mgr.step():
                        outs.append(m(**inputs))
            ok = all(torch.equal(o, ref) for o in outs)
            results["identical"][f"{tier} p{p}"] = ok
            if tier == "pinned":
                # the page-locked store replaces each original the parameter owns alone
                results["released"][f"{tier} p{p}"] = (
                    mgr.run.meta["init"]["originals_released_bytes"] == sp.layer_bytes)
            # the after-compute order holds the host so a group keeps at most prefetch + 1 layers on
            # the device: the allocator's high-water mark stays within the planner's estimate
            peak = mgr.run.meta.get("device_peak") or {}
            results["device_peak"][f"{tier} p{p}"] = {**peak, "within_estimate": bool(
                peak and peak["measured_bytes"] <= peak["predicted_bytes"])}
            log(f"  smoke: {tier:<8} prefetch {p}: outputs {'bit-identical' if ok else 'DIFFER'}; device peak "
                f"{peak.get('measured_bytes')} B measured, {peak.get('predicted_bytes')} B estimated")
        del mapped
    after = model.state_dict()
    results["restored"]["values"] = all(torch.equal(after[k], v) for k, v in before.items())
    results["restored"]["devices"] = all(v.device.type == "cpu" for v in after.values())
    # rebuilt originals: the same layout, in plain pageable memory (not the store's page-locked one)
    results["restored"]["layout"] = all(
        (v.shape, v.stride(), v.storage_offset(), v.dtype, v.requires_grad) == layout[k] and not v.is_pinned()
        for k, v in model.state_dict(keep_vars=True).items())
    results["restored"]["hooks"] = not any(mm._forward_pre_hooks or mm._forward_hooks for mm in model.modules())
    log(f"  smoke: restored {results['restored']}")
    h3 = synthetic.build(catalog.load("minimax-h3"), scale=0.05, layers={"token_refiner.blocks": 2, "blocks": 8},
                         dtype=torch.bfloat16)
    plan = offload_lab.plan(offload_lab.spec_of(h3), tier="pinned", prefetch=1, host=host)
    for init in ("grouped", "naive"):
        torch.cuda.empty_cache()
        with offload_lab.offload(h3, plan, backend=backend, init=init) as mgr:
            pass
        measured, predicted = mgr._meta["startup_peak_bytes"], plan.startup_peak(init)
        results["startup_peak"][init] = {"measured": measured, "predicted": predicted}
        log(f"  smoke: startup peak {init}: measured {measured} B, predicted {predicted} B "
            f"({measured / predicted - 1:+.1%})")
    return results


def trace_check(dev, out: Path, log=print) -> dict:
    """A real CUDA torch.profiler trace of offloaded steps, read back by from_torch_profiler.

    Each block is bracketed by a ``record_function("blocks.<i>")`` label (as a user would add),
    the model runs under the manager with half its layers pinned and half pageable, and the
    imported trace must show the same copies per tier and bytes per step as the manager's own Run.
    """
    import torch
    from torch.profiler import ProfilerActivity, record_function, schedule

    import offload_lab
    from offload_lab import HostMemory, catalog, synthetic

    scale, tokens = (1.0, 2048) if dev.type == "cuda" else (0.1, 64)  # a cpu dry run stays small
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=scale, layers=6, dtype=torch.bfloat16)
    inputs = synthetic.example_inputs(model, tokens=tokens, device=dev)
    spec = offload_lab.spec_of(model)
    full = offload_lab.plan(spec, host=HostMemory(available="64GiB"))
    half = int(full.layers["bytes"].iloc[0]) * 3
    plan = offload_lab.plan(spec, pin_budget=half, prefetch=1, host=HostMemory(available="64GiB"))
    labels = []
    for i, block in enumerate(model.blocks):
        def pre(m, a, i=i):
            labels.append(record_function(f"blocks.{i}"))
            labels[-1].__enter__()

        def post(m, a, o):
            labels.pop().__exit__(None, None, None)
        block.register_forward_pre_hook(pre)
        block.register_forward_hook(post)
    path = out / "h200_offload_trace.json"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with offload_lab.offload(model, plan, backend=dev.type) as mgr, torch.no_grad():
        with torch.profiler.profile(activities=activities,
                                    schedule=schedule(wait=0, warmup=1, active=2, repeat=1)) as prof:
            for _ in range(3):
                with mgr.step():
                    model(**inputs)
                prof.step()
        own = mgr.build_run(warmup=1)
    prof.export_chrome_trace(str(path))
    run = offload_lab.from_torch_profiler(path, label="torch.profiler trace")
    got = run.events[run.events["kind"] == "copy"].groupby("tier")["bytes"].agg(["count", "sum"])
    mine = own.events[own.events["kind"] == "copy"].groupby("tier")["bytes"].agg(["count", "sum"])
    log(f"  trace: {path.stat().st_size / 2**20:.1f} MiB, copies by tier from the trace:\n{got}\n"
        f"  the manager's own run:\n{mine}")
    import gzip
    import shutil
    with open(path, "rb") as f, gzip.open(str(path) + ".gz", "wb") as g:
        shutil.copyfileobj(f, g)
    path.unlink()
    return {"trace_copies": {t: [int(r["count"]), int(r["sum"])] for t, r in got.iterrows()},
            "own_copies": {t: [int(r["count"]), int(r["sum"])] for t, r in mine.iterrows()},
            "trace_steps": len(run.steps), "own_steps": len(own.steps)}


def diffusers_check(dev, steps: int = 2, warmup: int = 1, tokens: int = 32760, layers: int | None = None,
                    log=print) -> list:
    """diffusers' group offloading (block level, with streams) observed by ``observe()``, beside
    offload-lab's own all-pinned prefetch-1 run of the same model and inputs. Needs diffusers."""
    import torch
    from diffusers.hooks import apply_group_offloading

    import offload_lab
    from offload_lab import HostMemory, catalog, synthetic

    spec13 = catalog.load("wan2.1-t2v-1.3b")
    kw = {"layers": layers} if layers else {}
    model = fast_build(spec13, dev, **kw) if dev.type == "cuda" else synthetic.build(
        spec13, scale=0.05, dtype=torch.bfloat16, **kw)
    inputs = synthetic.example_inputs(model, tokens=tokens, device=dev)
    spec = offload_lab.spec_of(model, name=spec13.name)
    ours = offload_lab.profile(model, lambda: model(**inputs),
                               offload_lab.plan(spec, tier="pinned", prefetch=1, host=HostMemory(available="64GiB")),
                               steps=steps, warmup=warmup, backend=dev.type, label="offload-lab pinned p1")
    apply_group_offloading(model, onload_device=dev, offload_device=torch.device("cpu"),
                           offload_type="block_level", num_blocks_per_group=1,
                           use_stream=dev.type == "cuda")
    # diffusers makes every ModuleList/Sequential a block group, onloaded only when that module's
    # forward is called; the synthetic DiT reads its small Sequentials' weights directly, so keep
    # those (non-layer, a few MiB) on the device, as offload-lab does with non-layer weights
    for name, child in model.named_children():
        if name != "blocks" and isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
            child.to(dev)
    with offload_lab.observe(model, label="diffusers group offload (block_level, stream)") as obs, torch.no_grad():
        for _ in range(steps + warmup):
            with obs.step():
                model(**inputs)
    theirs = obs.build_run(warmup=warmup)
    for r in (ours, theirs):
        r.meta["gpu_check"] = {"tokens": tokens, "machine": "cloud GPU machine"}
    log("  diffusers vs offload-lab:\n" + offload_lab.compare([ours, theirs]).to_string())
    return [ours, theirs]


def recommend_check(dev, steps: int = 2, warmup: int = 1, tokens: int = 32760, device_memory: str = "2.5GiB",
                    log=print) -> tuple[list, dict]:
    """``recommend()`` on the H200 profile for the full-width Wan2.1-1.3B-shaped model with a
    device memory that holds only part of it, then ``rec.confirm`` on the cuda backend: the
    recommended plan and the all-pageable baseline (at prefetch 0 where the best is all pageable at
    prefetch 1), predicted (simulated) vs measured step and
    device peak (``torch.cuda.max_memory_allocated``). About a minute on an H200."""
    import offload_lab
    from offload_lab import HostMemory, catalog, synthetic

    spec13 = catalog.load("wan2.1-t2v-1.3b")
    model = fast_build(spec13, dev)
    inputs = synthetic.example_inputs(model, tokens=tokens, device=dev)
    spec = offload_lab.spec_of(model, name=spec13.name)
    rec = offload_lab.recommend(spec, "h200", host=HostMemory.probe(), device_memory=device_memory, tokens=tokens)
    log(rec.summary())
    conf = rec.confirm(model, lambda: model(**inputs), steps=steps, warmup=warmup, backend=dev.type)
    log(conf.summary())
    for r in conf.runs:
        r.meta["gpu_check"] = {"tokens": tokens, "machine": "cloud GPU machine", "stage": "recommend"}
    res = {"device_memory": device_memory, "tokens": tokens, "explanation": rec.explanation,
           "search_s": rec.search_s, "table": conf.table.to_dict("records")}
    return conf.runs, res
def pipeline_check(dev, log=print) -> list:
    """A real diffusers WanPipeline (tiny random config) on the GPU with no step markers: the
    transformer under pinned and pageable plans, then the whole pipeline under one pipeline plan.
    Checks steps found from the scheduler, 2 calls per step and frames bit-identical to the
    pipeline without offload; returns the runs. Takes well under a minute. Needs diffusers."""
    import torch

    import offload_lab
    from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_call, tiny_wan_pipeline

    steps = 3
    pipe = tiny_wan_pipeline(layers=6).to(dev)
    with torch.no_grad():
        ref = pipe(**tiny_wan_call(steps=steps, device=dev)).frames
    runs = []
    for tier in ("pinned", "pageable"):
        plan = offload_lab.plan(offload_lab.spec_of(pipe.transformer), tier=tier)
        with offload_lab.offload(pipe.transformer, plan, backend="cuda", label=f"wan pipeline {tier}") as m, \
                torch.no_grad():
            out = pipe(**tiny_wan_call(steps=steps, device=dev)).frames
        runs.append(m.build_run())
        runs[-1].meta["gpu_check"] = {"stage": "pipeline", "same_frames": bool(torch.equal(out, ref)),
                                      "machine": "cloud GPU machine"}
    pp = offload_lab.plan_pipeline(offload_lab.spec_of(pipe).with_uses(steps=steps), tier="pinned")
    with offload_lab.offload(pipe, pp, backend="cuda", label="wan pipeline, whole") as m, torch.no_grad():
        out = pipe(**tiny_wan_call(steps=steps, device=dev)).frames
    runs.append(m.build_run())
    runs[-1].meta["gpu_check"] = {"stage": "pipeline", "same_frames": bool(torch.equal(out, ref)),
                                  "machine": "cloud GPU machine"}
    for r in runs:
        log(f"  {r.label:<28} steps {len(r.steps)} ({r.meta['steps_from']}), calls "
            f"{r.steps['calls'].tolist()}, same frames {r.meta['gpu_check']['same_frames']}, "
            f"{r.step_time:.4f} s/step")
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for the runs, comparison and log")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip remaining configurations once this many seconds have passed (default 360; "
                         "--stage first: run each part only while its estimated time fits, default 420)")
    ap.add_argument("--steps", type=int, default=2, help="measured steps per run (default 2)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps per run (default 1)")
    ap.add_argument("--tokens", type=int, default=32760, help="video tokens (default 32760 = 480p)")
    ap.add_argument("--skip-14b", action="store_true", help="skip the T2V-14B-shaped pair")
    ap.add_argument("--stage", default="all",
                    help="first: smoke, then the issue-order experiment (14B-shaped: all pinned, all pageable "
                         "under both issue orders, all staged), then as many evidence stages as fit --budget-s "
                         "(scripts/gpu_first.py; under 8 minutes); "
                         "main: smoke + measured runs; smoke: only the correctness checks; "
                         "ranks: the multi-rank checks (nccl gather, host staging bandwidth; about a minute); "
                         "staged: pinned vs pageable (both issue orders) vs staged vs a quarter pinned + staged, "
                         "1.3B and 14B, about 3 minutes; "
                         "extras: the torch.profiler trace check; "
                         "recommend: recommend() then confirm() on cuda, predicted vs measured step and "
                         "device peak (about a minute); "
                         "pipeline: a tiny diffusers WanPipeline with no step markers (under a minute); "
                         "diffusers: its group offloading observed beside ours, if diffusers is installed; "
                         "evidence: every stage of scripts/gpu_stages.py, or a comma-separated list of them "
                         f"({', '.join(STAGES)}) (default all)")
    args = ap.parse_args(argv)
    if args.budget_s is not None and not args.budget_s > 0:
        ap.error(f"--budget-s {args.budget_s!r}: accepted: a positive number of seconds")
    if args.budget_s is None:
        args.budget_s = 420.0 if args.stage == "first" else 360.0
    named = ("all", "main", "smoke", "extras", "diffusers", "recommend", "ranks", "pipeline", "staged", "first")
    evidence = [] if args.stage in named else (
        list(STAGES) if args.stage == "evidence" else [x.strip() for x in args.stage.split(",")])
    unknown = [x for x in evidence if x not in STAGES]
    if unknown:
        ap.error(f"--stage {args.stage!r}: {unknown} unknown; accepted: {', '.join(named)}, evidence "
                 f"or a comma-separated list of {list(STAGES)}")

    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch "
              f"(torch {torch.__version__}); this script measures the cuda backend and needs a GPU.",
              file=sys.stderr)
        return 2

    import pandas as pd

    import offload_lab
    from offload_lab import HostMemory, catalog, synthetic

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # runs are bundled into one tar: one file is easier to copy back from a remote GPU machine
    runs_dir = Path(tempfile.mkdtemp(prefix="gpu_runs_"))
    t_start = time.perf_counter()
    runs: list = []
    rows: list[dict] = []
    dev = torch.device("cuda")
    host = HostMemory.probe()
    print(f"gpu_check: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
          f"host available {offload_lab.format_bytes(host.available)}", flush=True)

    def elapsed() -> float:
        return time.perf_counter() - t_start

    def bundle() -> None:
        with tarfile.open(out / "gpu_runs.tar", "w") as tar:
            for p in sorted(runs_dir.glob("*.zip")):
                tar.add(p, arcname=p.name)
        if rows:
            pd.DataFrame(rows).to_csv(out / "comparison.csv", index=False)

    def measure(name: str, model, inputs, plan, init: str = "grouped") -> None:
        if elapsed() > args.budget_s:
            print(f"  skip {name}: time budget of {args.budget_s:.0f} s spent", flush=True)
            return
        t0 = time.perf_counter()
        try:
            run = offload_lab.profile(model, lambda: model(**inputs), plan, steps=args.steps,
                                      warmup=args.warmup, backend="cuda", init=init, label=name)
        except Exception:
            print(f"  FAILED {name}:\n{traceback.format_exc()}", flush=True)
            torch.cuda.empty_cache()
            return
        run.meta["gpu_check"] = {"tokens": int(inputs_tokens[0]), "machine": "cloud GPU machine"}
        runs.append(run)
        run.save(runs_dir / f"{len(runs):02d}-{name}.zip")
        st = run.steps
        rows.append({
            "label": name, "model": run.meta["model"], "tokens": inputs_tokens[0],
            "step_s": run.step_time, "compute_s": float(st["compute_s"].median()),
            "copy_s": float(st["copy_s"].median()), "stall_s": float(st["stall_s"].median()),
            "overlap": float(st["overlap"].median()), "bytes_moved": int(st["bytes_moved"].median()),
            "startup_peak_gib": run.meta["startup_peak_bytes"] / 2**30,
            "predicted_peak_gib": run.meta["predicted_startup_peak_bytes"] / 2**30,
            "pinned_gib": run.meta["pinned_bytes"] / 2**30,
            "net_anon_gib": run.meta["net_anonymous_bytes"] / 2**30,
            "device_peak_predicted_gib": run.meta["device_peak"]["predicted_bytes"] / 2**30,
            "device_peak_measured_gib": run.meta["device_peak"]["measured_bytes"] / 2**30,
            "wall_s": time.perf_counter() - t0,
        })
        r = rows[-1]
        print(f"  {name:<28} {r['step_s']:8.4f} s/step  compute {r['compute_s']:.4f}  copy {r['copy_s']:.4f}"
              f"  stall {r['stall_s']:.4f}  overlap {r['overlap']:.2f}  ({r['wall_s']:.1f} s)", flush=True)
        bundle()

    inputs_tokens = [args.tokens]
    import json

    if evidence:
        return 1 if run_stages(evidence, out, dev) else 0
    if args.stage == "first":
        from gpu_first import run_first

        res = run_first(out, dev, budget_s=args.budget_s, tokens=args.tokens, steps=args.steps, warmup=args.warmup,
                        log=lambda m: print(m, flush=True))
        return 1 if res["failed"] else 0

    if args.stage in ("all", "extras"):
        try:
            res = trace_check(dev, out, log=lambda m: print(m, flush=True))
            (out / "trace_check.json").write_text(json.dumps(res, indent=1))
        except Exception:
            print(f"  FAILED trace check:\n{traceback.format_exc()}", flush=True)
        if args.stage == "extras":
            return 0
    if args.stage in ("all", "ranks"):
        from gpu_ranks import run_stage

        run_stage(out, log=lambda m: print(m, flush=True))
        if args.stage == "ranks":
            return 0
    if args.stage == "staged":
        from gpu_staged import staged_stage

        staged_stage(dev, out, runs_dir, fast_build, tokens=args.tokens, steps=args.steps, warmup=args.warmup,
                     budget_s=min(args.budget_s, 170.0), log=lambda m: print(m, flush=True))
        bundle()
        return 0
    if args.stage in ("all", "diffusers"):
        try:
            import diffusers  # noqa: F401

            for r in diffusers_check(dev, steps=args.steps, warmup=args.warmup, tokens=args.tokens,
                                     log=lambda m: print(m, flush=True)):
                runs.append(r)
                r.save(runs_dir / f"{len(runs):02d}-{r.label.split(' (')[0].replace(' ', '_')}.zip")
            bundle()
        except ImportError:
            print("  diffusers is not installed here: its group offloading is not measured", flush=True)
        except Exception:
            print(f"  FAILED diffusers check:\n{traceback.format_exc()}", flush=True)
        if args.stage == "diffusers":
            return 0
    if args.stage in ("all", "pipeline"):
        try:
            for r in pipeline_check(dev, log=lambda m: print(m, flush=True)):
                runs.append(r)
                r.save(runs_dir / f"{len(runs):02d}-{r.label.replace(' ', '_').replace(',', '')}.zip")
            bundle()
        except ImportError:
            print("  diffusers is not installed here: the pipeline check is not run", flush=True)
        except Exception:
            print(f"  FAILED pipeline check:\n{traceback.format_exc()}", flush=True)
        if args.stage == "pipeline":
            return 0

    if args.stage in ("all", "recommend"):
        try:
            rec_runs, res = recommend_check(dev, steps=args.steps, warmup=args.warmup, tokens=args.tokens,
                                            log=lambda m: print(m, flush=True))
            for r in rec_runs:
                runs.append(r)
                r.save(runs_dir / f"{len(runs):02d}-recommend-{r.label.split(' ')[0]}-{r.backend}.zip")
            (out / "recommend.json").write_text(json.dumps(res, indent=1, default=str))
            bundle()
        except Exception:
            print(f"  FAILED recommend check:\n{traceback.format_exc()}", flush=True)
        if args.stage == "recommend":
            return 0

    try:
        res = smoke(dev, log=lambda m: print(m, flush=True))
        (out / "smoke.json").write_text(json.dumps(res, indent=1))
    except Exception:
        print(f"  FAILED smoke:\n{traceback.format_exc()}", flush=True)
    if args.stage == "smoke":
        return 0

    # -- Wan2.1 T2V-1.3B, full width, bf16 ------------------------------------------------------
    spec13 = catalog.load("wan2.1-t2v-1.3b")
    print(f"[{elapsed():6.1f}s] building {spec13.name} synthetic ({offload_lab.format_bytes(spec13.total_bytes)})",
          flush=True)
    model = fast_build(spec13, dev)
    inputs = synthetic.example_inputs(model, tokens=args.tokens, device=dev)
    spec = offload_lab.spec_of(model, name=spec13.name)
    big_host = HostMemory(available=host.available)

    def mk(**kw):
        return offload_lab.plan(spec, host=big_host, **kw)

    measure("1.3B resident (no offload)", model, inputs, mk(resident=spec.groups[0].num_layers))
    measure("1.3B pinned p1", model, inputs, mk(tier="pinned", prefetch=1))
    measure("1.3B pageable p1", model, inputs, mk(tier="pageable", prefetch=1))
    measure("1.3B pinned p0", model, inputs, mk(tier="pinned", prefetch=0))
    measure("1.3B pinned p2", model, inputs, mk(tier="pinned", prefetch=2))
    half = int(spec.layers["bytes"].sum() // 2)
    measure("1.3B half pin budget p1", model, inputs, mk(pin_budget=half, prefetch=1))

    # copy-bound regime: few tokens, so each block's compute is shorter than its copy
    inputs_tokens[0] = 1024
    small = synthetic.example_inputs(model, tokens=1024, device=dev)
    measure("1.3B pinned p1 1k-tok", model, small, mk(tier="pinned", prefetch=1))
    measure("1.3B pageable p1 1k-tok", model, small, mk(tier="pageable", prefetch=1))
    inputs_tokens[0] = args.tokens

    # mapped: the same weights served from a saved checkpoint's pages
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        try:
            synthetic.save(model, Path(tmp) / "ckpt")
            mapped_model = synthetic.load(Path(tmp) / "ckpt", mmap=True)
            mspec = offload_lab.spec_of(mapped_model, name=spec13.name)
            mplan = offload_lab.plan(mspec, tier="mapped", prefetch=1, host=big_host)
            measure("1.3B mapped p1", mapped_model, inputs, mplan)
            del mapped_model
        except Exception:
            print(f"  FAILED mapped setup:\n{traceback.format_exc()}", flush=True)
    del model
    torch.cuda.empty_cache()

    # -- Wan2.1 T2V-14B-shaped: pinned vs pageable ---------------------------------------------
    spec14 = catalog.load("wan2.1-t2v-14b")
    if not args.skip_14b and elapsed() < args.budget_s * 0.55 and host.available > 3 * spec14.total_bytes:
        print(f"[{elapsed():6.1f}s] building {spec14.name} synthetic ({offload_lab.format_bytes(spec14.total_bytes)})",
              flush=True)
        model = fast_build(spec14, dev)
        inputs = synthetic.example_inputs(model, tokens=args.tokens, device=dev)
        spec = offload_lab.spec_of(model, name=spec14.name)
        measure("14B pinned p1", model, inputs, offload_lab.plan(spec, tier="pinned", host=big_host))
        measure("14B pageable p1", model, inputs, offload_lab.plan(spec, tier="pageable", host=big_host))
        del model
    else:
        print(f"[{elapsed():6.1f}s] skipping the 14B pair (time or host memory)", flush=True)

    bundle()
    if rows:
        table = pd.DataFrame(rows)
        table["ratio"] = table["step_s"] / table["step_s"].iloc[0]
        print("\n" + table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    # the simulator, calibrated on measured runs, predicting the others (see sim_accuracy.py)
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
        import sim_accuracy

        sim_accuracy.main(["--runs", str(runs_dir), "--source", "1.3B half pin budget p1"])
    except Exception:
        print(f"sim accuracy skipped:\n{traceback.format_exc()}", flush=True)
    print(f"gpu_check: {len(runs)} runs in {elapsed():.1f} s -> {out}", flush=True)
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
