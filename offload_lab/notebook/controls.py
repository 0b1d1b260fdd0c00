"""The controls of :class:`~offload_lab.notebook.explorer.PlanExplorer`: its widgets, the host
it plans for, and what the controls stand for as :func:`offload_lab.plan` arguments.

The choices offered (tiers, orders, residencies) are the ones every surface accepts
(:mod:`offload_lab.planning.options`).
"""

from __future__ import annotations

import contextlib
import html
import math
from collections.abc import Iterator
from typing import Any

import ipywidgets as W

from offload_lab.errors import OffloadLabError
from offload_lab.planning.hostmem import HostMemory, resolve_host
from offload_lab.planning.options import FORCED_TIERS, ORDERS, RESIDENCIES
from offload_lab.units import SizeError, format_bytes

__all__ = ["ControlsMixin", "ExplorerError", "HYPOTHETICAL_HOSTS_GIB"]

#: host sizes (GiB available) offered besides this machine, to ask "what if the host had ..."
HYPOTHETICAL_HOSTS_GIB = (16, 32, 64, 128, 256, 512)
GIB, MIB = 2**30, 2**20
_AUTO = "auto"
_TIERS_TIP = ("simulate this plan with every streamed layer pinned (as far as the host can "
              "afford), then pageable, and add both to the comparison")


class ExplorerError(OffloadLabError, ValueError):
    """An argument PlanExplorer cannot use; the message names it and what is accepted."""


def _nice_step(span: float) -> float:
    """A round slider step giving about 200 positions over ``span``."""
    if span <= 0:
        return 0.01
    return max(10 ** math.floor(math.log10(span / 200)), 0.001)



class ControlsMixin:
    """The controls half of PlanExplorer: widgets, host choice, budget range, plan arguments."""

    def _resolve_host(self, host: Any) -> HostMemory | None:
        try:
            return resolve_host(host, probe=False)
        except ValueError as e:
            raise ExplorerError(f"host {host!r:.60}: {e}" if isinstance(e, SizeError) else str(e)) from None

    def _probe_host(self) -> HostMemory:
        if self._probe is None:
            self._probe = HostMemory.probe()
        return self._probe

    def _host_options(self) -> list[tuple[str, str]]:
        opts = []
        if self._given_host is not None:
            opts.append((f"given: {format_bytes(self._given_host.available)} available", "given"))
        probe = self._probe_host()
        opts.append((f"this machine: {format_bytes(probe.available)} available", "probe"))
        opts += [(f"hypothetical: {g} GiB available", f"{g}GiB") for g in HYPOTHETICAL_HOSTS_GIB]
        return opts

    def _default_host_key(self) -> str:
        if self._given_host is not None:
            return "given"
        if self.model is not None:
            return "probe"
        for g in HYPOTHETICAL_HOSTS_GIB:
            if HostMemory(available=g * GIB).spendable >= self._layer_total:
                return f"{g}GiB"
        return f"{HYPOTHETICAL_HOSTS_GIB[-1]}GiB"

    @property
    def host(self) -> HostMemory:
        """The host the displayed plan is made for (the host dropdown)."""
        key = self.host_choice.value
        if key == "given" and self._given_host is not None:
            return self._given_host
        if key == "probe":
            return self._probe_host()
        return HostMemory(available=key)

    def _build_widgets(self, steps: int, report_path: str, live: bool) -> None:
        style = {"description_width": "110px"}
        wide = W.Layout(width="340px")
        groups = self.spec.groups
        biggest = max(g.num_layers for g in groups)
        self.title = W.HTML(
            f"<b>PlanExplorer · {html.escape(self.spec.name)}</b> — "
            f"{sum(g.num_layers for g in groups)} layers in {len(groups)} group(s) "
            f"({', '.join(f'{html.escape(g.name)}: {g.num_layers}' for g in groups)}), "
            f"{format_bytes(self._layer_total)} of layer weights"
            # a saved notebook redraws the dashboard from its saved widget state after a
            # kernel restart: the tabs still switch but no control reaches Python any more
            "<br><small style='color:#667085'>The controls act through the running kernel: "
            "after a kernel restart, or in a copy of the notebook opened later, run this cell again."
            "</small>")
        self.host_choice = W.Dropdown(options=self._host_options(), value=self._default_host_key(),
                                      description="host", style=style, layout=wide)
        self.budget = W.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.01,
                                    description=f"pin budget ({self._unit_name})", style=style,
                                    continuous_update=False, layout=W.Layout(width="420px"))
        self.budget_note = W.HTML()
        # a count applies to every group (capped at its size): say so where there are several
        per_group = "resident per group" if len(groups) > 1 else "resident layers"
        self.resident = W.IntSlider(value=0, min=0, max=biggest, description=per_group,
                                    style=style, continuous_update=False, layout=wide)
        self.resident_note = W.HTML()
        self.residency = W.Dropdown(options=list(RESIDENCIES), value="leading",
                                    description="residency", style=style, layout=wide)
        self.order = W.Dropdown(options=list(ORDERS), value="execution", description="pin order",
                                style=style, layout=wide)
        self.prefetch = W.IntSlider(value=1, min=0, max=max(1, min(4, biggest)),
                                    description="prefetch depth", style=style,
                                    continuous_update=False, layout=wide)
        tiers = [t for t in FORCED_TIERS if t != "mapped" or self.spec.mapped_bytes > 0]
        self.tier = W.Dropdown(options=[("planner's choice", _AUTO)] + [(t, t) for t in tiers],
                               value=_AUTO, description="forced tier", style=style, layout=wide)
        self.profile_choice = W.Dropdown(options=list(self.profiles), value=next(iter(self.profiles)),
                                         description="device profile", style=style, layout=wide)
        self.steps = W.BoundedIntText(value=steps, min=1, max=50, description="steps",
                                      style=style, layout=W.Layout(width="200px"))
        self.live = W.Checkbox(value=live, description="simulate on every change", indent=False)
        self._build_actions(report_path)
        self._wire()
        self._layout()

    def _build_actions(self, report_path: str) -> None:
        style = {"description_width": "110px"}
        self.simulate_button = W.Button(description="Simulate", button_style="primary",
                                        tooltip="predict this plan's timeline on the device profile")
        self.run_button = W.Button(description="Run", button_style="success",
                                   disabled=self.fn is None,
                                   tooltip=("profile the real model with fn under this plan"
                                            if self.fn else "needs PlanExplorer(model, fn=...)"))
        self.add_button = W.Button(description="Add to comparison", disabled=True)
        self.tiers_button = W.Button(description="pinned vs pageable", tooltip=_TIERS_TIP)
        self.clear_button = W.Button(description="Clear comparison")
        self.export_button = W.Button(description="Export report", icon="download")
        self.report_path = W.Text(value=report_path, description="report file", style=style,
                                  layout=W.Layout(width="360px"))
        self.progress = W.IntProgress(value=0, min=0, max=1, description="run",
                                      layout=W.Layout(width="340px", visibility="hidden"))
        self.status = W.HTML()
        self.ledger_html = W.HTML()
        self.reasons_html = W.HTML()
        self.comparison_html = W.HTML("<i>No runs kept yet: Simulate or Run, then Add to "
                                      "comparison (or press pinned vs pageable).</i>")
        self.timeline_out = W.Output()
        self.tier_map_out = W.Output()
        self.ledger_out = W.Output()
        self.comparison_out = W.Output()

    def _wire(self) -> None:
        for w in (self.budget, self.resident, self.residency, self.order, self.prefetch,
                  self.tier, self.profile_choice, self.steps):
            w.observe(self._on_change, names="value")
        self.host_choice.observe(self._on_host, names="value")
        self.simulate_button.on_click(lambda _b: self._guard(self.simulate))
        self.run_button.on_click(lambda _b: self._guard(self.run))
        self.add_button.on_click(lambda _b: self._guard(self.add_to_comparison))
        self.tiers_button.on_click(lambda _b: self._guard(self.compare_tiers))
        self.clear_button.on_click(lambda _b: self._guard(self.clear_comparison))
        self.export_button.on_click(lambda _b: self._guard(self.export_report))

    def _layout(self) -> None:
        tabs = W.Tab(children=[
            self.timeline_out, self.tier_map_out,
            W.VBox([self.ledger_html, self.ledger_out, self.reasons_html]),
            W.VBox([self.comparison_html, self.comparison_out]),
        ])
        for i, name in enumerate(("Timeline", "Tier map", "Plan: ledger & reasons", "Comparison")):
            tabs.set_title(i, name)
        self.tabs = tabs
        self.widget = W.VBox([
            self.title,
            W.HBox([self.host_choice, self.budget, self.budget_note]),
            W.HBox([self.resident, self.residency, self.order, self.resident_note]),
            W.HBox([self.prefetch, self.tier, self.profile_choice]),
            W.HBox([self.steps, self.live]),
            W.HBox([self.simulate_button, self.run_button, self.add_button, self.tiers_button,
                    self.clear_button]),
            W.HBox([self.export_button, self.report_path, self.progress]),
            self.status, tabs,
        ])

    @contextlib.contextmanager
    def _hold(self) -> Iterator[None]:
        """Change several controls without replanning after each one."""
        was, self._suspended = self._suspended, True
        try:
            yield
        finally:
            self._suspended = was

    def _budget_max(self) -> float:
        cap = min(self.host.spendable, self._layer_total)
        step = _nice_step(cap / self._unit)
        # round up to the step so the slider's top position means "all of it"
        return math.ceil(cap / self._unit / step) * step

    def _update_budget_range(self, keep_max: bool = False) -> None:
        with self._hold():
            top = self._budget_max()
            at_max = keep_max or self.budget.value >= self.budget.max - self.budget.step / 2
            step = _nice_step(top)
            self.budget.max = top  # clamps the value when the range shrinks
            self.budget.step = step
            if at_max:
                self.budget.value = top
            digits = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
            self.budget.readout_format = f".{digits}f"
        host = self.host
        self.budget_note.value = (
            f"<span style='color:#667085'>host can spend {format_bytes(host.spendable)} "
            f"(available {format_bytes(host.available)} − reserve {format_bytes(host.reserve)}); "
            f"layers total {format_bytes(self._layer_total)}</span>")

    def pin_budget(self) -> int | None:
        """The slider's budget in bytes; ``None`` at the top (everything the host can spend).

        >>> from offload_lab.notebook.explorer import PlanExplorer
        >>> ex = PlanExplorer("wan2.1-t2v-14b", host="64GiB", live=False)
        >>> ex.pin_budget() is None, (setattr(ex.budget, "value", 4.0), ex.pin_budget())[1] == 4 * 2**30
        (True, True)
        """
        if self.budget.value >= self.budget.max - self.budget.step / 2:
            return None
        return int(round(self.budget.value * self._unit))

    def plan_kwargs(self) -> dict[str, Any]:
        """The arguments of :func:`offload_lab.plan` that the controls stand for (host aside).

        >>> from offload_lab.notebook.explorer import PlanExplorer
        >>> PlanExplorer("wan2.1-t2v-1.3b", host="64GiB", live=False).plan_kwargs()["order"]
        'execution'
        """
        return {
            "pin_budget": self.pin_budget(), "resident": int(self.resident.value),
            "residency": self.residency.value, "order": self.order.value,
            "prefetch": int(self.prefetch.value),
            "tier": None if self.tier.value == _AUTO else self.tier.value,
        }

    def _on_change(self, _change: dict) -> None:
        if not self._suspended:
            self.update_plan()

    def _on_host(self, _change: dict) -> None:
        if self._suspended:
            return
        self._update_budget_range()
        self.update_plan()

    def _update_resident_note(self) -> None:
        """Say what a resident count means per group (35 on MiniMax-H3 keeps 35 + 2)."""
        groups = self.spec.groups
        k = int(self.resident.value)
        if len(groups) < 2:
            self.resident_note.value = ""
            return
        each = ", ".join(f"{html.escape(g.name)} {min(k, g.num_layers)}" for g in groups)
        total = sum(min(k, g.num_layers) for g in groups)
        self.resident_note.value = (f"<span style='color:#667085'>{k} per group, capped at its "
                                    f"size: {each} ({total} resident)</span>")
