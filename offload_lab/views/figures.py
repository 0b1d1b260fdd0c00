"""Plotly figures: each a pure function of Run / Plan frames.

Every figure marks simulated runs as such (title, bar label and a hatched pattern), and every
figure uses one colour per tier (:data:`TIER_COLORS`). Bars are drawn as a few traces with many
bars each (one per tier × kind), never one trace per bar, so a 50-layer × 5-step timeline stays
small and fast in a browser.

Strings that come from users (labels, group names, reasons) are HTML-escaped before they reach a
figure: plotly.js renders a subset of HTML in text, so ``<b>`` or ``<a href=...>`` in a label
would otherwise be interpreted; escaped, plotly.js decodes them back and shows them as text.

>>> import offload_lab
>>> from offload_lab import figures
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
>>> run = offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)
>>> fig = figures.timeline(run)
>>> "SIMULATED" in fig.layout.title.text
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from offload_lab.analysis import summary as analysis
from offload_lab.analysis.comparison import compare
from offload_lab.analysis.summary import as_runs
from offload_lab.record.run import Run
from offload_lab.units import format_bytes
from offload_lab.views.tables import comparison_frame  # noqa: F401  (re-exported: older imports)
from offload_lab.views.text import (
    fmt_percent,
    fmt_ratio,
    fmt_seconds,
    time_unit,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go

from offload_lab.checks import is_int
from offload_lab.views.figure_kit import (
    HOST_BLOCK_COLOR,
    MEMORY_COLORS,
    RUN_COLORS,
    SIM_PATTERN,
    STAGE_COLOR,
    STALL_COLOR,
    TIER_COLORS,
    VizError,
    byte_unit,
    check_run,
    device_label,
    empty_figure,
    esc,
    fill_pattern,
    is_plan,
    make_figure,
    make_title,
    rate_gbps,
    run_name,
    run_names,
    short_label,
    sim_tag,
    tier_color,
    title_label,
    unique_names,
)


# -- timeline ---------------------------------------------------------------------------------
def _lanes(ev: pd.DataFrame) -> tuple[pd.Series, list[str]]:
    """Lane name per event and the lane order (top to bottom): compute, copy (per group), host."""
    comp = ev[ev["kind"] == "compute"]
    groups = list(dict.fromkeys(comp.sort_values("start_s")["group"].astype(str)))
    groups += [g for g in dict.fromkeys(ev["group"].astype(str)) if g not in groups]
    multi = len(groups) > 1
    stream = ev["stream"].astype(str)
    group = ev["group"].astype(str).map(esc)
    lane = stream.where(~stream.isin(["compute", "copy"]) | (not multi), stream + " · " + group)
    order = []
    for s in ("compute", "copy"):
        order += [f"{s} · {esc(g)}" for g in groups] if multi else [s]
    order += ["host_copy", "host"]
    present = set(lane)
    order = [n for n in order if n in present] + sorted(present - set(order))
    ranks = sorted(set(ev["rank"].tolist())) if "rank" in ev.columns else [0]
    if len(ranks) > 1:  # one band of lanes per rank, rank 0 on top
        lane = "rank " + ev["rank"].astype(str) + " · " + lane
        order = [f"rank {r} · {n}" for r in ranks for n in order]
        order = [n for n in order if n in set(lane)]
    return lane, order


def _step_ranges(ev: pd.DataFrame) -> dict[int, tuple[float, float]]:
    """Each step's window: from its first interval (the prefetched copy that feeds it, which
    may start in the previous step) to its last compute-stream interval."""
    comp = ev[ev["stream"] == "compute"]
    ends = (comp if len(comp) else ev).groupby("step")["end_s"].max()
    starts = ev.groupby("step")["start_s"].min()
    return {int(k): (float(starts[k]), float(ends[k])) for k in ends.index}


def _step_selector(ranges: dict[int, tuple[float, float]], t0: float, t1: float, scale: float,
                   zoom: bool) -> tuple[list[float], list[dict], list[dict]]:
    """The timeline's x range, step separators and a dropdown zooming to one step (or all)."""
    def rng(a: float, b: float) -> list[float]:
        pad = max((b - a) * 0.02, 1e-9)
        return [(a - pad) * scale, (b + pad) * scale]

    if not zoom or len(ranges) < 2:
        return rng(t0, t1), [], []
    # the selector zooms (relayout of the x range): the data is in the figure once
    shapes = [dict(type="line", x0=a * scale, x1=a * scale, yref="paper", y0=0, y1=1,
                   line=dict(color="#999", width=1, dash="dot")) for a, _b in ranges.values()]
    buttons = [dict(label=f"step {s}", method="relayout", args=[{"xaxis.range": rng(*r)}])
               for s, r in sorted(ranges.items())]
    buttons.append(dict(label="all steps", method="relayout", args=[{"xaxis.range": rng(t0, t1)}]))
    menus = [dict(type="dropdown", buttons=buttons, active=0, direction="down", showactive=True,
                  x=1.0, xanchor="right", y=1.0, yanchor="bottom", pad={"t": 0, "b": 6},
                  font={"size": 11})]
    return rng(*ranges[min(ranges)]), shapes, menus


def _call_shading(ev: pd.DataFrame, scale: float) -> list[dict]:
    """One shaded band per call within a step (odd calls darker), behind the bars.

    Several calls per step come from classifier-free guidance: the model runs twice.
    """
    comp = ev[ev["stream"] == "compute"]
    spans = comp.groupby(["step", "call"]).agg(a=("start_s", "min"), b=("end_s", "max"))
    return [dict(type="rect", xref="x", yref="paper", x0=a * scale, x1=b * scale, y0=0, y1=1,
                 layer="below", line=dict(width=0),
                 fillcolor="rgba(90,90,140,0.10)" if call % 2 else "rgba(90,90,140,0.03)",
                 label=dict(text=f"call {call}", textposition="top left", font=dict(size=9)))
            for (st, call), a, b in zip(spans.index, spans["a"], spans["b"])]


def timeline(run: Run, step: int | None = None) -> go.Figure:
    """Per-layer intervals on one lane per stream (and per group where there are several; per
    rank, in bands, for a multi-rank run).

    Copy and compute bars are coloured by tier; stalls (``wait``) are red, host-blocked intervals
    (pageable/mapped staging) dark and hatched. Hover shows group, layer, tier, bytes, duration and
    GB/s. With several steps a dropdown zooms to one step (or all); ``step=`` draws only that step.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="256GiB"))
    >>> run = offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)
    >>> sorted({t.name for t in timeline(run).data})[:2]
    ['compute · pageable', 'copy · pageable']
    """
    run = check_run(run)
    ev = run.events
    steps_measured = sorted({int(s) for s in run.steps["step"]}) if len(run.steps) else sorted(set(ev["step"]))
    ranks = sorted(set(run.layers["rank"].tolist()))
    lay = run.layers[run.layers["rank"] == ranks[0]] if len(ranks) > 1 else run.layers
    if step is not None:
        if not is_int(step) or int(step) not in steps_measured:
            raise VizError(f"step {step!r} was not measured in run {run.label!r}; "
                           f"accepted: one of {steps_measured} or None for all steps")
        ev = ev[ev["step"] == int(step)]
    sub = (f"{esc(analysis.tier_summary(lay))} · median step {fmt_seconds(run.step_time)} · "
           f"{len(steps_measured)} step(s)" + (f" · {len(ranks)} ranks" if len(ranks) > 1 else "")
           + f" · {device_label(run)}")
    title = make_title(f"Timeline · {title_label(run)}{sim_tag(run.simulated)}", sub)
    if not len(ev):
        return empty_figure(title, f"run {run.label!r} recorded no events", 220)

    ev = ev.reset_index(drop=True)
    lane, order = _lanes(ev)
    lane = lane.to_numpy(dtype=object)
    # the axis reads in ms (or µs) when steps are short: no ticks like 0.002 s
    ranges = _step_ranges(ev)
    scale, unit = time_unit(max((b - a for a, b in ranges.values()), default=float("nan")))
    start = ev["start_s"].to_numpy(dtype="float64")
    dur = ev["dur_s"].to_numpy(dtype="float64")
    nbytes = ev["bytes"].to_numpy(dtype="float64")
    gb = rate_gbps(nbytes, dur)
    tiers = ev["tier"].astype("string").fillna("unknown").astype(str)
    custom = np.column_stack([
        ev["group"].astype(str).map(esc).to_numpy(),
        ev["layer"].to_numpy(),
        tiers.to_numpy(),
        [format_bytes(b) if b > 0 else "-" for b in nbytes],
        [fmt_seconds(d) for d in dur],
        [f"{g:.1f} GB/s" if math.isfinite(g) else "-" for g in gb],
        ev["step"].to_numpy(),
        ev["call"].to_numpy(),
    ]).astype(object)
    multi_call = bool(len(ev) and int(ev["call"].max()) > 0)
    at = " · step %{customdata[6]}" + (" · call %{customdata[7]}" if multi_call else "")
    hover = ("<b>%{customdata[0]}.%{customdata[1]}</b> · %{customdata[2]}" + at +
             "<br>%{customdata[4]}, %{customdata[3]}, %{customdata[5]}<extra>%{fullData.name}</extra>")
    kind = ev["kind"].astype(str)
    traces: list[dict] = []

    def add(mask: np.ndarray, name: str, color: str, legendgroup: str, **marker: Any) -> None:
        idx = np.flatnonzero(mask)
        if len(idx):
            # one horizontal bar per interval: base = start, length = duration (µs-rounded
            # seconds keep the JSON short without moving a bar by a visible amount)
            traces.append(dict(
                type="bar", orientation="h", y=lane[idx], x=np.round(dur[idx] * scale, 9),
                base=np.round(start[idx] * scale, 9), customdata=custom[idx], hovertemplate=hover, name=name,
                legendgroup=legendgroup, width=0.72,
                marker=dict(color=color, line=dict(width=0), **marker)))

    present = set(tiers)
    for k in ("compute", "copy"):
        for tier in [t for t in TIER_COLORS if t in present] + sorted(present - set(TIER_COLORS)):
            extra = {"opacity": 0.55} if k == "compute" else {}
            add(((kind == k) & (tiers == tier)).to_numpy(), f"{k} · {esc(tier)}", tier_color(tier), tier, **extra)
    add((kind == "wait").to_numpy(), "stall (waiting for weights)", STALL_COLOR, "wait")
    # named by what blocked the host in this run: a pageable copy, a mapped read, a staging copy
    blocked = (kind == "host_block").to_numpy()
    for tier in dict.fromkeys(tiers[blocked]):
        add(blocked & (tiers == tier).to_numpy(), host_block_name(tier), HOST_BLOCK_COLOR, "host_block",
            pattern=fill_pattern("/", size=6))
    add((kind == "stage").to_numpy(), "host memcpy into a staging buffer", STAGE_COLOR, "stage")

    xrange, shapes, menus = _step_selector(ranges, float(start.min()), float(ev["end_s"].max()),
                                           scale, step is None)
    shapes = _call_shading(ev, scale) + shapes if multi_call else shapes
    return make_figure(
        # at least ~200 px of plot however few lanes: a legend and axis title below take their share
        traces, title, int(min(max(400, 200 + 44 * len(order)), 560 if not order[0].startswith("rank ") else 1200)),
        xaxis=dict(title_text=f"time ({unit} from run start)", range=xrange, zeroline=False),
        yaxis=dict(type="category", categoryorder="array", categoryarray=order[::-1], showgrid=False),
        barmode="overlay", bargap=0.2, shapes=shapes, updatemenus=menus)


def host_block_name(tier: str) -> str:
    """The legend entry of host-blocked intervals of a tier: what kept the host thread busy.

    >>> host_block_name("mapped"), host_block_name("staged")
    ('host blocked by a mapped read', 'host blocked by a staging copy')
    """
    what = {"pageable": "a pageable copy", "mapped": "a mapped read", "staged": "a staging copy"}
    return f"host blocked by {what.get(str(tier), esc(f'a {tier} copy'))}"


# -- tier map ---------------------------------------------------------------------------------
def tier_map(plan_or_run: Any) -> go.Figure:
    """Per layer: tier colour, bytes (bar height), pin rank (bar text), the plan's reason on hover.

    Accepts a Plan (with reasons) or a Run (its ``layers`` frame; reasons come only from a plan).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, pin_budget="8GiB", host=offload_lab.HostMemory(available="64GiB"))
    >>> sorted(t.name for t in tier_map(plan).data)
    ['pageable', 'pinned']
    """
    if isinstance(plan_or_run, Run):
        layers, sim = plan_or_run.layers, plan_or_run.simulated
        group_order = _group_order(plan_or_run)
        name = title_label(plan_or_run, 48)
        sub = f"{esc(analysis.tier_summary(layers))} · run on {device_label(plan_or_run)}"
    elif is_plan(plan_or_run):
        layers, sim = plan_or_run.layers, False
        spec = getattr(plan_or_run, "spec", None)
        group_order = list(getattr(spec, "group_names", None) or [])
        name = "plan of " + short_label(getattr(spec, "name", "a model"), 40)
        led = getattr(plan_or_run, "ledger", {}) or {}
        sub = (f"{esc(analysis.tier_summary(layers))} · pinned {format_bytes(led.get('pinned_bytes'))} "
               f"of budget {format_bytes(led.get('budget'))}")
    else:
        raise VizError(f"tier_map() got {type(plan_or_run).__name__} {plan_or_run!r:.80}; "
                       f"expected an offload_lab.Plan or an offload_lab.Run")
    title = make_title(f"Tier map · {name}{sim_tag(sim)}", sub)
    if not len(layers):
        return empty_figure(title, "no layers")
    lay = _ordered_layers(layers, group_order)
    groups = list(dict.fromkeys(lay["group"].astype(str)))
    multi = len(groups) > 1
    tiers = lay["tier"].astype("string").fillna("unknown").astype(str)
    rank = lay["pin_rank"] if "pin_rank" in lay else pd.Series([pd.NA] * len(lay))
    rank_s = [("" if pd.isna(r) else str(int(r))) for r in rank]
    # a resident layer's rank says nothing (it never streams): only pinned layers are labelled
    label = [r if t == "pinned" else "" for r, t in zip(rank_s, tiers)]
    reason = (lay["reason"].astype("string").fillna("").map(esc) if "reason" in lay
              else pd.Series(["(reasons are in the plan)"] * len(lay)))
    streamed = lay["streamed"].astype("boolean").fillna(False) if "streamed" in lay else tiers != "resident"
    custom = np.column_stack([
        lay["group"].astype(str).map(esc), lay["layer"], tiers,
        [format_bytes(b) for b in lay["bytes"]], [r or "-" for r in rank_s],
        np.where(streamed, "streamed", "kept on device"), reason,
    ]).astype(object)
    hover = ("<b>%{customdata[0]}.%{customdata[1]}</b> · %{customdata[2]} (%{customdata[5]})"
             "<br>%{customdata[3]} · pin rank %{customdata[4]}<br>%{customdata[6]}<extra></extra>")
    # one x position per layer in execution order; groups are labelled spans, so several groups
    # never interleave (a category axis shared by per-tier traces would reorder them)
    pos = np.arange(len(lay))
    div, unit = byte_unit(float(lay["bytes"].max()))
    size = lay["bytes"].to_numpy(dtype="float64") / div
    traces = []
    many = len(lay) > 16
    for tier in [t for t in TIER_COLORS if t in set(tiers)] + sorted(set(tiers) - set(TIER_COLORS)):
        idx = np.flatnonzero((tiers == tier).to_numpy())
        traces.append(dict(
            type="bar", x=pos[idx], y=size[idx], name=esc(tier),
            marker=dict(color=tier_color(tier), line=dict(width=0)),
            # above the bar, upright for many layers: every rank shows however narrow the bar
            text=[label[i] for i in idx], textposition="outside", constraintext="none",
            textangle=-90 if many else 0, cliponaxis=False,
            textfont=dict(color="#333", size=9 if many else 10), customdata=custom[idx], hovertemplate=hover))
    step = max(1, int(math.ceil(len(lay) / 30)))
    ticks = pos[::step]
    shapes, notes = _group_marks(lay, groups) if multi else ([], [])
    fig = make_figure(
        traces, title, 380,
        xaxis=dict(tickvals=ticks, ticktext=[str(v) for v in lay["layer"].to_numpy()[::step]],
                   range=[-0.6, len(lay) - 0.4], showgrid=False,
                   title_text=("layer index per group" if multi else f"{esc(groups[0])} layer index")
                   + (" · text above a bar = pin rank" if any(label) else "")),
        # room above the tallest bar for its rank
        yaxis=dict(title_text=f"{unit} per layer", range=[0, float(np.nanmax(size)) * (1.22 if many else 1.12)]),
        barmode="overlay", bargap=0.15, shapes=shapes, annotations=notes)
    # room above the plot for the staggered group names
    return fig.update_layout(margin_t=fig.layout.margin.t + 34) if len(groups) > 3 else fig


def _group_marks(lay: pd.DataFrame, groups: list[str]) -> tuple[list[dict], list[dict]]:
    """Dashed lines between groups and each group's name above its span (tier map)."""
    shapes, notes = [], []
    g = lay["group"].astype(str).to_numpy()
    # many groups (a whole pipeline) have narrow spans: their names alternate over three rows so
    # neighbours do not print over each other
    rows = 3 if len(groups) > 3 else 1
    for k, name in enumerate(groups):
        where = np.flatnonzero(g == name)
        lo, hi = int(where.min()), int(where.max())
        # a short first group (H3's 2-layer refiner) is labelled from its left edge, so the
        # label stays inside the plot instead of spilling past the y axis
        # label stays inside the plot instead of spilling past the y axis; a last one of many
        # ends at the right edge, for the same reason
        first, last = lo == 0, hi == len(g) - 1 and len(groups) > 3
        notes.append(dict(x=lo - 0.5 if first else hi + 0.5 if last else (lo + hi) / 2,
                          xanchor="left" if first else "right" if last else "center",
                          y=1.0, xref="x", yref="paper", yanchor="bottom", yshift=14 * (k % rows),
                          text=f"<b>{esc(name)}</b>", showarrow=False, font={"size": 11 if rows == 1 else 10}))
        if lo > 0:
            shapes.append(dict(type="line", x0=lo - 0.5, x1=lo - 0.5, yref="paper", y0=0, y1=1.06,
                               line=dict(color="#666", width=1, dash="dash")))
    return shapes, notes


def _group_order(run: Run) -> list[str]:
    """Groups in execution order: the order their first compute happened (declared order)."""
    comp = run.events[run.events["kind"] == "compute"]
    if not len(comp):
        return []
    first = comp.groupby("group", observed=True)["start_s"].min().sort_values()
    return [str(g) for g in first.index]


def _ordered_layers(layers: pd.DataFrame, group_order: list[str]) -> pd.DataFrame:
    lay = layers.reset_index(drop=True)
    seen = list(dict.fromkeys(lay["group"].astype(str)))
    order = [g for g in group_order if g in seen] + [g for g in seen if g not in group_order]
    rank = {g: i for i, g in enumerate(order)}
    key = lay["group"].astype(str).map(rank)
    return lay.assign(_g=key).sort_values(["_g", "layer"], kind="stable").drop(columns="_g").reset_index(drop=True)


# -- memory -----------------------------------------------------------------------------------
def memory(run: Run) -> go.Figure:
    """Device, pinned, anonymous and mapped bytes over the run (GiB, step-wise lines).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> fig = memory(offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=1))
    >>> "SIMULATED" in fig.layout.title.text
    True
    """
    run = check_run(run)
    mem = run.memory.sort_values("t_s")
    title = make_title(f"Memory · {title_label(run, 48)}{sim_tag(run.simulated)}",
                   f"{len(mem)} samples · {device_label(run)}")
    if not len(mem):
        return empty_figure(title, f"run {run.label!r} recorded no memory samples", 220)
    names = {"device_bytes": "device", "pinned_bytes": "pinned host",
             "anon_bytes": "anonymous host", "mapped_bytes": "mapped (file pages)"}
    t = mem["t_s"].to_numpy(dtype="float64")
    div, unit = byte_unit(float(mem[list(names)].to_numpy().max()))
    tk, tunit = time_unit(float(t.max()) if len(t) else float("nan"))
    traces = [dict(
        type="scatter", x=np.round(t * tk, 9), y=np.round(mem[col].to_numpy(dtype="float64") / div, 6),
        name=label, mode="lines", line_shape="hv", line=dict(color=MEMORY_COLORS[col], width=2),
        hovertemplate=f"{label}: %{{y:.4g}} {unit} at %{{x:.4g}} {tunit}<extra></extra>")
        for col, label in names.items()]
    return make_figure(traces, title, 380, xaxis=dict(title_text=f"time ({tunit} from run start)"),
                   yaxis=dict(title_text=unit, rangemode="tozero"))


# -- comparisons across runs ------------------------------------------------------------------
def step_times(runs: Run | Sequence[Run]) -> go.Figure:
    """Median step time per run, annotated with the ratio to the first comparable run.

    Bars take the colour of the run's main streamed tier; simulated runs are hatched and labelled
    ``(simulated)``; whiskers span the fastest and slowest measured step. Bar labels show what
    tells runs apart; what all labels share is in the title. Ratios are only between runs of the
    same model, token count and backend (:func:`offload_lab.analysis.comparison.compare`).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> host, prof = offload_lab.HostMemory(available="256GiB"), offload_lab.DeviceProfile.load("h200")
    >>> runs = [offload_lab.simulate(offload_lab.plan(spec, tier=t, host=host), prof, steps=2, label=t)
    ...         for t in ("pinned", "pageable")]
    >>> list(step_times(runs).data[0].y)
    ['pinned (simulated)', 'pageable (simulated)']
    """
    runs = as_runs(runs)
    cmp = compare(runs, ranks="max")
    # horizontal bars: long run labels read left of the bars instead of as rotated ticks
    common, names = run_names(runs)
    full = [run_name(r) for r in runs]
    st = cmp["step_s"].to_numpy(dtype="float64")
    lo = np.array([float(r.steps["wall_s"].min()) if len(r.steps) else np.nan for r in runs])
    hi = np.array([float(r.steps["wall_s"].max()) if len(r.steps) else np.nan for r in runs])
    k, unit = time_unit(np.nanmax(hi) if np.isfinite(hi).any() else np.nanmax(st) if np.isfinite(st).any() else 1.0)
    text = [f"{fmt_seconds(s)} · {fmt_ratio(q)}" if math.isfinite(q) else fmt_seconds(s)
            for s, q in zip(st, cmp["ratio"])]
    colors = [tier_color(analysis.dominant_tier(r.layers)) for r in runs]
    patterns = [SIM_PATTERN if r.simulated else "" for r in runs]
    versus = [f"{fmt_ratio(q)} of {esc(to)}" if math.isfinite(q) else esc(note)
              for q, to, note in zip(cmp["ratio"], cmp["ratio_to"].fillna(""), cmp["ratio_note"].fillna(""))]
    custom = np.column_stack([full, cmp["tiers"].map(esc), cmp["backend"].map(esc), versus,
                              ["simulated" if s else "measured" for s in cmp["simulated"]],
                              [fmt_seconds(x) for x in st]]).astype(object)
    bar = dict(
        type="bar", orientation="h", y=names, x=st * k, text=text, textposition="outside", cliponaxis=False,
        marker=dict(color=colors, pattern=fill_pattern(patterns),
                    line=dict(width=0)),
        error_x=dict(type="data", symmetric=False, array=np.nan_to_num(hi - st) * k,
                     arrayminus=np.nan_to_num(st - lo) * k, color="#666", thickness=1, width=3),
        customdata=custom, name="median step",
        hovertemplate=("<b>%{customdata[0]}</b><br>%{customdata[5]} per step (%{customdata[3]})"
                       "<br>%{customdata[1]}<br>%{customdata[2]} · %{customdata[4]}<extra></extra>"))
    sims = sum(r.simulated for r in runs)
    note = f"hatched = simulated ({sims} of {len(runs)})" if sims else "all measured"
    noisy = int(cmp["noisy"].sum())
    if noisy:
        note += f" · {noisy} noisy (slowest step > {analysis.NOISY_SPREAD:g}× fastest)"
    xaxis: dict[str, Any] = dict(title_text=f"{unit} per step", rangemode="tozero")
    if np.isfinite(st).any():
        # room on the right for the "1.03 s · ×1.00" labels
        xaxis["range"] = [0, float(np.nanmax(np.concatenate([st, hi]))) * k * 1.35]
    head = "Step time" + (f" · {short_label(common, 70)}" if common else "")
    return make_figure(
        [bar], make_title(head, "median per step · whiskers: fastest..slowest step · ratio to the first run "
                            f"of the same model, tokens and backend · {note}"),
        # at least ~200 px of plot for a few runs: the x title and subtitle take their share
        max(380, 130 + 40 * len(runs) + 14 * sum(n.count("<br>") for n in names)), xaxis=xaxis,
        yaxis=dict(type="category", categoryorder="array", categoryarray=names[::-1]),
        showlegend=False, bargap=0.3)


def bandwidth(runs: Run | Sequence[Run]) -> go.Figure:
    """Effective copy bandwidth per tier (Σ bytes / Σ copy time of the copy rows), per run.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> fig = bandwidth([offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=1)])
    >>> [t.name for t in fig.data]
    ['pinned']
    """
    runs = as_runs(runs)
    common, names = run_names(runs)
    per = []
    for name, r in zip(names, runs):
        bw = analysis.bandwidth_by_tier(r)
        bw["run"] = name
        bw["full"] = run_name(r)
        bw["simulated"] = r.simulated
        per.append(bw)
    df = pd.concat(per, ignore_index=True)
    sims = sum(r.simulated for r in runs)
    title = make_title("Copy bandwidth per tier" + (f" · {short_label(common, 70)}" if common else ""),
                   "effective GB/s = bytes / copy time (1 GB = 1e9 B)"
                   + (f" · hatched = simulated ({sims} of {len(runs)})" if sims else ""))
    if not len(df):
        return empty_figure(title, "no timed copies in these runs (everything resident?)", 260)
    present = set(df["tier"].astype(str))
    tiers = [t for t in TIER_COLORS if t in present] + sorted(present - set(TIER_COLORS))
    traces = []
    for tier in tiers:
        d = df[df["tier"] == tier]
        traces.append(dict(
            type="bar", orientation="h", y=list(d["run"]), x=d["gbps"].round(4), name=esc(tier),
            text=[f"{g:.3g}" for g in d["gbps"]], textposition="outside", cliponaxis=False,
            marker=dict(color=tier_color(tier), line=dict(width=0),
                        pattern=fill_pattern([SIM_PATTERN if s else "" for s in d["simulated"]])),
            customdata=np.column_stack([d["full"], d["copies"], [format_bytes(b) for b in d["bytes"]],
                                        [fmt_seconds(s) for s in d["copy_s"]]]).astype(object),
            hovertemplate=(f"<b>%{{customdata[0]}}</b> · {esc(tier)}<br>%{{x:.3g}} GB/s<br>"
                           "%{customdata[1]} copies, %{customdata[2]} in %{customdata[3]}<extra></extra>")))
    xaxis: dict[str, Any] = dict(title_text="GB/s", rangemode="tozero")
    if df["gbps"].notna().any():
        xaxis["range"] = [0, float(df["gbps"].max()) * 1.2]
    return make_figure(
        traces, title, max(400, 150 + len(runs) * (14 * len(tiers) + 22)), xaxis=xaxis,
        # every run keeps its row, even one without copies
        yaxis=dict(type="category", categoryorder="array", categoryarray=names[::-1]),
        barmode="group", bargap=0.25)


def startup_peaks(plan_or_runs: Any) -> go.Figure:
    """Startup device peak per init strategy: the plan's predictions and/or runs' measurements.

    Accepts a Plan, a Run, or a list mixing both. Plans give ``startup_peak("grouped")`` and
    ``startup_peak("naive")``; runs give ``meta["startup_peak_bytes"]`` for their
    ``meta["init_strategy"]``. One panel per scale, each with its own byte unit: the planner's
    predictions and runs on a GPU (or simulated on one) together, cpu-backend runs apart (there
    the number is the weights the cpu backend holds as its device, not GPU memory). One bar per
    plan prediction or run, coloured by strategy; a strategy nobody has a number for is not drawn.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("minimax-h3")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> [t.name for t in startup_peaks(plan).data]
    ['grouped', 'naive']
    """
    items = [plan_or_runs] if (isinstance(plan_or_runs, Run) or is_plan(plan_or_runs)) else plan_or_runs
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise VizError(f"startup_peaks() got {type(plan_or_runs).__name__} {plan_or_runs!r:.80}; "
                       f"expected a Plan, a Run, or a list of them")
    items = list(items)
    # bars: (panel, strategy, row label, bytes, simulated, hover note)
    bars: list[tuple[str, str, str, float, bool, str]] = []
    gpu, cpu = "gpu", "cpu"
    # a plan is drawn beside the runs of its own size: a plan of a model scaled down for the cpu
    # backend predicts MiB, and belongs with those runs, not on a GiB axis
    cpu_sizes = {int(it.layers["bytes"].sum()) for it in items
                 if isinstance(it, Run) and it.backend == "cpu" and not it.simulated and len(it.layers)}
    for i, it in enumerate(items):
        if is_plan(it):
            spec = getattr(it, "spec", None)
            name = f"plan of {short_label(getattr(spec, 'name', f'plan {i}'), 30)}"
            size = int(it.layers["bytes"].sum()) if len(it.layers) else -1
            where = cpu if size in cpu_sizes else gpu
            for s in ("grouped", "naive"):
                try:
                    y = float(it.startup_peak(s))
                except (AttributeError, ValueError, TypeError):
                    continue
                if math.isfinite(y):
                    bars.append((where, s, f"{name} · {s} (predicted)", y, False, "predicted by the planner"))
        elif isinstance(it, Run):
            peak, strat = it.meta.get("startup_peak_bytes"), it.meta.get("init_strategy")
            if peak is None or strat is None:
                continue
            pred = it.meta.get("predicted_startup_peak_bytes")
            note = ("simulated" if it.simulated else "measured") + (
                f" (planner predicted {format_bytes(pred)})" if isinstance(pred, (int, float)) and it.backend != "cpu" else "")
            bars.append((cpu if it.backend == "cpu" and not it.simulated else gpu, esc(strat),
                         f"{run_name(it, limit=30)} · {esc(strat)}", float(peak), it.simulated, note))
        else:
            raise VizError(f"startup_peaks() item {i} is {type(it).__name__} {it!r:.80}; "
                           f"expected an offload_lab.Plan or an offload_lab.Run")
    sim = any(b[4] for b in bars)
    title = make_title("Startup device peak per init strategy",
                       "grouped: every group's layers to host stores first, then the rest to the device once"
                       + (" · hatched = simulated" if sim else ""))
    if not bars:
        return empty_figure(title, "no startup peaks: pass a Plan or runs whose meta has startup_peak_bytes", 260)
    panels = [p for p in (gpu, cpu) if any(b[0] == p for b in bars)]
    rows = {p: unique_names([b[2] for b in bars if b[0] == p]) for p in panels}
    strategies = list(dict.fromkeys(b[1] for b in bars))
    colors = {s: RUN_COLORS[k % len(RUN_COLORS)] for k, s in enumerate(strategies)}
    gap_px = 84  # between panels: room for an x title and the next panel's name
    n_rows = sum(max(2, len(rows[p])) for p in panels)
    # bars of 26 px, taller when there are few: the plot area stays at least ~220 px
    row_px = max(26.0, (220 - gap_px * (len(panels) - 1)) / n_rows)
    plot_px = sum(max(2, len(rows[p])) * row_px for p in panels) + gap_px * (len(panels) - 1)
    traces, axes, notes, top = [], {}, [], 1.0
    for k, p in enumerate(panels):
        ax = "" if k == 0 else str(k + 1)
        part = [b for b in bars if b[0] == p]
        div, unit = byte_unit(max(b[3] for b in part))
        span = max(2, len(part)) * row_px / plot_px
        # bars about 24 px thick however tall the panel: a lone bar is not a slab
        width = min(0.75, 24 / (max(2, len(part)) * row_px / len(part)))
        axes[f"yaxis{ax}"] = dict(domain=[max(top - span, 0.0), top], anchor=f"x{ax}", type="category",
                                  categoryorder="array", categoryarray=rows[p][::-1], automargin=True)
        axes[f"xaxis{ax}"] = dict(anchor=f"y{ax}", rangemode="tozero", automargin=True,
                                  title=dict(text=f"{unit} at startup", standoff=4),
                                  range=[0, max(b[3] for b in part) / div * 1.3])
        kinds = [k for k, there in (("planner prediction", any("(predicted)" in r for r in rows[p])),
                                    ("GPU runs" if p == gpu else "cpu-backend runs (the weights it holds as "
                                     "its device, not GPU memory)", any("(predicted)" not in r for r in rows[p])))
                 if there]
        notes.append(dict(text=f"<b>{' and '.join(kinds)}</b>", xref="paper", yref="paper", x=0, y=top, xanchor="left",
                          yanchor="bottom", showarrow=False, font={"size": 11}))
        for s in strategies:
            idx = [j for j, b in enumerate(part) if b[1] == s]
            if not idx:
                continue
            traces.append(dict(
                type="bar", orientation="h", y=[rows[p][j] for j in idx], x=[part[j][3] / div for j in idx],
                name=s, legendgroup=s, showlegend=not any(t["name"] == s for t in traces),
                xaxis=f"x{ax}", yaxis=f"y{ax}", width=width, text=[format_bytes(part[j][3]) for j in idx],
                textposition="outside", cliponaxis=False, customdata=[part[j][5] for j in idx],
                marker=dict(color=colors[s], line=dict(width=0),
                            opacity=[0.55 if "(predicted)" in rows[p][j] else 1.0 for j in idx],
                            pattern=fill_pattern([SIM_PATTERN if part[j][4] else "" for j in idx])),
                hovertemplate=f"%{{y}}<br>%{{x:.4g}} {unit} · %{{customdata}}<extra></extra>"))
        top -= span + gap_px / plot_px
    height = int(plot_px) + 56 + 14 * 4 + 30 + 110
    fig = make_figure(traces, title, height, xaxis=axes.pop("xaxis"), yaxis=axes.pop("yaxis"),
                      barmode="overlay", showlegend=True, bargap=0.25, annotations=notes, **axes)
    # the first panel's name sits above the plot: room for it under the subtitle
    return fig.update_layout(margin_t=fig.layout.margin.t + 20)


# -- bytes: the host-memory ledger and bytes per tier ----------------------------------------
LEDGER_COLORS = {"reserve": "#9ca3af", "pinned": TIER_COLORS["pinned"], "pageable": TIER_COLORS["pageable"],
                 "staging": TIER_COLORS["staged"], "headroom": "#d1fae5", "over": STALL_COLOR}


def host_ledger(plan: Any) -> go.Figure:
    """A plan's host-memory ledger as two stacked bars: what the host has (reserve + spendable)
    and what the plan spends of it (pinned, pageable and other new anonymous bytes, staging
    buffers, the headroom left, or how far it is over).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("minimax-h3")
    >>> plan = offload_lab.plan(spec, pin_budget="8GiB", host=offload_lab.HostMemory(available="64GiB"))
    >>> [t.name for t in host_ledger(plan).data]
    ['reserve', 'spendable', 'pinned', 'pageable & other anonymous', 'headroom left']
    """
    if not is_plan(plan):
        raise VizError(f"host_ledger() got {type(plan).__name__} {plan!r:.80}; expected an offload_lab.Plan")
    led = getattr(plan, "ledger", None) or {}
    spec = getattr(plan, "spec", None)
    title = make_title(f"Host memory ledger · plan of {short_label(getattr(spec, 'name', 'a model'), 40)}",
                       f"available {format_bytes(led.get('available'))} · pin budget {format_bytes(led.get('budget'))}"
                       f" · {'fits' if led.get('fits', True) else 'does NOT fit'}")

    def num(key: str) -> float:
        v = led.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0

    if not any(num(k) for k in ("available", "spendable", "net_anonymous_bytes")):
        return empty_figure(title, "the plan has no host-memory ledger", 240)
    spend, net = num("spendable"), num("net_anonymous_bytes")
    pinned, staging = num("pinned_bytes"), num("staging_bytes")
    left = spend - net
    have, used = "host has", "plan spends"
    parts = [(have, "reserve", num("reserve"), "kept for the OS and everything else"),
             (have, "spendable", spend, "what the plan may spend"),
             (used, "pinned", pinned, "page-locked host copies"),
             (used, "pageable & other anonymous", max(net - pinned - staging, 0.0), "new anonymous host bytes"),
             (used, "staging", staging, "staging buffers"),
             (used, "headroom left" if left >= 0 else "over spendable", abs(left),
              "spendable − net new anonymous bytes")]
    div, unit = byte_unit(max(num("available"), spend + num("reserve"), net + num("reserve")))
    colors = {"spendable": "#e5e7eb", "pageable & other anonymous": LEDGER_COLORS["pageable"],
              "headroom left": LEDGER_COLORS["headroom"], "over spendable": LEDGER_COLORS["over"]}
    traces = []
    for row, name, v, why in parts:
        if v <= 0:
            continue
        traces.append(dict(
            type="bar", orientation="h", y=[row], x=[v / div], name=name,
            marker=dict(color=colors.get(name, LEDGER_COLORS.get(name, "#7f7f7f")), line=dict(width=1, color="white")),
            text=[format_bytes(v)], textposition="inside", insidetextanchor="middle", textangle=0,
            hovertemplate=f"{name}: {format_bytes(v)}<br>{why}<extra></extra>"))
    return make_figure(traces, title, 400, xaxis=dict(title_text=unit, rangemode="tozero"),
                       yaxis=dict(type="category", categoryorder="array", categoryarray=[used, have]),
                       barmode="stack", bargap=0.35, legend_traceorder="normal", uniformtext=dict(minsize=9, mode="hide"))


def tier_bytes(plans_or_runs: Any) -> go.Figure:
    """Bytes per tier at a glance: one stacked bar per plan or run (Σ layer bytes of each tier).

    Accepts a Plan, a Run, or a list mixing both; a multi-rank run shows its first rank's layers.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("minimax-h3")
    >>> plan = offload_lab.plan(spec, pin_budget="8GiB", host=offload_lab.HostMemory(available="64GiB"))
    >>> [t.name for t in tier_bytes(plan).data]
    ['pinned', 'pageable']
    """
    items = [plans_or_runs] if (isinstance(plans_or_runs, Run) or is_plan(plans_or_runs)) else plans_or_runs
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise VizError(f"tier_bytes() got {type(plans_or_runs).__name__} {plans_or_runs!r:.80}; "
                       f"expected a Plan, a Run, or a list of them")
    items = list(items)
    names, frames = [], []
    for i, it in enumerate(items):
        if isinstance(it, Run):
            lay = it.layers
            if "rank" in lay and lay["rank"].nunique() > 1:
                lay = lay[lay["rank"] == lay["rank"].min()]
            names.append(run_name(it, limit=30))
        elif is_plan(it):
            lay = it.layers
            names.append("plan of " + short_label(getattr(getattr(it, "spec", None), "name", f"plan {i}"), 30))
        else:
            raise VizError(f"tier_bytes() item {i} is {type(it).__name__} {it!r:.80}; "
                           f"expected an offload_lab.Plan or an offload_lab.Run")
        frames.append(lay.assign(tier=lay["tier"].astype("string").fillna("unknown").astype(str))
                      .groupby("tier")["bytes"].sum())
    names = unique_names(names)
    title = make_title("Bytes per tier", "Σ layer bytes in each tier · hatched = simulated"
                       if any(isinstance(it, Run) and it.simulated for it in items) else "Σ layer bytes in each tier")
    if not items or not any(len(f) for f in frames):
        return empty_figure(title, "no layers to count", 240)
    present = {t for f in frames for t in f.index}
    tiers = [t for t in TIER_COLORS if t in present] + sorted(present - set(TIER_COLORS))
    div, unit = byte_unit(max(float(f.sum()) for f in frames))
    sims = [isinstance(it, Run) and it.simulated for it in items]
    traces = []
    for tier in tiers:
        v = [float(f.get(tier, 0.0)) for f in frames]
        traces.append(dict(
            type="bar", orientation="h", y=names, x=[x / div for x in v], name=esc(tier),
            marker=dict(color=tier_color(tier), line=dict(width=1, color="white"),
                        pattern=fill_pattern([SIM_PATTERN if s else "" for s in sims])),
            text=[format_bytes(x) if x else "" for x in v], textposition="inside", insidetextanchor="middle", textangle=0,
            customdata=[format_bytes(x) for x in v],
            hovertemplate=f"%{{y}}<br>{esc(tier)}: %{{customdata}}<extra></extra>"))
    return make_figure(traces, title, max(400, 190 + 34 * len(items) + 14 * sum(n.count("<br>") for n in names)),
                       xaxis=dict(title_text=unit, rangemode="tozero"),
                       yaxis=dict(type="category", categoryorder="array", categoryarray=names[::-1]),
                       barmode="stack", bargap=0.3, legend_traceorder="normal", uniformtext=dict(minsize=9, mode="hide"))


__all__ = ["LEDGER_COLORS", "TIER_COLORS", "VizError", "bandwidth", "comparison_frame", "esc", "fmt_percent",
           "fmt_ratio", "fmt_seconds", "host_block_name", "host_ledger", "memory", "run_name", "run_names",
           "startup_peaks", "step_times", "tier_bytes", "tier_color", "tier_map", "timeline"]
