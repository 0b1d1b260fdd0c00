#!/usr/bin/env python3
"""What recording a real pipeline costs per call: steps found from the scheduler vs plain calls.

    .venv/bin/python benchmarks/pipeline_calls.py [--layers 6] [--steps 3] [--reps 7]

A tiny diffusers WanPipeline (random config, CPU, one thread), in interleaved rounds, four ways:

- ``pipeline, bare``: the pipeline alone (2 transformer calls per step: guidance on);
- ``pipeline, recorded``: under ``offload(pipe.transformer, all-resident plan)`` with no step
  markers: every call recorded, ``scheduler.step`` wrapped to close the steps;
- ``forward calls, bare``: the same number of transformer forwards called directly;
- ``forward calls, recorded``: those forwards under the same manager, one step per call.

All-resident plans copy nothing, so the difference is bookkeeping: call hooks, step markers,
per-layer hooks and memory samples. Prints medians and the overhead per transformer call.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import offload_lab
from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_call, tiny_wan_pipeline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pipe = tiny_wan_pipeline(layers=args.layers)
    tr = pipe.transformer
    plan = offload_lab.plan(offload_lab.spec_of(tr), resident=1.0,
                            host=offload_lab.HostMemory(available="64GiB"))
    calls = 2 * args.steps
    # the transformer's inputs as the pipeline passes them, captured once
    seen: list = []
    h = tr.register_forward_pre_hook(lambda m, a, k: seen.append(k) if len(seen) < 1 else None, with_kwargs=True)
    with torch.no_grad():
        pipe(**tiny_wan_call(steps=args.steps))
    h.remove()
    kw = seen[0]

    def pipeline():
        with torch.no_grad():
            pipe(**tiny_wan_call(steps=args.steps))

    def forwards():
        with torch.no_grad():
            for _ in range(calls):
                tr(**kw)

    def bare(fn):
        def go() -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        return go

    def recorded(fn, expect_from):
        # only the calls are timed: entering and leaving the manager happen once per session
        def go() -> float:
            with offload_lab.offload(tr, plan, backend="cpu") as m:
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
            run = m.build_run()
            assert run.meta["steps_from"] == expect_from, run.meta["steps_from"]
            assert run.meta["calls_recorded"] == calls
            return dt
        return go

    ways = {
        "pipeline, bare": bare(pipeline),
        "pipeline, recorded (steps from scheduler)": recorded(pipeline, "scheduler"),
        "forward calls, bare": bare(forwards),
        "forward calls, recorded (one step per call)": recorded(forwards, "calls"),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    for fn in ways.values():
        fn()  # warm up
    for _ in range(args.reps):
        for name, fn in ways.items():
            times[name].append(fn())
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"tiny WanPipeline: {args.layers} blocks, {args.steps} steps, guidance 5.0 -> {calls} "
          f"transformer calls per request; medians of {args.reps} interleaved rounds, 1 thread")
    print(f"{'way':48s} {'s / request':>12s} {'ms / call':>10s}")
    for k, v in med.items():
        print(f"{k:48s} {v:12.4f} {v / calls * 1e3:10.2f}")
    for what in ("pipeline", "forward calls"):
        bare = med[f"{what}, bare"]
        rec = next(v for k, v in med.items() if k.startswith(f"{what}, recorded"))
        print(f"overhead per call, {what}: {(rec - bare) / calls * 1e3:.2f} ms "
              f"({(rec - bare) / calls / (args.layers) * 1e6:.0f} µs per block)")


if __name__ == "__main__":
    main()
