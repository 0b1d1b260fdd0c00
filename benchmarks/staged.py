"""Host memcpy bandwidth into a staging buffer (threads 1..N), and the simulated staged table.

    PYTHONPATH=. python3 benchmarks/staged.py [--mib 256] [--threads 4] [--repeat 5]

Part 1 measures, on this machine, what the runtime's stager does for a ``staged`` layer: one
layer-sized memcpy from ordinary (pageable) memory into a staging buffer, split over 1..N
threads (``LayerStore.stage_into`` with a thread pool), best of ``--repeat``. Part 2 prints the
simulator's step times on the shipped H200 profile for Wan2.1-T2V-14B at 480p — all pinned,
all staged, all pageable with each issue order, and MiniMax-H3 on a 5.32 GiB pin budget with
and without staging — every one of them simulated.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def memcpy_table(mib: int, threads: int, repeat: int) -> list[tuple[int, float]]:
    import torch
    from torch import nn

    from offload_lab.record.runtime.stores import LayerStore

    layer = nn.Linear(1, 1, bias=False)
    layer.weight = nn.Parameter(torch.randn(mib * 2**20 // 4))
    store = LayerStore.from_module("bench", 0, layer, "staged")
    store.host_fill(pin=False, keep_original=lambda t: True)
    dst = torch.empty(store.nbytes, dtype=torch.uint8)
    out = []
    for n in range(1, threads + 1):
        pool = ThreadPoolExecutor(n) if n > 1 else None
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            store.stage_into(dst, pool)
            best = min(best, time.perf_counter() - t0)
        if pool is not None:
            pool.shutdown()
        assert torch.equal(dst.view(torch.float32)[: layer.weight.numel()], layer.weight.detach())
        out.append((n, store.nbytes / best / 1e9))
    return out


def simulated_table() -> list[tuple[str, float]]:
    import offload_lab
    from offload_lab import HostMemory, catalog

    prof = offload_lab.DeviceProfile.load("h200")
    wan = catalog.load("wan2.1-t2v-14b")
    h3 = catalog.load("minimax-h3")
    big = HostMemory(available="256GiB")
    rows = []
    for name, spec, kw, issue in (
        ("14B all pinned", wan, {"tier": "pinned"}, None),
        ("14B all staged", wan, {"tier": "staged"}, None),
        ("14B all pageable, after-compute", wan, {"tier": "pageable"}, "after-compute"),
        ("14B all pageable, before-compute", wan, {"tier": "pageable"}, "before-compute"),
        ("H3 5.32 GiB budget, no staging", h3, {"pin_budget": "5.32GiB"}, None),
        ("H3 5.32 GiB budget, staging", h3, {"pin_budget": "5.32GiB", "staging": True}, None),
        ("H3 5.32 GiB budget, no staging, before-compute", h3, {"pin_budget": "5.32GiB"}, "before-compute"),
    ):
        run = offload_lab.simulate(offload_lab.plan(spec, host=big, **kw), prof, steps=3, tokens="480p", issue=issue)
        assert run.simulated
        rows.append((f"{name} (simulated)", run.step_time))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256, help="layer size in MiB (default 256)")
    ap.add_argument("--threads", type=int, default=4, help="largest thread count (default 4)")
    ap.add_argument("--repeat", type=int, default=5, help="best of this many copies (default 5)")
    args = ap.parse_args(argv)
    import os

    print(f"host memcpy into a staging buffer, {args.mib} MiB layer, best of {args.repeat} "
          f"({os.cpu_count()} cores here, measured)")
    for n, gbps in memcpy_table(args.mib, args.threads, args.repeat):
        print(f"  {n} thread(s): {gbps:6.2f} GB/s")
    print("\nH200 profile, 480p, s/step (simulated)")
    for name, secs in simulated_table():
        print(f"  {name:<62} {secs:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
