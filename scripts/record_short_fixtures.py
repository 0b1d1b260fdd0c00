"""Record the measured CPU runs behind the short-run calibration test (tests/test_short_calibration.py).

The fixture model of ``scripts/record_sim_fixtures.py`` (Wan2.1-T2V-1.3B shapes at scale 0.25,
float32, 16 video and 16 text tokens) is profiled on the ``cpu`` backend truncated to 4 blocks
and at the model's full depth (30 blocks), all pinned and all pageable, prefetch 1. Each plan's
four plans run back to back in each of ``--rounds`` rounds (``STEPS`` measured steps after 1
warm-up per run), and every run is kept.

    .venv/bin/python scripts/record_short_fixtures.py            # -> tests/data/short/

Writes ``<out>/<plan>-r<round>.run.zip`` and ``<out>/manifest.json`` (how and where they were taken).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

DEPTHS = {"short": 4, "full": 30}
#: measured steps per run: the short runs take as many layer forwards as the full ones, so both
#: spend about as long under the machine's load
STEPS = {"short": 30, "full": 4}
TIERS = ("pinned", "pageable")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "short"))
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args(argv)
    import torch
    from record_sim_fixtures import HOST, MODEL

    import offload_lab as ol
    from offload_lab import synthetic

    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"about": "measured cpu-backend runs for tests/test_short_calibration.py; made by "
                         "scripts/record_short_fixtures.py",
                "model": {**MODEL, "layers": DEPTHS}, "rounds": args.rounds, "torch_threads": 1,
                "torch_version": torch.__version__,
                "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                "loadavg_before": list(os.getloadavg()),
                "recorded": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "runs": {}}
    host = ol.HostMemory(available=HOST)
    cases = {}
    for depth_name, depth in DEPTHS.items():
        model = synthetic.build(ol.catalog.load(MODEL["catalog"]), scale=MODEL["scale"], layers=depth,
                                dtype=MODEL["dtype"], seed=MODEL["seed"])
        inputs = synthetic.example_inputs(model, tokens=MODEL["tokens"], text_tokens=MODEL["text_tokens"])
        spec = synthetic.spec_of(model)
        for t in TIERS:
            cases[f"{depth_name}-{t}"] = (model, inputs, ol.plan(spec, tier=t, prefetch=1, host=host), depth,
                                          STEPS[depth_name])
    # short and full runs interleaved in every round, so a neighbour's load falls on both alike
    got: dict[str, list] = {n: [] for n in cases}
    for r in range(args.rounds):
        for name, (model, inputs, plan, _, steps) in cases.items():
            got[name].append(ol.profile(model, lambda m=model, x=inputs: m(**x), plan, steps=steps,
                                        warmup=1, backend="cpu", label=f"{name} (cpu, measured)"))
        print(f"round {r + 1}/{args.rounds}: " + " ".join(f"{n}={v[-1].step_time * 1e3:.1f}" for n, v in got.items()))
    # every round is kept: the test pools the rounds (calibrates on all short runs, compares
    # with the median step over all full runs), so the load on a shared machine falls on both alike
    for name, rs in got.items():
        for k, run in enumerate(rs):
            run.meta["tokens"] = MODEL["tokens"]
            path = run.save(out / f"{name}-r{k + 1}.run.zip")
            manifest["runs"][f"{name}-r{k + 1}"] = {"file": path.name, "plan": name, "round": k + 1,
                                                    "layers": cases[name][3], "step_s": run.step_time}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(manifest['runs'])} runs to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
