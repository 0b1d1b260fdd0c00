"""How long a report of 4 runs × 50 layers × 5 steps takes to build and how big the file is.

Target: built in ≤ 2 s and ≤ 8 MB. The runs are real frames from the simulator
(MiniMax-H3: 50 blocks + a 2-layer refiner, on the h200 profile) under four plans; the first
repeat is "cold" (it pays for importing plotly), the others are warm.

    .venv/bin/python benchmarks/report.py [--repeat 3] [--out artifacts/bench-report.html]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

TARGET_S = 2.0
TARGET_BYTES = 8 * 10**6


def make_runs(steps: int = 5):
    import offload_lab
    from offload_lab import catalog

    spec = catalog.load("minimax-h3")
    host = offload_lab.HostMemory(available="256GiB")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # forced tiers on this host warn; the plans are what we want
        plans = {
            "all pinned": offload_lab.plan(spec, tier="pinned", host=host),
            "all pageable": offload_lab.plan(spec, tier="pageable", host=host),
            "all mapped": offload_lab.plan(spec, tier="mapped", host=host),
            "24 GiB pin budget": offload_lab.plan(spec, pin_budget="24GiB", host=host),
        }
    runs = [offload_lab.simulate(p, "h200", steps=steps, label=name) for name, p in plans.items()]
    return runs, plans["24 GiB pin budget"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="builds to time (the first is cold)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default="artifacts/bench-report.html", help="where to write the report")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: accepted: an integer >= 1")

    t = time.perf_counter()
    runs, plan = make_runs(args.steps)
    t_runs = time.perf_counter() - t
    layers = len(runs[0].layers)
    events = sum(len(r.events) for r in runs)

    from offload_lab.views.report import report

    rows = []
    out = Path(args.out)
    for i in range(args.repeat):
        t0 = time.perf_counter()
        rep = report(runs, plan=plan, title="benchmark: 4 runs × 50 layers × 5 steps")
        t1 = time.perf_counter()
        path = rep.save(out)
        t2 = time.perf_counter()
        rows.append((("cold" if i == 0 else "warm"), t1 - t0, t2 - t1, t2 - t0, path.stat().st_size))

    print(f"runs: {len(runs)} × {layers} layers × {args.steps} steps ({events} events), "
          f"simulated in {t_runs:.2f} s; figures per report: {len(rep.figures)}")
    print(f"{'build':<6} {'report() s':>11} {'save() s':>9} {'total s':>8} {'size MB':>8}")
    for kind, a, b, c, size in rows:
        print(f"{kind:<6} {a:>11.3f} {b:>9.3f} {c:>8.3f} {size / 1e6:>8.2f}")
    worst = max(r[3] for r in rows)
    size = rows[-1][4]
    warm = [r[3] for r in rows[1:]] or [rows[0][3]]
    print(f"worst total {worst:.2f} s (target ≤ {TARGET_S} s), warm median {statistics.median(warm):.2f} s; "
          f"size {size / 1e6:.2f} MB (target ≤ {TARGET_BYTES / 1e6:.0f} MB); written to {path}")
    ok = worst <= TARGET_S and size <= TARGET_BYTES
    print("OK" if ok else "OVER TARGET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
