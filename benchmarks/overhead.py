#!/usr/bin/env python3
"""What recording costs: per-layer instrumentation overhead of the manager on the cpu backend, in CPU time.

    .venv/bin/python benchmarks/overhead.py [--layers 48] [--reps 40]

Runs one model side by side, in one process, in interleaved rounds, four ways: bare (no manager); under the manager
with every layer resident (hooks + interval recording, no copies) without and with memory
sampling; and streamed pinned (recording plus real copies). Steps are timed in CPU time
(``time.process_time``: every thread of this process, the copy thread included), which other
work on a shared machine moves far less than the wall clock (wall-clock ratios of the same
runs went from 0.91 to 1.25 under load). Each round times 5 steps of every configuration and
takes their median; the per-layer cost over bare is taken per round (the bare model timed in
the same round), then reported as the median over rounds with its spread (25th-75th
percentile and min-max of the rounds). Tiny widths make the hooks' share as large as it gets.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import offload_lab
from offload_lab import HostMemory, catalog, synthetic


def timed(fn, reps: int) -> float:
    """Median CPU seconds of ``fn()`` over ``reps`` calls, after one warm call."""
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        ts.append(time.process_time() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--reps", type=int, default=40, help="rounds × 5 (default 40: 8 rounds)")
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=args.scale, layers=args.layers,
                            dtype=torch.float32)
    inputs = synthetic.example_inputs(model, tokens=args.tokens)
    spec = offload_lab.spec_of(model)
    host = HostMemory(available="64GiB")
    n = args.layers

    def fwd():
        with torch.no_grad():
            model(**inputs)

    configs = [
        ("bare model", None, False),
        ("resident, intervals only", offload_lab.plan(spec, resident=n, host=host), False),
        ("resident, + memory samples", offload_lab.plan(spec, resident=n, host=host), True),
        ("streamed pinned, prefetch 1", offload_lab.plan(spec, tier="pinned", host=host), True),
    ]
    # rounds interleave the configurations, so a busy machine slows them all alike
    samples: dict[str, list[float]] = {c[0]: [] for c in configs}
    rounds = max(args.reps // 5, 1)
    for _ in range(rounds):
        for label, plan, record_memory in configs:
            if plan is None:
                samples[label].append(timed(fwd, 5))
                continue
            with offload_lab.offload(model, plan, backend="cpu", record_memory=record_memory) as m:
                def step(m=m):
                    with m.step():
                        fwd()
                samples[label].append(timed(step, 5))
    bare = np.array(samples["bare model"])
    print(f"cpu backend, {n} layers of {offload_lab.format_bytes(spec.layers['bytes'].iloc[0])}, "
          f"{args.tokens} tokens, torch threads 1, {rounds} rounds × 5 steps, CPU time")
    print(f"{'configuration':<30} {'step ms':>9} {'ratio':>7} {'µs/layer over bare':>19} "
          f"{'25-75 %':>15} {'min-max':>17}")
    for label, *_ in configs:
        t = np.array(samples[label])
        per = (t - bare) / n * 1e6  # per round, against the bare model of the same round
        q1, q3 = np.percentile(per, [25, 75])
        print(f"{label:<30} {np.median(t) * 1e3:9.3f} {np.median(t / bare):7.3f} {np.median(per):19.1f} "
              f"{q1:7.1f}-{q3:<7.1f} {per.min():8.1f}-{per.max():<8.1f}")

if __name__ == "__main__":
    main()
