"""Simulated stand-ins for the GPU stages that have not run yet, saved as runs with a manifest.

    PYTHONPATH=. python3 scripts/simulate_evidence.py [--out DIR] [--check]

Until a GPU runs the stages of ``scripts/gpu_stages.py`` (and the MiniMax-H3 full-size run),
the simulator's predictions for those cases ship as simulated runs: each case is planned on the
catalog spec, simulated on the shipped ``h200`` profile and saved as ``DIR/<stage>-NN-<label>.zip``
(default ``data/simulated/h200``) with ``DIR/manifest.json`` (case, the stage it stands in for,
plan options, profile, each prediction's evidence (a held-out band or none), this command). Every run is labelled
"(simulated)" and has ``meta["simulated"]`` True; none is ever a measurement.

``--check`` regenerates every case in a temporary folder and exits 1 when a step time differs
from the shipped files (the simulator is deterministic, so any difference means the simulator,
the profile, the catalog or the planner changed and the files must be regenerated).

Stages the simulator cannot stand in for are listed in the manifest under ``not_simulated``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROFILE = "h200"
DEFAULT_OUT = ROOT / "data" / "simulated" / PROFILE
COMMAND = "PYTHONPATH=. python3 scripts/simulate_evidence.py"
MANIFEST_FORMAT = "offload-lab/simulated-evidence"
#: host memory available when the shipped H200 runs were planned (their plans' ledger
#: ``available``), so these plans grant pins as that machine would
H200_HOST_AVAILABLE = 134_255_919_104
#: the GPU stages measure 2 steps after 1 warm-up step
STEPS, WARMUP = 2, 1
#: relative step-time difference ``--check`` tolerates: float noise only
CHECK_RTOL = 1e-9

NOT_SIMULATED = {
    "short": "a prediction from a profile calibrated on short GPU runs; there are no such runs to calibrate on yet",
    "overhead": "bare forwards against the manager: the simulator models the manager only",
    "repeats": "bit identity and run-to-run spread: the simulator is deterministic and computes no outputs",
}


@dataclass
class Case:
    """One simulated stand-in: what to plan and how to simulate it."""

    stage: str
    label: str
    model: str
    plan: dict[str, Any]
    tokens: int
    passes: int = 1
    host: dict[str, Any] = field(default_factory=lambda: {"available": H200_HOST_AVAILABLE})
    note: str = ""


def cases() -> list[Case]:
    """Every case, in the order the files are numbered."""
    import offload_lab

    out = [Case("tokens", f"1.3B pinned p1 {n}-tok", "wan2.1-t2v-1.3b", {"tier": "pinned", "prefetch": 1}, n)
           for n in (1024, 4096, 16384, 32760, 75600)]
    out.append(Case("tokens", "14B pinned p1 1024-tok", "wan2.1-t2v-14b", {"tier": "pinned", "prefetch": 1}, 1024))
    out.append(Case("cfg720", "1.3B pinned p1 720p cfg", "wan2.1-t2v-1.3b", {"tier": "pinned", "prefetch": 1},
                    75600, passes=2, note="two forwards per step (classifier-free guidance)"))
    spec14 = offload_lab.catalog.load("wan2.1-t2v-14b")
    total = int(spec14.layers["bytes"].sum())
    for share in (0.25, 0.5, 0.75):
        for order in ("execution", "reverse", "strided", "largest"):
            out.append(Case("budgets", f"14B pin {int(share * 100)}% {order}", "wan2.1-t2v-14b",
                            {"pin_budget": int(total * share), "order": order, "prefetch": 1}, 32760,
                            note=f"pin budget {share:.0%} of the model's layer bytes"))
    h3 = {"resident": {"blocks": 35}, "residency": "strided", "prefetch": 1}
    out.append(Case("h3", "H3 35 resident strided p1", "minimax-h3", h3, 32760,
                    note="both groups; the 15 streamed main blocks and the 2 refiner blocks all pinned "
                         "(host as the H200 runs')"))
    out.append(Case("h3", "H3 35 resident strided p1 8GiB-host", "minimax-h3", h3, 32760,
                    host={"available": "8GiB"},
                    note="a host with 8 GiB available: the planner pins what fits and keeps most of the "
                         "other streamed checkpoint views mapped (the net-anonymous check)"))
    return out


def simulate_case(case: Case) -> Any:
    """The simulated run of ``case`` (deterministic: same inputs, same step times)."""
    import offload_lab

    spec = offload_lab.catalog.load(case.model)
    plan = offload_lab.plan(spec, host=offload_lab.HostMemory(**case.host), **case.plan)
    run = offload_lab.simulate(plan, PROFILE, steps=STEPS + WARMUP, warmup=WARMUP, tokens=case.tokens,
                               passes=case.passes, label=case.label)
    run.meta.update(model=case.model, tokens=case.tokens, passes=case.passes, stands_in_for=case.stage)
    return run


def file_name(case: Case, index: int) -> str:
    """``<stage>-NN-<label>.zip`` as the GPU stages name theirs, kept to ``[A-Za-z0-9._-]``."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", case.label.replace("%", "pct"))
    return f"{case.stage}-{index:02d}-{safe}.zip"


def _numbered(all_cases: list[Case]) -> list[tuple[Case, str]]:
    seen: dict[str, int] = {}
    out = []
    for c in all_cases:
        seen[c.stage] = seen.get(c.stage, 0) + 1
        out.append((c, file_name(c, seen[c.stage])))
    return out


def generate(out: Path, log=print) -> dict[str, Any]:
    """Simulate every case into ``out``; returns (and writes) the manifest."""
    import offload_lab
    from offload_lab.record.run import display_label

    out.mkdir(parents=True, exist_ok=True)
    prof = offload_lab.DeviceProfile.load(PROFILE)
    entries = []
    for case, name in _numbered(cases()):
        run = simulate_case(case)
        run.save(out / name)
        tiers = run.layers.groupby("tier").size().to_dict()
        entries.append({
            "file": name, "label": display_label(run), "stage": case.stage, "model": case.model,
            "plan": case.plan, "host": case.host, "tokens": case.tokens, "passes": case.passes,
            "steps": STEPS, "warmup": WARMUP, "issue": run.meta.get("issue"),
            "tiers": {str(k): int(v) for k, v in tiers.items()},
            "step_s": [float(x) for x in run.steps["wall_s"]], "median_step_s": float(run.step_time),
            # what the prediction rests on (offload_lab.simulation.evidence): a held-out band, or none
            "evidence": {k: run.meta["evidence"][k] for k in ("status", "band", "basis")},
            "note": case.note,
        })
        log(f"  {case.stage:8s} {run.label:<48s} {run.step_time:8.4f} s/step")
    manifest = {
        "format": MANIFEST_FORMAT, "version": 1, "simulated": True,
        "profile": PROFILE, "step_error": prof.step_error,
        "profile_provenance_kind": (prof.provenance or {}).get("kind"),
        "command": COMMAND, "runs": entries, "not_simulated": NOT_SIMULATED,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def table(manifest: dict[str, Any]) -> str:
    """The predicted step times as a markdown table (what docs/simulator.md shows)."""
    lines = ["| stage | case (simulated) | layers | predicted s/step | evidence |", "| --- | --- | --- | ---: | --- |"]
    order = ("resident", "pinned", "staged", "pageable", "mapped")
    for r in manifest["runs"]:
        tiers = ", ".join(f"{r['tiers'][t]} {t}" for t in order if t in r["tiers"])
        ev = r.get("evidence") or {}
        band = ev.get("band")
        said = f"held-out ± {band:.1%}" if ev.get("status") == "held-out" and band is not None else \
            str(ev.get("status", "–"))
        lines.append(f"| `{r['stage']}` | {r['label'].removesuffix(' (simulated)')} | {tiers} | "
                     f"{r['median_step_s']:.4f} | {said} |")
    return "\n".join(lines)


def check(shipped: Path) -> int:
    """0 when regenerating every case gives the shipped step times, else 1 (what differs is printed)."""
    want_file = shipped / "manifest.json"
    if not want_file.is_file():
        print(f"no manifest.json in {shipped}; generate it first: {COMMAND}", file=sys.stderr)
        return 1
    import offload_lab

    want = json.loads(want_file.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        got = generate(Path(tmp), log=lambda *_: None)
    bad = []
    wanted = {r["file"]: r for r in want["runs"]}
    for r in got["runs"]:
        w = wanted.pop(r["file"], None)
        if w is None:
            bad.append(f"{r['file']}: not shipped")
            continue
        old = [float(x) for x in offload_lab.Run.load(shipped / r["file"]).steps["wall_s"]]
        for what, have in (("file", old), ("manifest", w["step_s"])):
            if len(have) != len(r["step_s"]) or any(abs(a - b) > CHECK_RTOL * max(abs(b), 1e-12)
                                                    for a, b in zip(have, r["step_s"])):
                bad.append(f"{r['file']}: shipped {what} steps {have} != regenerated {r['step_s']}")
    bad += [f"{f}: shipped but no longer generated" for f in wanted]
    if bad:
        print("simulated evidence is out of date; regenerate with: " + COMMAND, file=sys.stderr)
        print("\n".join(bad), file=sys.stderr)
        return 1
    print(f"ok: {len(got['runs'])} simulated runs in {shipped} match a fresh simulation")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder to write (default {DEFAULT_OUT})")
    ap.add_argument("--check", action="store_true",
                    help="regenerate in a temporary folder and fail if step times differ from --out")
    args = ap.parse_args(argv)
    if args.check:
        return check(args.out)
    print(f"simulated on the shipped {PROFILE!r} profile (not measured), {STEPS} steps after {WARMUP} warm-up:")
    manifest = generate(args.out)
    print(f"wrote {len(manifest['runs'])} runs and manifest.json to {args.out}")
    print(table(manifest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
