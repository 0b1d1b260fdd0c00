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
Prints one table; the numbers are wall-clock medians (and minima) over ``--repeat`` runs.
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
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)

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
        build_t = _time(lambda: Run.build(ev, bounds, plan.layers, mem, {"backend": "sim"}), args.repeat)
        sim_t = _time(lambda: sim.simulate(plan, profile, steps=steps, tokens=tokens), args.repeat)
        total_t = _time(lambda: sim.simulate(plan_fn(), profile, steps=steps, tokens=tokens), args.repeat)
        rows.append({
            "case": name, "events": len(ev),
            "plan_ms": plan_t[0] * 1e3, "engine_ms": eng_t[0] * 1e3, "Run.build_ms": build_t[0] * 1e3,
            "simulate_ms": sim_t[0] * 1e3, "plan+simulate_ms": total_t[0] * 1e3,
            "min_plan+simulate_ms": total_t[1] * 1e3,
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
    print(f"simulator speed ({args.repeat} repeats, medians; python {sys.version.split()[0]}, "
          f"pandas {pd.__version__})")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
