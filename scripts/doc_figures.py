#!/usr/bin/env python3
"""Rewrite the figures that ``docs/`` and ``benchmarks/RESULTS.md`` quote from a command, so a
page never quotes a number the code no longer prints.

    PYTHONPATH=. python3 scripts/doc_figures.py            # rewrite every figure
    PYTHONPATH=. python3 scripts/doc_figures.py --check    # exit 1 naming each stale figure
    PYTHONPATH=. python3 scripts/doc_figures.py --check --cheap   # only the fast ones (the test)

A figure sits between marker comments, inline or as a block::

    floor <!-- figures:h200-compute -->1.393 ms, 502.7 TFLOP/s<!-- /figures --> ...

    <!-- figures:recommend-best -->
    | model | device | ... |
    <!-- /figures -->

and is what :data:`FIGURES` computes under that name (unknown names are an error). Figures
that do not depend on this machine only: search and wall times are left out (the recommend
sample says "searched in … s").
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "RESULTS.md", ROOT / "README.md"]
MARK = re.compile(r"<!-- figures:([a-z0-9-]+) -->(.*?)<!-- /figures -->", re.S)

#: the recommend sample of docs/cli.md
SAMPLE = ["recommend", "wan2.1-t2v-14b", "--device", "rtx4090-pcie4", "--host-available", "64GiB",
          "--device-memory", "24GiB"]


def h200_compute() -> str:
    """The shipped h200 profile's fitted compute curve: launch floor and saturated rate."""
    from offload_lab import DeviceProfile

    floor, tflops = DeviceProfile.load("h200").compute_curve["blocks"]
    return f"{floor * 1e3:.3f} ms, {tflops:.1f} TFLOP/s"


def describe_best(rec: object) -> str:
    """One table cell: the best plan of a recommendation (simulated)."""
    from offload_lab.units import format_bytes

    r = rec.best_row  # type: ignore[attr-defined]
    if r is None:
        return "nothing fits"
    return (f"{int(r['resident_layers'])} resident, prefetch {int(r['prefetch'])}, pinned "
            f"{format_bytes(int(r['pinned_bytes']))}, {r['step_s']:.2f} s/step "
            f"({rec.calls_per_step} calls, simulated), peak {r['device_peak_bytes'] / 2**30:.2f} GiB")  # type: ignore[attr-defined]


def recommend_best() -> str:
    """``recommend()`` for every catalog model on every shipped profile (host 64 GiB, the
    profile's memory, calls = the model's guidance passes): the plans tried and the best."""
    import offload_lab
    from offload_lab import catalog

    lines = ["| model | device | plans tried | best (simulated) |", "| --- | --- | ---: | --- |"]
    for model in catalog.names():
        spec = catalog.load(model)
        calls = int(spec.meta.get("guidance_passes", 1) or 1)
        for dev in offload_lab.DeviceProfile.names():
            rec = offload_lab.recommend(spec, dev, host="64GiB", calls_per_step=calls)
            lines.append(f"| {model} | {dev} | {len(rec.tried)} | {describe_best(rec)} |")
    return "\n" + "\n".join(lines) + "\n"


def cli_recommend_sample() -> str:
    """What ``offload-lab recommend`` prints for :data:`SAMPLE`, the search time left out."""
    from offload_lab.cli.app import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(SAMPLE)
    text = re.sub(r"searched in [0-9.]+ s", "searched in … s", out.getvalue().rstrip("\n"))
    return "\n```text\n" + text + "\n```\n"


def cpu_heldout() -> str:
    """Leave-one-out over the committed cpu fixtures: median and worst |error|."""
    import json

    import offload_lab as ol
    from offload_lab.simulation.heldout import held_out

    d = ROOT / "tests" / "data" / "runs"
    manifest = json.loads((d / "manifest.json").read_text())
    runs = {n: ol.Run.load(d / v["file"]) for n, v in manifest["runs"].items()}
    err = held_out(runs, schemes=("loo",))["loo_err"].abs()
    return f"within {err.max() * 100:.1f} % (median {err.median() * 100:.1f} %, {len(err)} runs)"


def _story() -> object:
    """The pinned-vs-pageable rows of the shipped H200 runs and the simulator's two readings."""
    from offload_lab.views.story import story_frame, story_runs

    return story_frame(*story_runs())


def _row(df: object, source: str, model: str, tier: str) -> object:
    d = df[(df["source"] == source) & (df["model"] == model) & (df["tier"] == tier)]  # type: ignore[index]
    return d.iloc[0]


def h200_pinned_pageable() -> str:
    """The measured H200 pairs (before-compute order): 14B- and 1.3B-shaped at 480p, and 14B's copy rates."""
    import offload_lab
    from offload_lab.views.text import fmt_seconds

    df = _story()
    m14 = [_row(df, "measured (before-compute)", "wan2.1-t2v-14b", t) for t in ("pinned", "pageable")]
    m13 = [_row(df, "measured (before-compute)", "wan2.1-t2v-1.3b", t) for t in ("pinned", "pageable")]
    rates = {r.label: r.layers["gbps"].median() for r in offload_lab.shipped_runs("wan2.1-t2v-14b")}
    return (f"**{m14[0]['step_s']:.2f} s per step with every block pinned and {m14[1]['step_s']:.2f} s all "
            f"pageable ({m14[1]['vs_pinned']:.2f}×)**; the 1.3B-shaped one {fmt_seconds(m13[0]['step_s'])} vs "
            f"{fmt_seconds(m13[1]['step_s'])} ({m13[1]['vs_pinned']:.2f}×). Pinned copies "
            f"({rates['14B pinned p1']:.1f} GB/s per block in the 14B run) hide behind compute on the copy "
            f"stream; pageable ones ({rates['14B pageable p1']:.1f} GB/s)")


def sim_pinned_pageable() -> str:
    """The simulator's two readings of the all-pageable 14B plan at 480p on the h200 profile."""
    df = _story()
    b = _row(df, "simulated before-compute", "wan2.1-t2v-14b", "pageable")
    a = _row(df, "simulated after-compute", "wan2.1-t2v-14b", "pageable")
    p = _row(df, "simulated after-compute", "wan2.1-t2v-14b", "pinned")
    return (f"before-compute {b['step_s']:.2f} s ± {b['band'] * 100:.1f} % ({b['status']}), after-compute "
            f"{a['step_s']:.2f} s ({a['status']}; the all-pinned plan: {p['step_s']:.2f} s)")


@dataclass(frozen=True)
class Figure:
    make: Callable[[], str]
    cheap: bool  # a second or two: the test checks it on every run


FIGURES: dict[str, Figure] = {
    "h200-compute": Figure(h200_compute, True),
    "recommend-best": Figure(recommend_best, True),
    "cli-recommend": Figure(cli_recommend_sample, True),
    "cpu-heldout": Figure(cpu_heldout, False),
    "h200-pinned-pageable": Figure(h200_pinned_pageable, True),
    "sim-pinned-pageable": Figure(sim_pinned_pageable, True),
}


def render(page: str, cache: dict[str, str], cheap: bool = False) -> tuple[str, list[str]]:
    """``page`` with every figure rewritten, and the names of those that changed (with
    ``cheap``, figures that are not cheap are kept as they are)."""
    stale: list[str] = []

    def replace(m: re.Match) -> str:
        name = m.group(1)
        if name not in FIGURES:
            raise SystemExit(f"doc_figures: unknown figure {name!r}; known: {sorted(FIGURES)}")
        if cheap and not FIGURES[name].cheap:
            return m.group(0)
        if name not in cache:
            cache[name] = FIGURES[name].make()
        if m.group(2) != cache[name]:
            stale.append(name)
        return f"<!-- figures:{name} -->{cache[name]}<!-- /figures -->"

    return MARK.sub(replace, page), stale


def run(pages: list[Path], check: bool, cheap: bool = False) -> list[str]:
    """Rewrite (or with ``check`` only compare) the figures of ``pages``; returns
    ``"page: name"`` for each stale figure."""
    cache: dict[str, str] = {}
    found = []
    for p in pages:
        text = p.read_text(encoding="utf-8")
        new, stale = render(text, cache, cheap)
        found += [f"{p.name}: {n}" for n in stale]
        if not check and new != text:
            p.write_text(new, encoding="utf-8")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a figure is stale; write nothing")
    ap.add_argument("--cheap", action="store_true", help="only the figures that take a second or two")
    ap.add_argument("pages", nargs="*", type=Path, help="pages to scan (default: docs/*.md, RESULTS, README)")
    args = ap.parse_args(argv)
    stale = run(args.pages or PAGES, args.check, args.cheap)
    for s in stale:
        print(f"{'stale' if args.check else 'rewrote'}: {s}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
