"""``PlanExplorer``: an ipywidgets dashboard to change a plan and see its timeline at once.

Controls (pin budget, resident count and policy, ordering, prefetch depth, forced tier, host,
device profile, device memory) make a :class:`~offload_lab.planning.planner.Plan`; **Recommend**
searches for the fastest plan that fits and sets the controls to it; **Simulate** predicts its timeline on
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

The class is assembled from its controls (:mod:`offload_lab.notebook.controls`), its display
(:mod:`offload_lab.notebook.display`) and the actions below. Importing this module imports
ipywidgets; ``import offload_lab`` does not.
"""

from __future__ import annotations

import html
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from offload_lab.analysis import summary as analysis
from offload_lab.model.spec import ModelSpec
from offload_lab.notebook.controls import (
    _TIERS_TIP,
    GIB,
    HYPOTHETICAL_HOSTS_GIB,
    MIB,
    ControlsMixin,
    ExplorerError,
)
from offload_lab.notebook.display import DisplayMixin
from offload_lab.notebook.explorer_recommend import RecommendMixin
from offload_lab.notebook.magic import spec_for_model
from offload_lab.planning.hostmem import HostMemory
from offload_lab.planning.options import (
    BACKENDS,
    FORCED_TIERS,
    MAX_STEPS,
    OptionError,
    parse_tokens,
)
from offload_lab.planning.planner import Plan, PlanWarning, store_bytes
from offload_lab.planning.planner import plan as make_plan
from offload_lab.record.run import Run, display_label
from offload_lab.units import format_bytes
from offload_lab.views import figures as viz

__all__ = ["PlanExplorer", "ExplorerError", "HYPOTHETICAL_HOSTS_GIB"]


class PlanExplorer(RecommendMixin, ControlsMixin, DisplayMixin):
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
        if backend not in BACKENDS:
            raise ExplorerError(f"backend {backend!r} is not one of {', '.join(map(repr, BACKENDS))}")
        for what, v, lo in (("steps", steps, 1), ("warmup", warmup, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= MAX_STEPS:
                raise ExplorerError(f"{what} {v!r} is not accepted; expected an int in {lo}..{MAX_STEPS}")
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
        self._build_recommend()
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

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude)
        bundle["text/plain"] = repr(self)
        return bundle

    def __repr__(self) -> str:
        plan = self.plan.summary() if self.plan is not None else f"no plan ({self.error})"
        return f"<PlanExplorer {self.spec.name!r}: {plan}; {len(self.runs)} run(s) kept>"

    # -- controls → plan ------------------------------------------------------------------------
    def _make_plan(self, host: HostMemory, **overrides: Any) -> Plan:
        # the plan is checked against the device memory box (its ledger shows the estimated peak)
        kwargs = {**self.plan_kwargs(), "device_memory": self.device_memory_bytes(), "tokens": self.tokens,
                  **overrides}
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
        self._update_resident_note()
        self._refresh_tiers_button()
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
        from offload_lab.views.report_data import same_plan
        from offload_lab.views.text import fmt_step

        measured = [r for r in self.runs if not r.simulated and same_plan(r, run)]
        beside = (f"; measured {viz.fmt_seconds(measured[-1].step_time)} under the same plan "
                  f"({run.step_time / measured[-1].step_time - 1:+.1%} predicted vs measured)") if measured else ""
        self._set_last(run, f"simulated on {self.profile_choice.value}: "
                            f"{fmt_step(run.step_time, run.meta)} per step{beside}")
        return run

    def run(self, **overrides: Any) -> Run:
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
        p = self._make_plan(here, **overrides)
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
        peak = run.meta.get("device_peak") or {}
        if peak:
            note += (f"; device peak predicted {format_bytes(peak['predicted_bytes'])} (estimate), measured "
                     f"{format_bytes(peak['measured_bytes'])}")
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
            self.message = f"kept {display_label(run)!r}: {len(self.runs)} run(s) in the comparison"
        self._show_comparison()
        return self.runs

    def all_pinned_shortfall(self) -> tuple[str | None, str | None]:
        """``(why impossible, what is short)`` for an all-pinned arm on the selected host.

        The first is set when not one streamed layer can be pinned (nothing streamed, or the
        host can spend less than the smallest); the second when only some can.

        >>> PlanExplorer("wan2.1-t2v-14b", host="64GiB", live=False).all_pinned_shortfall()
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

    def _refresh_tiers_button(self) -> None:
        why, _ = self.all_pinned_shortfall()
        self.tiers_button.disabled = why is not None
        self.tiers_button.tooltip = f"not possible: {why}" if why else _TIERS_TIP

    def _tier_overrides(self, tier: str) -> dict[str, Any]:
        # the pinned arm is all pinned: the pin budget control would make it the mixed plan again
        return {"tier": tier, "pin_budget": None} if tier == "pinned" else {"tier": tier}

    def compare_tiers(self, tiers: Sequence[str] = ("pinned", "pageable"),
                      measured: bool = False) -> list[Run]:
        """Every streamed layer forced to each tier in turn, the other controls kept (the pinned
        arm ignores the pin budget: it pins all the host can afford, and says when that is not
        everything); each run is simulated (or measured with ``measured=True``) and added to the
        comparison.

        >>> ex = PlanExplorer("wan2.1-t2v-14b", host="64GiB", live=False)
        >>> pinned, pageable = ex.compare_tiers(("pinned", "pageable"))
        >>> pageable.step_time >= pinned.step_time * (1 - 1e-9), len(ex.runs)  # hidden at best
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
        from offload_lab.simulation import simulate

        out = []
        for t in tiers:
            if measured:
                out.append(self.run(**self._tier_overrides(t)))
            else:
                p = self._make_plan(self.host, **self._tier_overrides(t))
                run = simulate(p, self._profile(), steps=int(self.steps.value),
                               tokens=self.tokens)
                self._set_last(run, f"simulated {t}")
                out.append(run)
            self.add_to_comparison(out[-1])
        steps = " vs ".join(f"{viz.fmt_seconds(r.step_time)}" for r in out)
        kind = "measured" if measured else "simulated"
        self.message = f"{' vs '.join(tiers)}: {steps} per step ({kind})"
        if short:
            self.message += f"; not all pinned: {short}, so the pinned run pins what fits"
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

