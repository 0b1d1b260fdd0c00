"""Held-out accuracy of the simulator on measured runs (e.g. a folder of saved GPU runs).

:func:`held_out` predicts, for every measured run, its median step from profiles that never
saw that run (``benchmarks/sim_accuracy.py --runs DIR`` prints it):

* ``loo``: calibrated on every other measured run in the folder (leave-one-out);
* ``tokens``: calibrated only on runs of the same model at other token counts (480p ⇄ 1k),
  per-layer compute carried to the run's tokens by the compute curve (one training token
  count fits a rate only, so this is a FLOPs ratio);
* ``model``: calibrated only on runs of the other model size (1.3B ⇄ 14B, at any token count),
  compute from that model's compute curve (``floor + FLOPs / rate`` per layer kind) applied to
  this model's FLOPs.

``calibrate`` fits runs of one model, so training runs are fitted per model: per-layer compute
comes from the run's own model when it is in the training set (at the run's tokens when some
training run has them), else the other model's compute curve; bandwidths are the medians over
the models that copied from that tier. A mapped rate no training run measured is taken at the
pageable rate (mapped pages reach the device through the same pageable staging path); a run
whose tier no training run copied from at all is ``n/a``. On the cpu backend a contention side
that no training run shows alone and overlapped takes a prior fitted on the training runs
(:func:`~offload_lab.simulation.calibration.contention_prior`), never :data:`CPU_PRIOR`, which
was fitted on the cpu fixtures and would let the held-out run into its own prediction. Only measured runs take part: observed
runs (backend ``observe``) did not have their copies driven by the manager, and simulated ones
would test the simulator against itself, so :func:`held_out` skips both with a warning naming
them (``table.attrs["skipped"]``).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pandas as pd

from offload_lab.simulation.calibration import calibrate, contention_prior, spec_of_run, tokens_of
from offload_lab.simulation.engine import simulate
from offload_lab.simulation.errors import ProfileError, SimError
from offload_lab.simulation.runs import plan_of_run

__all__ = ["held_out", "SCHEMES", "not_measured"]


def fit(train: list[Any], model: str, tokens: int | None) -> Any:
    """A profile for ``model`` at ``tokens`` from ``train`` runs only (see the module text)."""
    by_model: dict[Any, list] = {}
    for r in train:
        by_model.setdefault(r.meta.get("model"), []).append(r)
    profs = {}
    for m, rs in by_model.items():
        have = {tokens_of(r) for r in rs}
        # the GPU's block effects (copy beside, idle before) are the device's: every training run
        profs[m] = calibrate(rs, tokens=tokens if tokens in have else None, effects_from=train)
        if profs[m].compute_mode == "sync" and profs[m].provenance.get("contention") not in ("fitted", "given"):
            # a side without its contrast: its prior from the training runs, not CPU_PRIOR
            # (fitted on the cpu fixtures, so it would carry the held-out run into its own fit)
            prior, how = contention_prior(rs)
            profs[m] = calibrate(rs, tokens=tokens if tokens in have else None, effects_from=train, prior=prior)
            profs[m] = profs[m].replace(provenance={**profs[m].provenance, "prior": how})
    if model in profs:
        base = profs[model]
    else:
        # another model size: its compute curve over this model's FLOPs, no per-layer seconds
        # (the largest training set of another model)
        other = max(by_model, key=lambda m: len(by_model[m]))
        base = profs[other].replace(compute_s={}, tokens=None)
    bw = {}
    for tier in ("pinned", "pageable", "mapped_warm", "mapped_cold"):
        seen = [p.bandwidths[tier] for p in profs.values() if tier in p.bandwidths]
        if seen:
            bw[tier] = float(np.median(seen))
    if "mapped_warm" not in bw and "pageable" in bw:
        # no training run copied from a mapping: a mapped page reaches the device through the
        # driver's pageable staging path, so it is taken at the pageable rate
        bw["mapped_warm"] = bw["pageable"]
    flags = {f: any(getattr(p, f) for p in profs.values() if
                    (f == "pageable_blocks_host" and "pageable" in p.bandwidths)
                    or (f == "mapped_blocks_host" and "mapped_warm" in p.bandwidths))
             for f in ("pageable_blocks_host", "mapped_blocks_host")}
    if not any("mapped_warm" in p.bandwidths for p in profs.values()):
        flags["mapped_blocks_host"] = flags["pageable_blocks_host"]
    return base.replace(bandwidths={**bw, **base.bandwidths}, **flags)


def predict(run: Any, prof: Any) -> float:
    """The median step (s) ``prof`` predicts for the plan ``run`` was made under; NaN if a tier is missing."""
    # the run's own spec (real shapes, for the FLOPs model) when it carries one or is a catalog
    # model at full size; else the spec rebuilt from its layers
    spec = spec_of_run(run)
    _, plan = plan_of_run(run, spec=spec)
    warm = int(run.meta.get("warmup_dropped", 0) or 0)
    try:
        return simulate(plan, prof, steps=len(run.steps) + warm, warmup=warm,
                        tokens=tokens_of(run)).step_time
    except ProfileError:
        return math.nan  # no training run copied from a tier this run uses


SCHEMES = ("loo", "tokens", "model")


def not_measured(run: Any) -> str | None:
    """Why ``run`` cannot be a held-out target or training run (``None``: it is measured)."""
    if getattr(run, "simulated", False):
        return "simulated"
    if getattr(run, "backend", None) == "observe":
        return "observed"
    return None


def held_out(runs: dict[str, Any], schemes: tuple[str, ...] = SCHEMES) -> pd.DataFrame:
    """One row per run: measured and held-out predicted median step (ms) and the relative errors.

    Columns ``run, tokens, measured_ms`` then ``<scheme>_ms, <scheme>_err`` for the schemes
    ``loo``, ``tokens`` and ``model`` (or those in ``schemes``); NaN where a scheme has no
    training run. Simulated and observed runs are skipped (they neither train nor are
    predicted), with a warning; their names are in ``attrs["skipped"]``.

    >>> import offload_lab
    >>> runs = {r.label: r for r in offload_lab.shipped_runs("wan2.1-t2v-1.3b")[1:4]}
    >>> t = held_out(runs)
    >>> list(t.columns[:5]), len(t)
    (['run', 'tokens', 'measured_ms', 'loo_ms', 'loo_err'], 3)
    """
    if not isinstance(runs, dict) or not runs:
        raise SimError(f"held_out needs a non-empty dict of name -> Run, got {type(runs).__name__}")
    bad = [x for x in schemes if x not in SCHEMES]
    if bad or not schemes:
        raise SimError(f"held_out schemes {schemes!r}; accepted: a non-empty subset of {list(SCHEMES)}")
    skipped = [f"{n} ({why})" for n, r in runs.items() if (why := not_measured(r))]
    if skipped:
        runs = {n: r for n, r in runs.items() if not not_measured(r)}
        if not runs:
            raise SimError(f"held_out needs measured runs; every run given is simulated or observed: {skipped}")
        warnings.warn(f"held_out skips runs the manager did not measure: {', '.join(skipped)}", stacklevel=2)
    rows = []
    for name, run in runs.items():
        model, tok = run.meta.get("model"), tokens_of(run)
        others = [r for n, r in runs.items() if n != name]
        train_sets = {
            "loo": others,
            "tokens": [r for r in others if r.meta.get("model") == model and tokens_of(r) != tok],
            "model": [r for r in others if r.meta.get("model") != model],
        }
        row = {"run": name, "tokens": tok, "measured_ms": run.step_time * 1e3}
        for scheme, train in train_sets.items():
            if scheme not in schemes:
                continue
            got = predict(run, fit(train, model, tok)) if train else math.nan
            row[f"{scheme}_ms"] = got * 1e3
            row[f"{scheme}_err"] = got / run.step_time - 1
        rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["skipped"] = skipped
    return table
