"""How fast recommend() answers, and how the device-peak estimate compares with the GPU runs.

    .venv/bin/python benchmarks/recommend.py [--repeat 3]

1. ``recommend()`` for every catalog model on every shipped device profile: a 64 GiB host, the
   profile's own memory size, ``calls_per_step`` = the model's guidance passes (2). Wall-clock
   median (and minimum) over ``--repeat`` searches and the plans tried (the best plans are a
   figure of ``scripts/doc_figures.py``: they do not depend on the machine).
2. For each shipped GPU run that carries its plan: the planner's device-peak estimate (at the
   run's token count) next to the largest ``device_bytes`` sample the run recorded
   (``torch.cuda.memory_allocated`` above the manager's starting point, sampled between layers:
   weights and the activations alive at that moment, so at most the true high-water mark).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _searches(repeat: int) -> None:
    import offload_lab
    from offload_lab import catalog

    print("recommend() search time (host 64 GiB, device memory = the profile's, calls = guidance passes, "
          "tolerance 1 %)")
    print("| model | device | median s | min s | plans tried |")
    print("| --- | --- | ---: | ---: | ---: |")
    for model in catalog.names():
        spec = catalog.load(model)
        calls = int(spec.meta.get("guidance_passes", 1) or 1)
        for dev in offload_lab.DeviceProfile.names():
            ts, rec = [], None
            for _ in range(repeat):
                t0 = time.perf_counter()
                rec = offload_lab.recommend(spec, dev, host="64GiB", calls_per_step=calls)
                ts.append(time.perf_counter() - t0)
            print(f"| {model} | {dev} | {statistics.median(ts):.3f} | {min(ts):.3f} | {len(rec.tried)} |")
    print("(the best plans: scripts/doc_figures.py, figure recommend-best)")


def _peaks() -> None:
    import offload_lab
    from offload_lab.planning.device import device_parts

    print("\ndevice peak of the shipped GPU runs: estimate vs largest measured sample")
    print(f"{'run':<26} {'tokens':>6} {'estimate GiB':>12} {'(activations)':>13} {'measured GiB':>12} {'measured/est':>12}")
    for run in offload_lab.shipped_runs():
        full = run.meta.get("plan_full")
        if not full:
            print(f"{run.label:<26} (no plan recorded in meta: skipped)")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = offload_lab.Plan.from_dict(full)
        tokens = int((run.meta.get("gpu_check") or {}).get("tokens") or 0) or None
        parts = device_parts(plan.spec, plan._placement(), plan.prefetch, tokens, None)
        est = parts["device_peak_bytes"]
        meas = int(run.memory["device_bytes"].max())
        print(f"{run.label:<26} {tokens or '-':>6} {est / 2**30:>12.3f} {parts['device_activation_bytes'] / 2**30:>13.3f} "
              f"{meas / 2**30:>12.3f} {meas / est:>12.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    _searches(args.repeat)
    _peaks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
