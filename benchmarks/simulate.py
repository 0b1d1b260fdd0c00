"""How fast the simulator answers: the budget is a slider that feels instant (tens of ms).

    .venv/bin/python benchmarks/simulate.py [--repeat 7]

Cases:

* ``100 layers x 50 steps``: a 100-block model, every block streamed at prefetch 1, simulated
  for 50 steps on the H200 profile (pinned, then pageable: pageable adds a host_block row per copy);
* ``H3 plan+simulate``: what the plan widget does on each change — ``plan()`` MiniMax-H3 at its
  operating point (35 of 50 layers resident, strided) then ``simulate()`` 3 steps on the
  RTX 5090 profile; and the same for a 50-step sampling run.

Each case is split into the engine (the discrete-event walk that produces the event rows) and
``Run.build`` (the Run's summary frames), so a slow total says which side to speed up.
Prints one table of CPU-time medians (``time.process_time``: what this process spent, so
other work on a shared machine moves it less than the wall clock) over ``--repeat`` runs, with
the wall-clock median of plan + simulate beside them; then, unless ``--no-growth``, the growth
curve: plan + simulate of a pinned model of L layers for S steps (L 25-400, S 10-200), CPU
medians, and a least-squares fit ``t = fixed + a·L + b·(L·S)`` printed with its residuals.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _time(fn, repeat: int) -> tuple[float, float]:
    """Median and minimum CPU seconds of ``fn()`` over ``repeat`` calls (after one warm call)."""
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        ts.append(time.process_time() - t0)
    return statistics.median(ts), min(ts)


def _wall(fn, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-growth", action="store_true", help="skip the growth curve")
    args = ap.parse_args(argv)

    import numpy as np
    import pandas as pd

    import offload_lab as ol
    from offload_lab import simulation as sim
    from offload_lab.model.spec import GroupSpec, LayerSpec, ModelSpec, TensorSpec
    from offload_lab.record.run import Run
    from offload_lab.simulation.engine import run_engine
    from offload_lab.simulation.layers import prepare

    rows = []

    def case(name: str, spec, plan_fn, profile, steps: int, tokens=None) -> None:
        plan = plan_fn()
        layers, streamed, prefetch, info, _ = prepare(spec, plan, profile, tokens)
        ev, bounds, mem = run_engine(spec, streamed, prefetch, info, profile, steps, 1)
        plan_t = _time(plan_fn, args.repeat)
        eng_t = _time(lambda: run_engine(spec, streamed, prefetch, info, profile, steps, 1), args.repeat)
        build_t = _time(lambda: Run.build(ev, bounds, plan.layers, mem, {"backend": "sim"}, trusted=True),
                        args.repeat)
        sim_t = _time(lambda: sim.simulate(plan, profile, steps=steps, tokens=tokens), args.repeat)
        total_t = _time(lambda: sim.simulate(plan_fn(), profile, steps=steps, tokens=tokens), args.repeat)
        wall = _wall(lambda: sim.simulate(plan_fn(), profile, steps=steps, tokens=tokens), args.repeat)
        rows.append({
            "case": name, "events": len(ev),
            "plan_ms": plan_t[0] * 1e3, "engine_ms": eng_t[0] * 1e3, "Run.build_ms": build_t[0] * 1e3,
            "simulate_ms": sim_t[0] * 1e3, "plan+simulate_ms": total_t[0] * 1e3,
            "min_plan+simulate_ms": total_t[1] * 1e3, "wall_plan+simulate_ms": wall * 1e3,
        })

    host = ol.HostMemory(available="1TiB")
    big = ModelSpec("bench-100x1.2GiB", [GroupSpec("blocks", [
        LayerSpec("blocks", i, [TensorSpec(f"blocks.{i}.w", (645_571_840,), "bfloat16")]) for i in range(100)])])
    h200 = sim.DeviceProfile.load("h200").replace(compute_s={"blocks": 0.03})
    for tier in ("pinned", "pageable"):
        case(f"100 layers x 50 steps, {tier} p1", big,
             lambda tier=tier: ol.plan(big, tier=tier, prefetch=1, host=host), h200, 50)

    h3 = ol.catalog.load("minimax-h3")
    r5090 = sim.DeviceProfile.load("rtx5090-pcie5")
    h3_host = ol.HostMemory(available="60GiB")

    def h3_plan():
        return ol.plan(h3, resident=35, residency="strided", host=h3_host)

    case("H3 plan+simulate, 3 steps", h3, h3_plan, r5090, 3, "480p")
    case("H3 plan+simulate, 50 steps", h3, h3_plan, r5090, 50, "480p")

    table = pd.DataFrame(rows)
    print(f"simulator speed ({args.repeat} repeats, CPU-time medians unless 'wall'; python "
          f"{sys.version.split()[0]}, pandas {pd.__version__}, numpy {np.__version__})")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    if not args.no_growth:
        _growth(args.repeat, host, h200)
    return 0


def _growth(repeat: int, host, profile) -> None:
    """plan + simulate over layers × steps, and the fit ``fixed + a·L + b·L·S``."""
    import numpy as np

    import offload_lab as ol
    from offload_lab import simulation as sim
    from offload_lab.model.spec import GroupSpec, LayerSpec, ModelSpec, TensorSpec

    pts = []
    for n in (25, 50, 100, 200, 400):
        spec = ModelSpec(f"bench-{n}", [GroupSpec("blocks", [
            LayerSpec("blocks", i, [TensorSpec(f"blocks.{i}.w", (645_571_840,), "bfloat16")]) for i in range(n)])])
        for steps in (10, 50, 200):
            t, _ = _time(lambda spec=spec, steps=steps: sim.simulate(
                ol.plan(spec, tier="pinned", prefetch=1, host=host), profile, steps=steps), max(3, repeat // 3))
            pts.append((n, steps, t))
    L = np.array([p[0] for p in pts], dtype=float)
    S = np.array([p[1] for p in pts], dtype=float)
    t = np.array([p[2] for p in pts])
    A = np.stack([np.ones_like(L), L, L * S], axis=1)
    (fixed, per_layer, per_forward), *_ = np.linalg.lstsq(A, t, rcond=None)
    print("\ngrowth: plan + simulate, pinned p1, CPU ms (medians)")
    print("layers  steps  layer-forwards       ms   fit ms")
    for (n, steps, tt), fit in zip(pts, A @ np.array([fixed, per_layer, per_forward])):
        print(f"{n:6d} {steps:6d} {n * steps:15,d} {tt * 1e3:8.1f} {fit * 1e3:8.1f}")
    print(f"fit: t = {fixed * 1e3:.2f} ms fixed + {per_layer * 1e3:.4f} ms per layer + "
          f"{per_forward * 1e6:.2f} µs per layer forward (L·S)")


if __name__ == "__main__":
    raise SystemExit(main())
