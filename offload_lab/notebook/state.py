"""The explorer without its widgets: :class:`ExplorerState` holds the controls' values, the plan
they make, the runs, the figures and the texts a view shows.

:class:`~offload_lab.notebook.explorer.PlanExplorer` is a widget view over one state: its
controls write :attr:`ExplorerState.controls` through :meth:`ExplorerState.set`, its buttons
call the actions (:meth:`~ExplorerState.simulate`, :meth:`~ExplorerState.run`,
:meth:`~ExplorerState.recommend`, ...) and it draws what the state says (:meth:`~ExplorerState.status_html`,
:attr:`~ExplorerState.figures`, ...). Nothing here imports ipywidgets, so the explorer's logic runs
and is tested in any Python.

>>> st = ExplorerState("wan2.1-t2v-14b", host="64GiB", live=False)
>>> _ = st.set(budget=8.0)                       # GiB
>>> st.plan.tier_counts["pinned"]
12
>>> st.simulate().simulated, "timeline" in st.figures
(True, True)

A control is one field of :class:`Controls` (its value, as the widget holds it) plus the place
the state reads it (:meth:`ExplorerState.plan_kwargs` for the planner, :meth:`ExplorerState.sim_kwargs`
for the simulator); a line of the status is one entry of :meth:`ExplorerState.status_lines`.
"""

from __future__ import annotations

import dataclasses
import html
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from offload_lab.analysis.summary import tier_summary
from offload_lab.checks import check_int
from offload_lab.engines.compare import compare as compare_engines
from offload_lab.engines.compare import figure as engines_figure
from offload_lab.errors import OffloadLabError
from offload_lab.model import catalog
from offload_lab.model.pipeline import PipelineSpec
from offload_lab.model.spec import ModelSpec
from offload_lab.notebook import display
from offload_lab.notebook.models import spec_for_model
from offload_lab.planning.hostmem import HostMemory, resolve_host
from offload_lab.planning.options import (
    BACKENDS,
    FORCED_TIERS,
    ISSUE_ORDERS,
    MAX_STEPS,
    OptionError,
    parse_tokens,
)
from offload_lab.planning.planner import Plan, PlanWarning, store_bytes
from offload_lab.planning.planner import plan as make_plan
from offload_lab.record.run import Run, display_label
from offload_lab.simulation.calibration import calibrate
from offload_lab.simulation.engine import simulate
from offload_lab.simulation.evidence import issue_of, streams_host_blocking
from offload_lab.simulation.profile import DeviceProfile, names
from offload_lab.simulation.recommend import recommend, step_text
from offload_lab.units import SizeError, format_bytes
from offload_lab.views import figures as viz
from offload_lab.views.report import report
from offload_lab.views.report_data import same_plan
from offload_lab.views.report_recommend import front_figure
from offload_lab.views.text import evidence_text, fmt_seconds

__all__ = ["ExplorerState", "Controls", "ExplorerError", "HYPOTHETICAL_HOSTS_GIB", "AUTO", "PASSES_CHOICES"]

#: host sizes (GiB available) offered besides this machine, to ask "what if the host had ..."
HYPOTHETICAL_HOSTS_GIB = (16, 32, 64, 128, 256, 512)
GIB, MIB = 2**30, 2**20
#: the tier control's "planner's choice"
AUTO = "auto"
#: the most steps the steps box offers (a dashboard simulates while you wait)
STEPS_BOX_MAX = 50
#: the calls per step the guidance control offers: one call, or two with classifier-free guidance
PASSES_CHOICES = (1, 2)
#: plans and simulated runs kept for controls set again (a slider moved back and forth)
_CACHE_SIZE = 64
TIERS_TIP = ("simulate this plan with every streamed layer pinned (as far as the host can "
             "afford), then pageable, and add both to the comparison")
_NO_RUNS_YET = ("<i>No runs kept yet: Simulate or Run, then Add to comparison (or press pinned vs "
                "pageable).</i>")
_NO_ENGINES_YET = ("<i>Press Compare engines: diffusers', SGLang's and offload-lab's offload settings "
                   "for this model on the selected profile, host and device memory (simulated).</i>")
_NO_RECOMMENDATION = ("<i>Press Recommend: the fastest plans that fit this host and device "
                      "(simulated).</i>")


class ExplorerError(OffloadLabError, ValueError):
    """An argument PlanExplorer cannot use; the message names it and what is accepted."""


class LazyFigures(dict):
    """The state's figures by name; a figure registered with :meth:`later` is made when it is
    first read, so a figure no view shows (a hidden tab's) costs nothing on a control change.

    >>> figs = LazyFigures()
    >>> figs.later("answer", lambda: 42)
    >>> "answer" in figs, dict.__contains__(figs, "answer"), figs["answer"]
    (True, False, 42)
    """

    def __init__(self) -> None:
        super().__init__()
        self._makers: dict[str, Callable[[], Any]] = {}

    def later(self, name: str, make: Callable[[], Any]) -> None:
        dict.pop(self, name, None)
        self._makers[name] = make

    def _make_all(self) -> None:
        for name in list(self._makers):
            self[name]

    def __getitem__(self, name: str) -> Any:
        make = self._makers.pop(name, None)
        if make is not None:
            dict.__setitem__(self, name, make())
        return dict.__getitem__(self, name)

    def __setitem__(self, name: str, value: Any) -> None:
        self._makers.pop(name, None)
        dict.__setitem__(self, name, value)

    def __contains__(self, name: object) -> bool:
        return name in self._makers or dict.__contains__(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def pop(self, name: str, *default: Any) -> Any:
        if name in self._makers:
            self[name]
        return dict.pop(self, name, *default)

    def __iter__(self):  # noqa: ANN204 - dict's own signature
        self._make_all()
        return dict.__iter__(self)

    def __len__(self) -> int:
        return dict.__len__(self) + len(self._makers)

    def keys(self):  # noqa: ANN201
        self._make_all()
        return dict.keys(self)

    def values(self):  # noqa: ANN201
        self._make_all()
        return dict.values(self)

    def items(self):  # noqa: ANN201
        self._make_all()
        return dict.items(self)

    def __repr__(self) -> str:
        self._make_all()
        return dict.__repr__(self)


def _nice_step(span: float) -> float:
    """A round slider step giving about 200 positions over ``span``.

    >>> _nice_step(26.6), _nice_step(0)
    (0.1, 0.01)
    """
    if span <= 0:
        return 0.01
    return max(10 ** math.floor(math.log10(span / 200)), 0.001)


@dataclass
class Controls:
    """What the explorer's controls hold, one field per control, in the widgets' units."""

    host: str = "probe"            # "given", "probe" or a hypothetical size such as "64GiB"
    budget: float = 0.0            # pin budget in the state's unit (GiB or MiB); the top: everything
    resident: int = 0
    residency: str = "leading"
    order: str = "execution"
    prefetch: int = 1
    tier: str = AUTO
    profile: str = ""              # a key of ExplorerState.profiles
    steps: int = 3
    issue: str = "after-compute"   # the runtime's issue order (offload_lab.offload(issue=...))
    passes: int = 1                # calls of the model per step: 2 with classifier-free guidance
    live: bool = True
    device_memory: float = 24.0    # GiB the plan must fit on the device
    report_path: str = "offload-report.html"


CONTROL_NAMES = tuple(f.name for f in dataclasses.fields(Controls))


class ExplorerState:
    """One model's explorer: controls → plan → simulate / run → figures and comparison.

    The arguments are :class:`~offload_lab.notebook.explorer.PlanExplorer`'s (see there).
    Change controls with :meth:`set`; read :attr:`plan`, :attr:`last_run`, :attr:`runs`,
    :attr:`figures` (plotly figures by name), :attr:`message` and :attr:`error`.

    >>> st = ExplorerState("minimax-h3", host="64GiB", live=False)
    >>> st.set(resident=35, residency="strided").streamed_layers("blocks")[:3]
    [1, 5, 8]
    """

    def __init__(self, model_or_spec: Any, fn: Callable[[], Any] | None = None,
                 profile: Any = None, host: HostMemory | str | int | None = None, *,
                 tokens: int | str | None = None, steps: int = 3, warmup: int = 1,
                 backend: str = "auto", report_path: str = "offload-report.html",
                 live: bool = True) -> None:
        self.model, self.spec = _resolve_model(model_or_spec)
        if fn is not None and not callable(fn):
            raise ExplorerError(f"fn {fn!r:.60} is not callable; expected a function of no "
                                f"arguments that runs one step, e.g. lambda: model(**inputs)")
        if fn is not None and self.model is None:
            raise ExplorerError("fn was given but model_or_spec is a spec: Run needs the live "
                                "torch.nn.Module; pass the module instead of its spec")
        if backend not in BACKENDS:
            raise ExplorerError(f"backend {backend!r} is not one of {', '.join(map(repr, BACKENDS))}")
        for what, v, lo in (("steps", steps, 1), ("warmup", warmup, 0)):
            check_int(what, v, minimum=lo, maximum=MAX_STEPS, error=ExplorerError)
        if tokens is not None:
            try:
                tokens = parse_tokens(tokens)  # the same counts and resolutions as the CLI
            except OptionError as e:
                raise ExplorerError(str(e)) from None
        self.fn, self.tokens, self.warmup, self.backend = fn, tokens, warmup, backend
        self.plan: Plan | None = None
        self.error: str | None = None
        self.plan_error: str | None = None  # why the controls make no plan, while they don't
        self.last_run: Run | None = None
        self.runs: list[Run] = []
        self.figures: dict[str, Any] = LazyFigures()
        self.report_file: Path | None = None
        self._message, self._message_is_html = "", False
        self.recommendation: Any = None
        self.recommend_html = _NO_RECOMMENDATION
        self.front_options: list[tuple[str, int]] = []
        self.front_choice: int | None = None
        self.comparison_html = _NO_RUNS_YET
        #: the Engines view: engines.compare()'s frame, its table, the controls it was made for
        self.engines_frame: pd.DataFrame | None = None
        self.engines_html = _NO_ENGINES_YET
        self._engines: dict[Any, pd.DataFrame] = {}
        self._engines_key: Any = None
        #: called with (done, total) while :meth:`run` profiles (a view's progress bar)
        self.on_progress: Callable[[int, int], None] | None = None
        #: True while :meth:`run` measures (the status then says "running…", not an old result)
        self.running = False
        self._plans: dict[Any, Plan] = {}        # plan key -> plan (see _make_plan)
        self._plan_figures: dict[Any, dict] = {}  # plan key -> its figures (tier map, start-up peaks)
        self._sims: dict[Any, Run] = {}          # plan key + profile + simulator options -> run
        self._timelines: dict[int, Any] = {}     # id of a cached run -> its timeline figure
        self._plan_key: Any = None               # the key of the plan on display
        self._last_key: Any = None               # the key the last simulated run was made from
        self.layer_total = sum(store_bytes(layer)[0] for layer in self.spec.iter_layers())
        self.unit, self.unit_name = (GIB, "GiB") if self.layer_total >= GIB else (MIB, "MiB")
        self._probe: HostMemory | None = None
        self._given_host = _resolve_host(host)
        self.profiles = _resolve_profiles(profile)
        biggest = max(g.num_layers for g in self.spec.groups)
        self.resident_max = biggest
        self.prefetch_max = max(1, min(4, biggest))
        self.tier_options = [t for t in FORCED_TIERS if t != "mapped" or self.spec.mapped_bytes > 0]
        self.budget_max, self.budget_step, self.budget_digits = 1.0, 0.01, 2
        self.controls = Controls(host=self._default_host_key(), profile=next(iter(self.profiles)),
                                 steps=min(steps, STEPS_BOX_MAX), live=live, report_path=report_path)
        mem = self._profile_memory_gib()
        if mem is not None:
            self.controls.device_memory = mem
        self._update_budget_range(keep_max=True)
        self.update_plan()

    # -- controls ---------------------------------------------------------------------------------
    def set(self, **changes: Any) -> Plan | None:
        """Change controls (``budget=8.0``, ``tier="pageable"``, ...) and plan again once.

        A new host keeps a budget at the top of its range at the top (and clamps the rest); a
        new device profile brings its memory size into ``device_memory``. Returns the plan the
        controls now make (``None`` when the planner refuses them; :attr:`error` says why).

        >>> st = ExplorerState("wan2.1-t2v-1.3b", host="64GiB", live=False)
        >>> st.set(colour="red")
        Traceback (most recent call last):
        ...
        offload_lab.notebook.state.ExplorerError: control 'colour' is not one of host, budget, resident, residency, order, prefetch, tier, profile, steps, issue, passes, live, device_memory, report_path
        """
        bad = [k for k in changes if k not in CONTROL_NAMES]
        if bad:
            raise ExplorerError(f"control {bad[0]!r} is not one of {', '.join(CONTROL_NAMES)}")
        c = self.controls
        if "host" in changes and changes["host"] not in [v for _, v in self.host_options()]:
            raise ExplorerError(f"host {changes['host']!r} is not one of {[v for _, v in self.host_options()]}")
        if "profile" in changes and changes["profile"] not in self.profiles:
            raise ExplorerError(f"profile {changes['profile']!r} is not one of {list(self.profiles)}")
        if "issue" in changes and changes["issue"] not in ISSUE_ORDERS:
            raise ExplorerError(f"issue {changes['issue']!r} is not one of {list(ISSUE_ORDERS)}")
        if "passes" in changes and changes["passes"] not in PASSES_CHOICES:
            raise ExplorerError(f"passes {changes['passes']!r} is not one of {list(PASSES_CHOICES)} "
                                f"(calls of the model per step; 2 with classifier-free guidance)")
        new_host = "host" in changes and changes["host"] != c.host
        new_profile = "profile" in changes and changes["profile"] != c.profile
        for k, v in changes.items():
            setattr(c, k, v)
        c.resident = max(0, min(int(c.resident), self.resident_max))
        c.prefetch = max(0, min(int(c.prefetch), self.prefetch_max))
        c.steps = max(1, min(int(c.steps), STEPS_BOX_MAX))
        c.budget = max(0.0, min(float(c.budget), self.budget_max))
        if new_host:
            self._update_budget_range()
        if new_profile and "device_memory" not in changes:
            mem = self._profile_memory_gib()
            if mem is not None:
                c.device_memory = mem
        if set(changes) <= {"live", "report_path"}:
            return self.plan  # neither changes the plan
        return self.update_plan()

    def _cached(self, cache: dict, key: Any, make: Callable[[], Any]) -> Any:
        # a small insertion-ordered cache: a slider moved back to a value redraws without work
        if key in cache:
            return cache[key]
        value = cache[key] = make()
        while len(cache) > _CACHE_SIZE:
            cache.pop(next(iter(cache)))
        return value

    @property
    def host(self) -> HostMemory:
        """The host the displayed plan is made for (the host control)."""
        key = self.controls.host
        if key == "given" and self._given_host is not None:
            return self._given_host
        if key == "probe":
            return self._probe_host()
        return HostMemory(available=key)

    def host_options(self) -> list[tuple[str, str]]:
        """``(text, key)`` of every host the host control offers."""
        opts = []
        if self._given_host is not None:
            opts.append((f"given: {format_bytes(self._given_host.available)} available", "given"))
        probe = self._probe_host()
        opts.append((f"this machine: {format_bytes(probe.available)} available", "probe"))
        opts += [(f"hypothetical: {g} GiB available", f"{g}GiB") for g in HYPOTHETICAL_HOSTS_GIB]
        return opts

    def _probe_host(self) -> HostMemory:
        if self._probe is None:
            self._probe = HostMemory.probe()
        return self._probe

    def _default_host_key(self) -> str:
        if self._given_host is not None:
            return "given"
        if self.model is not None:
            return "probe"
        for g in HYPOTHETICAL_HOSTS_GIB:
            if HostMemory(available=g * GIB).spendable >= self.layer_total:
                return f"{g}GiB"
        return f"{HYPOTHETICAL_HOSTS_GIB[-1]}GiB"

    def _update_budget_range(self, keep_max: bool = False) -> None:
        cap = min(self.host.spendable, self.layer_total)
        step = _nice_step(cap / self.unit)
        # round up to the step so the slider's top position means "all of it"
        top = math.ceil(cap / self.unit / step) * step
        c = self.controls
        at_max = keep_max or c.budget >= self.budget_max - self.budget_step / 2
        self.budget_max, self.budget_step = top, _nice_step(top)
        c.budget = top if at_max else min(c.budget, top)
        self.budget_digits = max(0, -int(math.floor(math.log10(self.budget_step)))) if self.budget_step < 1 else 0

    def pin_budget(self) -> int | None:
        """The budget control in bytes; ``None`` at the top (everything the host can spend).

        >>> st = ExplorerState("wan2.1-t2v-14b", host="64GiB", live=False)
        >>> st.pin_budget() is None, (st.set(budget=4.0), st.pin_budget())[1] == 4 * 2**30
        (True, True)
        """
        if self.controls.budget >= self.budget_max - self.budget_step / 2:
            return None
        return int(round(self.controls.budget * self.unit))

    def plan_kwargs(self) -> dict[str, Any]:
        """The arguments of :func:`offload_lab.plan` that the controls stand for (host aside).

        >>> ExplorerState("wan2.1-t2v-1.3b", host="64GiB", live=False).plan_kwargs()["order"]
        'execution'
        """
        c = self.controls
        return {
            "pin_budget": self.pin_budget(), "resident": int(c.resident), "residency": c.residency,
            "order": c.order, "prefetch": int(c.prefetch), "tier": None if c.tier == AUTO else c.tier,
        }

    def sim_kwargs(self) -> dict[str, Any]:
        """The arguments of :func:`offload_lab.simulate` that the controls stand for (plan and device aside).

        >>> st = ExplorerState("wan2.1-t2v-1.3b", host="64GiB", live=False)
        >>> st.set(issue="before-compute", passes=2) and sorted(st.sim_kwargs().items())
        [('issue', 'before-compute'), ('passes', 2), ('steps', 3), ('tokens', None)]
        """
        c = self.controls
        return {"steps": int(c.steps), "tokens": self.tokens, "issue": c.issue, "passes": int(c.passes)}

    def device_memory_bytes(self) -> int:
        """The device-memory control in bytes."""
        return int(round(float(self.controls.device_memory) * GIB))

    def profile(self) -> Any:
        """The selected device profile (a shipped name or a :class:`~offload_lab.simulation.DeviceProfile`)."""
        return self.profiles[self.controls.profile]

    def _profile_memory_gib(self) -> float | None:
        prof = self.profile()
        if isinstance(prof, str):
            prof = DeviceProfile.load(prof)
        return None if prof.memory_bytes is None else round(prof.memory_bytes / GIB, 2)

    # -- the message of the status line ----------------------------------------------------------
    @property
    def message(self) -> str:
        """What the last action says (plain text, unless an action wrote HTML such as a link)."""
        return self._message

    @message.setter
    def message(self, text: str) -> None:
        self._message, self._message_is_html = text, False

    def guard(self, action: Callable[[], Any]) -> Any:
        """Run an action; keep a failure in :attr:`error` instead of raising it (a view's button
        callback would only send it to the browser's console)."""
        self.error = self.plan_error  # a new action starts clean, but a broken plan stays said
        try:
            return action()
        except Exception as e:  # noqa: BLE001 - every failure must reach the user's eyes
            self.error = f"{type(e).__name__}: {e}"
            return None

    # -- controls → plan ------------------------------------------------------------------------
    def _plan_args(self, host: HostMemory, **overrides: Any) -> tuple[dict[str, Any], Any]:
        # the plan is checked against the device memory control (its ledger shows the estimated peak)
        kwargs = {**self.plan_kwargs(), "device_memory": self.device_memory_bytes(), "tokens": self.tokens,
                  **overrides}
        key = (host.available, host.reserve, host.source, tuple(sorted(kwargs.items())))
        return kwargs, key

    def _make_plan(self, host: HostMemory, **overrides: Any) -> Plan:
        kwargs, key = self._plan_args(host, **overrides)

        def make() -> Plan:
            with warnings.catch_warnings():
                # a plan's warnings are shown in the ledger and the status line; printing them too
                # would repeat them
                warnings.simplefilter("ignore", PlanWarning)
                return make_plan(self.spec, host=host, **kwargs)

        return self._cached(self._plans, key, make)

    def _simulate(self, plan: Plan, plan_key: Any, **overrides: Any) -> Run:
        """``simulate(plan, profile, **sim_kwargs)``, once per plan, profile and options."""

        kw = {**self.sim_kwargs(), **overrides}
        key = (plan_key, self.controls.profile, tuple(sorted(kw.items())))
        return self._cached(self._sims, key, lambda: simulate(plan, self.profile(), **kw))

    def _sim_key(self) -> tuple[Any, tuple]:
        return self._plan_key, tuple(sorted(self.sim_kwargs().items()))

    def other_order_run(self) -> Run | None:
        """The last simulated run's plan in the other issue order (same profile, steps and calls);
        None when the order does not change the plan (pinned copies only, or nothing streamed),
        when the last run is measured, or when there is none.

        >>> st = ExplorerState("wan2.1-t2v-14b", host="64GiB", live=False)
        >>> _ = st.set(tier="pageable"); _ = st.simulate()
        >>> st.other_order_run().meta["issue"], st.other_order_run().meta["evidence"]["status"]
        ('before-compute', 'held-out')
        """

        run = self.last_run
        if run is None or not run.simulated or self._last_key is None or not streams_host_blocking(run):
            return None
        plan_key, kw = self._last_key
        plan = self._plans.get(plan_key)
        if plan is None:
            return None
        kw = dict(kw)  # the options the shown run was simulated with, whatever the controls say now
        kw["issue"] = next(o for o in ISSUE_ORDERS if o != kw["issue"])
        return self._simulate(plan, plan_key, **kw)

    def update_plan(self) -> Plan | None:
        """Plan from the controls (and simulate it when ``live``).

        A combination the planner refuses (say, tier ``pinned`` forced with a zero budget)
        keeps the previous plan and sets :attr:`error` to the planner's message.
        """
        try:
            _, key = self._plan_args(self.host)
            plan = self._make_plan(self.host)
        except ValueError as e:
            self.error = self.plan_error = f"{type(e).__name__}: {e}"
            return None
        self.error = self.plan_error = None
        if plan is not self.plan or "tier_map" not in self.figures:
            # only a new plan is drawn again: a simulator option (issue order, calls, steps,
            # profile) leaves the plan and its figures as they are

            drawn = self._cached(self._plan_figures, key, dict)  # this plan's figures made so far
            names = {"tier_map": viz.tier_map}
            if len(self.spec.groups) > 1:
                names["startup_peaks"] = viz.startup_peaks
            for name, draw in names.items():
                def make(name: str = name, draw: Callable[[Any], Any] = draw) -> Any:
                    if name not in drawn:
                        drawn[name] = draw(plan)
                    return drawn[name]

                self.figures.later(name, make)
            self.plan, self._plan_key = plan, key
        if self.controls.live:
            self.guard(self.simulate)
        return self.plan

    # -- plan → runs ------------------------------------------------------------------------------
    def simulate(self) -> Run:
        """Simulate the current plan on the selected device profile (labelled simulated).

        >>> ExplorerState("wan2.1-t2v-1.3b", host="64GiB", live=False).simulate().simulated
        True
        """

        if self.plan is None or self.plan_error:
            # the plan on display is the last valid one; simulating it would mislabel the result
            raise ExplorerError(f"the controls make no valid plan to simulate: {self.plan_error}")
        run = self._simulate(self.plan, self._plan_key)
        measured = [r for r in self.runs if not r.simulated and same_plan(r, run)]
        beside = (f"; measured {fmt_seconds(measured[-1].step_time)} under the same plan "
                  f"({run.step_time / measured[-1].step_time - 1:+.1%} predicted vs measured)") if measured else ""
        self._set_last(run, f"simulated on {self.controls.profile}, {step_words(run)}{beside}")
        self._last_key = self._sim_key()
        return run

    def run(self, **overrides: Any) -> Run:
        """Profile the real model with ``fn`` under the current controls, on this machine.

        The plan is made again against this machine's memory (a hypothetical host could grant
        pins this machine cannot afford); the message says when that changed any tier.
        ``overrides`` are :func:`offload_lab.plan` arguments that replace the controls'.
        """
        from offload_lab.record.runtime import profile  # heavy: torch

        if self.model is None or self.fn is None:
            raise ExplorerError("Run needs the live model and fn: PlanExplorer(model, "
                                "fn=lambda: model(**inputs))")
        here = HostMemory.probe()
        self._probe = here
        p = self._make_plan(here, **overrides)
        note = ""
        if self.plan is not None and list(p.layers["tier"]) != list(self.plan.layers["tier"]):
            note = (f" (planned again for this machine: {tier_summary(p.layers)}; the "
                    f"displayed plan is for the selected host)")
        backend = self.backend
        if backend == "auto":
            import torch

            backend = "cuda" if torch.cuda.is_available() else "cpu"
        issue = self.controls.issue
        label = f"{tier_summary(p.layers)} · prefetch {p.prefetch} · {issue} · measured on {backend}"
        steps = int(self.controls.steps)
        total = steps + self.warmup
        tell = self.on_progress or (lambda _k, _n: None)
        # the status says "running…" until the run ends, never the result of the run before
        self.running, self.message = True, f"running… {total} step(s) on {backend} ({issue})"
        try:
            tell(0, total)
            run = profile(self.model, self.fn, p, steps=steps, warmup=self.warmup, backend=backend,
                          label=label, progress=lambda k, _n: tell(k, total), issue=issue)
        except BaseException:
            self.message = f"run on {backend} failed"
            raise
        finally:
            self.running = False
        self._offer_calibrated(run)
        peak = run.meta.get("device_peak") or {}
        if peak and backend == "cuda":
            note += (f"; device peak predicted {format_bytes(peak['predicted_bytes'])} (estimate), measured "
                     f"{format_bytes(peak['measured_bytes'])}")
        elif peak:
            # the cpu backend has no device memory: its number is the weights it holds as one
            note += (f"; no device peak on the {backend} backend (it held "
                     f"{format_bytes(peak['measured_bytes'])} of weights as its device, no activations)")
        self._set_last(run, f"measured on {backend} ({issue}): {fmt_seconds(run.step_time)} per step "
                            f"(one call of fn){note}")
        return run

    def _offer_calibrated(self, run: Run) -> None:
        """Add a profile fitted to the measured run to the profiles offered (not selected)."""

        try:
            fitted = calibrate(run)
        except ValueError:
            return  # a run the fit cannot read (e.g. nothing streamed): nothing to offer
        key = f"calibrated from run {len([k for k in self.profiles if k.startswith('calibrated')]) + 1}"
        self.profiles[key] = fitted

    def _set_last(self, run: Run, message: str) -> None:
        self.message = message
        self._last_key = None  # set again by simulate(), the one action whose other order is shown
        if run is self.last_run and "timeline" in self.figures:
            return  # the same (cached) run: its figure is on display already
        self.last_run = run
        held = self._timelines.get(id(run))
        if held is not None and held[0] is run:
            self.figures["timeline"] = held[1]
        else:
            fig = self.figures["timeline"] = viz.timeline(run)
            if any(r is run for r in self._sims.values()):
                self._timelines = {k: v for k, v in self._timelines.items()
                                   if any(r is v[0] for r in self._sims.values())}
                self._timelines[id(run)] = (run, fig)

    def add_to_comparison(self, run: Run | None = None) -> list[Run]:
        """Keep ``run`` (default: the last one) in the comparison; returns the runs kept.

        >>> st = ExplorerState("wan2.1-t2v-1.3b", host="64GiB", live=False)
        >>> _ = st.simulate(); len(st.add_to_comparison())
        1
        """
        run = run if run is not None else self.last_run
        if run is None:
            raise ExplorerError("there is no run to add yet: press Simulate or Run first")
        if not isinstance(run, Run):
            raise ExplorerError(f"run {run!r:.60} is not an offload_lab.Run")
        if all(r is not run for r in self.runs):
            self.runs.append(run)
            self.message = f"kept {display_label(run)!r}: {len(self.runs)} run(s) in the comparison"
        self._comparison_changed()
        return self.runs

    def _comparison_changed(self) -> None:
        if self.runs:
            self.figures["step_times"] = viz.step_times(self.runs)
            self.figures["bandwidth"] = viz.bandwidth(self.runs)
        else:
            self.figures.pop("step_times", None)
            self.figures.pop("bandwidth", None)
        self.comparison_html = display.comparison_html(self.runs)

    def all_pinned_shortfall(self) -> tuple[str | None, str | None]:
        """``(why impossible, what is short)`` for an all-pinned arm on the selected host.

        The first is set when not one streamed layer can be pinned (nothing streamed, or the
        host can spend less than the smallest); the second when only some can.

        >>> ExplorerState("wan2.1-t2v-14b", host="64GiB", live=False).all_pinned_shortfall()
        (None, None)
        """
        if self.plan is None:
            return self.plan_error or "no plan", None
        df = self.plan.layers
        streamed = [int(b) for b in df.loc[df["streamed"], "bytes"]]
        if not streamed:
            return "every layer is resident: nothing is streamed, so tiers make no difference", None
        spend = self.host.spendable
        if min(streamed) > spend:
            return (f"the host can spend {format_bytes(spend)} on pins, less than the smallest "
                    f"streamed layer ({format_bytes(min(streamed))})"), None
        if sum(streamed) > spend:
            return None, (f"the host can spend {format_bytes(spend)}, all-pinned needs "
                          f"{format_bytes(sum(streamed))}")
        return None, None

    def tiers_tooltip(self) -> tuple[bool, str]:
        """``(possible, tooltip)`` of the pinned-vs-pageable action."""
        why, _ = self.all_pinned_shortfall()
        return why is None, (f"not possible: {why}" if why else TIERS_TIP)

    def compare_tiers(self, tiers: Sequence[str] = ("pinned", "pageable"), measured: bool = False) -> list[Run]:
        """Every streamed layer forced to each tier in turn, the other controls kept (the pinned
        arm ignores the pin budget: it pins all the host can afford, and says when that is not
        everything); each run is simulated (or measured with ``measured=True``) and added to the
        comparison.

        >>> st = ExplorerState("wan2.1-t2v-14b", host="64GiB", live=False)
        >>> pinned, pageable = st.compare_tiers(("pinned", "pageable"))
        >>> pageable.step_time >= pinned.step_time * (1 - 1e-9), len(st.runs)  # hidden at best
        (True, 2)
        """

        bad = [t for t in tiers if t not in FORCED_TIERS]
        if isinstance(tiers, str) or bad or not tiers:
            raise ExplorerError(f"tiers {tiers!r} is not accepted; expected a list of "
                                f"{', '.join(FORCED_TIERS)}")
        if measured and (self.model is None or self.fn is None):
            raise ExplorerError("measured=True needs the live model and fn")
        why, short = self.all_pinned_shortfall() if "pinned" in tiers else (None, None)
        if why is not None:
            raise ExplorerError(f"an all-pinned run is not possible: {why}")
        out = []
        for t in tiers:
            # the pinned arm is all pinned: the budget control would make it the mixed plan again
            over = {"tier": t, "pin_budget": None} if t == "pinned" else {"tier": t}
            if measured:
                out.append(self.run(**over))
            else:
                run = simulate(self._make_plan(self.host, **over), self.profile(), **self.sim_kwargs())
                self._set_last(run, f"simulated {t}")
                out.append(run)
            self.add_to_comparison(out[-1])
        steps = " vs ".join(f"{fmt_seconds(r.step_time)}" for r in out)
        self.message = f"{' vs '.join(tiers)}: {steps} per step ({'measured' if measured else 'simulated'})"
        if short:
            self.message += f"; not all pinned: {short}, so the pinned run pins what fits"
        return out

    def clear_comparison(self) -> None:
        """Forget the runs kept for comparison."""
        self.runs.clear()
        self._comparison_changed()
        self.message = "comparison cleared"

    def export_report(self, path: str | Path | None = None) -> Path:
        """Write an offline HTML report of the runs kept (else the last run) and the plan.

        >>> st = ExplorerState("wan2.1-t2v-1.3b", host="64GiB")
        >>> st.export_report("/tmp/explorer-state-doctest.html").name
        'explorer-state-doctest.html'
        """

        runs = list(self.runs) or ([self.last_run] if self.last_run is not None else [])
        if not runs and self.plan is None:
            raise ExplorerError("nothing to report yet: Simulate or Run first")
        target = Path(path if path is not None else self.controls.report_path)
        self.report_file = report(runs, plan=self.plan, title=f"PlanExplorer · {self.spec.name}").save(target)
        where = html.escape(str(self.report_file))
        self._message = f"report written to <a href='{where}' target='_blank'>{where}</a>"
        self._message_is_html = True
        return self.report_file

    # -- recommend ----------------------------------------------------------------------------------
    def recommend(self) -> Any:
        """Search on the selected profile, host and device memory; load the best plan.

        >>> st = ExplorerState("wan2.1-t2v-14b", profile="rtx4090-pcie4", host="64GiB", live=False)
        >>> rec = st.recommend()
        >>> st.plan.tier_counts == rec.best.tier_counts
        True
        """

        rec = recommend(self.spec, self.profile(), host=self.host, device_memory=self.device_memory_bytes(),
                        tokens=self.tokens, calls_per_step=int(self.controls.passes))
        self.recommendation = rec
        self.front_options = [(f"#{int(r['id'])}: {r['step_s']:.3f} s, {int(r['resident_layers'])} "
                               f"resident, prefetch {int(r['prefetch'])}", int(r["id"]))
                              for _, r in rec.front.iterrows()]
        self.front_choice = int(rec.best_row["id"]) if rec.best is not None else None
        self.recommend_html = (f"<p>{html.escape(rec.explanation)}</p>"
                               + rec._repr_html_().split("</p>", 2)[-1])
        if rec.best is None:
            self.message = f"recommend: {rec.explanation}"
            return rec
        fig = self.figures["recommend_front"] = front_figure(rec)
        # the legend under the plot: at its default place it covers the colour bar's title
        fig.update_layout(legend={"orientation": "h", "x": 0, "y": -0.22, "yanchor": "top"},
                          margin={"b": 90})
        self.load_tried(int(rec.best_row["id"]))
        guidance = int(self.spec.meta.get("guidance_passes", 1) or 1)
        self.message = (f"recommended (simulated on {rec.profile.name}): "
                        f"{step_text(float(rec.best_row['step_s']), rec.calls_per_step, guidance)}, "
                        f"device peak {format_bytes(int(rec.best_row['device_peak_bytes']))} of "
                        f"{format_bytes(rec.device_memory)}")
        return rec

    def load_tried(self, plan_id: int) -> Plan | None:
        """Set the controls to plan ``plan_id`` of the last recommendation (a row of its
        ``tried`` frame) and plan again; returns the plan the controls now make."""
        rec = self.recommendation
        if rec is None:
            raise ExplorerError("no recommendation yet: press Recommend first")
        rec.plan_at(plan_id)  # names the accepted ids on a bad one
        row = rec.tried.loc[plan_id]
        budget = int(row["pin_budget"])
        self.prefetch_max = max(self.prefetch_max, int(row["prefetch"]))
        if plan_id in [v for _, v in self.front_options]:
            self.front_choice = plan_id
        return self.set(resident=int(row["resident"]), residency=str(row["residency"]), order=str(row["order"]),
                        prefetch=int(row["prefetch"]), tier=str(row["tier"]) or AUTO,
                        # the top of the budget range: everything the host can spend
                        budget=self.budget_max if budget >= self.host.spendable else budget / self.unit)

    # -- engines ------------------------------------------------------------------------------------
    def engines_key(self) -> tuple[Any, ...]:
        """What :meth:`compare_engines` depends on: profile, host, device memory, tokens, calls."""
        c = self.controls
        return (c.profile, c.host, self.device_memory_bytes(), self.tokens, int(c.passes))

    def engines_stale(self) -> bool:
        """True when the Engines view shows a comparison made for other controls (or none yet)."""
        return self.engines_frame is None or self._engines_key != self.engines_key()

    def engines_view_html(self) -> str:
        """The Engines tab's text: the table, with a note when the controls moved since it was made."""
        if self.engines_frame is not None and self.engines_stale():
            return ("<p style='color:#b54708'>The controls changed since this comparison: press Compare "
                    "engines to make it for them.</p>" + self.engines_html)
        return self.engines_html

    def compare_engines(self) -> pd.DataFrame:
        """Other engines' offload settings for this model on the selected profile, host and device
        memory, simulated side by side (:func:`offload_lab.engines.compare`: about 13 settings, so
        it runs when asked, never on a control change); sets :attr:`engines_frame`,
        :attr:`engines_html` and ``figures["engines"]``.

        >>> st = ExplorerState("wan2.1-t2v-1.3b", host="64GiB", live=False)
        >>> df = st.compare_engines()
        >>> df.loc[0, "engine"], bool(df.loc[0, "fits"]), "engines" in st.figures
        ('diffusers-group', True, True)
        """
        key = self.engines_key()
        frame = self._cached(self._engines, key, lambda: compare_engines(
            self.spec, self.profile(), host=self.host, device_memory=self.device_memory_bytes(),
            tokens=self.tokens, calls=int(self.controls.passes)))
        self.engines_frame, self._engines_key = frame, key
        self.figures["engines"] = engines_figure(frame)
        prof = self.profile()
        name = prof if isinstance(prof, str) else prof.name
        self.engines_html = display.engines_html(
            frame, f"{self.spec.name} on {name}, host available {format_bytes(self.host.available)}, "
                   f"device memory {format_bytes(self.device_memory_bytes())}, {int(self.controls.passes)} call(s) per step")
        best = frame.loc[frame["fits"].astype(bool)].sort_values("step_s").head(1)
        self.message = ("engines compared (simulated): " + (
            f"fastest that fits {best['engine'].iloc[0]} ({best['settings'].iloc[0]}), "
            f"{fmt_seconds(float(best['step_s'].iloc[0]))} per step" if len(best) else "none fits"))
        return frame

    # -- what a view shows ----------------------------------------------------------------------------
    def status_lines(self) -> list[tuple[str, str | None, bool]]:
        """The status line's parts, ``(kind, text, is_html)``, in order (see :func:`display.status_html`).

        The plan (its budget in the slider's number and unit), the plan's warnings, the last
        action's message (a simulated step time with what it rests on, or "running…" while a
        run measures) and, where the plan streams pageable, mapped or staged layers, the other
        issue order's prediction with its own evidence.

        >>> st = ExplorerState("wan2.1-t2v-14b", host="64GiB", live=False)
        >>> _ = st.set(tier="pageable", passes=2); _ = st.simulate()
        >>> [k for k, text, _ in st.status_lines() if text]
        ['plan', 'message', 'other order']
        """
        other = None if self.running else self.other_order_run()
        stale = (self.last_run is not None and self.last_run.simulated and self._last_key is not None
                 and self._last_key != self._sim_key() and not self.running)
        message = self._message + (" — for the controls before the last change: press Simulate"
                                   if stale and not self._message_is_html else "")
        return [("plan", self.plan_line(), False),
                ("warning", "; ".join(self.plan.warnings) if self.plan is not None else None, False),
                ("message", message, self._message_is_html),
                ("other order", step_words(other) if other is not None else None, False),
                ("error", self.error, False)]

    def budget_text(self) -> str:
        """The pin budget as the slider shows it (its number, digits and unit).

        >>> st = ExplorerState("wan2.1-t2v-14b", host="32GiB", live=False)
        >>> st.budget_text()
        "26.2 GiB (the slider's top: everything the host can spend, 30.00 GiB)"
        """
        text = f"{self.controls.budget:.{self.budget_digits}f} {self.unit_name}"
        if self.pin_budget() is None:
            text += f" (the slider's top: everything the host can spend, {format_bytes(self.host.spendable)})"
        return text

    def plan_line(self) -> str | None:
        """The plan's summary, its budget written as the budget slider reads it."""
        if self.plan is None:
            return None
        text = self.plan.summary()
        led = self.plan.ledger or {}
        if "budget" in led:
            text = text.replace(f"of budget {format_bytes(led['budget'])}", f"of budget {self.budget_text()}", 1)
        return text

    def status_html(self) -> str:
        """The status line: the plan's summary, the last action's message and any error."""
        return display.status_html(self.status_lines())

    def ledger_html(self) -> str:
        return display.ledger_html(self.plan) if self.plan is not None else ""

    def reasons_html(self) -> str:
        return display.reasons_html(self.plan) if self.plan is not None else ""

    def title_html(self) -> str:
        groups = self.spec.groups
        return (f"<b>PlanExplorer · {html.escape(self.spec.name)}</b> — "
                f"{sum(g.num_layers for g in groups)} layers in {len(groups)} group(s) "
                f"({', '.join(f'{html.escape(g.name)}: {g.num_layers}' for g in groups)}), "
                f"{format_bytes(self.layer_total)} of layer weights")

    def budget_note(self) -> str:
        host = self.host
        return (f"<span style='color:#667085'>host can spend {format_bytes(host.spendable)} "
                f"(available {format_bytes(host.available)} − reserve {format_bytes(host.reserve)}); "
                f"layers total {format_bytes(self.layer_total)}</span>")

    def resident_note(self) -> str:
        """What a resident count means per group (35 on MiniMax-H3 keeps 35 + 2); empty for one group."""
        groups = self.spec.groups
        k = int(self.controls.resident)
        if len(groups) < 2:
            return ""
        each = ", ".join(f"{html.escape(g.name)} {min(k, g.num_layers)}" for g in groups)
        total = sum(min(k, g.num_layers) for g in groups)
        return (f"<span style='color:#667085'>{k} per group, capped at its size: {each} "
                f"({total} resident)</span>")

    def __repr__(self) -> str:
        plan = self.plan.summary() if self.plan is not None else f"no plan ({self.error})"
        return f"<ExplorerState {self.spec.name!r}: {plan}; {len(self.runs)} run(s) kept>"


def step_words(run: Run) -> str:
    """A simulated run's step time for the status line: its issue order, per call and per step
    (the calls spelled out), and what it rests on (± band, or the word that says no run does).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> p = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="64GiB"))
    >>> step_words(offload_lab.simulate(p, "h200", steps=1, passes=2))  # doctest: +ELLIPSIS
    'after-compute order: ... s per call × 2 calls = ... s per step (simulated; unconfirmed — no GPU run of this issue order yet)'
    """

    passes = int(run.meta.get("passes", 1) or 1)
    step = float(run.step_time)
    calls = (f"{fmt_seconds(step / passes)} per call × {passes} calls = {fmt_seconds(step)} per step"
             if passes > 1 else f"{fmt_seconds(step)} per step, 1 call per step")
    note = evidence_text(run.meta)
    return f"{issue_of(run)} order: {calls}" + (f" {note}" if note else "")


# -- inputs ---------------------------------------------------------------------------------------
def _resolve_model(obj: Any) -> tuple[Any, ModelSpec]:
    if isinstance(obj, ModelSpec):
        return None, obj
    if isinstance(obj, PipelineSpec):
        # every component's groups side by side (prefixed), as one run of the pipeline records them
        return None, obj.merged()
    if isinstance(obj, str):
        return None, catalog.load(obj)
    try:
        from torch import nn
    except ImportError:  # pragma: no cover - torch is a dependency
        nn = None
    if nn is not None and isinstance(obj, nn.Module):
        return obj, spec_for_model(obj)
    raise ExplorerError(f"model_or_spec {obj!r:.60} is a {type(obj).__name__}; expected a "
                        f"torch.nn.Module, a ModelSpec, a pipeline's spec (offload_lab.spec_of(pipe)) or a "
                        f"catalog name such as 'wan2.1-t2v-14b'")


def _resolve_host(host: Any) -> HostMemory | None:
    try:
        return resolve_host(host, probe=False)
    except ValueError as e:
        raise ExplorerError(f"host {host!r:.60}: {e}" if isinstance(e, SizeError) else str(e)) from None


def _resolve_profiles(profile: Any) -> dict[str, Any]:
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
