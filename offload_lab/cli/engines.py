"""``offload-lab engines MODEL --device NAME``: other engines' offload settings simulated side by side.

One row per engine setting (:func:`offload_lab.engines.compare`): simulated step time, the
evidence it rests on, the host bytes the engine's pins really lock, the device peak, whether it
fits the host and the device.
"""

from __future__ import annotations

import argparse

from offload_lab.cli.inputs import resolve_spec
from offload_lab.engines import compare
from offload_lab.engines.compare import text
from offload_lab.simulation.profile import DeviceProfile
from offload_lab.views.text import text_table

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Carry out ``offload-lab engines``; returns 0 (1 when no setting fits)."""
    spec, _ = resolve_spec(args.model)
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
