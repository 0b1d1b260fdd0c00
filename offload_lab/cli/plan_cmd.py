"""``offload-lab plan MODEL``: where each layer would live, and why."""

from __future__ import annotations

import argparse
import json

from offload_lab.cli.common import host_line, one_line, say
from offload_lab.cli.inputs import make_plan, resolve_spec
from offload_lab.units import format_bytes
from offload_lab.views.text import text_table

__all__ = ["cmd_plan"]


def cmd_plan(args: argparse.Namespace) -> int:
    """``offload-lab plan MODEL``: the plan table, ledger and warnings (or JSON).

    >>> from offload_lab.cli.app import build_parser
    >>> cmd_plan(build_parser().parse_args(["plan", "wan2.1-t2v-14b", "-b", "8GiB", "--host", "64GiB"]))
    ... # doctest: +ELLIPSIS
    wan2.1-t2v-14b (catalog): blocks ×40; ...
    40 layers: 12 pinned, 28 pageable; ...
    0
    """
    spec, kind = resolve_spec(args.model)
    p = make_plan(spec, args)
    if args.json:
        d = p.to_dict()
        d["startup_peak"] = {s: p.startup_peak(s) for s in ("grouped", "naive")}
        print(json.dumps(d, indent=1, default=str))
        return 0
    groups = ", ".join(f"{g.name} ×{g.num_layers}" for g in spec.groups)
    say(f"{spec.name} ({kind}): {groups}; {format_bytes(spec.layer_bytes)} of layer weights + "
        f"{format_bytes(spec.non_layer_bytes)} non-layer (always on the device)")
    say(host_line(p))
    say()
    say(text_table(p.table(), right=("layer", "size", "mapped", "pin rank")))
    say()
    say("ledger:")
    led = p.ledger
    for key in ("available", "reserve", "spendable", "budget", "pinned_bytes", "net_anonymous_bytes"):
        if key in led:
            say(f"  {key:<20} {format_bytes(led[key])}")
    if "headroom" in led:
        # the ledger's headroom is what the plan could spend; the reader wants what it leaves
        after = led["headroom"] - led.get("net_anonymous_bytes", 0)
        say(f"  {'headroom after plan':<20} {'-' if after < 0 else ''}{format_bytes(abs(after))} "
            f"(of {format_bytes(led['headroom'])} before its net new anonymous bytes)")
    say(f"  {'fits':<20} {'yes' if led.get('fits') else 'NO'}")
    say(f"init order: {', '.join(p.init_order)}; prefetch {p.prefetch}; startup peak on the device: "
        f"{format_bytes(p.startup_peak('grouped'))} grouped, {format_bytes(p.startup_peak('naive'))} naive")
    for w in p.warnings:
        say(f"warning: {one_line(w)}")
    say(p.summary())
    return 0
