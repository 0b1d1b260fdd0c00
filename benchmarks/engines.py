"""The shipped H200 run of diffusers' group offloading, predicted from its settings alone.

``engines.as_plan(spec, "diffusers-group", num_blocks_per_group=1, use_stream=True)`` simulated
with the shipped ``h200`` profile, beside the observed diffusers run and offload-lab's own
all-pinned run of the same model and inputs (``data/runs/h200-*/diffusers-*.zip``). The
profile's calibration (``scripts/calibrate_h200.py``) leaves the ``diffusers-*`` runs out, so
the diffusers prediction is held out.

    PYTHONPATH=. python benchmarks/engines.py [--runs data/runs/h200-2026-12-01]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import offload_lab
from offload_lab import catalog, engines
from offload_lab.engines.compare import extra_seconds

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(ROOT / "data/runs/h200-2026-12-01"))
    args = ap.parse_args(argv)
    runs = {r.label: r for r in (offload_lab.Run.load(p) for p in sorted(Path(args.runs).glob("diffusers-*.zip")))}
    theirs = runs["diffusers group offload (block_level, stream)"]
    ours = runs["offload-lab pinned p1"]
    profile = offload_lab.DeviceProfile.load("h200")
    held = not any(str(r).startswith("diffusers-") for r in profile.provenance.get("runs", []))
    tokens = int(theirs.meta["gpu_check"]["tokens"])
    spec = catalog.load(theirs.meta["model"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = engines.as_plan(spec, "diffusers-group", num_blocks_per_group=1, use_stream=True, host="64GiB")
        own = offload_lab.plan(spec, tier="pinned", prefetch=1, host=offload_lab.HostMemory(available="64GiB"))
    print(f"profile h200 fitted {'without' if held else 'WITH'} the diffusers runs "
          f"(provenance runs: {len(profile.provenance.get('runs', []))}); tokens {tokens}")
    print(f"{'run':<44} {'measured s':>10} {'predicted s':>11} {'error':>7}  evidence")
    for label, plan, run in (("diffusers group offload (as_plan)", p, theirs), ("offload-lab pinned p1", own, ours)):
        sim = offload_lab.simulate(plan, profile, steps=3, warmup=1, tokens=tokens)
        pred = float(sim.steps["wall_s"].mean())
        meas = float(run.steps["wall_s"].mean())
        print(f"{label:<44} {meas:>10.3f} {pred:>11.3f} {pred / meas - 1:>+7.1%}  {sim.meta['evidence']['status']}")
        if plan is p:
            extra = extra_seconds(p, profile)
            print(f"{'  + unmatched group copied every forward':<44} {meas:>10.3f} {pred + extra:>11.3f} "
                  f"{(pred + extra) / meas - 1:>+7.1%}  (extra {extra * 1e3:.1f} ms, an upper bound here: the "
                  f"run kept the non-layer Sequentials on the device)")
            bytes_pred = sum(o["bytes"] for o in engines.onloads(p))
            print(f"  bytes per step: predicted {bytes_pred:,}, observed {int(run.steps['bytes_moved'].iloc[0]):,}")
            print(f"  pinned: planner's exact stores {p.ledger['pinned_bytes']:,} B, as locked by the caching "
                  f"host allocator {engines.pinned_bytes(p):,} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
