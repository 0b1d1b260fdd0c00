"""Figures of a multi-rank run: each rank's step time (the straggler marked) and copy bandwidth.

The timeline of a multi-rank run draws one band of lanes per rank
(:func:`offload_lab.views.figures.timeline`); these two add the per-rank summaries. Pure
functions of the frames, like every figure.

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> plan = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="256GiB"))
>>> run = offload_lab.simulate(plan, "h200", steps=2, ranks_per_node=4)
>>> list(rank_steps(run).data[0].y)
['rank 0', 'rank 1', 'rank 2', 'rank 3']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from offload_lab.analysis.ranks import rank_table
from offload_lab.record.run import Run
from offload_lab.views.figure_kit import (
    STALL_COLOR,
    check_run,
    empty_figure,
    fill_pattern,
    make_figure,
    make_title,
    sim_tag,
    tier_color,
    title_label,
)
from offload_lab.views.text import fmt_seconds, time_unit

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["rank_steps", "rank_bandwidth"]

_BAR = "#0e7490"


def rank_steps(run: Run) -> go.Figure:
    """Median step time per rank (whiskers: its slowest step); the straggler, which sets the
    node's step, is red and named in the title."""
    run = check_run(run)
    t = rank_table(run)
    names = [f"rank {k}" for k in t["rank"]]
    strag = t.loc[t["straggler"], "rank"]
    who = f"straggler: rank {int(strag.iloc[0])}" if len(strag) and len(t) > 1 else "one rank"
    title = make_title(f"Step time per rank · {title_label(run)}{sim_tag(run.simulated)}",
                   f"median step per rank · {who} (the slowest rank sets the step)")
    if not t["step_s"].notna().any():
        return empty_figure(title, f"run {run.label!r} has no measured steps", 220)
    scale, unit = time_unit(float(t["step_s"].max()))
    step = t["step_s"].to_numpy(dtype="float64")
    worst = t["slowest_step_s"].to_numpy(dtype="float64")
    colors = [STALL_COLOR if s else _BAR for s in t["straggler"]]
    trace = dict(
        type="bar", orientation="h", y=names, x=np.round(step * scale, 9), name="median step",
        marker=dict(color=colors, line=dict(width=0), pattern=fill_pattern("/" if run.simulated else "")),
        error_x=dict(type="data", symmetric=False, array=np.round((worst - step) * scale, 9), arrayminus=[0] * len(t),
                     color="#555", thickness=1),
        text=[fmt_seconds(s) + ("  (+" + fmt_seconds(b) + ")" if b > 0 else "")
              for s, b in zip(step, t["behind_s"].fillna(0.0))],
        textposition="outside", cliponaxis=False,
        hovertemplate="<b>%{y}</b><br>median step %{text}<extra></extra>")
    return make_figure([trace], title, int(min(130 + 30 * len(t), 700)),
                   xaxis=dict(title_text=f"median step ({unit})", rangemode="tozero",
                              range=[0, float(np.nanmax(worst)) * scale * 1.25]),
                   yaxis=dict(type="category", categoryorder="array", categoryarray=names[::-1]),
                   showlegend=False)


def rank_bandwidth(run: Run) -> go.Figure:
    """Copy bandwidth per rank and tier (bytes over copy time): ranks that share a host memory
    bus slow each other's pageable copies, while each pinned copy has its own link."""
    run = check_run(run)
    t = rank_table(run)
    names = [f"rank {k}" for k in t["rank"]]
    title = make_title(f"Copy bandwidth per rank · {title_label(run)}{sim_tag(run.simulated)}",
                   "effective GB/s = bytes / copy time (1 GB = 1e9 B)")
    traces = []
    for tier, col in (("pinned", "pinned_gbps"), ("pageable", "pageable_gbps")):
        if t[col].notna().any():
            traces.append(dict(type="bar", orientation="h", y=names, x=t[col].round(4), name=tier,
                               text=[f"{g:.3g}" if g == g else "" for g in t[col]], textposition="outside",
                               cliponaxis=False, marker=dict(color=tier_color(tier), line=dict(width=0)),
                               hovertemplate=f"<b>%{{y}}</b> · {tier}<br>%{{x:.3g}} GB/s<extra></extra>"))
    if not traces:
        return empty_figure(title, "no timed pinned or pageable copies in this run", 220)
    top = float(np.nanmax(t[["pinned_gbps", "pageable_gbps"]].to_numpy(dtype="float64")))
    return make_figure(traces, title, int(min(150 + 14 * len(traces) * len(t) + 22 * len(t), 800)),
                   xaxis=dict(title_text="GB/s", rangemode="tozero", range=[0, top * 1.2]),
                   yaxis=dict(type="category", categoryorder="array", categoryarray=names[::-1]),
                   barmode="group", bargap=0.25)
