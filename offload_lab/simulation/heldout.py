"""Held-out accuracy of the simulator on measured runs (e.g. a folder of saved GPU runs).

:func:`held_out` predicts, for every measured run, its median step from profiles that never
saw that run (``benchmarks/sim_accuracy.py --runs DIR`` prints it):

* ``loo``: calibrated on every other measured run in the folder (leave-one-out);
* ``tokens``: calibrated only on runs of the same model at other token counts (480p ⇄ 1k),
  compute scaled to the run's tokens by FLOPs;
* ``model``: calibrated only on runs of the other model size (1.3B ⇄ 14B) at the same token
  count, compute carried over as an achieved TFLOP/s rate.

``calibrate`` fits runs of one model at one token count, so training runs are fitted per
(model, tokens) group: compute comes from the group of the run's own model and tokens when
there is one (per-layer seconds), else from the nearest group as a FLOP rate; bandwidths come
from every group that copied from that tier. A run whose tier no training run copied from is
``n/a``. Pass measured runs only: observed runs (backend ``observe``) did not have their copies
driven by the manager, and simulated ones would test the simulator against itself.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from offload_lab.simulation.errors import SimError

__all__ = ["held_out"]


def tokens_of(run: Any) -> int | None:
    """The video token count a run used (its meta's ``tokens``, or the GPU check's), else None."""
    t = run.meta.get("tokens") or (run.meta.get("gpu_check") or {}).get("tokens")
    return int(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 else None


def _rate(prof: Any, model: str, tokens: int) -> float:
    """Achieved TFLOP/s of a profile's per-layer compute on its own model and tokens."""
    from offload_lab import catalog, flops

    spec = catalog.load(model)
    fl = sum(flops.layer_flops(spec, g.name, tokens, layer=i) for g in spec.groups for i in range(g.num_layers))
    secs = sum(prof.compute_s.values())
    return fl / secs / 1e12


def fit(train: list[Any], model: str, tokens: int | None) -> Any:
    """A profile for ``model`` at ``tokens`` from ``train`` runs only (see the module text)."""
    from offload_lab import calibrate

    groups: dict[tuple, list] = {}
    for r in train:
        groups.setdefault((r.meta.get("model"), tokens_of(r)), []).append(r)
    profs = {k: calibrate(rs, tokens=k[1]) for k, rs in groups.items()}
    if (model, tokens) in profs:
        base = profs[(model, tokens)]
    else:
        # nearest: the same model at other tokens, else another model at the same tokens
        key = next((k for k in profs if k[0] == model), None) or \
            next((k for k in profs if k[1] == tokens), None) or next(iter(profs))
        base = profs[key]
        base = base.replace(compute_s={}, tflops=_rate(base, key[0], key[1]), tokens=None)
    bw = {}
    for tier in ("pinned", "pageable", "mapped_warm", "mapped_cold"):
        seen = [p.bandwidths[tier] for p in profs.values() if tier in p.bandwidths]
        if seen:
            bw[tier] = float(np.median(seen))
    flags = {f: any(getattr(p, f) for p in profs.values() if
                    (f == "pageable_blocks_host" and "pageable" in p.bandwidths)
                    or (f == "mapped_blocks_host" and "mapped_warm" in p.bandwidths))
             for f in ("pageable_blocks_host", "mapped_blocks_host")}
    return base.replace(bandwidths={**bw, **base.bandwidths}, **flags)


def predict(run: Any, prof: Any) -> float:
    from offload_lab import catalog, simulate
    from offload_lab.simulation import ProfileError, plan_of_run

    # the catalog's spec (real shapes, for the FLOPs model) when the run is of the full model;
    # a scaled model (the CPU fixtures) keeps the spec rebuilt from its own layers
    model = run.meta.get("model")
    spec = catalog.load(model) if model in catalog.names() else None
    if spec is not None and sum(g.num_layers for g in spec.groups) != len(run.layers):
        spec = None
    _, plan = plan_of_run(run, spec=spec)
    warm = int(run.meta.get("warmup_dropped", 0) or 0)
    try:
        return simulate(plan, prof, steps=len(run.steps) + warm, warmup=warm,
                        tokens=tokens_of(run)).step_time
    except ProfileError:
        return math.nan  # no training run copied from a tier this run uses


def held_out(runs: dict[str, Any]) -> pd.DataFrame:
    """One row per run: measured and held-out predicted median step (ms) and the relative errors.

    Columns ``run, tokens, measured_ms`` then ``<scheme>_ms, <scheme>_err`` for the schemes
    ``loo``, ``tokens`` and ``model``; NaN where a scheme has no training run.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> host = offload_lab.HostMemory(available="64GiB")
    >>> runs = {f"{t} p{p}": offload_lab.simulate(offload_lab.plan(spec, tier=t, prefetch=p, host=host),
    ...                                           "h200", steps=3)
    ...         for t, p in (("pinned", 1), ("pinned", 0), ("pageable", 1))}
    >>> t = held_out(runs)
    >>> list(t.columns[:5])
    ['run', 'tokens', 'measured_ms', 'loo_ms', 'loo_err']
    """
    if not isinstance(runs, dict) or not runs:
        raise SimError(f"held_out needs a non-empty dict of name -> Run, got {type(runs).__name__}")
    rows = []
    for name, run in runs.items():
        model, tok = run.meta.get("model"), tokens_of(run)
        others = [r for n, r in runs.items() if n != name]
        schemes = {
            "loo": others,
            "tokens": [r for r in others if r.meta.get("model") == model and tokens_of(r) != tok],
            "model": [r for r in others if r.meta.get("model") != model and tokens_of(r) == tok],
        }
        row = {"run": name, "tokens": tok, "measured_ms": run.step_time * 1e3}
        for scheme, train in schemes.items():
            got = predict(run, fit(train, model, tok)) if train else math.nan
            row[f"{scheme}_ms"] = got * 1e3
            row[f"{scheme}_err"] = got / run.step_time - 1
        rows.append(row)
    return pd.DataFrame(rows)
