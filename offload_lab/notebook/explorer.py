"""``PlanExplorer``: an ipywidgets dashboard to change a plan and see its timeline at once.

Controls (pin budget, resident count and policy, ordering, prefetch depth, forced tier, host,
device profile) make a :class:`~offload_lab.planning.planner.Plan`; **Simulate** predicts its timeline on
a device profile (instant, labelled simulated), **Run** profiles the real model with ``fn``
(on the GPU when there is one, else the cpu backend, labelled with the backend), **Add to
comparison** keeps a run, **pinned vs pageable** simulates the headline comparison, and
**Export report** writes one offline HTML file.

All logic lives in plain methods (:meth:`PlanExplorer.update_plan`, :meth:`~PlanExplorer.simulate`,
:meth:`~PlanExplorer.run`, :meth:`~PlanExplorer.add_to_comparison`,
:meth:`~PlanExplorer.compare_tiers`, :meth:`~PlanExplorer.export_report`) and their results in
attributes (``plan``, ``last_run``, ``runs``, ``figures``, ``error``), so it works and is tested
without a browser: set a control's ``.value`` or ``.click()`` a button, then read them.

>>> from offload_lab import catalog
>>> ex = PlanExplorer(catalog.load("wan2.1-t2v-14b"), host="64GiB", live=False)
>>> ex.budget.value = 8.0                       # GiB
>>> ex.plan.tier_counts["pinned"]
12
>>> ex.simulate_button.click()
>>> ex.last_run.simulated, "timeline" in ex.figures
(True, True)

Importing this module imports ipywidgets; ``import offload_lab`` does not.
"""

from __future__ import annotations

import contextlib
import html
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as W

from offload_lab.analysis import summary as analysis
from offload_lab.model.spec import ModelSpec
from offload_lab.notebook.magic import figure_bundle, spec_for_model
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.planner import (
    FORCED_TIERS,
    ORDERS,
    RESIDENCIES,
    Plan,
    PlanWarning,
    pinned_footprint,
    store_bytes,
)
from offload_lab.planning.planner import plan as make_plan
from offload_lab.record.run import Run
from offload_lab.units import format_bytes, parse_size
from offload_lab.views import figures as viz

__all__ = ["PlanExplorer", "ExplorerError", "HYPOTHETICAL_HOSTS_GIB"]

#: host sizes (GiB available) offered besides this machine, to ask "what if the host had ..."
HYPOTHETICAL_HOSTS_GIB = (16, 32, 64, 128, 256, 512)
GIB, MIB = 2**30, 2**20
_AUTO = "auto"


class ExplorerError(ValueError):
    """An argument PlanExplorer cannot use; the message names it and what is accepted."""


def _in_kernel() -> bool:
    """True inside a Jupyter kernel, where Output widgets capture displays."""
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


def _nice_step(span: float) -> float:
    """A round slider step giving about 200 positions over ``span``."""
    if span <= 0:
        return 0.01
    return max(10 ** math.floor(math.log10(span / 200)), 0.001)


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
        self.model, self.spec = self._resolve_model(model_or_spec)
        if fn is not None and not callable(fn):
            raise ExplorerError(f"fn {fn!r:.60} is not callable; expected a function of no "
                                f"arguments that runs one step, e.g. lambda: model(**inputs)")
        if fn is not None and self.model is None:
            raise ExplorerError("fn was given but model_or_spec is a spec: Run needs the live "
                                "torch.nn.Module; pass the module instead of its spec")
        if backend not in ("auto", "cuda", "cpu"):
            raise ExplorerError(f"backend {backend!r} is not one of 'auto', 'cuda', 'cpu'")
        for what, v, lo in (("steps", steps, 1), ("warmup", warmup, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ExplorerError(f"{what} {v!r} is not accepted; expected an int ≥ {lo}")
        self.fn, self.tokens, self.warmup, self.backend = fn, tokens, warmup, backend
        self.plan: Plan | None = None
        self.error: str | None = None
        self.plan_error: str | None = None  # why the controls make no plan, while they don't
        self.last_run: Run | None = None
        self.runs: list[Run] = []
        self.figures: dict[str, Any] = {}
        self.report_file: Path | None = None
        self.message = ""
        self._suspended = False
        self._layer_total = sum(store_bytes(layer)[0] for layer in self.spec.iter_layers())
        self._unit, self._unit_name = (GIB, "GiB") if self._layer_total >= GIB else (MIB, "MiB")
        self._probe: HostMemory | None = None
        self._given_host = self._resolve_host(host)
        self.profiles = self._resolve_profiles(profile)
        self._build_widgets(steps, report_path, live)
        self._update_budget_range(keep_max=True)
        self.update_plan()

    # -- inputs ------------------------------------------------------------------------------
    @staticmethod
    def _resolve_model(obj: Any) -> tuple[Any, ModelSpec]:
        if isinstance(obj, ModelSpec):
            return None, obj
        if isinstance(obj, str):
            from offload_lab.model import catalog

            return None, catalog.load(obj)
        try:
            from torch import nn
        except ImportError:  # pragma: no cover - torch is a dependency
            nn = None
        if nn is not None and isinstance(obj, nn.Module):
            return obj, spec_for_model(obj)
        raise ExplorerError(f"model_or_spec {obj!r:.60} is a {type(obj).__name__}; expected a "
                            f"torch.nn.Module, a ModelSpec or a catalog name such as "
                            f"'wan2.1-t2v-14b'")

    def _resolve_host(self, host: Any) -> HostMemory | None:
        if host is None or isinstance(host, HostMemory):
            return host
        if isinstance(host, (str, int, float)) and not isinstance(host, bool):
            try:
                return HostMemory(available=parse_size(host, "host"))
            except ValueError as e:
                raise ExplorerError(f"host {host!r}: {e}") from None
        raise ExplorerError(f"host {host!r:.60} is not accepted; expected None (this machine), a "
                            f"HostMemory or an available size such as '64GiB'")

    @staticmethod
    def _resolve_profiles(profile: Any) -> dict[str, Any]:
        from offload_lab.simulation import DeviceProfile, names

        shipped = names()
        profiles: dict[str, Any] = {n: n for n in shipped}
        if profile is None:
            first = "h200" if "h200" in shipped else shipped[0]
            return {first: first, **profiles}
        if isinstance(profile, DeviceProfile):
            key = profile.name if profile.name not in shipped else f"{profile.name} (given)"
            return {key: profile, **profiles}
        if isinstance(profile, str):
            try:
                DeviceProfile.load(profile)  # names the shipped profiles when it is unknown
            except ValueError as e:
                raise ExplorerError(f"profile {profile!r}: {e}") from None
            key = profile.strip().lower()
            return {key: profile, **{k: v for k, v in profiles.items() if k != key}}
        raise ExplorerError(f"profile {profile!r:.60} is not accepted; expected a DeviceProfile or "
                            f"one of {shipped}")

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

    # -- widgets -----------------------------------------------------------------------------
    def _build_widgets(self, steps: int, report_path: str, live: bool) -> None:
        style = {"description_width": "110px"}
        wide = W.Layout(width="340px")
        groups = self.spec.groups
        biggest = max(g.num_layers for g in groups)
        self.title = W.HTML(
            f"<b>PlanExplorer · {html.escape(self.spec.name)}</b> — "
            f"{sum(g.num_layers for g in groups)} layers in {len(groups)} group(s) "
            f"({', '.join(f'{html.escape(g.name)}: {g.num_layers}' for g in groups)}), "
            f"{format_bytes(self._layer_total)} of layer weights")
        self.host_choice = W.Dropdown(options=self._host_options(), value=self._default_host_key(),
                                      description="host", style=style, layout=wide)
        self.budget = W.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.01,
                                    description=f"pin budget ({self._unit_name})", style=style,
                                    continuous_update=False, layout=W.Layout(width="420px"))
        self.budget_note = W.HTML()
        self.resident = W.IntSlider(value=0, min=0, max=biggest, description="resident layers",
                                    style=style, continuous_update=False, layout=wide)
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
        self.simulate_button = W.Button(description="Simulate", button_style="primary",
                                        tooltip="predict this plan's timeline on the device profile")
        self.run_button = W.Button(description="Run", button_style="success",
                                   disabled=self.fn is None,
                                   tooltip=("profile the real model with fn under this plan"
                                            if self.fn else "needs PlanExplorer(model, fn=...)"))
        self.add_button = W.Button(description="Add to comparison", disabled=True)
        self.tiers_button = W.Button(description="pinned vs pageable",
                                     tooltip="simulate this plan with every streamed layer pinned, "
                                             "then pageable, and add both to the comparison")
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
            W.HBox([self.resident, self.residency, self.order]),
            W.HBox([self.prefetch, self.tier, self.profile_choice]),
            W.HBox([self.steps, self.live]),
            W.HBox([self.simulate_button, self.run_button, self.add_button, self.tiers_button,
                    self.clear_button]),
            W.HBox([self.export_button, self.report_path, self.progress]),
            self.status, tabs,
        ])

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude)
        bundle["text/plain"] = repr(self)
        return bundle

    def __repr__(self) -> str:
        plan = self.plan.summary() if self.plan is not None else f"no plan ({self.error})"
        return f"<PlanExplorer {self.spec.name!r}: {plan}; {len(self.runs)} run(s) kept>"

    @contextlib.contextmanager
    def _hold(self) -> Iterator[None]:
        """Change several controls without replanning after each one."""
        was, self._suspended = self._suspended, True
        try:
            yield
        finally:
            self._suspended = was

    # -- controls → plan ------------------------------------------------------------------------
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

        >>> ex = PlanExplorer("wan2.1-t2v-14b", host="64GiB", live=False)
        >>> ex.pin_budget() is None, (setattr(ex.budget, "value", 4.0), ex.pin_budget())[1] == 4 * 2**30
        (True, True)
        """
        if self.budget.value >= self.budget.max - self.budget.step / 2:
            return None
        return int(round(self.budget.value * self._unit))

    def plan_kwargs(self) -> dict[str, Any]:
        """The arguments of :func:`offload_lab.plan` that the controls stand for (host aside).

        >>> PlanExplorer("wan2.1-t2v-1.3b", host="64GiB", live=False).plan_kwargs()["order"]
        'execution'
        """
        return {
            "pin_budget": self.pin_budget(), "resident": int(self.resident.value),
            "residency": self.residency.value, "order": self.order.value,
            "prefetch": int(self.prefetch.value),
            "tier": None if self.tier.value == _AUTO else self.tier.value,
        }

    def _make_plan(self, host: HostMemory, **overrides: Any) -> Plan:
        kwargs = {**self.plan_kwargs(), **overrides}
        with warnings.catch_warnings():
            # a plan's warnings are shown in the ledger; printing them too would repeat them
            warnings.simplefilter("ignore", PlanWarning)
            return make_plan(self.spec, host=host, **kwargs)

    def update_plan(self) -> Plan | None:
        """Plan from the controls; refresh the tier map, ledger and reasons (and simulate if live).

        A combination the planner refuses (say, tier ``pinned`` forced with a zero budget)
        keeps the previous plan, sets :attr:`error` and shows the planner's message.
        """
        try:
            self.plan = self._make_plan(self.host)
        except ValueError as e:
            self.error = self.plan_error = f"{type(e).__name__}: {e}"
            self._show_status()
            return None
        self.error = self.plan_error = None
        self.figures["tier_map"] = viz.tier_map(self.plan)
        if len(self.spec.groups) > 1:
            self.figures["startup_peaks"] = viz.startup_peaks(self.plan)
        self._show_plan()
        self._render(self.tier_map_out, self.figures["tier_map"])
        if len(self.spec.groups) > 1:
            self._render(self.ledger_out, self.figures["startup_peaks"])
        if self.live.value:
            self._guard(self.simulate)
        else:
            self._show_status()
        return self.plan

    def _on_change(self, _change: dict) -> None:
        if not self._suspended:
            self.update_plan()

    def _on_host(self, _change: dict) -> None:
        if self._suspended:
            return
        self._update_budget_range()
        self.update_plan()

    # -- plan → runs ------------------------------------------------------------------------------
    def _profile(self) -> Any:
        return self.profiles[self.profile_choice.value]

    def simulate(self) -> Run:
        """Simulate the current plan on the selected device profile (labelled simulated).

        >>> PlanExplorer("wan2.1-t2v-1.3b", host="64GiB", live=False).simulate().simulated
        True
        """
        from offload_lab.simulation import simulate

        if self.plan is None or self.plan_error:
            # the plan on display is the last valid one; simulating it would mislabel the result
            raise ExplorerError(f"the controls make no valid plan to simulate: {self.plan_error}")
        run = simulate(self.plan, self._profile(), steps=int(self.steps.value),
                       tokens=self.tokens)
        self._set_last(run, f"simulated on {self.profile_choice.value}: "
                            f"{viz.fmt_seconds(run.step_time)} per step")
        return run

    def run(self) -> Run:
        """Profile the real model with ``fn`` under the current controls, on this machine.

        The plan is made again against this machine's memory (a hypothetical host could grant
        pins this machine cannot afford); the status line says when that changed any tier.
        """
        from offload_lab.record.runtime import profile

        if self.model is None or self.fn is None:
            raise ExplorerError("Run needs the live model and fn: PlanExplorer(model, "
                                "fn=lambda: model(**inputs))")
        here = HostMemory.probe()
        self._probe = here
        p = self._make_plan(here)
        note = ""
        if self.plan is not None and list(p.layers["tier"]) != list(self.plan.layers["tier"]):
            note = (f" (planned again for this machine: {analysis.tier_summary(p.layers)}; the "
                    f"displayed plan is for the selected host)")
        backend = self.backend
        if backend == "auto":
            import torch

            backend = "cuda" if torch.cuda.is_available() else "cpu"
        label = f"{analysis.tier_summary(p.layers)} · prefetch {p.prefetch} · measured on {backend}"
        steps = int(self.steps.value)
        self.progress.max, self.progress.value = steps + self.warmup, 0
        self.progress.layout.visibility = "visible"
        try:
            run = profile(self.model, self.fn, p, steps=steps, warmup=self.warmup, backend=backend,
                          label=label, progress=lambda k, _n: setattr(self.progress, "value", k))
        finally:
            self.progress.layout.visibility = "hidden"
        self._offer_calibrated(run)
        self._set_last(run, f"measured on {backend}: {viz.fmt_seconds(run.step_time)} per step{note}")
        return run

    def _offer_calibrated(self, run: Run) -> None:
        """Add a profile fitted to the measured run to the profile list (not selected)."""
        from offload_lab.simulation import calibrate

        try:
            fitted = calibrate(run)
        except ValueError:
            return  # a run the fit cannot read (e.g. nothing streamed): nothing to offer
        key = f"calibrated from run {len([k for k in self.profiles if k.startswith('calibrated')]) + 1}"
        self.profiles[key] = fitted
        with self._hold():
            self.profile_choice.options = list(self.profiles)

    def _set_last(self, run: Run, message: str) -> None:
        self.last_run = run
        self.message = message
        self.figures["timeline"] = viz.timeline(run)
        self.add_button.disabled = False
        self._render(self.timeline_out, self.figures["timeline"])
        self._show_status()

    def add_to_comparison(self, run: Run | None = None) -> list[Run]:
        """Keep ``run`` (default: the last one) in the comparison; returns the runs kept.

        >>> ex = PlanExplorer("wan2.1-t2v-1.3b", host="64GiB", live=False)
        >>> _ = ex.simulate(); len(ex.add_to_comparison())
        1
        """
        run = run if run is not None else self.last_run
        if run is None:
            raise ExplorerError("there is no run to add yet: press Simulate or Run first")
        if not isinstance(run, Run):
            raise ExplorerError(f"run {run!r:.60} is not an offload_lab.Run")
        if all(r is not run for r in self.runs):
            self.runs.append(run)
            self.message = f"kept {run.label!r}: {len(self.runs)} run(s) in the comparison"
        self._show_comparison()
        return self.runs

    def compare_tiers(self, tiers: Sequence[str] = ("pinned", "pageable"),
                      measured: bool = False) -> list[Run]:
        """Every streamed layer forced to each tier in turn, the other controls kept; each run
        is simulated (or measured with ``measured=True``) and added to the comparison.

        >>> ex = PlanExplorer("wan2.1-t2v-14b", host="64GiB", live=False)
        >>> pinned, pageable = ex.compare_tiers(("pinned", "pageable"))
        >>> pageable.step_time > pinned.step_time, len(ex.runs)
        (True, 2)
        """
        bad = [t for t in tiers if t not in FORCED_TIERS]
        if isinstance(tiers, str) or bad or not tiers:
            raise ExplorerError(f"tiers {tiers!r} is not accepted; expected a list of "
                                f"{', '.join(FORCED_TIERS)}")
        if measured and (self.model is None or self.fn is None):
            raise ExplorerError("measured=True needs the live model and fn")
        from offload_lab.simulation import simulate

        out = []
        with self._hold():
            before = self.tier.value
            try:
                for t in tiers:
                    if measured:
                        self.tier.value = t
                        out.append(self.run())
                    else:
                        p = self._make_plan(self.host, tier=t)
                        run = simulate(p, self._profile(), steps=int(self.steps.value),
                                       tokens=self.tokens)
                        self._set_last(run, f"simulated {t}")
                        out.append(run)
                    self.add_to_comparison(out[-1])
            finally:
                self.tier.value = before
        steps = " vs ".join(f"{viz.fmt_seconds(r.step_time)}" for r in out)
        self.message = f"{' vs '.join(tiers)}: {steps} per step ({'measured' if measured else 'simulated'})"
        self._show_status()
        return out

    def clear_comparison(self) -> None:
        """Forget the runs kept for comparison."""
        self.runs.clear()
        self.figures.pop("step_times", None)
        self.figures.pop("bandwidth", None)
        self.message = "comparison cleared"
        self._show_comparison()
        self._show_status()

    def export_report(self, path: str | Path | None = None) -> Path:
        """Write an offline HTML report of the runs kept (else the last run) and the plan.

        >>> ex = PlanExplorer("wan2.1-t2v-1.3b", host="64GiB")
        >>> ex.export_report("/tmp/explorer-doctest.html").name
        'explorer-doctest.html'
        """
        from offload_lab.views.report import report

        runs = list(self.runs) or ([self.last_run] if self.last_run is not None else [])
        if not runs and self.plan is None:
            raise ExplorerError("nothing to report yet: Simulate or Run first")
        target = Path(path if path is not None else self.report_path.value)
        self.report_file = report(runs, plan=self.plan,
                                  title=f"PlanExplorer · {self.spec.name}").save(target)
        self.message = (f"report written to <a href='{html.escape(str(self.report_file))}' "
                        f"target='_blank'>{html.escape(str(self.report_file))}</a>")
        self._show_status(raw=True)
        return self.report_file

    # -- display ---------------------------------------------------------------------------------
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
