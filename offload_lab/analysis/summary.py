"""Pure pandas transforms of one :class:`~offload_lab.record.run.Run`: tiers, bandwidth, bound, metrics.

Nothing here imports plotly: figures and the report read these results. Comparing runs with
each other is :mod:`offload_lab.analysis.comparison`.

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
>>> run = offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)
>>> list(offload_lab.compare([run]).columns)[:6]
['label', 'backend', 'simulated', 'tiers', 'step_s', 'ratio']
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from offload_lab.checks import check_number
from offload_lab.errors import OffloadLabError
from offload_lab.record.run import TIERS, Run, display_label

BANDWIDTH_COLUMNS = ["tier", "copies", "bytes", "copy_s", "gbps", "best_gbps"]
_COPY_TIERS = ("pinned", "staged", "pageable", "mapped", "resident", "unknown")


class AnalysisError(OffloadLabError, ValueError):
    """Input that the analysis functions cannot read (not a Run, a bad bandwidth, ...)."""


# -- input checking ---------------------------------------------------------------------------
def as_runs(runs: Run | Iterable[Run] | Mapping[str, Run], what: str = "runs") -> list[Run]:
    """Accept one Run, a sequence of Runs, or a ``{label: Run}`` mapping; return a list.

    >>> as_runs([])
    Traceback (most recent call last):
    ...
    offload_lab.analysis.summary.AnalysisError: runs [] is empty; expected at least one offload_lab.Run
    """
    if isinstance(runs, Run):
        return [runs]
    if isinstance(runs, Mapping):
        runs = list(runs.values())
    if isinstance(runs, (str, bytes)) or not isinstance(runs, Iterable):
        raise AnalysisError(f"{what} {runs!r} is not a Run or a list of Runs; "
                            f"expected an offload_lab.Run or a list of them")
    out = list(runs)
    if not out:
        raise AnalysisError(f"{what} {out!r} is empty; expected at least one offload_lab.Run")
    for i, r in enumerate(out):
        if not isinstance(r, Run):
            raise AnalysisError(f"{what}[{i}] is {type(r).__name__} {r!r:.80}; "
                                f"expected an offload_lab.Run (from profile(), simulate() or Run.load())")
    return out


def _check_run(run: Any) -> Run:
    if not isinstance(run, Run):
        raise AnalysisError(f"run {run!r:.80} of type {type(run).__name__} is not an offload_lab.Run; "
                            f"expected the result of profile(), simulate() or Run.load()")
    return run


def _median(s: pd.Series) -> float:
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.median()) if len(s) else float("nan")


# -- small summaries --------------------------------------------------------------------------
def tier_counts(layers: pd.DataFrame) -> dict[str, int]:
    """Layers per tier, in the canonical tier order (resident, pinned, pageable, mapped, ...).

    >>> import pandas as pd
    >>> tier_counts(pd.DataFrame({"tier": ["pinned", "pageable", "pinned"]}))
    {'pinned': 2, 'pageable': 1}
    """
    if "tier" not in layers or not len(layers):
        return {}
    counts = layers["tier"].astype("string").fillna("unknown").value_counts()
    order = [t for t in TIERS if t in counts.index] + sorted(t for t in counts.index if t not in TIERS)
    return {str(t): int(counts[t]) for t in order}


def tier_summary(layers: pd.DataFrame) -> str:
    """``"20 pinned, 10 pageable"`` — how a run's or plan's layers are placed.

    >>> import pandas as pd
    >>> tier_summary(pd.DataFrame({"tier": ["pinned"] * 20 + ["pageable"] * 10}))
    '20 pinned, 10 pageable'
    """
    counts = tier_counts(layers)
    return ", ".join(f"{n} {t}" for t, n in counts.items()) if counts else "no layers"


def dominant_tier(layers: pd.DataFrame) -> str:
    """The tier most streamed layers use (``resident`` when nothing is streamed).

    >>> import pandas as pd
    >>> dominant_tier(pd.DataFrame({"tier": ["resident", "pageable", "pageable"], "streamed": [False, True, True]}))
    'pageable'
    """
    if "tier" not in layers or not len(layers):
        return "unknown"
    streamed = layers[layers["streamed"].astype("boolean").fillna(False)] if "streamed" in layers else layers
    pool = streamed if len(streamed) else layers
    counts = tier_counts(pool)
    return max(counts, key=counts.get) if counts else "unknown"


def bandwidth_by_tier(run: Run) -> pd.DataFrame:
    """Effective copy bandwidth per tier from the run's ``copy`` rows.

    ``gbps`` = Σ bytes / Σ copy seconds (1 GB = 1e9 bytes); ``best_gbps`` = the highest per-layer
    median (``Run.layers.gbps``) of that tier — steadier than the fastest single copy.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> run = offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)
    >>> list(bandwidth_by_tier(run)["tier"])
    ['pinned']
    """
    run = _check_run(run)
    ev = run.events
    # plain numpy: a pandas groupby over Arrow strings costs ~50 ms here, and reports call this often
    kind = ev["kind"].to_numpy(dtype=object)
    dur = ev["dur_s"].to_numpy(dtype="float64")
    keep = (kind == "copy") & (dur > 0)
    tiers = ev["tier"].astype("string").fillna("unknown").to_numpy(dtype=object)[keep]
    nbytes, dur = ev["bytes"].to_numpy(dtype="float64")[keep], dur[keep]
    lay_tier = run.layers["tier"].astype("string").fillna("unknown").to_numpy(dtype=object)
    lay_gbps = pd.to_numeric(run.layers["gbps"], errors="coerce").to_numpy(dtype="float64")
    present = set(tiers)
    rows = []
    for tier in [t for t in _COPY_TIERS if t in present] + sorted(present - set(_COPY_TIERS)):
        m = tiers == tier
        total_b, total_s = float(nbytes[m].sum()), float(dur[m].sum())
        gbps = total_b / total_s / 1e9
        best = lay_gbps[(lay_tier == tier) & np.isfinite(lay_gbps)]
        rows.append({"tier": str(tier), "copies": int(m.sum()), "bytes": int(total_b), "copy_s": total_s,
                     "gbps": gbps, "best_gbps": float(best.max()) if len(best) else gbps})
    return pd.DataFrame(rows, columns=BANDWIDTH_COLUMNS).astype(
        {"tier": "string", "copies": "int64", "bytes": "int64", "copy_s": "float64",
         "gbps": "float64", "best_gbps": "float64"})


def _profile_bandwidth(meta: dict[str, Any]) -> float | None:
    """Pinned GB/s of a simulated run's device profile (``meta["profile"]`` is its ``to_dict()``)."""
    prof = meta.get("profile")
    bws = prof.get("bandwidths") if isinstance(prof, dict) else None
    v = bws.get("pinned") if isinstance(bws, dict) else None
    if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
        return float(v)
    return None


def _link_bandwidth(run: Run, bandwidth: float | None,
                    bw: pd.DataFrame | None = None) -> tuple[float | None, str]:
    if bandwidth is not None:
        return check_number("bandwidth", bandwidth, above=0, error=AnalysisError,
                            accepted="a positive number of GB/s (1 GB = 1e9 bytes), e.g. 50.0"), "given"
    bw = (bandwidth_by_tier(run) if bw is None else bw).set_index("tier")
    if "pinned" in bw.index:
        return float(bw.loc["pinned", "best_gbps"]), "best measured pinned"
    prof = _profile_bandwidth(run.meta)
    if prof is not None:
        return prof, "device profile (pinned)"
    if len(bw):
        # No pinned copies: the best tier seen is still a lower bound on what the link can do.
        best = bw["best_gbps"].idxmax()
        return float(bw.loc[best, "best_gbps"]), f"best measured {best}"
    return None, "none"


# -- public API -------------------------------------------------------------------------------
def bound(run: Run, bandwidth: float | None = None) -> dict[str, Any]:
    """The fastest a step could be: ``max(Σ compute, Σ streamed bytes / bandwidth)`` per step.

    ``bandwidth`` is in GB/s; by default the best measured pinned bandwidth of the run, else the
    simulator profile's pinned bandwidth, else the best tier seen. Medians over measured steps.
    Returns ``bandwidth_gbps, bandwidth_source, compute_s, streamed_bytes, copy_s, bound_s,
    limit ('compute' | 'copy'), step_s, vs_bound`` (measured / bound, ≥ 1 unless the clock lies).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="256GiB"))
    >>> run = offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)
    >>> b = bound(run, bandwidth=50.0)
    >>> b["limit"] in ("compute", "copy"), b["vs_bound"] >= 1.0
    (True, True)
    """
    return _bound(_check_run(run), bandwidth, None)


def _bound(run: Run, bandwidth: float | None, tiers: pd.DataFrame | None) -> dict[str, Any]:
    bw, source = _link_bandwidth(run, bandwidth, tiers)
    steps = run.steps
    if not len(steps):
        nan = float("nan")
        return {"bandwidth_gbps": bw if bw is not None else nan, "bandwidth_source": source,
                "compute_s": nan, "streamed_bytes": 0, "copy_s": nan, "bound_s": nan,
                "limit": "unknown", "step_s": nan, "vs_bound": nan}
    compute = pd.to_numeric(steps["compute_s"], errors="coerce").fillna(0.0)
    moved = pd.to_numeric(steps["bytes_moved"], errors="coerce").fillna(0).astype("float64")
    if bw is None:
        if (moved > 0).any():
            n_copies = int((run.events["kind"] == "copy").sum())
            raise AnalysisError(f"run {run.label!r} cannot be bounded: its steps moved "
                                f"{int(moved.max()):,} bytes but it holds {n_copies} copy row(s) and none "
                                f"with a positive duration to time the link by, and no device profile "
                                f"to read a bandwidth from")
        copy_t = moved * 0.0
    else:
        copy_t = moved / (bw * 1e9)
    per_step = pd.concat([compute, copy_t], axis=1).max(axis=1)
    bound_s = float(per_step.median())
    step_s = run.step_time
    comp_med, copy_med = float(compute.median()), float(copy_t.median())
    return {
        "bandwidth_gbps": bw if bw is not None else float("nan"),
        "bandwidth_source": source,
        "compute_s": comp_med,
        "streamed_bytes": int(moved.median()),
        "copy_s": copy_med,
        "bound_s": bound_s,
        "limit": "copy" if copy_med > comp_med else "compute",
        "step_s": step_s,
        "vs_bound": step_s / bound_s if bound_s > 0 else float("nan"),
    }


def metrics(run: Run, bandwidth: float | None = None) -> dict[str, Any]:
    """Headline numbers of one run (medians over measured steps, seconds and GB/s).

    Keys: ``label, backend, simulated, steps, step_s, compute_s, copy_s, stall_s,
    exposed_copy_s, overlap, bytes_moved, gbps`` (``{tier: effective GB/s}`` from copy rows),
    ``bound`` (see :func:`bound`), ``bound_s``, ``vs_bound``, ``spread`` (slowest / fastest
    step) and ``noisy`` (see :func:`is_noisy`).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> m = metrics(offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2))
    >>> sorted(m["gbps"]), m["simulated"]
    (['pinned'], True)
    """
    run = _check_run(run)
    s = run.steps
    bw = bandwidth_by_tier(run)
    b = _bound(run, bandwidth, bw)
    return {
        "label": display_label(run),  # what tables show: a simulated run says so
        "backend": run.backend,
        "simulated": run.simulated,
        "steps": int(len(s)),
        "step_s": run.step_time,
        "compute_s": _median(s["compute_s"]),
        "copy_s": _median(s["copy_s"]),
        "stall_s": _median(s["stall_s"]),
        "exposed_copy_s": _median(s["exposed_copy_s"]),
        "overlap": _median(s["overlap"]),
        "bytes_moved": int(_median(s["bytes_moved"])) if len(s) else 0,
        "gbps": {str(r.tier): float(r.gbps) for r in bw.itertuples(index=False)},
        "tiers": tier_summary(run.layers),
        "bound": b,
        "bound_s": b["bound_s"],
        "vs_bound": b["vs_bound"],
        "spread": step_spread(run),
        "noisy": is_noisy(run),
    }


# -- noise ------------------------------------------------------------------------------------
NOISY_SPREAD = 1.5
"""A measured run is noisy when its slowest measured step took more than this many times its fastest."""


def step_spread(run: Run) -> float:
    """Slowest measured step / fastest (``wall_s``); NaN with fewer than two timed steps.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> round(step_spread(offload_lab.simulate(plan, "h200", steps=3)), 2)
    1.0
    """
    wall = pd.to_numeric(_check_run(run).steps["wall_s"], errors="coerce").to_numpy(dtype="float64")
    wall = wall[np.isfinite(wall) & (wall > 0)]
    return float(wall.max() / wall.min()) if len(wall) >= 2 else float("nan")


def is_noisy(run: Run, limit: float = NOISY_SPREAD) -> bool:
    """Whether a measured run's step times disagree too much to trust its median.

    The rule: a run that is not simulated, with at least two measured steps, whose slowest step
    took more than ``limit`` (1.5) times its fastest. A busy machine (other processes on the same
    cores) is the usual cause; simulated runs are never noisy.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> is_noisy(offload_lab.simulate(plan, "h200", steps=3))
    False
    """
    check_number("noise limit", limit, above=1, error=AnalysisError, accepted="a ratio above 1, e.g. 1.5")
    run = _check_run(run)
    spread = step_spread(run)
    return bool(not run.simulated and math.isfinite(spread) and spread > limit)
