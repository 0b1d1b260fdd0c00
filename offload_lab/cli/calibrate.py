"""``offload-lab calibrate --model MODEL --layers 4 --out my-gpu.json``: a device profile from a short run.

A few layers of the model at full width (``--scale 1``; the cpu backend picks a smaller width
unless told) are profiled on this machine all pinned and all pageable, prefetch 1, at each
``--tokens`` count; :func:`offload_lab.calibrate` fits the profile from those runs (bandwidths,
host costs, per-layer compute and the compute curve ``floor + FLOPs / rate``; two token counts
fit the floor). Each layer of the same shape costs the same, so the profile predicts the full
model's depth: the command prints the simulated full-model step beside the measured short one.
"""

from __future__ import annotations

import argparse
from typing import Any

from offload_lab.cli.outputs import FORCE_HELP, check_output, check_output_dir
from offload_lab.errors import OffloadLabError
from offload_lab.vocabulary import BACKENDS, CALIBRATION_TIERS

__all__ = ["add_parser", "run", "CalibrateError", "TIERS"]

#: the plans measured (:data:`offload_lab.vocabulary.CALIBRATION_TIERS`)
TIERS = CALIBRATION_TIERS

_EPILOG = """\
examples:
  offload-lab calibrate --model wan2.1-t2v-14b --layers 4 --out my-gpu.json
  offload-lab calibrate --model wan2.1-t2v-1.3b --layers 4 --tokens 480p,1024 --out my-gpu.json
  offload-lab calibrate --model wan2.1-t2v-1.3b --layers 2 --scale 0.1 --tokens 16 --backend cpu --out cpu.json

Use the profile anywhere a device is named: offload-lab simulate MODEL --device my-gpu.json,
PlanExplorer(spec, profile=DeviceProfile.load("my-gpu.json")). On a GPU the default token
counts are the model's 480p and 1,024 (two counts fit the launch floor of a block); on the cpu
backend, the sized count only."""


class CalibrateError(OffloadLabError, ValueError):
    """A calibration the command cannot do: an unknown model, an output that exists, ..."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``calibrate`` subcommand to ``subparsers``.

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="offload-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> a = parser.parse_args(["calibrate", "--model", "wan2.1-t2v-14b", "--out", "g.json"])
    >>> a.model, a.layers, a.tokens, a.force
    ('wan2.1-t2v-14b', 4, None, False)
    """
    p = subparsers.add_parser(
        "calibrate", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG,
        help="a device profile of this machine from a short run of a few layers",
        description="Profile a few layers of MODEL on this machine (all pinned and all pageable)\n"
                    "and fit a device profile that predicts the full model.")
    p.add_argument("--model", required=True, metavar="NAME", help="catalog model name (offload-lab catalog)")
    p.add_argument("--layers", type=_positive("layers"), default=4, metavar="N",
                   help="layers per group to run (default 4)")
    p.add_argument("--scale", type=_scale, metavar="S",
                   help="width scale in (0, 1] (default: 1 on cuda, chosen to fit on cpu)")
    p.add_argument("--tokens", metavar="LIST",
                   help="comma-separated video token counts or resolutions (default: 480p,1024 on cuda)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="where to run (default: cuda when available)")
    p.add_argument("-n", "--steps", type=_positive("steps"), default=3, metavar="N",
                   help="measured steps per run (default 3)")
    p.add_argument("--warmup", type=_positive("warmup", 0), default=1, metavar="N",
                   help="warm-up steps dropped per run (default 1)")
    p.add_argument("--threads", type=_positive("threads"), metavar="N",
                   help="torch intra-op threads on the cpu backend (default: every core)")
    p.add_argument("--name", help="profile name (default: from the device)")
    p.add_argument("--save-runs", metavar="DIR", help="also save the measured short runs here")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="where to write the profile")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(func="offload_lab.cli.calibrate:run")
    return p


def _positive(what: str, lo: int = 1) -> Any:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < lo:
            raise argparse.ArgumentTypeError(f"--{what} {text!r}; accepted: an integer >= {lo}")
        return n
    return parse


def _scale(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = float("nan")
    if not 0 < s <= 1:
        raise argparse.ArgumentTypeError(f"--scale {text!r}; accepted: a number in (0, 1]")
    return s


def token_counts(spec: Any, text: str | None, backend: str, sized: int) -> list[int]:
    """``--tokens`` as a list of counts; the default depends on the backend.

    >>> from offload_lab import catalog
    >>> token_counts(catalog.load("wan2.1-t2v-1.3b"), "480p, 1024", "cpu", 16)
    [32760, 1024]
    >>> token_counts(catalog.load("wan2.1-t2v-1.3b"), None, "cpu", 16)
    [16]
    """
    from offload_lab.model.flops import FlopsError, resolve_tokens

    if text is None:
        return [resolve_tokens(spec, "480p"), 1024] if backend == "cuda" and "480p" in (
            k.lower() for k in (spec.meta.get("tokens") or {})) else [sized]
    out = []
    for part in (x.strip() for x in text.split(",")):
        try:
            out.append(resolve_tokens(spec, int(part) if part.isdigit() else part))
        except FlopsError as e:
            raise CalibrateError(f"--tokens {text!r}: {e}") from None
    if not out:
        raise CalibrateError(f"--tokens {text!r}; accepted: counts or resolutions, comma-separated")
    return out


def run(args: argparse.Namespace) -> int:
    """Carry out ``offload-lab calibrate``; returns the exit status (0)."""
    import offload_lab as ol
    from offload_lab.cli.commands import _resolve_backend, _set_threads
    from offload_lab.cli.sizing import choose_size
    from offload_lab.model import synthetic

    if args.model not in ol.catalog.names():
        raise CalibrateError(f"--model {args.model!r} is not in the catalog; accepted: {ol.catalog.names()}")
    full = ol.catalog.load(args.model)
    backend = _resolve_backend(args.backend)
    if args.tokens is not None:
        token_counts(full, args.tokens, backend, 0)  # a bad --tokens fails before the outputs
    # the outputs once the inputs are read, before the sizing probe and the runs
    out = check_output(args.out, args.force, example="profile.json")
    save_dir = check_output_dir(args.save_runs, args.force) if args.save_runs else None
    _set_threads(backend, args.threads)
    scale = args.scale if args.scale is not None else (1.0 if backend == "cuda" else None)
    size = choose_size(full, backend, scale=scale, layers=args.layers)
    counts = token_counts(full, args.tokens, backend, size.tokens)
    print(f"calibrating on {backend}: {args.model} at {size.describe().split(',')[0]}, "
          f"tokens {counts}, tiers {list(TIERS)}", flush=True)
    device = "cuda" if backend == "cuda" else "cpu"
    model = synthetic.build(full, scale=size.scale, layers=size.layers, device="cpu")
    spec = synthetic.spec_of(model)
    host = ol.HostMemory.probe()
    runs = []
    for n in counts:
        inputs = synthetic.example_inputs(model, tokens=n, text_tokens=size.text_tokens, device=device)
        for tier in TIERS:
            plan = ol.plan(spec, tier=tier, prefetch=1, host=host)
            r = ol.profile(model, lambda x=inputs: model(**x), plan, steps=args.steps, warmup=args.warmup,
                           backend=backend, label=f"{tier} p1, {n} tokens ({backend}, measured)")
            r.meta["tokens"] = int(n)
            runs.append(r)
            print(f"  {r.label}: {r.step_time * 1e3:.2f} ms/step", flush=True)
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
        for k, r in enumerate(runs):
            r.save(save_dir / f"calibrate-{k:02d}.zip")
    prof = ol.calibrate(runs, name=args.name or f"calibrated-{backend}", tokens=counts[0])
    prof.provenance["short_run"] = {"model": args.model, "scale": size.scale, "layers": size.layers,
                                    "full_layers": {g.name: g.num_layers for g in full.groups},
                                    "tokens": counts, "text_tokens": size.text_tokens}
    prof.to_json(out)
    print(f"wrote {out.resolve()}: {prof!r}")
    if size.scale == 1.0:
        # full width: the catalog model's own shapes, simulated on the fitted profile
        plan = ol.plan(full, tier="pinned", prefetch=1, host=ol.HostMemory(available="4TiB"))
        sim = ol.simulate(plan, prof, steps=2, tokens=counts[0])
        print(f"predicted full {args.model} ({sum(g.num_layers for g in full.groups)} layers), all pinned p1, "
              f"{counts[0]} tokens: {sim.step_time:.3f} s/step (simulated)")
    return 0
