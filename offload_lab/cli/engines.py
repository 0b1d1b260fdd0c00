"""``offload-lab engines MODEL --device NAME``: other engines' offload settings simulated side by side.

One row per engine setting (:func:`offload_lab.engines.compare`): simulated step time, the
evidence it rests on, the host bytes the engine's pins really lock, the device peak, whether it
fits the host and the device.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from offload_lab.engines import ENGINES, compare
from offload_lab.engines.compare import text
from offload_lab.planning.options import MAX_PASSES, argparse_type, parse_count, parse_tokens
from offload_lab.simulation.profile import DeviceProfile
from offload_lab.views.text import text_table

__all__ = ["add_parser", "run", "HOST"]

#: the hypothetical host when --host-available is not given (the other simulating commands' default)
HOST = "256GiB"

_EPILOG = """\
examples:
  offload-lab engines wan2.1-t2v-14b --device rtx4090-pcie4 --host-available 64GiB --device-memory 24GiB
  offload-lab engines wan2.1-t2v-1.3b --device h200 --host-available 64GiB --calls 2
  offload-lab engines wan2.1-t2v-14b --device rtx4090-pcie4 --engine diffusers-group --engine sglang-layerwise

Every step time is SIMULATED (offload-lab's simulator with the device profile); each engine's
settings are modelled as an offload-lab plan (offload_lab.engines.as_plan), its assumptions in
plan.params["engine"]["notes"]. "pinned" is what the engine's pins really lock on the host."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``engines`` subcommand to ``subparsers``.

    >>> parser = argparse.ArgumentParser(prog="offload-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["engines", "wan2.1-t2v-14b", "--device", "h200", "--calls", "2"])
    >>> args.command, args.device, args.calls, args.host_available
    ('engines', 'h200', 2, '256GiB')
    """
    p = subparsers.add_parser(
        "engines", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG,
        help="diffusers', SGLang's and offload-lab's offload settings simulated side by side",
        description="Simulate other engines' offload settings (diffusers group / model offload, SGLang's\n"
                    "layerwise offload) beside offload-lab's plans: one row per engine setting.")
    p.add_argument("model", metavar="MODEL", help="catalog name, .safetensors file/dir/index, or spec JSON")
    p.add_argument("--device", required=True, metavar="NAME|PATH",
                   help="device profile: a shipped name (offload-lab catalog --devices) or a JSON file")
    p.add_argument("--host-available", metavar="SIZE", default=HOST,
                   help=f"host memory available, e.g. 64GiB (default {HOST}, not this machine)")
    p.add_argument("--device-memory", metavar="SIZE", help="device memory, e.g. 24GiB (default: the profile's)")
    p.add_argument("--tokens", type=argparse_type(parse_tokens, "tokens"), metavar="480p|N",
                   help="video tokens or a resolution (default: the model's smallest, 480p)")
    p.add_argument("--calls", type=argparse_type(lambda t: parse_count(t, "calls", 1, MAX_PASSES), "calls"),
                   default=1, metavar="N", help="forwards per step, e.g. 2 for classifier-free guidance (default 1)")
    p.add_argument("--engine", action="append", choices=list(ENGINES), metavar="NAME",
                   help=f"only this engine (repeatable; default all: {', '.join(ENGINES)})")
    p.set_defaults(func="offload_lab.cli.engines:run")
    return p


def run(args: argparse.Namespace) -> int:
    """Carry out ``offload-lab engines``; returns 0 (1 when no setting fits)."""
    # the MODEL resolver lives with the other commands, which import the parser module that
    # imports this one; looked up at run time, as the parser looks up every command
    spec, _ = importlib.import_module("offload_lab.cli.commands").resolve_spec(args.model)
    profile = DeviceProfile.load(args.device)
    frame = compare(spec, profile, host=args.host_available, device_memory=args.device_memory,
                    tokens=args.tokens, calls=args.calls, engines=args.engine)
    shown = text(frame).drop(columns=["extra_s"])
    print(f"{spec.name} on {profile.name} (simulated), host available {args.host_available}, "
          f"{args.calls} call(s) per step", flush=True)
    print(text_table(shown, right=("step_s", "pinned", "device peak")), flush=True)
    print("(step times SIMULATED; step_s includes copies outside the layers; evidence: held-out = measured runs "
          "of that regime back it, unconfirmed / derived = none do; device peaks are estimates)", flush=True)
    return 0 if bool(frame["fits"].any()) else 1
