"""Pinned vs pageable, told once: what a GPU measured, what the simulator reads, what was reported.

Offload-lab's runtime has two issue orders for copies that block the host thread (pageable,
mapped, staged). In ``before-compute`` order (what other runtimes do, and what every shipped
H200 run measured) a pageable copy is issued before its layer's compute and holds the host, so
nothing overlaps; in ``after-compute`` order (offload-lab's default) the copy is issued after
the compute was queued, and the simulator predicts it hides almost like a pinned one: a
prediction no GPU has confirmed yet. :func:`story_frame` lays the three sources side by side
(one row per source, model, token count and tier) and :func:`pinned_vs_pageable` draws them in
one figure, the step times another layerwise-offload runtime reported on Wan2.1 (1.03 s pinned,
1.90 s pageable) as a group of their own; :func:`story_runs` makes both from the shipped runs.

Ratios are only ever taken between rows of one source, model and token count (one device).

>>> REPORTED["pinned"], REPORTED["pageable"]
(1.03, 1.9)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from offload_lab.model import catalog
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.planner import plan as make_plan
from offload_lab.record.run import Run
from offload_lab.record.shipped import shipped_runs
from offload_lab.simulation.calibration import tokens_of
from offload_lab.simulation.evidence import both_orders, issue_of
from offload_lab.views.figure_kit import (
    SIM_PATTERN,
    VizError,
    esc,
    fill_pattern,
    make_figure,
    make_title,
    tier_color,
)
from offload_lab.views.text import fmt_seconds

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["REPORTED", "SOURCES", "story_frame", "story_runs", "pinned_vs_pageable"]

REPORTED: dict[str, Any] = {
    "pinned": 1.03, "pageable": 1.90, "model": "Wan2.1",
    "source": "reported by another layerwise-offload runtime (Wan2.1, its own GPU; not run here)",
}
"""Step times another layerwise-offload runtime reported for Wan2.1, every block pinned vs pageable."""

SOURCES = ("measured (before-compute)", "simulated before-compute", "simulated after-compute",
           "reported (another runtime)")
"""The bar groups of :func:`pinned_vs_pageable`, in the order drawn."""

_TIERS = ("pinned", "pageable")
_SHORT = {"wan2.1-t2v-14b": "14B-shaped", "wan2.1-t2v-1.3b": "1.3B-shaped"}


def _tier_of(run: Run) -> str | None:
    """``pinned`` / ``pageable`` when every streamed layer has that tier at prefetch 1, else None."""
    lay = run.layers
    if lay is None or lay.empty or "tier" not in lay:
        return None
    tiers = set(lay.loc[lay["tier"] != "resident", "tier"].astype(str))
    if len(tiers) != 1 or int(run.meta.get("prefetch") or 1) != 1:
        return None
    (t,) = tiers
    return t if t in _TIERS else None


def story_frame(measured_runs: Sequence[Run], simulated_runs: Sequence[Run] = ()) -> pd.DataFrame:
    """One row per source, model, token count and tier (all pinned or all pageable, prefetch 1).

    Columns ``source`` (one of :data:`SOURCES`), ``simulated``, ``model``, ``tokens``, ``device``,
    ``tier``, ``issue``, ``step_s``, ``status`` (the evidence of a simulated row: held-out /
    unconfirmed / derived; ``measured`` or ``reported`` otherwise), ``band`` and ``vs_pinned``
    (the row's step over the pinned row of the same source, model and token count; never across
    devices). Runs that are neither all pinned nor all pageable are left out; the reported pair is
    the last two rows. A simulated run's pinned plan is the same under either order, so it is
    listed under both simulated sources.
    """
    rows: list[dict[str, Any]] = []
    for r in list(measured_runs) + list(simulated_runs):
        if not isinstance(r, Run):
            raise VizError(f"story_frame takes offload_lab.Run objects; got {type(r).__name__}: {r!r:.60}")
        tier = _tier_of(r)
        if tier is None:
            continue
        ev = r.meta.get("evidence") if isinstance(r.meta.get("evidence"), dict) else {}
        base = {"model": str(r.meta.get("model") or ""), "tokens": tokens_of(r), "tier": tier,
                "device": str(r.meta.get("device_name") or r.meta.get("profile") or r.backend),
                "step_s": float(r.step_time), "simulated": bool(r.simulated)}
        if not r.simulated:
            rows.append({**base, "source": SOURCES[0], "issue": issue_of(r), "status": "measured", "band": None})
            continue
        issue = str(r.meta.get("issue") or "after-compute")
        status, band = ev.get("status"), ev.get("band")
        orders = ("before-compute", "after-compute") if tier == "pinned" else (issue,)
        for o in orders:
            rows.append({**base, "source": f"simulated {o}", "issue": o, "status": status, "band": band})
    if not rows:
        raise VizError("story_frame found no all-pinned or all-pageable run at prefetch 1 among the runs given")
    rows += [{"source": SOURCES[3], "simulated": False, "model": REPORTED["model"], "tokens": None,
              "device": "another runtime's GPU", "tier": t, "issue": None, "step_s": REPORTED[t],
              "status": "reported", "band": None} for t in _TIERS]
    df = pd.DataFrame(rows)
    df["tokens"] = df["tokens"].astype("Int64")
    df = df.drop_duplicates(subset=["source", "model", "tokens", "tier"], keep="first")
    key = df["source"] + "|" + df["model"] + "|" + df["tokens"].astype(str)
    pinned = df[df["tier"] == "pinned"].set_index(key[df["tier"] == "pinned"])["step_s"]
    df["vs_pinned"] = [s / pinned[k] if k in pinned.index else float("nan") for k, s in zip(key, df["step_s"])]
    order = {s: i for i, s in enumerate(SOURCES)}
    df = df.assign(_o=df["source"].map(order), _t=df["tier"].map({"pinned": 0, "pageable": 1}))
    df = df.sort_values(["_o", "model", "tokens", "_t"], kind="stable", na_position="last")
    cols = ["source", "simulated", "model", "tokens", "device", "tier", "issue", "step_s", "vs_pinned",
            "status", "band"]
    return df[cols].reset_index(drop=True)


def story_runs(device: str = "h200", tokens: int = 32760) -> tuple[list[Run], list[Run]]:
    """The shipped measured all-pinned and all-pageable runs at ``tokens``, and their plans
    simulated on ``device`` under both issue orders (:func:`~offload_lab.simulation.evidence.both_orders`)."""
    measured = [r for r in shipped_runs() if _tier_of(r) and tokens_of(r) == tokens
                and str(r.meta.get("model", "")) in _SHORT]
    host = HostMemory(available="1TiB")
    simulated: list[Run] = []
    for model in dict.fromkeys(str(r.meta["model"]) for r in measured):
        spec = catalog.load(model)
        for tier in _TIERS:
            simulated += both_orders(make_plan(spec, tier=tier, host=host), device, steps=2, tokens=tokens)
    return measured, simulated


def _bar_text(row: pd.Series) -> str:
    t = fmt_seconds(row["step_s"])
    if row["status"] == "unconfirmed":
        return f"{t} unconfirmed"
    if row["band"] is not None and row["band"] == row["band"]:
        return f"{t} ±{float(row['band']) * 100:.1f}%"
    return t


def pinned_vs_pageable(measured_runs: Sequence[Run], simulated_runs: Sequence[Run] = ()) -> go.Figure:
    """Grouped bars, all pinned vs all pageable, per source: measured (before-compute), simulated
    before-compute (with its held-out band), simulated after-compute (hatched, its pageable bar
    marked *unconfirmed*), and the pair another layerwise-offload runtime reported, as a group
    of its own. The x axis is model · token count, then tier; bars of different devices never
    share a ratio. Built from :func:`story_frame`."""
    df = story_frame(measured_runs, simulated_runs)
    df = df.assign(group=[f"{esc(_SHORT.get(m, m))}<br>{int(t):,} tok" if pd.notna(t)
                          else f"{esc(m)}<br>reported" for m, t in zip(df["model"], df["tokens"])])
    traces: list[dict] = []
    for source in SOURCES:
        d = df[df["source"] == source]
        if d.empty:
            continue
        sim = source.startswith("simulated")
        after = source == "simulated after-compute"
        band = [float(b) * s if b is not None and b == b else 0.0 for b, s in zip(d["band"], d["step_s"])]
        marker: dict[str, Any] = {"color": [tier_color(t) for t in d["tier"]],
                                  "line": {"color": "#333" if source == SOURCES[3] else "rgba(0,0,0,0)",
                                           "width": 1}}
        if sim:
            marker["pattern"] = fill_pattern(SIM_PATTERN if not after else "x")
        if source == SOURCES[3]:
            marker["opacity"] = 0.55
        traces.append({
            "type": "bar", "name": esc(source) + (" — a prediction" if after else ""),
            "x": [list(d["group"]), list(d["tier"])], "y": list(d["step_s"]),
            # vertical labels: four bars a tier leave no room for horizontal ones at a readable size
            "text": [esc(_bar_text(r)) for _, r in d.iterrows()], "textposition": "outside",
            "textangle": -90, "textfont": {"size": 10}, "cliponaxis": False,
            "marker": marker, "offsetgroup": source,
            "error_y": {"type": "data", "array": band, "visible": bool(any(band)), "color": "#555"},
            "customdata": list(d["status"]),
            "hovertemplate": f"{esc(source)}<br>%{{x}}: %{{y:.3f}} s/step (%{{customdata}})<extra></extra>",
        })
    title = make_title(
        "Pinned vs pageable: measured, simulated both ways, reported",
        "measured: before-compute order (every shipped H200 run) · simulated before-compute: held-out band · "
        "simulated after-compute (offload-lab's default): unconfirmed, no GPU run of that order yet · "
        "reported: another layerwise-offload runtime, its own GPU (no ratio across devices)")
    top = float((df["step_s"] * (1 + df["band"].fillna(0).astype(float))).max())
    return make_figure(traces, title, height=480, barmode="group", uniformtext={"minsize": 9, "mode": "show"},
                       yaxis={"title": {"text": "seconds per step"}, "range": [0, top * 1.5]},
                       xaxis={"type": "multicategory"})
