"""``offload-lab report RUN.zip ...``: one offline HTML report from saved runs and traces."""

from __future__ import annotations

import argparse

from offload_lab.cli.common import run_paths, say
from offload_lab.cli.inputs import load_run, read_plan
from offload_lab.cli.outputs import check_output
from offload_lab.cli.results import comparison_text, write_report

__all__ = ["cmd_report"]


def cmd_report(args: argparse.Namespace) -> int:
    """``offload-lab report RUN.zip ...``: one offline HTML report.

    >>> import tempfile, pathlib, offload_lab
    >>> from offload_lab.cli.app import build_parser
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> p = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> _ = offload_lab.simulate(p, "h200", steps=1).save(d / "sim.zip")
    >>> cmd_report(build_parser().parse_args(["report", str(d / "sim.zip"),
    ...                                       "--out", str(d / "r.html")]))  # doctest: +ELLIPSIS
    run ...
    report: ...r.html
    0
    """
    paths = run_paths(args.runs)
    runs = [load_run(p) for p in paths]
    plan = read_plan(args.plan) if args.plan else None
    # the output is looked at once every input has been read: a corrupt run is reported as such
    out = check_output(args.out, args.force, inputs=[*paths, *([args.plan] if args.plan else [])])
    path = write_report(runs, out, plan, args.title)
    say(comparison_text(runs))
    say(f"report: {path.resolve()}")
    return 0
