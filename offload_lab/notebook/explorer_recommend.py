"""The **Recommend** part of :class:`~offload_lab.notebook.explorer.PlanExplorer`: a device-memory
box, a Recommend button that searches the plan space on the selected profile and sets the
controls to the best plan, and the front as a scatter plot (click a point — or pick it in the
list beside it — to load that plan).

The logic is in plain methods (:meth:`RecommendMixin.recommend`, :meth:`RecommendMixin.load_tried`,
:meth:`RecommendMixin.on_front_click`), so it is tested without a browser. Clicks reach Python
through a plotly ``FigureWidget``, which needs the ``anywidget`` package; without it the scatter
is drawn as a plain figure and the list loads the plans.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W

from offload_lab.notebook.controls import GIB, ExplorerError
from offload_lab.units import format_bytes

__all__ = ["RecommendMixin"]

_AUTO = "auto"  # the tier control's "planner's choice" (notebook.controls)


class RecommendMixin:
    """Widgets and actions of the Recommend tab; mixed into PlanExplorer."""

    recommendation: Any = None

    def _build_recommend(self) -> None:
        mem = self._profile_memory_gib()
        self.device_memory = W.BoundedFloatText(
            value=mem if mem is not None else 24.0, min=0.5, max=4096.0, step=1.0,
            description="device GiB", tooltip="device memory the plan must fit (estimated peak)")
        self.recommend_button = W.Button(description="Recommend", button_style="info",
                                         tooltip="search the plan space with the simulator and load the "
                                                 "fastest plan that fits host and device")
        self.front_choice = W.Dropdown(options=[], description="front plan", disabled=True)
        self.recommend_html = W.HTML("<i>Press Recommend: the fastest plans that fit this host and "
                                     "device (simulated).</i>")
        self.recommend_out = W.Output()
        self.recommend_button.on_click(lambda _b: self._guard(self.recommend))
        self.front_choice.observe(self._on_front_choice, names="value")
        self.device_memory.observe(self._on_change, names="value")
        self.profile_choice.observe(self._on_profile_memory, names="value")
        self.widget.children = (*self.widget.children[:-2],
                                W.HBox([self.device_memory, self.recommend_button, self.front_choice]),
                                *self.widget.children[-2:])
        self.tabs.children = (*self.tabs.children, W.VBox([self.recommend_html, self.recommend_out]))
        self.tabs.set_title(len(self.tabs.children) - 1, "Recommend")

    def _profile_memory_gib(self) -> float | None:
        from offload_lab.simulation import DeviceProfile

        prof = self._profile()
        if isinstance(prof, str):
            prof = DeviceProfile.load(prof)
        return None if prof.memory_bytes is None else round(prof.memory_bytes / GIB, 2)

    def _on_profile_memory(self, _change: dict) -> None:
        mem = self._profile_memory_gib()
        if mem is not None:
            self.device_memory.value = mem

    def device_memory_bytes(self) -> int:
        """The device-memory box in bytes."""
        return int(round(float(self.device_memory.value) * GIB))

    # -- actions ----------------------------------------------------------------------------------
    def recommend(self) -> Any:
        """Search on the selected profile, host and device memory; load the best plan.

        >>> from offload_lab.notebook.explorer import PlanExplorer
        >>> ex = PlanExplorer("wan2.1-t2v-14b", profile="rtx4090-pcie4", host="64GiB", live=False)
        >>> rec = ex.recommend()
        >>> ex.plan.tier_counts == rec.best.tier_counts
        True
        """
        from offload_lab.simulation.recommend import recommend

        rec = recommend(self.spec, self._profile(), host=self.host, device_memory=self.device_memory_bytes(),
                        tokens=self.tokens)
        self.recommendation = rec
        front = rec.front
        with self._hold():
            self.front_choice.options = [(f"#{int(r['id'])}: {r['step_s']:.3f} s, {int(r['resident_layers'])} "
                                          f"resident, prefetch {int(r['prefetch'])}", int(r["id"]))
                                         for _, r in front.iterrows()]
            self.front_choice.disabled = front.empty
            if rec.best is not None:
                self.front_choice.value = int(rec.best_row["id"])
        self.recommend_html.value = (f"<p>{html.escape(rec.explanation)}</p>"
                                     + rec._repr_html_().split("</p>", 2)[-1])
        if rec.best is None:
            self.message = f"recommend: {rec.explanation}"
            self._show_status()
            return rec
        self._show_front(rec)
        self.load_tried(int(rec.best_row["id"]))
        from offload_lab.simulation.recommend import step_text

        guidance = int(self.spec.meta.get("guidance_passes", 1) or 1)
        self.message = (f"recommended (simulated on {rec.profile.name}): "
                        f"{step_text(float(rec.best_row['step_s']), rec.calls_per_step, guidance)}, "
                        f"device peak {format_bytes(int(rec.best_row['device_peak_bytes']))} of "
                        f"{format_bytes(rec.device_memory)}")
        self._show_status()
        return rec

    def _show_front(self, rec: Any) -> None:
        from offload_lab.views.report_recommend import front_figure

        fig = front_figure(rec)
        self.figures["recommend_front"] = fig
        try:
            import plotly.graph_objects as go

            widget = go.FigureWidget(fig)  # needs anywidget; clicks then reach on_front_click
        except ImportError:
            self._render(self.recommend_out, fig)
            return
        for trace in widget.data:
            trace.on_click(self.on_front_click)
        self.recommend_out.outputs = ()
        with self.recommend_out:
            from IPython.display import display

            display(widget)

    def load_tried(self, plan_id: int) -> Any:
        """Set the controls to plan ``plan_id`` of the last recommendation (a row of its
        ``tried`` frame) and replan; returns the plan the controls now make."""
        rec = self.recommendation
        if rec is None:
            raise ExplorerError("no recommendation yet: press Recommend first")
        rec.plan_at(plan_id)  # names the accepted ids on a bad one
        row = rec.tried.loc[plan_id]
        budget = int(row["pin_budget"])
        with self._hold():
            self.resident.value = int(row["resident"])
            self.residency.value = str(row["residency"])
            self.order.value = str(row["order"])
            self.prefetch.max = max(self.prefetch.max, int(row["prefetch"]))
            self.prefetch.value = int(row["prefetch"])
            self.tier.value = str(row["tier"]) or _AUTO
            if budget >= self.host.spendable:
                self.budget.value = self.budget.max  # the top: everything the host can spend
            else:
                self.budget.value = budget / self._unit
        return self.update_plan()

    def on_front_click(self, trace: Any, points: Any, _state: Any = None) -> Any:
        """A click on the front scatter: load the plan of the clicked point."""
        inds = list(getattr(points, "point_inds", []) or [])
        if not inds:
            return None
        plan_id = int(list(trace.customdata)[inds[0]])
        with self._hold():
            self.front_choice.value = plan_id if plan_id in [v for _, v in self.front_choice.options] else None
        return self.load_tried(plan_id)

    def _on_front_choice(self, change: dict) -> None:
        if self._suspended or change.get("new") is None:
            return
        self._guard(lambda: self.load_tried(int(change["new"])))
