"""``offload-lab catalog [NAME] [--devices]``: the shipped models and device profiles."""

from __future__ import annotations

import argparse

from offload_lab.cli.common import CliError, say
from offload_lab.model import catalog, flops
from offload_lab.model.spec import ModelSpec
from offload_lab.simulation import DeviceProfile
from offload_lab.simulation import names as device_names
from offload_lab.units import format_bytes

__all__ = ["cmd_catalog"]


def cmd_catalog(args: argparse.Namespace) -> int:
    """``offload-lab catalog [NAME] [--devices]``: the shipped models and device profiles.

    >>> from offload_lab.cli.app import build_parser
    >>> cmd_catalog(build_parser().parse_args(["catalog", "--devices"]))  # doctest: +ELLIPSIS
    device ...
    h200 ...
    0
    """
    if args.name is not None and not args.name.strip():
        raise CliError(f"catalog NAME '' is empty; accepted: one of {', '.join(catalog.names())}, "
                       f"or no NAME to list them all")
    if args.devices:
        if args.name:
            raise CliError("catalog takes a model NAME or --devices, not both")
        # bandwidths are rates: GB/s in the header, plain numbers in the rows
        say(f"{'device':<16} {'pinned':>8} {'pageable':>8} {'mapped':>8} {'TFLOP/s':>8}  compute  profile")
        say(f"{'':<16} {'GB/s':>8} {'GB/s':>8} {'GB/s':>8}")
        nan = float("nan")
        for name in device_names():
            d = DeviceProfile.load(name)
            bw = d.bandwidths
            mapped = bw.get("mapped_warm", bw.get("mapped_cold", nan))
            tf = f"{d.tflops:.0f}" if d.tflops else "-"
            say(f"{name:<16} {bw.get('pinned', nan):>8.1f} {bw.get('pageable', nan):>8.1f} {mapped:>8.1f} "
                f"{tf:>8}  {d.compute_mode:<7}  {d.provenance.get('kind')}: {d.provenance.get('machine', '')}")
        say("bandwidths in GB/s (1e9 bytes/s), host to device; use with offload-lab simulate MODEL --device NAME")
        return 0
    if args.name:
        return _catalog_details(catalog.load(args.name))
    rows = []
    for name in catalog.names():
        s = catalog.load(name)
        rows.append((name, str(s.meta.get("display_name", "")),
                     ", ".join(f"{g.name} ×{g.num_layers}" for g in s.groups),
                     str(sum(g.num_layers for g in s.groups)), format_bytes(s.layer_bytes),
                     format_bytes(s.total_bytes)))
    head = ("name", "model", "groups", "layers", "layer bytes", "total")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        say("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    say(f"device profiles: {', '.join(device_names())} (offload-lab catalog --devices)")
    return 0


def _catalog_details(spec: ModelSpec) -> int:
    meta = spec.meta
    say(f"{spec.name}: {meta.get('display_name', spec.name)} (arch {meta.get('arch', '?')})")
    for g in spec.groups:
        sizes = sorted({layer.bytes for layer in g.layers})
        each = format_bytes(sizes[0]) if len(sizes) == 1 else f"{format_bytes(sizes[0])}–{format_bytes(sizes[-1])}"
        say(f"  group {g.name}: {g.num_layers} layers × {each} ({g.block_class or 'block'}), "
            f"{format_bytes(g.bytes)}")
    dtypes = sorted({t.dtype for t in spec.tensors()})
    say(f"  layer weights {format_bytes(spec.layer_bytes)}, non-layer {format_bytes(spec.non_layer_bytes)}, "
        f"total {format_bytes(spec.total_bytes)}; checkpoint views (mapped) {format_bytes(spec.mapped_bytes)}; "
        f"dtypes {', '.join(dtypes)}")
    tokens = meta.get("tokens") or {}
    if tokens:
        say(f"  tokens: {', '.join(f'{k} {v:,}' for k, v in tokens.items())}; text tokens "
            f"{meta.get('text_tokens', '-')}; default {meta.get('default_steps', '-')} steps × "
            f"{meta.get('guidance_passes', 1)} guidance passes")
        res = min(tokens, key=tokens.get)
        try:
            per = {g.name: flops.layer_flops(spec, g.name, res) for g in spec.groups}
            say(f"  FLOPs per layer forward at {res}: "
                + ", ".join(f"{g} {v / 1e12:.2f} TFLOP" for g, v in per.items())
                + f"; per step {flops.step_flops(spec, res) / 1e15:.2f} PFLOP")
        except ValueError:
            pass  # a spec the FLOPs model cannot read still lists its bytes
    dims = meta.get("dims") or {}
    if dims:
        say("  dims: " + ", ".join(f"{k} {v}" for k, v in dims.items() if not isinstance(v, dict)))
    say(f"try: offload-lab plan {spec.name} --pin-budget 8GiB  |  offload-lab simulate {spec.name} --device h200")
    return 0
