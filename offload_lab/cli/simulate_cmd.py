"""``offload-lab simulate MODEL --device NAME``: a plan's predicted timeline, labelled simulated."""

from __future__ import annotations

import argparse
from typing import Any

import pandas as pd

from offload_lab.analysis import summary as analysis
from offload_lab.analysis.ranks import slowest_rank_run
from offload_lab.cli.common import SIM_HOST, CliError, host_line, one_line, say
from offload_lab.cli.inputs import device_profile, make_plan, resolve_spec
from offload_lab.cli.outputs import check_output, cleaned_up
from offload_lab.cli.results import evidence_head
from offload_lab.model.flops import resolve_tokens
from offload_lab.planning.hostmem import HostMemory, resolve_host
from offload_lab.planning.planner import Plan
from offload_lab.record.run import Run, display_label
from offload_lab.simulation import simulate
from offload_lab.simulation.evidence import streams_host_blocking
from offload_lab.views.text import fmt_percent, fmt_ratio, fmt_seconds, text_table

__all__ = ["cmd_simulate"]


def cmd_simulate(args: argparse.Namespace) -> int:
    """``offload-lab simulate MODEL --device NAME``: a simulated run, labelled so.

    >>> from offload_lab.cli.app import build_parser
    >>> cmd_simulate(build_parser().parse_args(["simulate", "wan2.1-t2v-14b", "--device", "h200",
    ...                                         "-n", "1", "--tier", "pinned"]))  # doctest: +ELLIPSIS
    host: hypothetical: ...
    ...(simulated): ... per step (SIMULATED on the ... profile 'h200', not measured)
    ...
    0
    """
    spec, _ = resolve_spec(args.model)
    profile = device_profile(args.device)
    if args.tokens is None and not spec.meta.get("tokens"):
        raise CliError(f"MODEL {args.model!r} names no token count (only catalog specs do); "
                       f"pass --tokens N, e.g. --tokens 32760")
    if args.tokens is not None:
        resolve_tokens(spec, args.tokens)  # a bad resolution fails before any output
    k = getattr(args, "ranks_per_node", 1)
    if k > 1:  # the node's host is shared: each rank plans against its 1/k
        node = resolve_host(args.host if args.host is not None else SIM_HOST)
        args.host = HostMemory.from_dict({**node.to_dict(), "shared_by": k, "local_rank": 0})
    p = make_plan(spec, args, host=SIM_HOST)
    # every input is read and the plan made before the output is looked at
    out = None
    if args.out is not None:
        out = check_output(args.out, args.force, inputs=[args.model, args.device], suffix=".zip")
    say(host_line(p))
    say(f"plan: {p.summary()}")
    for w in p.warnings:
        say(f"warning: {one_line(w)}")
    run = simulate(p, profile, steps=args.steps or 3, tokens=args.tokens, label=args.label,
                   warmup=args.warmup, passes=args.passes, ranks_per_node=k,
                   issue=args.issue)
    if k > 1:
        say(f"node: {k} ranks copying at once; pageable and mapped staging share the host memory bus "
            f"(an estimate: {'; '.join(run.meta['estimates'])})")
        run_view = slowest_rank_run(run)
    else:
        run_view = run
    m = analysis.metrics(run_view)
    kind = profile.provenance.get("kind", "estimated")
    say(f"{display_label(run)}: {fmt_seconds(m['step_s'])} per step (SIMULATED on the {kind} profile "
        f"{profile.name!r}, not measured)")
    say(f"  stall {fmt_seconds(m['stall_s'])}, exposed copy {fmt_seconds(m['exposed_copy_s'])}, overlap "
        f"{fmt_percent(m['overlap'])}, {fmt_ratio(m['vs_bound'])} its {m['bound']['limit']}-bound of "
        f"{fmt_seconds(m['bound_s'])}")
    _say_orders(run, p, profile, args, k)
    if out is not None:
        with cleaned_up(out):
            path = run.save(out)
        say(f"saved {path.resolve()}")
    return 0


def _say_orders(run: Run, p: Plan, profile: Any, args: argparse.Namespace, k: int) -> None:
    """The prediction under both issue orders, each with what it rests on, when the plan streams
    pageable, mapped or staged layers (the order does not change an all-pinned plan)."""
    if k > 1 or not streams_host_blocking(run):
        ev = run.meta.get("evidence") or {}
        say(f"  evidence: {evidence_head(ev)} — {ev.get('basis', 'none recorded')}")
        return
    other = "before-compute" if run.meta["issue"] == "after-compute" else "after-compute"
    twin = simulate(p, profile, steps=args.steps or 3, tokens=args.tokens, warmup=args.warmup,
                    passes=args.passes, issue=other)
    by_order = {r.meta["issue"]: r for r in (run, twin)}
    say("  both issue orders (the plan streams copies that block the host or are staged):")
    rows = [[o + (" (this run)" if o == run.meta["issue"] else ""), fmt_seconds(by_order[o].step_time),
             evidence_head(by_order[o].meta.get("evidence") or {})] for o in ("after-compute", "before-compute")]
    table = text_table(pd.DataFrame(rows, columns=["issue order", "step", "evidence"]), right=("step",))
    for line in table.splitlines():
        say(f"    {line}")
    for o in ("after-compute", "before-compute"):
        say(f"    {o}: {(by_order[o].meta.get('evidence') or {}).get('basis', 'no evidence recorded')}")
