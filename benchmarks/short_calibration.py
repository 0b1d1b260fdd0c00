"""A profile calibrated on a short run (4 blocks at full width) against the full-depth model.

    PYTHONPATH=. .venv/bin/python benchmarks/short_calibration.py [--runs tests/data/short]

Reads the committed cpu-backend fixture runs of ``scripts/record_short_fixtures.py`` (the fixture
model truncated to 4 blocks and at its full 30, all pinned and all pageable, interleaved rounds),
calibrates one profile per tier on the 4-block runs only and prints, per tier, the 30-block
median step it predicts beside the measured one. The 30-block runs are never seen by the fit:
the error is held out. ``tests/test_short_calibration.py`` holds it to 10 %.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default=str(ROOT / "tests" / "data" / "short"),
                    help="a directory written by scripts/record_short_fixtures.py (default: the committed one)")
    args = ap.parse_args(argv)
    import numpy as np

    import offload_lab as ol
    from offload_lab.simulation import plan_of_run
    from offload_lab.simulation.calibration import spec_of_run

    root = Path(args.runs)
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        print(f"--runs {root}: no manifest.json; accepted: a directory written by "
              "scripts/record_short_fixtures.py", file=sys.stderr)
        return 2
    manifest = json.loads(manifest_path.read_text())

    def runs(plan: str) -> list:
        return [ol.Run.load(root / v["file"]) for v in manifest["runs"].values() if v["plan"] == plan]

    def median_step(rs: list) -> float:
        return float(np.median(np.concatenate([r.steps["wall_s"].to_numpy() for r in rs])))

    print(f"runs: {root} (recorded {manifest.get('recorded', '?')}, {manifest.get('rounds', '?')} rounds, "
          f"load average before {manifest.get('loadavg_before', '?')})")
    print(f"{'tier':<9} {'4-block step':>13} {'30-block predicted':>19} {'measured':>9} {'error':>7}")
    for tier in ("pinned", "pageable"):
        short, full = runs(f"short-{tier}"), runs(f"full-{tier}")
        profile = ol.calibrate(short)
        _, plan = plan_of_run(full[0], spec=spec_of_run(full[0]))
        predicted = ol.simulate(plan, profile, steps=5, warmup=1).step_time
        measured = median_step(full)
        print(f"{tier:<9} {median_step(short) * 1e3:>10.1f} ms {predicted * 1e3:>16.1f} ms "
              f"{measured * 1e3:>6.1f} ms {predicted / measured - 1:>+7.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
