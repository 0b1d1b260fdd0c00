"""Record the measured CPU runs that the simulator's truth checks compare against.

One small synthetic model (Wan2.1-T2V-1.3B shapes at scale 0.25, 6 blocks, float32, 16 video
and 16 text tokens, so that a copy takes about half a block's compute) is profiled on the
``cpu`` backend under several plans: pinned / pageable / mixed tiers, prefetch 0, 1, 2, and two
resident layers. Each plan is measured ``--rounds`` times, interleaved, and its typical run (the
one at the median over rounds) is kept: on a shared machine the neighbours' load comes and goes,
and typical runs stand for all plans under the same conditions.

Writes ``<out>/<plan>.run.zip`` (``Run.save``) and ``<out>/manifest.json`` (each plan as
``Plan.to_dict()`` without its spec, which is stored once, so tests rebuild the exact plan and
spec without torch or the planner's current defaults; plus how and where the runs were taken).

    .venv/bin/python scripts/record_sim_fixtures.py                # -> tests/data/runs/
    .venv/bin/python scripts/record_sim_fixtures.py --out /tmp/runs --rounds 5

Keep the directory small (tens of KB per run); tests load it, nothing re-measures it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = {"catalog": "wan2.1-t2v-1.3b", "scale": 0.25, "layers": 6, "dtype": "float32",
         "tokens": 16, "text_tokens": 16, "seed": 0}
HOST = "64GiB"  # a hypothetical host, so that the plans do not depend on this machine's memory
STEPS, WARMUP = 9, 1


def plan_args(layer_bytes: int) -> dict[str, dict[str, Any]]:
    """The plans recorded, by fixture name (arguments of ``offload_lab.plan``)."""
    return {
        "pinned-p0": {"tier": "pinned", "prefetch": 0},
        "pinned-p1": {"tier": "pinned", "prefetch": 1},
        "pinned-p2": {"tier": "pinned", "prefetch": 2},
        "pageable-p0": {"tier": "pageable", "prefetch": 0},
        "pageable-p1": {"tier": "pageable", "prefetch": 1},
        # the first three layers pinned, the rest pageable: both tiers in one run
        "mixed-p1": {"pin_budget": 3 * layer_bytes + 4096, "prefetch": 1},
        "resident2-pinned-p1": {"tier": "pinned", "prefetch": 1, "resident": 2},
    }


def load_plan(manifest: dict[str, Any], name: str):
    """The recorded plan ``name`` of a manifest, as an ``offload_lab.planning.planner.Plan``."""
    from offload_lab.planning.planner import Plan

    return Plan.from_dict({**manifest["runs"][name]["plan"], "spec": manifest["spec"]})


def build_model():
    """The fixture model, its example inputs and its spec (what the manifest describes)."""
    import offload_lab as ol
    from offload_lab import synthetic

    model = synthetic.build(ol.catalog.load(MODEL["catalog"]), scale=MODEL["scale"],
                            layers=MODEL["layers"], dtype=MODEL["dtype"], seed=MODEL["seed"])
    inputs = synthetic.example_inputs(model, tokens=MODEL["tokens"], text_tokens=MODEL["text_tokens"])
    return model, inputs, synthetic.spec_of(model)


def make_plans(spec) -> dict[str, Any]:
    import offload_lab as ol

    host = ol.HostMemory(available=HOST)
    layer_bytes = max(layer.bytes for layer in spec.iter_layers())
    return {name: ol.plan(spec, host=host, **args) for name, args in plan_args(layer_bytes).items()}


def spread(run) -> float:
    """Slowest over fastest measured step: near 1 when nothing disturbed the run."""
    w = run.steps["wall_s"]
    return float(w.max() / w.min())


def measure(model, inputs, plans: dict[str, Any], rounds: int, steps: int = STEPS,
            warmup: int = WARMUP, log=print) -> dict[str, Any]:
    """Profile every plan once per round, back to back, for ``rounds`` rounds; keep typical runs.

    The plans are compared with each other, so each kept run must stand for its plan under the
    same conditions. On a shared machine the neighbours' load comes and goes between rounds, so
    the kept run of a plan is its *typical* one: the run whose median step is the median over
    the rounds (ties: the steadier run, slowest step over fastest). A single quiet or disturbed
    round then moves no fixture.
    """
    import offload_lab as ol

    got: dict[str, list] = {name: [] for name in plans}
    for r in range(rounds):
        for name, plan in plans.items():
            run = ol.profile(model, lambda: model(**inputs), plan, steps=steps, warmup=warmup,
                             backend="cpu", label=f"{name} (cpu, measured)")
            got[name].append(run)
        log(f"round {r + 1}/{rounds}: " + " ".join(f"{n}={rs[-1].step_time * 1e3:.1f}" for n, rs in got.items()))
    kept = {}
    for name, rs in got.items():
        mid = float(np.median([x.step_time for x in rs]))
        kept[name] = min(rs, key=lambda x: (abs(x.step_time - mid), spread(x)))
        log(f"{name:22s} median over rounds {mid * 1e3:7.2f} ms; kept {kept[name].step_time * 1e3:7.2f} ms "
            f"(spread {spread(kept[name]):.2f})")
    return kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "runs"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: a shared machine's noise hurts less)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    loadavg = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    model, inputs, spec = build_model()
    plans = make_plans(spec)
    runs = measure(model, inputs, plans, args.rounds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "about": "measured cpu-backend runs for tests/test_sim.py; made by scripts/record_sim_fixtures.py",
        "model": MODEL, "host": HOST, "steps": STEPS, "warmup": WARMUP, "rounds": args.rounds,
        "torch_threads": args.threads, "torch_version": torch.__version__,
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count()},
        "recorded": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "selection": "per plan, the run at the median over the rounds (measure())",
        "loadavg_before": loadavg,
        "spec": spec.to_dict(),
        "runs": {},
    }
    for name, run in runs.items():
        path = run.save(out / f"{name}.run.zip")
        plan = plans[name].to_dict()
        del plan["spec"]  # stored once above; load_plan() puts it back
        manifest["runs"][name] = {"file": path.name, "step_s": run.step_time, "plan": plan}
    (out / "manifest.json").write_text(json.dumps(manifest, separators=(",", ":")) + "\n")
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {len(runs)} runs + manifest to {out} ({total / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
