"""``PlanExplorer``: an ipywidgets dashboard to change a plan and see its timeline at once.

Controls (pin budget, resident count and policy, ordering, prefetch depth, forced tier, host,
device profile, device memory) make a :class:`~offload_lab.planning.planner.Plan`; the issue
order and the calls per step (1, or 2 with guidance) are the simulator's, and the status line
says what each prediction rests on (± band, or *unconfirmed* where no GPU run backs it, with the
other issue order's prediction beside it); **Recommend**
searches for the fastest plan that fits and sets the controls to it; **Simulate** predicts its timeline on
a device profile (instant, labelled simulated), **Run** profiles the real model with ``fn``
(on the GPU when there is one, else the cpu backend, labelled with the backend), **Add to
comparison** keeps a run, **pinned vs pageable** simulates the headline comparison, and
**Export report** writes one offline HTML file.

The dashboard is a view over one :class:`~offload_lab.notebook.state.ExplorerState`
(``ex.state``), which holds all the logic and needs no widgets: every control writes its
field of ``ex.state.controls``, every button calls one of the state's actions, and the view
then draws what the state holds. The results are read here too (``plan``, ``last_run``,
``runs``, ``figures``, ``error``), so the dashboard is tested without a browser: set a
control's ``.value`` or ``.click()`` a button, then read them.

>>> from offload_lab import catalog
>>> ex = PlanExplorer(catalog.load("wan2.1-t2v-14b"), host="64GiB", live=False)
>>> ex.budget.value = 8.0                       # GiB
>>> ex.plan.tier_counts["pinned"]
12
>>> ex.simulate_button.click()
>>> ex.last_run.simulated, "timeline" in ex.figures
(True, True)

Importing this module imports ipywidgets; ``import offload_lab`` does not, nor does
:mod:`offload_lab.notebook.state`.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as W

from offload_lab.notebook import display
from offload_lab.notebook.state import (
    AUTO,
    HYPOTHETICAL_HOSTS_GIB,
    PASSES_CHOICES,
    STEPS_BOX_MAX,
    Controls,
    ExplorerError,
    ExplorerState,
)
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.options import ISSUE_ORDERS, ORDERS, RESIDENCIES
from offload_lab.planning.planner import Plan
from offload_lab.record.run import Run

__all__ = ["PlanExplorer", "ExplorerState", "Controls", "ExplorerError", "HYPOTHETICAL_HOSTS_GIB", "RESTART_NOTICE"]

# wide enough for the longest description ("resident per group"): a narrower one is cut
_STYLE = {"description_width": "140px"}
#: the tabs' titles: short, since JupyterLab gives a tab about 140 px and cuts a longer title
TAB_TITLES = ("Timeline", "Tier map", "Plan", "Comparison", "Recommend", "Engines")


def _box(width: str) -> W.Layout:
    # a fixed width that a row never squeezes (a squeezed slider was ~30 px wide and unusable)
    return W.Layout(width=width, min_width=width, flex="0 0 auto")


def _row(*children: Any) -> W.HBox:
    # a row that wraps onto the next line instead of shrinking its controls
    return W.HBox(list(children), layout=W.Layout(flex_flow="row wrap", align_items="center"))


#: a plain HTML output shown *above* the dashboard: after a kernel restart the widget's own HTML
#: is gone (JupyterLab draws "model not found", or a saved copy whose controls reach nothing),
#: while an ordinary output stays, so this is where the user reads what to do
RESTART_NOTICE = ("<div style='border-left:4px solid #f79009;background:#fffaeb;color:#7a2e0e;"
                  "padding:6px 10px;margin:2px 0;font-size:13px'><b>&#9888; Live dashboard:</b> "
                  "its controls act through the kernel that ran this cell. After a kernel restart, "
                  "or in a copy of the notebook opened later, they do nothing (or JupyterLab shows "
                  "<i>model not found</i>): <b>run this cell again</b>.</div>")


def _plot_view_class() -> Any:
    """:class:`~offload_lab.notebook.plot_view.PlotView` when it can run here, else None."""
    if importlib.util.find_spec("anywidget") is None:
        return None
    from offload_lab.notebook import plot_view  # heavy: plotly (plotly.js), in a kernel only

    return plot_view.PlotView


def _widget_output(widget: Any, fig: Any = None) -> dict[str, Any]:
    """An Output widget's output that shows ``widget`` (set as outputs: no display capture),
    with ``fig``'s static HTML for a notebook exported without the widgets' scripts."""
    data = {"application/vnd.jupyter.widget-view+json": {"version_major": 2, "version_minor": 0,
                                                         "model_id": widget.model_id},
            "text/plain": f"<plotly figure widget: {len(widget.data)} traces>"}
    if fig is not None:
        data["text/html"] = display.figure_html(fig, plotlyjs=False)
    return {"output_type": "display_data", "metadata": {}, "data": data}


class PlanExplorer:
    """A dashboard over one model: controls → plan → simulate / run → figures and comparison.

    - ``model_or_spec``: a ``torch.nn.Module`` (its blocks in ``nn.ModuleList``s), a
      :class:`~offload_lab.model.spec.ModelSpec`, or a catalog name such as ``"wan2.1-t2v-14b"``.
    - ``fn``: a callable with no arguments that runs one step of the model (``lambda:
      model(**inputs)``); needed only for **Run**.
    - ``profile``: the device profile for **Simulate**: a shipped name (``"h200"``) or a
      :class:`~offload_lab.simulation.DeviceProfile`; default ``"h200"``.
    - ``host``: the host the plan is made for: a :class:`~offload_lab.planning.hostmem.HostMemory`, a
      size (``"64GiB"`` = a hypothetical host with that much available), or ``None``: this
      machine for a module, else the smallest offered hypothetical host that could pin it all.
      **Run** always plans against this machine, so it never pins more than it can spend.
    - ``tokens``: video tokens for the simulator's compute model (default: the spec's 480p).
    - ``live``: simulate on every control change (else only on **Simulate**).

    >>> from offload_lab import catalog
    >>> ex = PlanExplorer("minimax-h3", host="64GiB", live=False)
    >>> ex.resident.value, ex.residency.value = 35, "strided"
    >>> ex.plan.streamed_layers("blocks")[:3]
    [1, 5, 8]
    """

    def __init__(self, model_or_spec: Any, fn: Callable[[], Any] | None = None,
                 profile: Any = None, host: HostMemory | str | int | None = None, *,
                 tokens: int | str | None = None, steps: int = 3, warmup: int = 1,
                 backend: str = "auto", report_path: str = "offload-report.html",
                 live: bool = True) -> None:
        self.state = ExplorerState(model_or_spec, fn, profile, host, tokens=tokens, steps=steps,
                                   warmup=warmup, backend=backend, report_path=report_path, live=live)
        self.state.on_progress = self._progress
        self._syncing = False
        self._shown: dict[int, tuple[Any, ...]] = {}  # id of an Output widget -> the figures it shows
        self._widgets: dict[int, list[Any]] = {}  # id of an Output widget -> its PlotViews, by slot
        self._live: set[int] = set()  # ids of the PlotViews a page has drawn
        self._running = False
        self._build_widgets()
        self._refresh()

    # -- what the state holds, read here as before --------------------------------------------------
    model = property(lambda self: self.state.model)
    spec = property(lambda self: self.state.spec)
    fn = property(lambda self: self.state.fn)
    tokens = property(lambda self: self.state.tokens)
    warmup = property(lambda self: self.state.warmup)
    backend = property(lambda self: self.state.backend)
    profiles = property(lambda self: self.state.profiles)
    plan = property(lambda self: self.state.plan)
    plan_error = property(lambda self: self.state.plan_error)
    error = property(lambda self: self.state.error)
    message = property(lambda self: self.state.message)
    last_run = property(lambda self: self.state.last_run)
    runs = property(lambda self: self.state.runs)
    figures = property(lambda self: self.state.figures)
    report_file = property(lambda self: self.state.report_file)
    recommendation = property(lambda self: self.state.recommendation)
    host = property(lambda self: self.state.host, doc="The host the displayed plan is made for.")

    def pin_budget(self) -> int | None:
        """The budget slider in bytes; ``None`` at the top (everything the host can spend).

        >>> ex = PlanExplorer("wan2.1-t2v-14b", host="64GiB", live=False)
        >>> ex.pin_budget() is None, (setattr(ex.budget, "value", 4.0), ex.pin_budget())[1] == 4 * 2**30
        (True, True)
        """
        return self.state.pin_budget()

    def plan_kwargs(self) -> dict[str, Any]:
        """The arguments of :func:`offload_lab.plan` that the controls stand for (host aside).

        >>> PlanExplorer("wan2.1-t2v-1.3b", host="64GiB", live=False).plan_kwargs()["order"]
        'execution'
        """
        return self.state.plan_kwargs()

    def device_memory_bytes(self) -> int:
        """The device-memory box in bytes."""
        return self.state.device_memory_bytes()

    # -- actions: the state's, then the view is drawn again -------------------------------------------
    def _then_refresh(self, action: Callable[[], Any]) -> Any:
        try:
            return action()
        finally:
            self._refresh()

    def update_plan(self) -> Plan | None:
        """Plan from the controls (and simulate if live); a refused combination keeps the plan
        and shows the planner's message."""
        return self._then_refresh(self.state.update_plan)

    def simulate(self) -> Run:
        """Simulate the current plan on the selected device profile (labelled simulated).

        >>> PlanExplorer("wan2.1-t2v-1.3b", host="64GiB", live=False).simulate().simulated
        True
        """
        return self._then_refresh(self.state.simulate)

    def run(self, **overrides: Any) -> Run:
        """Profile the real model with ``fn`` under the current controls, on this machine
        (see :meth:`ExplorerState.run`)."""
        return self._then_refresh(lambda: self.state.run(**overrides))

    def add_to_comparison(self, run: Run | None = None) -> list[Run]:
        """Keep ``run`` (default: the last one) in the comparison; returns the runs kept.

        >>> ex = PlanExplorer("wan2.1-t2v-1.3b", host="64GiB", live=False)
        >>> _ = ex.simulate(); len(ex.add_to_comparison())
        1
        """
        return self._then_refresh(lambda: self.state.add_to_comparison(run))

    def all_pinned_shortfall(self) -> tuple[str | None, str | None]:
        """``(why impossible, what is short)`` for an all-pinned arm on the selected host.

        >>> PlanExplorer("wan2.1-t2v-14b", host="64GiB", live=False).all_pinned_shortfall()
        (None, None)
        """
        return self.state.all_pinned_shortfall()

    def compare_tiers(self, tiers: Sequence[str] = ("pinned", "pageable"), measured: bool = False) -> list[Run]:
        """Every streamed layer forced to each tier in turn, each run kept in the comparison
        (see :meth:`ExplorerState.compare_tiers`).

        >>> ex = PlanExplorer("wan2.1-t2v-14b", host="64GiB", live=False)
        >>> pinned, pageable = ex.compare_tiers(("pinned", "pageable"))
        >>> pageable.step_time >= pinned.step_time * (1 - 1e-9), len(ex.runs)  # hidden at best
        (True, 2)
        """
        return self._then_refresh(lambda: self.state.compare_tiers(tiers, measured))

    def clear_comparison(self) -> None:
        """Forget the runs kept for comparison."""
        return self._then_refresh(self.state.clear_comparison)

    def export_report(self, path: str | Path | None = None) -> Path:
        """Write an offline HTML report of the runs kept (else the last run) and the plan.

        >>> ex = PlanExplorer("wan2.1-t2v-1.3b", host="64GiB")
        >>> ex.export_report("/tmp/explorer-doctest.html").name
        'explorer-doctest.html'
        """
        return self._then_refresh(lambda: self.state.export_report(path))

    def recommend(self) -> Any:
        """Search on the selected profile, host and device memory; load the best plan.

        >>> ex = PlanExplorer("wan2.1-t2v-14b", profile="rtx4090-pcie4", host="64GiB", live=False)
        >>> rec = ex.recommend()
        >>> ex.plan.tier_counts == rec.best.tier_counts
        True
        """
        return self._then_refresh(self.state.recommend)

    def load_tried(self, plan_id: int) -> Plan | None:
        """Set the controls to plan ``plan_id`` of the last recommendation and plan again."""
        return self._then_refresh(lambda: self.state.load_tried(plan_id))

    def on_front_click(self, trace: Any, points: Any, _state: Any = None) -> Plan | None:
        """A click on the front scatter: load the plan of the clicked point."""
        inds = list(getattr(points, "point_inds", []) or [])
        if not inds:
            return None
        plan_id = int(list(trace.customdata)[inds[0]])
        if plan_id not in [v for _, v in self.state.front_options]:
            self.state.front_choice = None
        return self.load_tried(plan_id)

    def _button(self, action: Callable[[], Any]) -> None:
        # a failure goes to the status line: an exception in a widget callback would only
        # reach the browser's console
        self.state.guard(action)
        self._refresh()

    # -- widgets --------------------------------------------------------------------------------------
    def _build_widgets(self) -> None:
        st, c = self.state, self.state.controls
        wide = _box("380px")
        self.title = W.HTML(st.title_html())
        self.host_choice = W.Dropdown(options=st.host_options(), value=c.host, description="host",
                                      style=_STYLE, layout=wide)
        self.budget = W.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.01,
                                    description=f"pin budget ({st.unit_name})", style=_STYLE,
                                    continuous_update=False, layout=_box("460px"))
        self.budget_note = W.HTML()
        # a count applies to every group (capped at its size): say so where there are several
        per_group = "resident per group" if len(st.spec.groups) > 1 else "resident layers"
        self.resident = W.IntSlider(value=c.resident, min=0, max=st.resident_max, description=per_group,
                                    style=_STYLE, continuous_update=False, layout=wide)
        self.resident_note = W.HTML()
        self.residency = W.Dropdown(options=list(RESIDENCIES), value=c.residency, description="residency",
                                    style=_STYLE, layout=wide)
        self.order = W.Dropdown(options=list(ORDERS), value=c.order, description="pin order",
                                style=_STYLE, layout=wide)
        self.prefetch = W.IntSlider(value=c.prefetch, min=0, max=st.prefetch_max, description="prefetch depth",
                                    style=_STYLE, continuous_update=False, layout=wide)
        self.tier = W.Dropdown(options=[("planner's choice", AUTO)] + [(t, t) for t in st.tier_options],
                               value=c.tier, description="forced tier", style=_STYLE, layout=wide)
        self.issue = W.Dropdown(options=list(ISSUE_ORDERS), value=c.issue, description="issue order",
                                style=_STYLE, layout=wide,
                                tooltip="when the runtime issues a layer's copy: after the previous "
                                        "layer's compute, or before it (offload(issue=...))")
        self.passes = W.Dropdown(options=[("1 call" if n == 1 else f"{n} calls (guidance)", n)
                                          for n in PASSES_CHOICES], value=c.passes,
                                 description="calls per step", style=_STYLE, layout=wide,
                                 tooltip="forwards of the model per denoising step: 2 with "
                                         "classifier-free guidance")
        self.profile_choice = W.Dropdown(options=list(st.profiles), value=c.profile,
                                         description="device profile", style=_STYLE, layout=wide)
        self.steps = W.BoundedIntText(value=c.steps, min=1, max=STEPS_BOX_MAX, description="steps",
                                      style=_STYLE, layout=_box("240px"))
        self.live = W.Checkbox(value=c.live, description="simulate on every change", indent=False,
                               layout=_box("240px"))
        self.device_memory = W.BoundedFloatText(
            value=c.device_memory, min=0.5, max=4096.0, step=1.0, description="device GiB",
            style=_STYLE, layout=_box("260px"), tooltip="device memory the plan must fit (estimated peak)")
        self.report_path = W.Text(value=c.report_path, description="report file", style=_STYLE,
                                  layout=_box("380px"))
        #: control name (a field of Controls) -> the widget that holds it
        self.controls: dict[str, Any] = {
            "host": self.host_choice, "budget": self.budget, "resident": self.resident,
            "residency": self.residency, "order": self.order, "prefetch": self.prefetch, "tier": self.tier,
            "profile": self.profile_choice, "steps": self.steps, "issue": self.issue, "passes": self.passes,
            "live": self.live, "device_memory": self.device_memory, "report_path": self.report_path,
        }
        for name, w in self.controls.items():
            w.observe(lambda change, name=name: self._on_control(name, change["new"]), names="value")
        self._build_actions()
        self._layout()

    def _build_actions(self) -> None:
        st = self.state
        self.simulate_button = W.Button(description="Simulate", button_style="primary",
                                        tooltip="predict this plan's timeline on the device profile")
        self.run_button = W.Button(description="Run", button_style="success", disabled=st.fn is None,
                                   tooltip=("profile the real model with fn under this plan"
                                            if st.fn else "needs PlanExplorer(model, fn=...)"))
        self.add_button = W.Button(description="Add to comparison", disabled=True, layout=_box("160px"))
        self.tiers_button = W.Button(description="pinned vs pageable", layout=_box("160px"))
        self.clear_button = W.Button(description="Clear comparison", layout=_box("160px"))
        self.export_button = W.Button(description="Export report", icon="download", layout=_box("160px"))
        self.recommend_button = W.Button(description="Recommend", button_style="info",
                                         tooltip="search the plan space with the simulator and load the "
                                                 "fastest plan that fits host and device")
        self.front_choice = W.Dropdown(options=[], description="front plan", disabled=True,
                                       style=_STYLE, layout=_box("460px"))
        self.front_choice.observe(self._on_front_choice, names="value")
        # beside the Run button: the run it shows the progress of
        self.progress = W.IntProgress(value=0, min=0, max=1, description="running…",
                                      style={"description_width": "initial"},
                                      layout=W.Layout(width="260px", visibility="hidden"))
        self.status = W.HTML()
        self.ledger_html = W.HTML()
        self.reasons_html = W.HTML()
        self.comparison_html = W.HTML()
        self.recommend_html = W.HTML()
        # the Engines tab: simulated on demand (about 13 engine settings), never on a control change
        self.engines_button = W.Button(description="Compare engines", button_style="info", layout=_box("160px"),
                                       tooltip="simulate diffusers', SGLang's and offload-lab's offload settings "
                                               "for this model on the profile, host and device memory")
        self.engines_html = W.HTML()
        self.engines_out = W.Output()
        self.engines_button.on_click(lambda _b: self._button(st.compare_engines))
        self.timeline_out = W.Output()
        self.tier_map_out = W.Output()
        self.ledger_out = W.Output()
        self.comparison_out = W.Output()
        self.recommend_out = W.Output()
        for button, action in ((self.simulate_button, st.simulate),
                               (self.add_button, st.add_to_comparison), (self.tiers_button, st.compare_tiers),
                               (self.clear_button, st.clear_comparison), (self.export_button, st.export_report),
                               (self.recommend_button, st.recommend)):
            button.on_click(lambda _b, action=action: self._button(action))
        self.run_button.on_click(lambda _b: self._run_clicked())

    def _layout(self) -> None:
        tabs = W.Tab(children=[
            self.timeline_out, self.tier_map_out,
            W.VBox([self.ledger_html, self.ledger_out, self.reasons_html]),
            W.VBox([self.comparison_html, self.comparison_out]),
            W.VBox([self.recommend_html, self.recommend_out]),
            W.VBox([self.engines_button, self.engines_html, self.engines_out]),
        ])
        for i, name in enumerate(TAB_TITLES):
            tabs.set_title(i, name)
        self.tabs = tabs
        self.widget = W.VBox([
            self.title,
            _row(self.host_choice, self.budget), self.budget_note,
            _row(self.resident, self.residency, self.order), self.resident_note,
            _row(self.prefetch, self.tier, self.profile_choice),
            _row(self.issue, self.passes, self.steps, self.live),
            _row(self.simulate_button, self.run_button, self.progress, self.add_button, self.tiers_button,
                 self.clear_button),
            _row(self.export_button, self.report_path),
            _row(self.device_memory, self.recommend_button, self.front_choice),
            self.status, tabs,
        ])

    # -- widgets → state ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _sync(self) -> Iterator[None]:
        """Write widgets from the state without their observers writing the state back."""
        was, self._syncing = self._syncing, True
        try:
            yield
        finally:
            self._syncing = was

    def _on_control(self, name: str, value: Any) -> None:
        if self._syncing:
            return
        self._button(lambda: self.state.set(**{name: value}))

    def _on_front_choice(self, change: dict) -> None:
        if self._syncing or change.get("new") is None:
            return
        self._button(lambda: self.state.load_tried(int(change["new"])))

    def _progress(self, done: int, total: int) -> None:
        self.progress.max, self.progress.value = total, done
        self.progress.layout.visibility = "visible"
        self.status.value = self.state.status_html()  # "running…", not the result before

    def _run_clicked(self) -> None:
        """Run, with the button off, the progress bar beside it and the status saying running…"""
        if self._running:
            return  # a second click while one run measures
        self._running = True
        self.run_button.disabled = True
        try:
            self._button(self.state.run)
        finally:
            self._running = False
            self.run_button.disabled = self.state.fn is None
            self.progress.layout.visibility = "hidden"

    # -- state → widgets --------------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Draw what the state holds: control values and ranges, texts, buttons and figures."""
        st, c = self.state, self.state.controls
        with self._sync():
            if list(self.profile_choice.options) != list(st.profiles):
                self.profile_choice.options = list(st.profiles)
            self.budget.max = st.budget_max  # the range first: a value is clamped to it
            self.budget.step = st.budget_step
            self.budget.readout_format = f".{st.budget_digits}f"
            self.prefetch.max = st.prefetch_max
            front = [(t, v) for t, v in st.front_options]
            if list(self.front_choice.options) != front:
                self.front_choice.options = front
            self.front_choice.value = st.front_choice if st.front_choice in [v for _, v in front] else None
            self.front_choice.disabled = not front
            for name, w in self.controls.items():
                v = getattr(c, name)
                if w.value != v:
                    w.value = v
        if not self._running:
            self.progress.layout.visibility = "hidden"
        # the open tab's figure first: it reaches the page while the rest is made (the status
        # line simulates the other issue order; hidden tabs are drawn last, so a notebook saved
        # with its widget state still holds every figure)
        shown = self.tabs.selected_index or 0
        self._draw_figures([shown])
        self.budget_note.value = st.budget_note()
        self.resident_note.value = st.resident_note()
        self.status.value = st.status_html()
        self.ledger_html.value = st.ledger_html()
        self.reasons_html.value = st.reasons_html()
        self.comparison_html.value = st.comparison_html
        self.recommend_html.value = st.recommend_html
        self.engines_html.value = st.engines_view_html()
        self.add_button.disabled = st.last_run is None
        possible, tip = st.tiers_tooltip()
        self.tiers_button.disabled, self.tiers_button.tooltip = not possible, tip
        self._draw_figures([t for t in range(len(TAB_TITLES)) if t != shown])

    def _draw_figures(self, tabs: Sequence[int] | None = None) -> None:
        """Draw the figures of ``tabs`` (default: all), each only when it changed."""
        st, figs = self.state, self.state.figures
        tabs = range(len(TAB_TITLES)) if tabs is None else tabs
        for tab in tabs:
            if tab == 0:
                self._draw(self.timeline_out, figs.get("timeline"))
            elif tab == 1:
                self._draw(self.tier_map_out, figs.get("tier_map"))
            elif tab == 2 and len(st.spec.groups) > 1:
                self._draw(self.ledger_out, figs.get("startup_peaks"))
            elif tab == 3:
                self._draw(self.comparison_out, figs.get("step_times"), figs.get("bandwidth"), empty=not st.runs)
            elif tab == 4:
                # a click on a point of the front loads its plan
                self._draw(self.recommend_out, figs.get("recommend_front"), on_click=self.on_front_click)
            elif tab == 5:
                self._draw(self.engines_out, figs.get("engines"))

    def _draw(self, out: W.Output, *figs: Any, empty: bool = False,
              on_click: Callable[[Any, Any], Any] | None = None) -> None:
        """Render figures into ``out`` when they are not the ones it shows; ``empty`` clears it.

        In a kernel with ``anywidget`` each figure slot of ``out`` holds one
        :class:`~offload_lab.notebook.plot_view.PlotView`, sent once; a new figure for the slot
        is sent as its JSON in one message, and plotly.js redraws the plot on the page in place
        instead of building a new one. Elsewhere (and without ``anywidget``) the figures are
        sent whole.
        """
        figs = () if empty else tuple(f for f in figs if f is not None)
        if not figs and not empty:
            return  # nothing to draw yet
        if self._is_shown(out, figs):
            return
        self._shown[id(out)] = figs  # the figures themselves: their ids stay theirs while held
        if figs and display.in_kernel() and self._update_in_place(out, figs, on_click):
            return
        old = self._widgets.pop(id(out), ())
        display.render(out, *figs)
        self._close(old)

    def _update_in_place(self, out: W.Output, figs: tuple[Any, ...],
                         on_click: Callable[[Any, Any], Any] | None = None) -> bool:
        """Show ``figs`` in ``out`` through its PlotViews; False when there are none here."""
        make = _plot_view_class()
        if make is None:
            return False
        held = self._widgets.get(id(out))
        if held is not None and len(held) == len(figs) and all(id(w) in self._live for w in held):
            for widget, fig in zip(held, figs):
                widget.show(fig)
            return True
        # new widgets, with each figure's static HTML beside: where no page draws the widgets (a
        # headless run exporting the notebook) the next figure comes this way too, so the saved
        # outputs always hold the figure on display
        old = held or ()
        held = self._widgets[id(out)] = [make(fig) for fig in figs]
        for w in held:
            # a page that draws the widget says so: from then on new figures reach it in place
            w.observe(lambda _change, w=w: self._live.add(id(w)), names="drawn")
            if on_click is not None:
                w.on_click(on_click)
        out.outputs = tuple(_widget_output(w, fig) for w, fig in zip(held, figs))
        self._close(old)
        return True

    def _close(self, widgets: Sequence[Any]) -> None:
        """Close figure widgets no output shows any more (their models would stay in the page)."""
        for w in widgets:
            self._live.discard(id(w))
            w.close()

    def _is_shown(self, out: W.Output, figs: tuple[Any, ...]) -> bool:
        shown = self._shown.get(id(out))
        return shown is not None and len(shown) == len(figs) and all(a is b for a, b in zip(shown, figs))

    # -- in a notebook ----------------------------------------------------------------------------------
    def _ipython_display_(self) -> None:
        """Show :data:`RESTART_NOTICE` as an output of its own, then the dashboard."""
        from IPython.display import HTML
        from IPython.display import display as show

        show(HTML(RESTART_NOTICE))
        show(self._repr_mimebundle_(), raw=True)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude)
        bundle["text/plain"] = repr(self)
        return bundle

    def __repr__(self) -> str:
        plan = self.plan.summary() if self.plan is not None else f"no plan ({self.error})"
        return f"<PlanExplorer {self.spec.name!r}: {plan}; {len(self.runs)} run(s) kept>"
