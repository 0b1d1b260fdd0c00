"""Runs side by side: one row per run, and ratios only between runs that can be compared.

A ratio of step times says something only when the runs did the same work the same way: the
same model (name and, where known, size — a scaled-down CPU model is another model), the same
token count and the same backend on the same device (a simulation is not a measurement, and a
prediction on one device profile is not divided by one on another). Each run's ratio is to
the first earlier run it is comparable with; a run with no comparable partner gets no ratio
and a note saying why.

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
>>> run = offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)
>>> list(compare([run]).columns)[:6]
['label', 'backend', 'simulated', 'tiers', 'step_s', 'ratio']
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from offload_lab.analysis.summary import as_runs, metrics
from offload_lab.record.run import Run, display_label

COMPARE_COLUMNS = ["label", "backend", "simulated", "tiers", "step_s", "ratio", "stall_s",
                   "exposed_copy_s", "overlap", "bound_s", "vs_bound", "ratio_to", "ratio_note",
                   "spread", "noisy"]
_DTYPES = {"label": "string", "backend": "string", "simulated": "bool", "tiers": "string",
           "step_s": "float64", "ratio": "float64", "stall_s": "float64", "exposed_copy_s": "float64",
           "overlap": "float64", "bound_s": "float64", "vs_bound": "float64", "ratio_to": "string",
           "ratio_note": "string", "spread": "float64", "noisy": "bool"}

__all__ = ["COMPARE_COLUMNS", "compare", "why_not_comparable", "why_not_paired", "device_of"]


def _tokens(meta: dict[str, Any]) -> Any:
    # simulations record tokens at the top of meta (and the count a default resolved to);
    # GPU check runs under their own settings
    sim = bool(meta.get("simulated"))
    if meta.get("tokens") is not None:
        t = meta["tokens"]
        # a resolution name ("480p") reads as the count it resolved to
        return meta.get("tokens_used") or t if sim and isinstance(t, str) else t
    if sim and meta.get("tokens_used") is not None:
        return meta["tokens_used"]
    gc = meta.get("gpu_check")
    return gc.get("tokens") if isinstance(gc, dict) else None


def device_of(run: Run) -> str:
    """The device a run's step time belongs to: the one it was measured on, or for a simulated
    run the device of the measured runs behind its profile (``"<profile> (no measured run)"``
    for a profile without any).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> p = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> device_of(offload_lab.simulate(p, "h200", steps=1)), device_of(offload_lab.simulate(p, "rtx4090-pcie4", steps=1))
    ('NVIDIA H200', 'rtx4090-pcie4 (no measured run)')
    """
    if not run.simulated:
        return str(run.meta.get("device_name") or run.backend)
    prof = run.meta.get("profile") if isinstance(run.meta.get("profile"), dict) else {}
    reg = prof.get("regimes") if isinstance(prof.get("regimes"), dict) else {}
    if reg.get("device_name"):
        return str(reg["device_name"])
    return f"{prof.get('name') or run.meta.get('device_name') or 'simulated'} (no measured run)"


def _backend(run: Run) -> str:
    # measured runs are comparable when measured on the same device, whichever recorder took them
    # (the manager's cuda backend, or the observer watching another offload system on that GPU)
    if run.simulated:
        return "simulated"
    return f"measured on {run.meta.get('device_name') or run.backend}"


def why_not_comparable(a: Run, b: Run) -> str | None:
    """Why the step times of ``a`` and ``b`` must not be divided (None when they may be).

    Comparable runs share the model (name, and size where both know it), the token count, and
    the backend: both simulated on the same device profile, or both measured on the same device.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> why_not_comparable(offload_lab.simulate(plan, "h200", steps=1, tokens=1024),
    ...                    offload_lab.simulate(plan, "h200", steps=1, tokens=4096))
    'tokens 1024 vs 4096'
    """
    pairs = (("model", a.meta.get("model"), b.meta.get("model")),
             ("tokens", _tokens(a.meta), _tokens(b.meta)),
             ("backend", _backend(a), _backend(b)),
             # two predictions are of one device only when their profiles are the same one
             ("device", _sim_device(a), _sim_device(b)))
    for what, x, y in pairs:
        if x != y:
            return f"{what} {'unknown' if x is None else x} vs {'unknown' if y is None else y}"
    x, y = a.meta.get("model_bytes"), b.meta.get("model_bytes")
    if x is not None and y is not None and x != y:
        return f"model size {x} B vs {y} B (a scaled model)"
    return None


def _sim_device(run: Run) -> str | None:
    prof = run.meta.get("profile")
    return (str(prof.get("name")) if isinstance(prof, dict) and prof.get("name") else str(run.meta.get("device_name"))) \
        if run.simulated else None


def why_not_paired(sim: Run, measured: Run) -> str | None:
    """Why a prediction must not be set against a measurement as "predicted vs measured" (None
    when it may): they need the same device (the profile's measured device), model, token count,
    issue order and plan (each layer's tier, prefetch).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> p = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> meas = offload_lab.shipped_runs("wan2.1-t2v-14b")[0]
    >>> why_not_paired(offload_lab.simulate(p, "h200", steps=2), meas) is None
    True
    >>> why_not_paired(offload_lab.simulate(p, "rtx4090-pcie4", steps=2), meas)
    'device rtx4090-pcie4 (no measured run) vs NVIDIA H200'
    """
    from offload_lab.simulation.evidence import issue_of, run_regime

    checks = (("device", device_of(sim), device_of(measured)),
              ("model", sim.meta.get("model"), measured.meta.get("model")),
              ("tokens", _tokens(sim.meta), _tokens(measured.meta)))
    for what, x, y in checks:
        if x != y:
            return f"{what} {'unknown' if x is None else x} vs {'unknown' if y is None else y}"
    # the order matters only where a copy blocks the host or is staged (a pinned plan runs alike)
    if run_regime(sim)["issue"] != "any" and issue_of(sim) != issue_of(measured):
        return f"issue order {issue_of(sim)} vs {issue_of(measured)}"
    la, lb = sim.layers, measured.layers
    if len(la) != len(lb) or list(la["tier"].astype(str)) != list(lb["tier"].astype(str)):
        return "another plan (the layers' tiers differ)"
    if sim.meta.get("prefetch") != measured.meta.get("prefetch"):
        return f"prefetch {sim.meta.get('prefetch')} vs {measured.meta.get('prefetch')}"
    return None


def _ratios(runs: list[Run], step_s: list[float]) -> tuple[list[float], list[str | None], list[str]]:
    """Per run: ratio to its reference, the reference's label, and a note where there is none."""
    ratio, ref, note = [], [], []
    for i, r in enumerate(runs):
        j = next((k for k in range(i + 1) if why_not_comparable(runs[k], r) is None), i)
        partners = j < i or any(why_not_comparable(r, o) is None for o in runs[i + 1:])
        base = step_s[j]
        if (partners or len(runs) == 1) and base and math.isfinite(base):
            ratio.append(step_s[i] / base)
            ref.append(display_label(runs[j]))
            note.append("")
        else:
            ratio.append(float("nan"))
            ref.append(None)
            if partners or len(runs) == 1:
                # comparable, but the reference has no step time to divide by (no steps)
                note.append(f"no ratio: {runs[j].label} has no measured step time")
                continue
            why = why_not_comparable(runs[0], r) if i else why_not_comparable(r, runs[1])
            note.append("no ratio: no other run of the same model, tokens and backend on the same device"
                        + (f" ({why})" if why else ""))
    return ratio, ref, note


RANK_MODES = ("all", "max")


def _expand_ranks(runs: list[Run], ranks: str) -> list[Run]:
    """A multi-rank run as its ranks' runs plus the node's (``"all"``) or the node's alone (``"max"``)."""
    from offload_lab.analysis.ranks import is_multi_rank, slowest_rank_run, split_ranks

    if ranks not in RANK_MODES:
        raise ValueError(f"ranks {ranks!r} is not one of {list(RANK_MODES)}")
    out = []
    for r in runs:
        if not is_multi_rank(r):
            out.append(r)
            continue
        if ranks == "all":
            out += list(split_ranks(r).values())
        out.append(slowest_rank_run(r))
    return out


def compare(runs: Run | Iterable[Run] | Mapping[str, Run], ranks: str = "all") -> pd.DataFrame:
    """One row per run: ``label, backend, simulated, tiers, step_s, ratio``, then ``stall_s,
    exposed_copy_s, overlap`` (medians per step), ``bound_s, vs_bound``, ``ratio_to`` (the label
    of the run the ratio is to), ``ratio_note`` (why a ratio is blank), ``spread`` (slowest /
    fastest step) and ``noisy`` (see :func:`offload_lab.analysis.summary.is_noisy`).

    ``ratio`` is the step time over that of the first run of the same model, token count and
    backend (see :func:`why_not_comparable`); NaN where no other run is comparable.

    A multi-rank run gives one row per rank (``"<label> · rank k"``) and then the node's row
    (``"<label> · max over ranks"``: each step as long as its slowest rank's); ``ranks="max"``
    keeps only the node's row, one row per run given.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> host = offload_lab.HostMemory(available="256GiB")
    >>> prof = offload_lab.DeviceProfile.load("h200")
    >>> runs = [offload_lab.simulate(offload_lab.plan(spec, tier=t, host=host), prof, steps=2, label=t)
    ...         for t in ("pinned", "pageable")]
    >>> df = compare(runs)
    >>> list(df["label"]), float(df["ratio"].iloc[0])
    (['pinned (simulated)', 'pageable (simulated)'], 1.0)
    """
    runs = _expand_ranks(as_runs(runs), ranks)
    keep = ("label", "backend", "simulated", "tiers", "step_s", "stall_s", "exposed_copy_s", "overlap",
            "bound_s", "vs_bound", "spread", "noisy")
    df = pd.DataFrame([{k: m[k] for k in keep} for m in map(metrics, runs)])
    df["ratio"], df["ratio_to"], df["ratio_note"] = _ratios(runs, df["step_s"].tolist())
    return df[COMPARE_COLUMNS].astype(_DTYPES)
