"""What every figure shares: tier colours, escaped labels, titles, the plotly layout and its lazy import.

:mod:`offload_lab.views.figures` and :mod:`offload_lab.views.rank_figures` draw with these; they
are pure functions of strings and numbers, and nothing here imports plotly until a figure is made.

>>> esc("<b>x</b>"), tier_color("pinned") == TIER_COLORS["pinned"]
('&lt;b&gt;x&lt;/b&gt;', True)
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from offload_lab.errors import OffloadLabError
from offload_lab.record.run import Run, display_label
from offload_lab.views.text import (
    split_labels,
    wrap,
)

if TYPE_CHECKING:  # plotly is imported lazily so that `import offload_lab.views.figures` stays cheap
    import plotly.graph_objects as go

TIER_COLORS: dict[str, str] = {
    "resident": "#2ca02c",
    "pinned": "#1f77b4",
    "staged": "#bcbd22",
    "pageable": "#ff7f0e",
    "mapped": "#9467bd",
    "unknown": "#7f7f7f",
}
"""The colour of each tier in every figure and in the report (a tier a run does not know is ``unknown``)."""
STALL_COLOR = "#d62728"
HOST_BLOCK_COLOR = "#4d4d4d"
STAGE_COLOR = "#8c564b"
MEMORY_COLORS = {"device_bytes": "#17becf", "pinned_bytes": TIER_COLORS["pinned"],
                 "anon_bytes": TIER_COLORS["pageable"], "mapped_bytes": TIER_COLORS["mapped"]}
SIM_PATTERN = "/"
# runs told apart by colour where tiers are not the subject (not the tier colours, to avoid misreading)
RUN_COLORS = ["#0e7490", "#7c3aed", "#be185d", "#4d7c0f", "#a16207", "#334155"]
GIB = 2**30
_FONT = dict(family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=12)


class VizError(OffloadLabError, ValueError):
    """An argument a figure cannot draw (a step that was not measured, a wrong object type)."""


# -- helpers ----------------------------------------------------------------------------------
def _go():
    import plotly.graph_objects as go

    return go


def esc(s: Any) -> str:
    """Escape a string for plotly text (``<``, ``>``, ``&``); plotly.js shows entities as text.

    >>> esc("</script><b>x</b>")
    '&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;'
    """
    return html.escape(str(s), quote=False)


def tier_color(tier: str) -> str:
    """The colour of a tier in every figure (unknown tiers are grey).

    >>> tier_color("pinned")
    '#1f77b4'
    """
    return TIER_COLORS.get(str(tier), TIER_COLORS["unknown"])


def _lines(label: Any, width: int | None) -> str:
    # wrap first, escape each line second: escaping first would count "&lt;" as four characters
    # and could break an entity across lines; never cut, a cut hides what tells runs apart
    text = str(label)
    if width is None or len(text) <= width:
        return esc(text)
    return "<br>".join(esc(line) for line in wrap(text, width, sep="\n").split("\n"))


def run_name(run: Run, limit: int | None = None) -> str:
    """A run's label as figures show it, with ``(simulated)`` for simulated runs (escaped).

    ``limit`` wraps long labels onto lines of about that many characters (never cuts them).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> run_name(offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=1, label="a"))
    'a (simulated)'
    """
    return _lines(display_label(run), limit)


def run_names(runs: Sequence[Run], width: int = 30) -> tuple[str, list[str]]:
    """What all runs' labels share (escaped, for a title) and each run's own part (escaped, wrapped).

    What tells runs apart comes first and is never cut; simulated runs say ``(simulated)`` once.
    Equal names get ``#2``, ``#3`` so that a category axis keeps them apart.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> host = offload_lab.HostMemory(available="256GiB")
    >>> runs = [offload_lab.simulate(offload_lab.plan(spec, tier=t, host=host), "h200", steps=1,
    ...                              label=f"h200 · 480p tokens · {t}") for t in ("pinned", "pageable")]
    >>> run_names(runs)
    ('h200 · 480p tokens', ['pinned (simulated)', 'pageable (simulated)'])
    """
    common, own = split_labels([r.label for r in runs])
    names = [_lines(o + (" (simulated)" if r.simulated else ""), width) for o, r in zip(own, runs)]
    return esc(common), _unique(names)


def _unique(names: list[str]) -> list[str]:
    # category axes merge equal labels, so two runs both called "pinned" must stay apart
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} #{seen[n]}")
    return out


def _short(label: Any, limit: int = 60) -> str:
    """Escaped label for a title, wrapped onto lines of about ``limit`` characters."""
    return _lines(label, limit)


def _title_label(run: Run, limit: int = 60) -> str:
    # the stored label, without display_label's "(simulated)": the title's SIMULATED tag says it
    return _short(run.label, limit)


def _device(run: Run) -> str:
    """Where a run ran, once: ``h200`` for a simulation (the title says SIMULATED), ``x86_64 (cpu)``."""
    name = str(run.meta.get("device_name") or "").strip()
    if run.simulated:
        return esc(name or "simulator")
    return esc(f"{name} ({run.backend})" if name and run.backend not in name else (name or run.backend))


def _pattern(shape: str | list[str], size: int = 8) -> dict:
    # white hatching over the bar's own colour: "overlay" keeps the fill (plotly's default,
    # "replace", would paint white lines on a white bar once no template sets it)
    return dict(shape=shape, fillmode="overlay", fgcolor="#ffffff", size=size, solidity=0.35)


def _sim_tag(sim: bool) -> str:
    return ' · <span style="color:#b54708"><b>SIMULATED</b></span>' if sim else ""


def _wrap_parts(text: str, width: int = 80) -> str:
    """Break a `` · ``-separated line between parts so no line is much over ``width`` characters:
    plotly never wraps titles itself, and a half-width figure in the report cuts them."""
    lines, cur = [], ""
    for part in text.split(" · "):
        if cur and len(cur) + 3 + len(part) > width:
            lines.append(cur + " ·")
            cur = part
        else:
            cur = f"{cur} · {part}" if cur else part
    return "<br>".join(lines + [cur])


def _title(text: str, sub: str | None = None) -> dict:
    t: dict[str, Any] = {"text": text, "x": 0.01, "xanchor": "left", "font": {"size": 15}}
    if sub:
        t["subtitle"] = {"text": _wrap_parts(sub), "font": {"size": 11, "color": "#555"}}
    return t


# a small template: plotly's own ("plotly", "plotly_white") is deep-copied into every figure and
# costs more than drawing 1,000 bars; every figure is built in one go.Figure call for the same reason
_TEMPLATE = {"layout": {
    "paper_bgcolor": "white", "plot_bgcolor": "white", "font": _FONT,
    "colorway": RUN_COLORS, "hoverlabel": {"align": "left"},
    "xaxis": {"gridcolor": "#ebedf0", "linecolor": "#c7cbd1", "zerolinecolor": "#ebedf0", "automargin": True},
    "yaxis": {"gridcolor": "#ebedf0", "linecolor": "#c7cbd1", "zerolinecolor": "#ebedf0", "automargin": True},
}}


def _figure(traces: list[dict], title: dict, height: int, xaxis: dict | None = None,
            yaxis: dict | None = None, **layout: Any) -> go.Figure:
    """One figure from trace dicts and layout settings, validated once."""
    go = _go()
    lay: dict[str, Any] = dict(
        template=_TEMPLATE, title=title, height=height,
        margin=dict(l=60, r=24, b=40, t=56 + 14 * (str(title["text"]).count("<br>")
                                                  + (str(title["subtitle"]["text"]).count("<br>") + 2
                                                     if "subtitle" in title else 0))),
        # legends sit under the plot: titles and subtitles keep the top, long legends wrap below
        legend=dict(orientation="h", yref="container", yanchor="bottom", y=0.0, xanchor="left",
                    x=0.0, font={"size": 11}),
        xaxis={"automargin": True, **(xaxis or {})}, yaxis={"automargin": True, **(yaxis or {})})
    lay.update(layout)
    return go.Figure(data=traces, layout=lay)


def _check_run(run: Any, what: str = "run") -> Run:
    if not isinstance(run, Run):
        raise VizError(f"{what} {run!r:.80} of type {type(run).__name__} is not an offload_lab.Run; "
                       f"expected the result of profile(), simulate() or Run.load()")
    return run


def _is_plan(obj: Any) -> bool:
    # duck-typed so that viz never imports the planner (a Plan has a ledger and a layers frame)
    return (not isinstance(obj, Run) and hasattr(obj, "ledger") and hasattr(obj, "layers")
            and isinstance(obj.layers, pd.DataFrame))


def _gbps(nbytes: np.ndarray, dur: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(dur > 0, nbytes / np.where(dur > 0, dur, 1.0) / 1e9, np.nan)


def _byte_unit(largest: float) -> tuple[float, str]:
    """Divisor and unit name so that the largest value reads as a plain number."""
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= div:
            return float(div), unit
    return 1.0, "bytes"


def _empty(title: dict, message: str, height: int = 240) -> go.Figure:
    """A figure that says why there is nothing to draw (never a silent blank)."""
    note = dict(text=esc(message), showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                font={"size": 13, "color": "#666"})
    return _figure([], title, height, xaxis={"visible": False}, yaxis={"visible": False},
                   annotations=[note])


