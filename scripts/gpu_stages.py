"""The GPU measurements the simulator's accuracy still lacks, as stages of ``scripts/gpu_check.py``.

    PYTHONPATH=. python3 scripts/gpu_check.py --out DIR --stage evidence            # all below
    PYTHONPATH=. python3 scripts/gpu_check.py --out DIR --stage tokens,short,overhead

Each stage saves its runs as ``DIR/<stage>-NN-<label>.zip`` with the machine's facts in
``meta["machine"]`` (GPU, driver, CUDA, host cores and memory, package versions) and writes
``DIR/<stage>.json`` with what it checked. They run in the order below.

Estimated times on one H200, from the shipped runs in ``data/runs/h200-2026-12-01/``: a
1.3B-shaped run (1 warm-up + 2 steps at 480p) takes 3.3 s of wall and a 14B-shaped one 23-24 s
(``wall_s`` in ``comparison.csv``; steps 0.62 s, 3.27 s pinned, 6.38 s pageable; the rest of a
pinned 14B run, about 14 s, is setting up and pinning 26 GiB); building the 14B model takes
about 20 s (``log.txt``: 98.6 s in all, less the 31.2 s before the build and the two 14B runs);
diffusers' group offloading steps in 0.69 s (``log_diffusers.txt``). Larger models are scaled
from these by bytes (building, pinning) and by FLOPs (steps: MiniMax-H3 at 480p does 1.71× the
14B's work per forward, ``offload_lab.model.flops.forward_flops``).

| stage | what | ≈ s |
| --- | --- | ---: |
| ``tokens`` | 1.3B pinned p1 at 1,024 / 4,096 / 16,384 / 32,760 / 75,600 tokens; 14B pinned at 1,024: the compute curve from more than two token counts, held out across tokens both ways | 60 |
| ``short`` | ``offload-lab calibrate`` on 4 layers of 14B at 480p and 1,024, then the full 40 layers: the short-run prediction checked | 90 |
| ``overhead`` | 1.3B at 480p: bare forwards vs the manager with everything resident | 15 |
| ``cfg720`` | 1.3B pinned p1 at 720p, two calls per step (classifier-free guidance) | 30 |
| ``pin_memory`` | 8 blocks of 14B (5.6 GB): each held pageable, by torch's ``tensor.pin_memory()`` (caching host allocator) and by offload-lab's exact registered stores; H2D GB/s of each, and the host bytes really locked (``VmLck``, ``VmPin``, torch's ``host_memory_stats``) beside the requested bytes and the planner's exact / power-of-two predictions | 30 |
| ``diffusers_bare`` | diffusers' block-level group offloading of 1.3B at 480p, wall clock with ``cuda.synchronize``, without and with ``offload_lab.observe`` attached, two rounds of 5 forwards each: the observer's own overhead (skipped with a note without diffusers) | 25 |
| ``h3`` | MiniMax-H3 at full size (66 GB bf16, two groups), 35 of 50 main blocks resident strided, the 17 streamed layers pinned (10) and mapped (7) from a 21 GB safetensors file written for them on local disk; startup peak grouped vs naive against the planner; one profiled run at 480p. Needs about 85 GB of host memory and 25 GB of disk: skips with a note otherwise | 140 |
| ``budgets`` | 14B at pin budgets 25 / 50 / 75 % × orders execution / reverse / strided / largest: twelve 14B runs | 300 |
| ``repeats`` | 14B pinned and pageable, 5 measured steps, 2 repeats, outputs compared bit for bit with the unmanaged model | 240 |

All of them take about 16 minutes: more than the 8 minutes one session aims at. The first seven
(``tokens`` to ``h3``, about 390 s) fit; short of time, skip ``budgets`` first, then
``repeats``, then ``h3``::

    PYTHONPATH=. python3 scripts/gpu_check.py --out DIR --stage tokens,short,overhead,cfg720,pin_memory,diffusers_bare,h3

``--stage first`` (``scripts/gpu_first.py``) runs the smoke checks and the issue-order
experiment, then these stages in this order while their estimates fit its ``--budget-s``.

``run_stages(..., scale=0.01)`` runs ``pin_memory``, ``diffusers_bare`` and ``h3`` at a tiny
width on the cpu backend: their logic, not their numbers (``tests/test_gpu_stages.py``).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

# in the order they run: the ones to skip first when short of time come last
STAGES = ("tokens", "short", "overhead", "cfg720", "pin_memory", "diffusers_bare", "h3", "budgets", "repeats")
#: the stages that also run at a tiny width (``scale`` < 1), so their logic is tested on a cpu
SCALED = ("h3", "pin_memory", "diffusers_bare")


def machine_facts() -> dict[str, Any]:
    """GPU, driver, CUDA, host cores and memory, package versions: the meta every run carries.

    Without a CUDA device (a cpu dry run) the GPU fields are None: nothing here pretends to be one.
    """
    import importlib.metadata as md

    import psutil
    import torch

    def version(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        smi = None
    cuda = torch.cuda.is_available()
    return {
        "gpu": torch.cuda.get_device_name(0) if cuda else None, "nvidia_smi": smi,
        "cuda_runtime": torch.version.cuda,
        "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
        "host_cores": os.cpu_count(), "host_memory_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(), "python": platform.python_version(),
        "packages": {p: version(p) for p in ("torch", "numpy", "pandas", "pyarrow", "safetensors", "diffusers",
                                             "offload-lab")},
    }


class Stage:
    """Runs of one stage, saved as they come with the machine's facts.

    ``backend`` is the manager's: ``cuda`` on the GPU, ``cpu`` for a dry run of a stage's logic
    at a tiny size (its numbers are then CPU numbers, and the run says so in ``meta["backend"]``).
    """

    def __init__(self, name: str, out: Path, facts: dict[str, Any], steps: int = 2, warmup: int = 1,
                 backend: str = "cuda"):
        self.name, self.out, self.facts, self.steps, self.warmup = name, out, facts, steps, warmup
        self.backend = backend
        self.runs: list = []
        self.notes: dict[str, Any] = {}

    def measure(self, label: str, model, inputs, plan, tokens: int, steps: int | None = None, **kw):
        import offload_lab

        run = offload_lab.profile(model, lambda: model(**inputs), plan, steps=steps or self.steps,
                                  warmup=self.warmup, backend=self.backend, label=label, **kw)
        return self.keep(run, tokens)

    def keep(self, run, tokens: int, **meta):
        """Save a run made outside :meth:`measure` (an observed one, two passes a step) as this stage's."""
        run.meta.update(tokens=int(tokens), machine=self.facts, **meta)
        self.runs.append(run)
        run.save(self.out / f"{self.name}-{len(self.runs):02d}-{run.label.replace(' ', '_')}.zip")
        print(f"  {self.name}: {run.label:<34} {run.step_time:8.4f} s/step", flush=True)
        return run

    def finish(self) -> None:
        (self.out / f"{self.name}.json").write_text(json.dumps(
            {"stage": self.name, "machine": self.facts, "runs": [r.label for r in self.runs],
             **self.notes}, indent=1, default=str) + "\n")


def _model(name: str, dev, layers: int | dict[str, int] | None = None, scale: float = 1.0):
    """A catalog model built by ``fast_build`` (full size unless ``scale`` < 1), and its spec."""
    from gpu_check import fast_build

    import offload_lab
    from offload_lab import catalog

    spec = catalog.load(name)
    kw: dict[str, Any] = {"layers": layers} if layers else {}
    if scale != 1.0:
        kw["scale"] = scale
    model = fast_build(spec, dev, **kw)
    return model, offload_lab.spec_of(model, name=spec.name)


def _host():
    from offload_lab import HostMemory

    return HostMemory.probe()


def stage_tokens(st: Stage, dev) -> None:
    import offload_lab
    from offload_lab import synthetic

    model, spec = _model("wan2.1-t2v-1.3b", dev)
    plan = offload_lab.plan(spec, tier="pinned", prefetch=1, host=_host())
    for n in (1024, 4096, 16384, 32760, 75600):
        st.measure(f"1.3B pinned p1 {n}-tok", model, synthetic.example_inputs(model, tokens=n, device=dev), plan, n)
    del model
    model, spec = _model("wan2.1-t2v-14b", dev)
    plan = offload_lab.plan(spec, tier="pinned", prefetch=1, host=_host())
    st.measure("14B pinned p1 1024-tok", model, synthetic.example_inputs(model, tokens=1024, device=dev), plan, 1024)


def stage_short(st: Stage, dev) -> None:
    import offload_lab
    from offload_lab import synthetic

    short, sspec = _model("wan2.1-t2v-14b", dev, layers=4)
    host = _host()
    train = []
    for n in (32760, 1024):
        x = synthetic.example_inputs(short, tokens=n, device=dev)
        for tier in ("pinned", "pageable"):
            train.append(st.measure(f"14B x4 {tier} p1 {n}-tok", short, x,
                                    offload_lab.plan(sspec, tier=tier, prefetch=1, host=host), n))
    prof = offload_lab.calibrate(train, name="h200-short", tokens=32760)
    prof.to_json(st.out / "short-profile.json")
    del short
    model, spec = _model("wan2.1-t2v-14b", dev)
    x = synthetic.example_inputs(model, tokens=32760, device=dev)
    checks = {}
    for tier in ("pinned", "pageable"):
        plan = offload_lab.plan(spec, tier=tier, prefetch=1, host=host)
        run = st.measure(f"14B {tier} p1 full", model, x, plan, 32760)
        sim = offload_lab.simulate(plan, prof, steps=2, tokens=32760)
        checks[tier] = {"measured_s": run.step_time, "predicted_s": sim.step_time,
                        "error": sim.step_time / run.step_time - 1}
    st.notes["short_run_prediction"] = checks


def stage_overhead(st: Stage, dev) -> None:
    import torch

    import offload_lab
    from offload_lab import synthetic

    model, spec = _model("wan2.1-t2v-1.3b", dev)
    x = synthetic.example_inputs(model, tokens=32760, device=dev)
    model.to(dev)
    times = []
    with torch.no_grad():
        for k in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(**x)
            torch.cuda.synchronize()
            if k:
                times.append(time.perf_counter() - t0)
    model.to("cpu")
    run = st.measure("1.3B manager all resident", model, x,
                     offload_lab.plan(spec, resident=spec.groups[0].num_layers, host=_host()), 32760, steps=5)
    bare = sorted(times)[len(times) // 2]
    st.notes["overhead"] = {"bare_median_s": bare, "bare_steps_s": times, "manager_median_s": run.step_time,
                            "ratio": run.step_time / bare}


def stage_cfg720(st: Stage, dev) -> None:
    import offload_lab
    from offload_lab import synthetic

    model, spec = _model("wan2.1-t2v-1.3b", dev)
    x = synthetic.example_inputs(model, tokens=75600, device=dev)
    plan = offload_lab.plan(spec, tier="pinned", prefetch=1, host=_host())
    # two forwards per step: the conditional and the unconditional pass
    run = offload_lab.profile(model, lambda: (model(**x), model(**x)), plan, steps=2, warmup=1,
                              backend="cuda", label="1.3B pinned p1 720p cfg")
    st.keep(run, 75600, passes=2)


def stage_budgets(st: Stage, dev) -> None:
    import offload_lab
    from offload_lab import synthetic

    model, spec = _model("wan2.1-t2v-14b", dev)
    x = synthetic.example_inputs(model, tokens=32760, device=dev)
    total = int(spec.layers["bytes"].sum())
    for share in (0.25, 0.5, 0.75):
        for order in ("execution", "reverse", "strided", "largest"):
            plan = offload_lab.plan(spec, pin_budget=int(total * share), order=order, prefetch=1, host=_host())
            st.measure(f"14B pin {int(share * 100)}% {order}", model, x, plan, 32760)


def stage_repeats(st: Stage, dev) -> None:
    import torch

    import offload_lab
    from offload_lab import synthetic

    model, spec = _model("wan2.1-t2v-14b", dev)
    x = synthetic.example_inputs(model, tokens=32760, device=dev)
    with torch.no_grad():
        model.to(dev)
        want = model(**x).float().cpu()
        model.to("cpu")
    same = {}
    for rep in (1, 2):
        for tier in ("pinned", "pageable"):
            plan = offload_lab.plan(spec, tier=tier, prefetch=1, host=_host())
            st.measure(f"14B {tier} p1 rep{rep}", model, x, plan, 32760, steps=5)
            with torch.no_grad(), offload_lab.offload(model, plan):
                got = model(**x).float().cpu()
            same[f"{tier} rep{rep}"] = bool(torch.equal(got, want))
    st.notes["bit_identical_to_unmanaged"] = same


def _stage_fn(name: str):
    """The function of a stage; the newer ones live in their own modules and take ``scale``."""
    if name == "h3":
        from gpu_stages_h3 import stage_h3

        return stage_h3
    if name == "pin_memory":
        from gpu_stages_pin import stage_pin_memory

        return stage_pin_memory
    if name == "diffusers_bare":
        from gpu_stages_bare import stage_diffusers_bare

        return stage_diffusers_bare
    return globals()[f"stage_{name}"]


def run_stages(names: list[str], out: Path, dev, scale: float = 1.0) -> int:
    """Run the named stages (``STAGES``) in order; a failed stage is reported and the rest go on.

    ``scale`` < 1 runs the stages in ``SCALED`` at that width (a cpu dry run of their logic);
    the others only exist at full size.
    """
    import traceback

    import torch

    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; accepted: {', '.join(STAGES)}")
    if scale != 1.0 and any(n not in SCALED for n in names):
        raise ValueError(f"scale {scale!r} is only for the stages {list(SCALED)}, not "
                         f"{[n for n in names if n not in SCALED]}")
    out.mkdir(parents=True, exist_ok=True)
    facts = machine_facts()
    failed = 0
    for name in names:
        st = Stage(name, out, facts, backend="cuda" if dev.type == "cuda" else "cpu")
        t0 = time.perf_counter()
        print(f"[stage {name}]", flush=True)
        try:
            fn = _stage_fn(name)
            fn(st, dev, scale=scale) if name in SCALED else fn(st, dev)
        except Exception:
            failed += 1
            st.notes["error"] = traceback.format_exc()
            print(f"  FAILED {name}:\n{st.notes['error']}", flush=True)
        st.notes["wall_s"] = time.perf_counter() - t0
        st.finish()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return failed
