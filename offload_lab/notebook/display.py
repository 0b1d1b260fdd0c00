"""What :class:`~offload_lab.notebook.explorer.PlanExplorer` shows: the status line, the ledger
and reasons, the comparison table and the figures in its Output widgets. Every string from a
plan, a spec or a run is escaped before it reaches HTML.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as W

from offload_lab.notebook.magic import figure_bundle
from offload_lab.planning.planner import pinned_footprint
from offload_lab.units import format_bytes
from offload_lab.views import figures as viz

__all__ = ["DisplayMixin"]


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


def _kv_html(rows: Sequence[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th style='text-align:left;padding-right:12px;color:#667085'>"
                    f"{html.escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"



class DisplayMixin:
    """The display half of PlanExplorer: it reads ``plan``, ``runs``, ``message`` and ``error``
    and writes the HTML and Output widgets built by the controls."""

    def _guard(self, action: Callable[[], Any]) -> Any:
        """Run a button's action; show a failure in the status line instead of losing it
        (an exception in a widget callback would only reach the browser's console)."""
        self.error = self.plan_error  # a new action starts clean, but a broken plan stays said
        try:
            return action()
        except Exception as e:  # noqa: BLE001 - every failure must reach the user's eyes
            self.error = f"{type(e).__name__}: {e}"
            self._show_status()
            return None

    def _render(self, out: W.Output, *figs: Any) -> None:
        """Put figures in an Output widget by setting its outputs.

        Setting ``outputs`` (rather than capturing ``display`` with ``with out:``) needs no
        round trip through the frontend: headless executors such as nbclient emulate that
        capture and can stall a notebook on it. plotly.js is not inlined here: the widget area
        relies on the page's copy (plotly's notebook renderer or an earlier figure loads it).
        """
        if not _in_kernel():
            return  # no frontend to show it; the figures stay in .figures for code and tests
        out.outputs = tuple({"output_type": "display_data", "metadata": {},
                             "data": figure_bundle(f, plotlyjs=False)} for f in figs)

    def _show_status(self, raw: bool = False) -> None:
        parts = []
        if self.plan is not None:
            parts.append(f"<b>plan</b>: {html.escape(self.plan.summary())}")
        if self.message:
            parts.append(self.message if raw else html.escape(self.message))
        if self.error:
            parts.append(f"<span style='color:#b42318'><b>error</b>: {html.escape(self.error)}</span>")
        self.status.value = "<br>".join(parts)

    def _show_plan(self) -> None:
        p = self.plan
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
             f"{format_bytes(pow2)}" + (" — more than the host can spend" if pow2 > led["spendable"]
                                        else "")),
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
        self.ledger_html.value = (_kv_html(rows) + (f"<ul style='color:#b42318'>{warn}</ul>"
                                                    if warn else ""))
        self.reasons_html.value = (f"<details open><summary>per-layer tiers and reasons "
                                   f"({len(p.layers)} layers)</summary>"
                                   + p.table().to_html(index=False, border=0) + "</details>")

    def _show_comparison(self) -> None:
        if not self.runs:
            self.comparison_html.value = "<i>No runs kept.</i>"
            self.comparison_out.outputs = ()
            return
        self.figures["step_times"] = viz.step_times(self.runs)
        self.figures["bandwidth"] = viz.bandwidth(self.runs)
        self.comparison_html.value = viz.comparison_frame(self.runs).to_html(index=False, border=0,
                                                                             escape=True)
        self._render(self.comparison_out, self.figures["step_times"], self.figures["bandwidth"])
