#!/usr/bin/env python3
"""Rebuild data/devices/h200.json from the measured H200 runs under data/runs/.

    .venv/bin/python scripts/calibrate_h200.py [--runs data/runs/h200-2026-12-01 [MORE ...]] [--check]

Bandwidths come from the copy rows of the runs of each tier (median bytes/duration); the
compute curve (a per-block floor plus a saturated rate, ``floor + FLOPs / rate``) from
``offload_lab.calibrate`` over every block of every measured run, after the block effects
(``copy_slowdown``, ``idle_speedup`` with its ``idle_tau_s``, fitted jointly over the same
blocks) are taken out (1.3B at 32,760 and 1,024
tokens, 14B at 32,760); the plain achieved rate (``tflops``, used for layers of a kind the
curve has not seen) from the 14B all-pinned run; host costs from ``offload_lab.calibrate`` on
the pinned runs; ``step_error`` (the ± band of a simulated step) is the worst leave-one-out
error of the simulator over the measured runs (``offload_lab.simulation.heldout``), and
``regimes`` the same errors per regime (issue order × class of streamed copies,
``offload_lab.simulation.evidence``), from which a simulated run's evidence is looked up: add
measured runs of a new regime (e.g. after-compute pageable) and rerun this to confirm it. The profile
itself is fitted on all the runs, so only the held-out figures measure it. Only ``mapped_cold`` (file pages not yet in the page cache) was not measured: it stays
the estimate, and says so. ``--check`` exits 1 when the shipped file differs from what this
script would write.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None, loo: Any = None) -> int:
    """Rebuild (or with ``--check`` compare) the profile; ``loo`` is ``held_out``'s table over the
    same runs when the caller has it already (the test suite computes it once for several tests)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # several folders: the shipped runs and the ones a later session brought back (docs/gpu.md)
    ap.add_argument("--runs", nargs="+", default=[str(ROOT / "data/runs/h200-2026-12-01")])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)

    import offload_lab
    from offload_lab import catalog, flops
    from offload_lab.simulation import DeviceProfile

    # the main stage's runs (the diffusers-* side-by-side pair is a later, separate stage)
    files = [p for d in args.runs for p in sorted(Path(d).glob("*.zip")) if not p.name.startswith("diffusers-")]
    runs = {r.label: r for r in (offload_lab.Run.load(p) for p in files)}
    by_tier: dict[str, list[float]] = {}
    for r in runs.values():
        c = r.events[r.events["kind"] == "copy"]
        for tier, g in c.groupby("tier"):
            by_tier.setdefault(str(tier), []).extend((g["bytes"] / g["dur_s"] / 1e9).tolist())
    bw = {t: round(statistics.median(v), 2) for t, v in by_tier.items()}

    big = runs["14B pinned p1"]
    spec14 = catalog.load("wan2.1-t2v-14b")
    tokens = int(big.meta["gpu_check"]["tokens"])
    per_block_s = float(big.layers["compute_s"].median())
    tflops = flops.layer_flops(spec14, "blocks", tokens) / per_block_s / 1e12

    pinned = [r for r in runs.values() if set(r.layers["tier"]) == {"pinned"} and r.meta["model"] == spec14.name
              and r.meta["gpu_check"]["tokens"] == tokens]
    host = offload_lab.calibrate(pinned)
    from offload_lab.simulation.calibration import fit_curve, fit_effects
    from offload_lab.simulation.heldout import held_out

    measured = [r for r in runs.values() if r.backend == "cuda"]
    effects = fit_effects(measured)
    curve = fit_curve(measured, False, None, None, effects)
    by_file = {p.stem: r for p, r in zip(files, runs.values()) if r.backend == "cuda"}
    if loo is None:
        loo = held_out(by_file, schemes=("loo",))
    elif sorted(loo["run"]) != sorted(by_file):
        raise SystemExit(f"calibrate_h200: the held-out table given covers {sorted(loo['run'])}, "
                         f"not the measured runs {sorted(by_file)}")
    step_error = float(loo["loo_err"].abs().max())
    # which regimes (issue order × copy class) the measured runs back, and each one's held-out
    # error: what every simulated run's evidence is looked up in
    from offload_lab.simulation.evidence import regime_table

    regimes = regime_table(by_file, loo=loo, source=", ".join(Path(d).name for d in args.runs))

    old = DeviceProfile.load("h200")
    d = old.to_dict()
    d["bandwidths"] = {"pinned": bw["pinned"], "pageable": bw["pageable"],
                       "mapped_warm": bw["mapped"], "mapped_cold": old.bandwidths["mapped_cold"]}
    d["tflops"] = round(tflops, 1)
    d["compute_curve"] = {k: [round(v[0], 7), round(v[1], 1)] for k, v in sorted(curve.items())}
    d["step_error"] = round(step_error, 3)
    d["copy_slowdown"] = round(effects.copy_slowdown, 4)
    d["idle_speedup"] = round(effects.idle_speedup, 4)
    d["idle_tau_s"] = round(effects.idle_tau_s, 5)
    d["hook_s"] = round(host.hook_s, 7)
    d["step_head_s"] = round(host.step_head_s, 6)
    # no staged run on this machine yet: a pageable copy is the driver's own host memcpy into
    # pinned buffers plus a DMA, so one thread's memcpy is at least the pageable rate
    d["host_memcpy_gbps"] = d.get("host_memcpy_gbps") or bw["pageable"]
    d["host_memcpy_max_gbps"] = d.get("host_memcpy_max_gbps")
    for k in ("launch_s", "issue_s", "copy_latency_s", "step_tail_s"):
        d[k] = 0.0  # folded into hook_s by the calibration
    d["provenance"] = {
        "kind": "measured",
        "machine": f"{big.meta['device_name']}, {big.meta['cuda']['total_memory'] // 2**20} MiB, "
                   "cloud host (16 cores, 128 GiB, gVisor); torch " + big.meta["torch_version"],
        "date": big.meta["created"][:10],
        "runs": [p.name for p in files],
        "method": [
            "bandwidths: median bytes/duration of every copy row of each tier, all runs",
            f"tflops: catalog FLOPs of one T2V-14B block at {tokens} tokens / the median measured block "
            f"compute ({per_block_s * 1e3:.1f} ms) of '14B pinned p1'",
            "compute_curve: floor + FLOPs / rate fitted by least squares to every block's median compute "
            "of every measured run against its catalog FLOPs (offload_lab.calibrate), with the two block "
            "effects below taken out first",
            "copy_slowdown, idle_speedup, idle_tau_s: fitted jointly over every block of every measured run "
            f"(within-layer regression, offload_lab.simulation.gpu_effects): {effects.how}",
            "hook_s, step_head_s: offload_lab.calibrate on the all-pinned T2V-14B run at 480p",
            "memory_bytes: torch.cuda.get_device_properties().total_memory recorded in '14B pinned p1' "
            "(NVIDIA's H200 datasheet, nvidia.com/en-us/data-center/h200, gives 141 GB HBM3e)",
            f"step_error: the worst leave-one-out error over the {len(loo)} measured runs "
            "(benchmarks/sim_accuracy.py --runs data/runs/h200-2026-12-01)",
            "regimes: the same leave-one-out errors grouped by regime (issue order × class of streamed "
            "copies; offload_lab.simulation.evidence), each regime's band its worst",
        ],
        "not_measured": ["mapped_cold: kept from the estimate (pages were in the page cache in every run)",
                         "host_memcpy_gbps: no staged run yet; set to the measured pageable rate, a lower "
                         "bound (the driver's pageable path is a host memcpy into pinned buffers plus a DMA); "
                         "host_memcpy_max_gbps: unknown (no ceiling)"],
        "command": "scripts/calibrate_h200.py (runs from: PYTHONPATH=. python3 scripts/gpu_check.py --out DIR)",
    }
    d["notes"] = ("Measured on one NVIDIA H200 cloud machine with scripts/gpu_check.py; pageable and mapped copies are "
                  "synchronous for the host thread there, as in the runtime.")
    d["memory_bytes"] = int(big.meta["cuda"]["total_memory"])
    d["regimes"] = regimes
    text = json.dumps(d, indent=1) + "\n"
    path = ROOT / "data/devices/h200.json"
    if args.check:
        same = path.read_text() == text
        print("h200.json is up to date" if same else "h200.json differs from the measured runs")
        return 0 if same else 1
    DeviceProfile.from_dict(d)  # validates
    path.write_text(text)
    print(f"wrote {path}: {d['bandwidths']}, {d['tflops']} TFLOP/s, curve {d['compute_curve']}, "
          f"step_error {d['step_error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
