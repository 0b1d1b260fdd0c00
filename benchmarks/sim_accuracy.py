"""How well the simulator predicts measured runs: fresh CPU measurements, predicted vs measured.

    .venv/bin/python benchmarks/sim_accuracy.py [--rounds 5] [--source mixed-p1] [--runs DIR]

Measures the fixture model of ``scripts/record_sim_fixtures.py`` live under every fixture plan
(pinned / pageable / mixed tiers, prefetch 0-2, resident layers; each plan's typical run of ``--rounds``
interleaved rounds), then prints per plan:

* ``parts``: the run's median step predicted from a profile calibrated on that same run with
  ``match_steps=False``: bandwidths, compute, hooks and hand-offs alone, nothing fitted to the
  step time itself;
* ``self``: the same with the default calibration, whose per-step head absorbs what the parts
  miss (so it reproduces its own run; the column shows that it does);
* ``cross``: predicted by a profile calibrated on the ``--source`` run (``mixed-p1`` holds both
  pinned and pageable copies, so it can predict every plan);
* ``all``: predicted by one profile calibrated on all the runs together (which can fit the
  copy/compute contention of the CPU from the prefetch-0 vs prefetch-1 contrast).

``parts``, ``self`` and ``all`` are in-sample (the profile saw the run); the held-out table
(below them: leave-one-out, across token counts, across model sizes) is the measure.

``--runs DIR`` reads saved runs instead of measuring: a fixture directory (with its
``manifest.json``) gives the table above; any other directory of ``*.zip`` runs (e.g.
``data/runs/h200-2026-12-01``, or the ``runs/`` that ``scripts/gpu_check.py`` writes on a GPU)
gives held-out accuracy for every measured run: leave-one-out, across token counts and across
model sizes (``offload_lab.simulation.heldout``; observed runs are skipped with a note). Nothing here
is a test: CPU timings on a shared machine move with the neighbours.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--source", default="mixed-p1",
                    help="the run that calibrates the 'cross' column (a fixture plan name, or a label)")
    ap.add_argument("--runs", help="a directory of saved runs with a manifest.json (default: measure now)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import pandas as pd
    from record_sim_fixtures import build_model, load_plan, make_plans, measure

    from offload_lab import simulation as sim
    from offload_lab.record.run import Run

    fixture = args.runs and (Path(args.runs) / "manifest.json").exists() and \
        "spec" in json.loads((Path(args.runs) / "manifest.json").read_text())
    if fixture:
        d = Path(args.runs)
        manifest = json.loads((d / "manifest.json").read_text())
        runs = {n: Run.load(d / v["file"]) for n, v in manifest["runs"].items()}
        plans = {n: load_plan(manifest, n) for n in runs}
        where = f"saved runs in {d}"
    elif args.runs:
        return _held_out(Path(args.runs))
    else:
        import torch

        torch.set_num_threads(args.threads)
        model, inputs, spec = build_model()
        plans = make_plans(spec)
        runs = measure(model, inputs, plans, args.rounds, log=lambda *_: None)
        where = f"fresh cpu runs (typical of {args.rounds} rounds, {args.threads} torch thread(s))"
    if args.source not in runs:
        ap.error(f"--source {args.source!r} is not one of {sorted(runs)}")
    by_model: dict = {}
    for r in runs.values():
        by_model.setdefault(r.meta.get("model"), []).append(r)

    def predict(profile, plan, steps: int) -> float:
        try:
            return sim.simulate(plan, profile, steps=steps).step_time
        except sim.ProfileError:
            return float("nan")  # the profile lacks a tier this plan uses

    cross = sim.calibrate(runs[args.source])
    # one joint profile per model (calibrate takes runs of one model)
    joint = {m: sim.calibrate(rs) for m, rs in by_model.items()}
    rows = []
    for name, run in runs.items():
        plan, steps, measured = plans[name], len(run.steps), run.step_time
        same = run.meta.get("model") == runs[args.source].meta.get("model")
        pp, s, c, a = (predict(p, plan, steps) if p is not None else float("nan")
                       for p in (sim.calibrate(run, match_steps=False), sim.calibrate(run),
                                 cross if same else None, joint[run.meta.get("model")]))
        rows.append({"plan": name, "measured_ms": measured * 1e3, "parts_ms": pp * 1e3,
                     "parts_err": pp / measured - 1, "self_ms": s * 1e3,
                     "self_err": s / measured - 1, "cross_ms": c * 1e3, "cross_err": c / measured - 1,
                     "all_ms": a * 1e3, "all_err": a / measured - 1})
    table = pd.DataFrame(rows)
    fmt = {c: (lambda x: f"{x:+.1%}") for c in table.columns if c.endswith("_err")}
    print(f"simulator vs measured, {where}")
    j = joint[runs[args.source].meta.get("model")]
    print(f"cross = calibrated on {args.source!r}; all = calibrated on every run of the model "
          f"(contention {j.contention:.2f}, {j.provenance['contention']})")
    print(table.to_string(index=False, formatters=fmt, float_format=lambda x: f"{x:.2f}"))
    for col in ("parts_err", "self_err", "cross_err", "all_err"):
        e = table[col].abs().dropna()
        print(f"  {col:9s} median |error| {e.median():.1%}, worst {e.max():.1%}")
    print("(parts, self and all are in-sample: their profiles saw the run they predict; held out:)")
    return _print_held_out(runs, where, [])


def _held_out(d: Path) -> int:
    """The held-out table for a folder of saved runs (see :mod:`offload_lab.simulation.heldout`)."""
    from offload_lab.record.run import Run

    runs, skipped = {}, []
    for f in sorted(d.glob("*.zip")):
        run = Run.load(f)
        if run.backend == "observe" or run.simulated:
            skipped.append(f"{f.name} ({'simulated' if run.simulated else 'observed'})")
            continue
        runs[f.stem] = run
    if not runs:
        print(f"no measured runs (*.zip) in {d}", file=sys.stderr)
        return 2
    return _print_held_out(runs, str(d), skipped)


def _print_held_out(runs: dict, where: str, skipped: list[str]) -> int:
    from offload_lab.simulation.heldout import held_out

    t = held_out(runs)
    print(f"simulator vs measured, held out: {len(runs)} measured runs in {where}")
    if skipped:
        print(f"skipped (the manager did not drive their copies): {', '.join(skipped)}")
    print("loo = calibrated on every other run; tokens = only the same model at other token counts; "
          "model = only the other model size (its curve over this model's FLOPs); a mapped rate no training run "
          "measured is taken at the pageable rate; n/a: no such training run, or none "
          "copied from this run's tier")
    fmt = {c: (lambda x: f"{x:+.1%}") for c in t.columns if c.endswith("_err")}
    print(t.to_string(index=False, formatters=fmt, float_format=lambda x: f"{x:.1f}", na_rep="n/a"))
    for col in ("loo_err", "tokens_err", "model_err"):
        e = t[col].abs().dropna()
        if len(e):
            print(f"  {col:10s} median |error| {e.median():.1%}, worst {e.max():.1%} over {len(e)} runs")
    _print_regimes(runs, t)
    _print_blocks(runs)
    return 0


def _print_regimes(runs: dict, loo) -> None:
    """The leave-one-out errors per regime (issue order × class of streamed copies): the bands
    simulated runs on a profile of this device carry (``offload_lab.simulation.evidence``)."""
    from offload_lab.simulation import SimError
    from offload_lab.simulation.evidence import regime_table

    try:
        reg = regime_table(runs, loo=loo)
    except SimError as e:  # runs of several devices: no one profile's table
        print(f"regimes: {e}")
        return
    print(f"per regime (the ± band of a prediction in that regime), {reg['device_name']}:")
    for row in reg["table"]:
        print(f"  {row['issue']:>14s} · {row['copies']:<22s} worst {row['band']:.1%} over {len(row['runs'])} runs")


def _print_blocks(runs: dict) -> None:
    """What the compute model's block effects are fitted from: per run, the median block, the
    idle time of the compute stream before it and the share of it a copy overlapped, and the
    host's per-block cost: ``hook_s`` fitted on that run alone, and the host's time between two
    consecutive host blocks of a step (launching a block and issuing the next copy), where a
    run has them."""
    import numpy as np

    from offload_lab import calibrate
    from offload_lab.simulation import gpu_effects

    print("\nblocks, per run (median; idle = the compute stream idle before a block; copy beside = share of "
          "the block a copy overlapped; host/block = hook_s calibrated on the run alone, in-sample; "
          "host between blocks = host time between consecutive host blocks of a step):")
    print(f"{'run':>36} {'block_ms':>9} {'idle_ms':>8} {'copy beside':>12} {'host/block_ms':>14} "
          f"{'host between blocks_ms':>23}")
    for name, r in runs.items():
        comp = r.events[r.events["kind"] == "compute"]
        fx = gpu_effects.observe(r)
        d = comp["dur_s"].to_numpy(dtype="float64")
        hb = r.events[r.events["kind"] == "host_block"].sort_values("start_s")
        between = [g["start_s"].to_numpy()[1:] - g["end_s"].to_numpy()[:-1] for _, g in hb.groupby("step")]
        between = np.concatenate(between) if between else np.zeros(0)
        gap = f"{np.median(between) * 1e3:23.3f}" if len(between) else f"{'-':>23}"
        print(f"{name:>36} {np.median(d) * 1e3:9.2f} {np.nanmedian(fx['idle']) * 1e3:8.2f} "
              f"{np.median(fx['ov'] / d):12.1%} {calibrate(r).hook_s * 1e3:14.3f} {gap}")
    fitted = calibrate(list(runs.values())[:1], effects_from=list(runs.values()))
    print(f"  block effects fitted over all these runs: copy_slowdown {fitted.copy_slowdown:.3f}, "
          f"idle_speedup {fitted.idle_speedup:.3f}, idle_tau_s {fitted.idle_tau_s * 1e3:.1f} ms "
          f"({fitted.provenance.get('gpu_effects')})")


if __name__ == "__main__":
    raise SystemExit(main())
