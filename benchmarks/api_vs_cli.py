#!/usr/bin/env python3
"""The README's Python snippet against ``offload-lab profile``: the same model, the same plan.

    PYTHONPATH=. .venv/bin/python benchmarks/api_vs_cli.py [--tier pinned] [--steps 3] [--rounds 3]

Each side runs in its own fresh process (torch's thread pool and OpenMP start there), with
``OMP_WAIT_POLICY`` taken out of the environment, as a user who sets nothing has it:

* ``api``: ``offload_lab.profile(model, lambda: model(**inputs), plan)`` on
  ``synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.1, layers=6)`` with 256 tokens;
* ``cli``: ``offload-lab profile wan2.1-t2v-1.3b --scale 0.1 --layers 6 --tokens 256``, whose
  inputs hold 64 text tokens (the snippet's hold the spec's 512), so the API also runs on the
  CLI's inputs: that pair compares the runtimes, the other the README as written.

Rounds alternate the two sides, so load from other work falls on both. Prints each round's
median s/step (the run's ``step_time``), the CPU seconds each process used, and the ratio of
the medians over rounds (API / CLI; the goal is at most 1.2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the text tokens ``offload-lab profile`` gives a synthetic model on the cpu backend
#: (``cli/sizing.py``); the README's snippet leaves ``example_inputs`` at the spec's 512
CLI_TEXT_TOKENS = "64"

API = """
import json, resource, sys, time
import offload_lab
from offload_lab import synthetic, catalog
model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.1, layers=6)
text = None if sys.argv[3] == "default" else int(sys.argv[3])
inputs = synthetic.example_inputs(model, tokens=256, text_tokens=text)
t0 = time.process_time()
run = offload_lab.profile(model, lambda: model(**inputs),
                          offload_lab.plan(offload_lab.spec_of(model), tier=sys.argv[1]), steps=int(sys.argv[2]))
print(json.dumps({"step_s": run.step_time, "cpu_s": time.process_time() - t0}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def api(tier: str, steps: int, text_tokens: str = "default") -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", API, tier, str(steps), text_tokens], env=_env(), check=True,
                         capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cli(tier: str, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cli.zip"
        subprocess.run([sys.executable, "-m", "offload_lab", "profile", "wan2.1-t2v-1.3b", "--scale", "0.1",
                        "--layers", "6", "--tokens", "256", "--tier", tier, "--steps", str(steps),
                        "--out", str(path)], env=_env(), check=True, capture_output=True, text=True, cwd=ROOT)
        sys.path.insert(0, str(ROOT))
        import offload_lab

        return {"step_s": offload_lab.Run.load(path).step_time}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", default="pinned")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    a, a64, c = [], [], []
    for k in range(args.rounds):
        ra, r64, rc = api(args.tier, args.steps), api(args.tier, args.steps, CLI_TEXT_TOKENS), cli(args.tier, args.steps)
        a.append(ra["step_s"])
        a64.append(r64["step_s"])
        c.append(rc["step_s"])
        print(f"round {k + 1}: api (README inputs) {ra['step_s']:.3f} s/step, api (the CLI's inputs) "
              f"{r64['step_s']:.3f} s/step, cli {rc['step_s']:.3f} s/step", flush=True)
    ma, m64, mc = statistics.median(a), statistics.median(a64), statistics.median(c)
    print(f"{args.tier}, {args.steps} steps, {args.rounds} rounds, {os.cpu_count()} cores, medians: "
          f"api (README inputs, 512 text tokens) {ma:.3f} s/step, api (the CLI's inputs, {CLI_TEXT_TOKENS} text "
          f"tokens) {m64:.3f} s/step, cli {mc:.3f} s/step; api / cli on the same inputs = {m64 / mc:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
