"""What a multi-rank run costs to make and move: the simulated node, the bytes, the join.

    .venv/bin/python benchmarks/ranks.py [--repeat 5]

Cases, on Wan2.1-T2V-14B all-pageable at prefetch 1 on the H200 profile, 3 steps:

* ``simulate ranks_per_node=k`` for k = 1, 8: one engine walk plus the k-rank merge;
* ``run_to_bytes`` / ``run_from_bytes`` of one rank's run: what each rank sends to rank 0 and
  what rank 0 decodes per rank in :func:`offload_lab.gather`;
* ``merge_ranks`` of 8 rank runs: the join on rank 0;
* ``rank_table`` and ``compare`` of the 8-rank run (the report's per-rank views).

Prints one table; wall-clock medians (and minima) over ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _time(fn, repeat: int) -> tuple[float, float]:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)

    import offload_lab
    from offload_lab.analysis.ranks import rank_table
    from offload_lab.record.gather import merge_ranks, run_from_bytes, run_to_bytes

    spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    plan = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="512GiB", shared_by=1))
    one = offload_lab.simulate(plan, "h200", steps=3)
    node = offload_lab.simulate(plan, "h200", steps=3, ranks_per_node=8)
    blob = run_to_bytes(one)
    cases = [
        ("simulate ranks_per_node=1", lambda: offload_lab.simulate(plan, "h200", steps=3), len(one.events)),
        ("simulate ranks_per_node=8", lambda: offload_lab.simulate(plan, "h200", steps=3, ranks_per_node=8),
         len(node.events)),
        (f"run_to_bytes (one rank, {len(blob) / 1024:.0f} KiB)", lambda: run_to_bytes(one), len(one.events)),
        ("run_from_bytes (one rank)", lambda: run_from_bytes(blob), len(one.events)),
        ("merge_ranks of 8", lambda: merge_ranks([one] * 8, ranks=list(range(8))), len(node.events)),
        ("rank_table (8 ranks)", lambda: rank_table(node), len(node.events)),
        ("compare (8 ranks + max)", lambda: offload_lab.compare(node), len(node.events)),
    ]
    print(f"{'case':<36} {'events':>8} {'median ms':>10} {'min ms':>8}")
    for name, fn, n in cases:
        med, lo = _time(fn, args.repeat)
        print(f"{name:<36} {n:>8,} {med * 1e3:>10.1f} {lo * 1e3:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
