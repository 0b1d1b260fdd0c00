"""What the notebook layer puts on screen: figures as display bundles, and the HTML of the
explorer's panes (status line, ledger and reasons, comparison table).

Every string from a plan, a spec or a run is escaped before it reaches HTML. This module imports
neither ipywidgets nor plotly at import time: ``%offload_profile`` and
:class:`~offload_lab.notebook.state.ExplorerState` use it without widgets.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from offload_lab.planning.planner import pinned_footprint
from offload_lab.units import format_bytes
from offload_lab.views import figures as viz
from offload_lab.views.report_data import engine_rows

if TYPE_CHECKING:
    from offload_lab.planning.planner import Plan
    from offload_lab.record.run import Run

__all__ = ["figure_html", "figure_bundle", "render", "in_kernel", "ledger_html", "reasons_html", "comparison_html",
           "status_html"]

_PLOTLYJS_SENT = False  # plotly.js is inlined once per kernel process, see figure_html()


# -- figures in notebook outputs ------------------------------------------------------------------
def _plotlyjs_loaded() -> bool:
    """Whether this process already put plotly.js into the notebook page."""
    if _PLOTLYJS_SENT:
        return True
    try:
        import plotly.io as pio
    except ImportError:
        return False
    # plotly's "notebook" renderer inlines plotly.js once, when it becomes the default renderer
    return "notebook" in str(pio.renderers.default).split("+")


def figure_html(fig: Any, div_id: str | None = None, plotlyjs: bool | None = None) -> str:
    """A figure as an HTML fragment that survives ``jupyter nbconvert --to html``.

    plotly ≥ 6.1 renders figures in a kernel as ``application/vnd.plotly.v1+json`` only, which
    nbconvert's HTML drops; this fragment carries the figure as a ``<div>`` plus script.
    ``plotlyjs``: inline plotly.js (≈ 4.8 MB) in the fragment; ``None`` (default) inlines it in
    the first fragment of a process only — unless plotly's ``notebook`` renderer already put it
    in the page — so an exported notebook works offline without carrying it twice.

    >>> import plotly.graph_objects as go
    >>> "plotly-graph-div" in figure_html(go.Figure(), plotlyjs=False)
    True
    """
    global _PLOTLYJS_SENT
    include = (not _plotlyjs_loaded()) if plotlyjs is None else bool(plotlyjs)
    out = fig.to_html(include_plotlyjs=include, full_html=False, validate=False, div_id=div_id,
                      default_width="100%", default_height=f"{fig.layout.height or 420}px",
                      config={"displaylogo": False, "responsive": True})
    _PLOTLYJS_SENT = _PLOTLYJS_SENT or include
    return out


def figure_bundle(fig: Any, plotlyjs: bool | None = None) -> dict[str, Any]:
    """A display bundle with the plotly mimetype (live JupyterLab) and ``text/html`` (export).

    ``plotlyjs`` is passed to :func:`figure_html`.

    >>> import plotly.graph_objects as go
    >>> sorted(figure_bundle(go.Figure(), plotlyjs=False))
    ['application/vnd.plotly.v1+json', 'text/html', 'text/plain']
    """
    import plotly.io as pio

    bundle = dict(pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_plotly_json()))
    bundle["text/html"] = figure_html(fig, plotlyjs=plotlyjs)
    title = getattr(getattr(fig.layout, "title", None), "text", None) or "figure"
    bundle["text/plain"] = f"<plotly figure: {re.sub(r'<[^>]+>', ' ', str(title)).strip()}>"
    return bundle


def _in_kernel() -> bool:
    """True inside a Jupyter kernel, where Output widgets capture displays.

    >>> _in_kernel()
    False
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def in_kernel() -> bool:
    """True inside a Jupyter kernel (where a frontend shows what the dashboard sends)."""
    return _in_kernel()


def render(out: Any, *figs: Any) -> None:
    """Put figures in an Output widget (anything with ``outputs``) by setting its outputs.

    Setting ``outputs`` (rather than capturing ``display`` with ``with out:``) needs no
    round trip through the frontend: headless executors such as nbclient emulate that
    capture and can stall a notebook on it. plotly.js is not inlined here: the widget area
    relies on the page's copy (plotly's notebook renderer or an earlier figure loads it).
    Outside a kernel nothing is drawn (no frontend would show it).
    """
    if not figs:
        out.outputs = ()
        return
    if not _in_kernel():
        return
    out.outputs = tuple({"output_type": "display_data", "metadata": {},
                         "data": figure_bundle(f, plotlyjs=False)} for f in figs)


# -- the explorer's panes -------------------------------------------------------------------------
def _kv_html(rows: Sequence[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th style='text-align:left;padding-right:12px;color:#667085'>"
                    f"{html.escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def status_html(lines: Sequence[tuple[str, str | None, bool]]) -> str:
    """The status line from ``(kind, text, is_html)`` parts; ``kind`` is ``plan``, ``message``,
    ``error`` or a label shown in bold before the text; plain texts are escaped.

    >>> status_html([("plan", "30 pinned", False), ("error", "<b>", False)])
    "<b>plan</b>: 30 pinned<br><span style='color:#b42318'><b>error</b>: &lt;b&gt;</span>"
    """
    parts = []
    for kind, text, raw in lines:
        if not text:
            continue
        body = text if raw else html.escape(text)
        if kind == "message":
            parts.append(body)
        elif kind == "error":
            parts.append(f"<span style='color:#b42318'><b>error</b>: {body}</span>")
        elif kind == "warning":  # a plan's warnings: the plan is made, but not as asked
            parts.append(f"<span style='color:#b54708'><b>warning</b>: {body}</span>")
        else:
            parts.append(f"<b>{html.escape(kind)}</b>: {body}")
    return "<br>".join(parts)


def ledger_html(p: Plan) -> str:
    """The plan's budget ledger (host and device) and its warnings, as a key/value table."""

    led = p.ledger
    peaks = {s: p.startup_peak(s) for s in ("grouped", "naive")}
    pow2 = pinned_footprint(p, "pow2")
    rows = [
        ("host", html.escape(repr(p.host)) if p.host is not None else "–"),
        ("available", format_bytes(led["available"])),
        ("reserve", format_bytes(led["reserve"])),
        ("spendable", format_bytes(led["spendable"])),
        ("pin budget", format_bytes(led["budget"])),
        ("pinned", f"{format_bytes(led['pinned_bytes'])} in "
                   f"{int(p.layers['pin_rank'].notna().sum())} layer(s)"),
        ("pinned if rounded to powers of two",
         f"{format_bytes(pow2)}" + (" — more than the host can spend" if pow2 > led["spendable"] else "")),
        ("net new anonymous", format_bytes(led["net_anonymous_bytes"])),
        ("fits", "<span style='color:#027a48'>yes</span>" if led["fits"]
         else "<b style='color:#b42318'>NO</b>"),
        ("startup peak (device)", f"grouped {format_bytes(peaks['grouped'])} · naive "
                                  f"{format_bytes(peaks['naive'])}"),
    ]
    if led.get("device_peak_bytes") is not None:
        mem = led.get("device_memory")
        fit = "" if mem is None else (" — <span style='color:#027a48'>fits</span>" if led["device_fits"]
                                      else " — <b style='color:#b42318'>does NOT fit</b>")
        rows.append(("device peak (estimate)",
                     f"{format_bytes(led['device_peak_bytes'])}" + (f" of {format_bytes(mem)}" if mem else "")
                     + fit + f" (non-layer {format_bytes(led['device_non_layer_bytes'])}, resident "
                     f"{format_bytes(led['device_resident_bytes'])}, in flight "
                     f"{format_bytes(led['device_in_flight_bytes'])}, activations "
                     f"{format_bytes(led['device_activation_bytes'])})"))
    warn = "".join(f"<li>{html.escape(w)}</li>" for w in p.warnings)
    return _kv_html(rows) + (f"<ul style='color:#b42318'>{warn}</ul>" if warn else "")


def reasons_html(p: Plan) -> str:
    """The per-layer tiers and reasons, as a folded table (cells escaped)."""
    return (f"<details open><summary>per-layer tiers and reasons ({len(p.layers)} layers)</summary>"
            + p.table().to_html(index=False, border=0) + "</details>")


def comparison_html(runs: Sequence[Run]) -> str:
    """The comparison table of the runs kept (cells escaped)."""

    if not runs:
        return "<i>No runs kept.</i>"
    return viz.comparison_frame(list(runs)).to_html(index=False, border=0, escape=True)


def engines_html(frame: Any, context: str) -> str:
    """The Engines tab's table: one row of :func:`offload_lab.engines.compare`'s frame each
    (engine, settings, simulated step and its evidence, pinned bytes really locked, device peak,
    fits), every string escaped."""
    head = ("engine", "settings", "tiers", "step (simulated)", "evidence", "pinned (locked)",
            "device peak (estimate)", "fits")
    cells = "".join(f"<th style='text-align:left;padding:2px 8px'>{h}</th>" for h in head)
    body = []
    for r in engine_rows(frame):
        step = html.escape(r["step"]) + (f"<br><small>{html.escape(r['extra'])}</small>" if r["extra"] else "")
        vals = [html.escape(r["engine"]), html.escape(r["settings"]), html.escape(r["tiers"]), step,
                f"<span title='{html.escape(r['evidence_title'], quote=True)}'>{html.escape(r['evidence'])}</span>",
                html.escape(r["pinned"]), html.escape(r["peak"]), html.escape(r["fits"])]
        colour = " style='color:#b42318'" if r["cls"] else ""
        body.append(f"<tr{colour}>" + "".join(f"<td style='padding:2px 8px'>{v}</td>" for v in vals) + "</tr>")
    return (f"<p>{html.escape(context)} — step times SIMULATED, including the copies an engine makes "
            f"outside the layers; pinned is what the engine's pins really lock.</p>"
            f"<table class='offload-engines'><thead><tr>{cells}</tr></thead><tbody>{''.join(body)}</tbody></table>")
