"""``offload-lab demo``: measured runs of a scaled catalog model, simulated full-size runs, one
offline HTML report.

The measured runs use a synthetic model with the catalog model's architecture, scaled so each
profile takes a few seconds here, under four plans (all pinned, all pageable, mapped from a
safetensors checkpoint, half the layers pinned), on CUDA when there is a GPU, else on the cpu
backend. Every output path is checked before the first run starts.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from offload_lab.cli.common import CPU_NOTE, SIM_HOST, CliError, resolve_backend, say, set_threads
from offload_lab.cli.outputs import check_output, check_output_dir
from offload_lab.cli.progress import Progress
from offload_lab.cli.results import comparison_text, evidence_line, write_report
from offload_lab.cli.sizing import Sizing, choose_size
from offload_lab.model import catalog, synthetic
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.planner import Plan, PlanWarning, plan
from offload_lab.record.run import Run, display_label
from offload_lab.record.runtime import profile
from offload_lab.record.shipped import shipped_runs
from offload_lab.shipped import ShippedDataError
from offload_lab.simulation import DeviceProfile
from offload_lab.simulation.evidence import both_orders, issue_of
from offload_lab.units import format_bytes

if TYPE_CHECKING:
    from offload_lab.model.spec import ModelSpec

__all__ = ["cmd_demo", "DEMO_DEVICES"]

#: the simulated runs of ``demo``: the full-size model on these shipped device profiles
DEMO_DEVICES = ("h200", "rtx4090-pcie4")
_N_JOBS = 4


@dataclass
class _Job:
    """One measured run of the demo: its label and plan, and the model it runs."""

    key: str
    label: str
    plan: Plan
    model: Any


@dataclass
class _Setup:
    """What the demo runs: the spec, backend, sizes and step counts, chosen before any work."""

    spec: ModelSpec
    name: str
    backend: str
    steps: int
    warmup: int
    sim_steps: int
    profiles: list[Any]
    size: Sizing | None = None
    why: str = ""  # why this backend


def _shipped_gpu_runs(model: str) -> list[Run]:
    """Measured GPU runs of ``model`` shipped with the package, 480p ones only ([] when none)."""
    try:
        runs = shipped_runs(model)
    except (ShippedDataError, ValueError):
        return []
    return [r for r in runs
            if r.backend == "cuda" and r.meta.get("gpu_check", {}).get("tokens") == 32760]


def _quiet_plan(spec: ModelSpec, **kwargs: Any) -> Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        return plan(spec, **kwargs)


def _setup(args: argparse.Namespace) -> _Setup:
    spec = catalog.load(args.model)
    backend = resolve_backend(args.backend)
    why = ({"cuda": "a CUDA device is present", "cpu": "no CUDA device"}[backend]
           if args.backend == "auto" else "as asked")
    name = spec.meta.get("display_name", spec.name)
    profiles = [DeviceProfile.load(d) for d in DEMO_DEVICES]  # fail early on a broken install
    quick = args.quick
    steps = args.steps or ((3 if quick else 5) if backend == "cuda" else (2 if quick else 3))
    warmup = args.warmup if args.warmup is not None else (1 if (quick or backend == "cpu") else 2)
    return _Setup(spec, name, backend, steps, warmup, 2 if quick else 3, profiles, why=why)


def _measure(args: argparse.Namespace, s: _Setup, bar: Progress) -> tuple[list[Run], Plan]:
    """The four measured runs of the scaled model; returns them and the half-pinned plan."""
    bar.stage("sizing the model for this machine")
    threads = set_threads(s.backend, args.threads)
    s.size = size = choose_size(s.spec, s.backend, quick=args.quick)
    if threads:
        size.why.insert(1, threads)
    bar.advance(1)
    for line in size.why:
        bar.print(f"  sizing: {line}")
    bar.stage("building the synthetic model")
    model = synthetic.build(s.spec, scale=size.scale, layers=size.layers)
    sspec = synthetic.spec_of(model)
    device = "cuda" if s.backend == "cuda" else "cpu"
    inputs = synthetic.example_inputs(model, tokens=size.tokens, text_tokens=size.text_tokens,
                                      device=device)
    bar.advance(2)
    half = int(sspec.layer_bytes) // 2
    partial = _quiet_plan(sspec, pin_budget=half)
    b = s.backend
    jobs = [_Job("pinned", f"{b}: all pinned", _quiet_plan(sspec, tier="pinned"), model),
            _Job("pageable", f"{b}: all pageable", _quiet_plan(sspec, tier="pageable"), model)]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="offload-lab-demo-") as tmp:
        bar.stage("saving a safetensors checkpoint for the mapped run")
        mapped_model = synthetic.load(synthetic.save(model, Path(tmp) / "model.safetensors"), mmap=True)
        mplan = _quiet_plan(synthetic.spec_of(mapped_model), tier="mapped")
        bar.advance(1)
        jobs += [_Job("mapped", f"{b}: mapped (mmap'd safetensors)", mplan, mapped_model),
                 _Job("partial", f"{b}: half pinned ({format_bytes(half)} budget)", partial, model)]
        for job in jobs:
            bar.stage(f"profiling {job.label}")
            m = job.model
            runs.append(profile(m, lambda m=m: m(**inputs), job.plan, steps=s.steps, warmup=s.warmup,
                                backend=b, label=job.label, progress=bar.steps(job.label)))
            job.model = None
        del mapped_model, m  # drop every view of the file before the directory goes
    del model
    if b == "cuda":
        torch.cuda.empty_cache()
    return runs, partial


def _simulate(s: _Setup, bar: Progress) -> list[Run]:
    """All-pinned and all-pageable runs of the full-size model on each demo device profile; the
    all-pageable plan under both issue orders (they differ for it; an all-pinned plan runs alike)."""
    bar.stage(f"simulating the full-size {s.name}")
    host = HostMemory(available=SIM_HOST)
    out: list[Run] = []
    for prof in s.profiles:
        for tier in ("pinned", "pageable"):
            p = _quiet_plan(s.spec, tier=tier, host=host)
            runs = both_orders(p, prof, steps=s.sim_steps, label=f"{prof.name}: all {tier}, full-size {s.spec.name}")
            out += runs
            bar.advance(len(runs))
    return out


def _print_results(s: _Setup, measured: list[Run], gpu_runs: list[Run], sim_runs: list[Run]) -> None:
    say()
    say(f"measured on {s.backend} — synthetic {s.name}, {s.size.describe()}, {s.steps} steps after "
        f"{s.warmup} warm-up:")
    say(comparison_text(measured))
    if gpu_runs:
        say()
        orders = ", ".join(sorted({issue_of(r) for r in gpu_runs}))
        say(f"MEASURED on {gpu_runs[0].meta.get('device_name', 'a GPU')} (shipped runs under "
            f"data/runs, scripts/gpu_check.py) — full-width synthetic {s.name}, issue order {orders}:")
        say(comparison_text(gpu_runs))
    for prof in s.profiles:
        group = [r for r in sim_runs if r.meta.get("profile", {}).get("name") == prof.name]
        say()
        say(f"SIMULATED on {prof.name} ({prof.provenance.get('kind', 'estimated')} profile) — "
            f"full-size {s.name}, {format_bytes(s.spec.layer_bytes)} of layer weights, one forward "
            f"per step:")
        say(comparison_text(group))
        for r in group:
            say(f"  {display_label(r)}: {evidence_line(r)}")
    say()
    if s.backend == "cpu":
        gap = measured[1].step_time / measured[0].step_time  # all pageable / all pinned
        here = f" (here all pageable took {gap:.2f}× the all-pinned step)" if math.isfinite(gap) else ""
        say(CPU_NOTE.format(here=here, where=" (the SIMULATED rows above, each order labelled)"))


def _save_runs(runs: list[Run], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(runs):
        r.save(directory / f"{i:02d}-{_slug(r.label)}.zip")


def _slug(text: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in text.lower())
    return "-".join(p for p in out.split("-") if p)[:60]


def cmd_demo(args: argparse.Namespace) -> int:
    """``offload-lab demo``: measured runs of a scaled model, simulated full-size runs, one report.

    It takes about a minute on a small machine, so the example is not run here:

    >>> from offload_lab.cli.app import build_parser
    >>> cmd_demo(build_parser().parse_args(["demo", "--quick", "--out", "/tmp/r.html"]))  # doctest: +SKIP
    0
    """
    t_start = time.perf_counter()
    s = _setup(args)  # the inputs first: the model, the backend, the device profiles
    # then every output, before minutes of work, not after
    out = check_output(args.out, args.force)
    save_dir = check_output_dir(args.save_runs, args.force) if args.save_runs is not None else None
    say(f"offload-lab demo: {s.name} ({s.spec.name}) on the {s.backend} backend ({s.why})")
    # simulations: all pinned once, all pageable under both issue orders, per profile
    bar = Progress(1 + _N_JOBS * (s.steps + s.warmup) + 2 + 1 + 3 * len(s.profiles) + 2, started=t_start)
    measured, partial = _measure(args, s, bar)
    sim_runs = _simulate(s, bar)
    gpu_runs = _shipped_gpu_runs(s.spec.name)
    all_runs = measured + gpu_runs + sim_runs
    if save_dir is not None:
        _save_runs(all_runs, save_dir)
    bar.stage("writing the report")
    failed: CliError | None = None
    try:
        path = write_report(all_runs, out, partial,
                           f"offload-lab demo: {s.name}, {s.backend} runs and simulated full-size runs")
    except CliError as e:
        # keep what was measured: print it and save the runs, then report the failure
        failed = e
    # the bar's clock started with the command: its last line is the total, said once
    bar.close("report failed" if failed else "done")
    _print_results(s, measured, gpu_runs, sim_runs)
    if save_dir is not None:
        say(f"runs: {save_dir.resolve()}")
    if failed is not None:
        if save_dir is None:
            save_dir = out.with_suffix(".runs")
            _save_runs(all_runs, save_dir)
            say(f"runs: {save_dir.resolve()}")
        say(f"build the report where plotly is installed: offload-lab report {save_dir.resolve()}")
        raise failed
    say(f"report: {path.resolve()}")
    return 0
