"""``offload-lab calibrate --model MODEL --layers 4 --out my-gpu.json``: a device profile from a short run.

A few layers of the model at full width (``--scale 1``; the cpu backend picks a smaller width
unless told) are profiled on this machine all pinned and all pageable, prefetch 1, at each
``--tokens`` count; :func:`offload_lab.calibrate` fits the profile from those runs (bandwidths,
host costs, per-layer compute and the compute curve ``floor + FLOPs / rate``; two token counts
fit the floor). Each layer of the same shape costs the same, so the profile predicts the full
model's depth: the command prints the simulated full-model step beside the measured short one.

The options are parsed by :mod:`offload_lab.cli.app` (this module imports torch; the parser
must not); :func:`run` is the command.
"""

from __future__ import annotations

import argparse
from typing import Any

from offload_lab.cli.common import resolve_backend, set_threads
from offload_lab.cli.outputs import check_output, check_output_dir
from offload_lab.cli.sizing import choose_size
from offload_lab.errors import OffloadLabError
from offload_lab.model import catalog, synthetic
from offload_lab.model.flops import FlopsError, resolve_tokens
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.planner import plan
from offload_lab.record.runtime import profile
from offload_lab.simulation.calibration import calibrate
from offload_lab.simulation.engine import simulate
from offload_lab.vocabulary import CALIBRATION_TIERS

__all__ = ["run", "token_counts", "CalibrateError", "TIERS"]

#: the plans measured (:data:`offload_lab.vocabulary.CALIBRATION_TIERS`)
TIERS = CALIBRATION_TIERS

class CalibrateError(OffloadLabError, ValueError):
    """A calibration the command cannot do: an unknown model, an output that exists, ..."""


def token_counts(spec: Any, text: str | None, backend: str, sized: int) -> list[int]:
    """``--tokens`` as a list of counts; the default depends on the backend.

    >>> from offload_lab import catalog
    >>> token_counts(catalog.load("wan2.1-t2v-1.3b"), "480p, 1024", "cpu", 16)
    [32760, 1024]
    >>> token_counts(catalog.load("wan2.1-t2v-1.3b"), None, "cpu", 16)
    [16]
    """
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
    if args.model not in catalog.names():
        raise CalibrateError(f"--model {args.model!r} is not in the catalog; accepted: {catalog.names()}")
    full = catalog.load(args.model)
    backend = resolve_backend(args.backend)
    if args.tokens is not None:
        token_counts(full, args.tokens, backend, 0)  # a bad --tokens fails before the outputs
    # the outputs once the inputs are read, before the sizing probe and the runs
    out = check_output(args.out, args.force, example="profile.json")
    save_dir = check_output_dir(args.save_runs, args.force) if args.save_runs else None
    set_threads(backend, args.threads)
    scale = args.scale if args.scale is not None else (1.0 if backend == "cuda" else None)
    size = choose_size(full, backend, scale=scale, layers=args.layers)
    counts = token_counts(full, args.tokens, backend, size.tokens)
    print(f"calibrating on {backend}: {args.model} at {size.describe().split(',')[0]}, "
          f"tokens {counts}, tiers {list(TIERS)}", flush=True)
    device = "cuda" if backend == "cuda" else "cpu"
    model = synthetic.build(full, scale=size.scale, layers=size.layers, device="cpu")
    spec = synthetic.spec_of(model)
    host = HostMemory.probe()
    runs = []
    for n in counts:
        inputs = synthetic.example_inputs(model, tokens=n, text_tokens=size.text_tokens, device=device)
        for tier in TIERS:
            p = plan(spec, tier=tier, prefetch=1, host=host)
            r = profile(model, lambda x=inputs: model(**x), p, steps=args.steps, warmup=args.warmup,
                        backend=backend, label=f"{tier} p1, {n} tokens ({backend}, measured)")
            r.meta["tokens"] = int(n)
            runs.append(r)
            print(f"  {r.label}: {r.step_time * 1e3:.2f} ms/step", flush=True)
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
        for k, r in enumerate(runs):
            r.save(save_dir / f"calibrate-{k:02d}.zip")
    prof = calibrate(runs, name=args.name or f"calibrated-{backend}", tokens=counts[0])
    prof.provenance["short_run"] = {"model": args.model, "scale": size.scale, "layers": size.layers,
                                    "full_layers": {g.name: g.num_layers for g in full.groups},
                                    "tokens": counts, "text_tokens": size.text_tokens}
    prof.to_json(out)
    print(f"wrote {out.resolve()}: {prof!r}")
    if size.scale == 1.0:
        # full width: the catalog model's own shapes, simulated on the fitted profile
        p = plan(full, tier="pinned", prefetch=1, host=HostMemory(available="4TiB"))
        sim = simulate(p, prof, steps=2, tokens=counts[0])
        print(f"predicted full {args.model} ({sum(g.num_layers for g in full.groups)} layers), all pinned p1, "
              f"{counts[0]} tokens: {sim.step_time:.3f} s/step (simulated)")
    return 0
