"""``offload-lab recommend MODEL``: which plans fit a device and a host, and which is fastest.

Every step time it prints is simulated on the device profile; device peaks are the planner's
estimate. With ``--out`` it writes a report of the best plan (simulated), its front and the
explanation.
"""

from __future__ import annotations

import argparse

from offload_lab.cli.common import one_line, say
from offload_lab.cli.inputs import device_profile, resolve_spec
from offload_lab.cli.outputs import check_output
from offload_lab.cli.results import write_report
from offload_lab.simulation.engine import simulate
from offload_lab.simulation.recommend import recommend

__all__ = ["cmd_recommend"]


def cmd_recommend(args: argparse.Namespace) -> int:
    """Search, print the best plan, the front and the explanation; exit 1 when nothing fits.

    >>> from offload_lab.cli.app import build_parser
    >>> cmd_recommend(build_parser().parse_args(["recommend", "wan2.1-t2v-14b", "--device", "rtx4090-pcie4",
    ...     "--host-available", "64GiB", "--device-memory", "24GiB"]))  # doctest: +ELLIPSIS
    wan2.1-t2v-14b on rtx4090-pcie4 (simulated): device memory 24.00 GiB, host available 64.00 GiB, ...
    best: ...
    0
    """
    spec, _ = resolve_spec(args.model)
    profile = device_profile(args.device)
    # recommend() checks the sizes, tokens and calls; the search itself takes about a second
    rec = recommend(spec, profile, host=args.host_available, device_memory=args.device_memory,
                    tokens=args.tokens, calls_per_step=args.calls, pin_budget=args.pin_budget,
                    tolerance=args.tolerance)
    out = None
    if args.out is not None:  # looked at once every input has been read, before anything is printed
        out = check_output(args.out, args.force, inputs=[args.model, args.device], suffix=".html")
    say(rec.summary())
    say(f"(step times SIMULATED on the {profile.provenance.get('kind', 'estimated')} profile "
        f"{profile.name!r}; device peaks are estimates; searched in {rec.search_s:.2f} s)")
    if out is not None and rec.best is not None:
        run = simulate(rec.best, profile, steps=2, tokens=args.tokens, passes=args.calls,
                       label=f"recommended on {profile.name}")
        path = write_report([run], out, rec.best, args.title, recommendation=rec)
        say(f"wrote {path.resolve()}")
    elif out is not None:
        say(f"no report written: {one_line(rec.explanation)}")
    return 0 if rec.best is not None else 1
