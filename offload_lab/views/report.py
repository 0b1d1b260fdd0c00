"""A self-contained, offline HTML report of runs (and optionally the plan behind them).

One file, plotly.js embedded once in ``<head>``, every figure written with
``include_plotlyjs=False, full_html=False``; no network access is needed to open it. The page is
rendered from ``templates/report.html.j2`` with Jinja2's autoescaping, so every string that
reaches the HTML is escaped; the only markup let through unescaped is the report's own stylesheet,
plotly.js, and each figure's HTML as plotly writes it. Strings inside figures are escaped before
plotly sees them and travel as JSON, which plotly writes with ``<``, ``>`` and ``/`` as ``\\u``
escapes, so a label such as ``</script>`` cannot end a script element (the tests check both).

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> host, prof = offload_lab.HostMemory(available="256GiB"), offload_lab.DeviceProfile.load("h200")
>>> runs = [offload_lab.simulate(offload_lab.plan(spec, tier=t, host=host), prof, steps=2, label=t)
...         for t in ("pinned", "pageable")]
>>> rep = offload_lab.report(runs, title="pinned vs pageable")
>>> path = rep.save("/tmp/offload-report-doctest.html")
>>> "SIMULATED" in path.read_text()
True
"""

from __future__ import annotations

import datetime as _dt
import html
import os
from collections.abc import Iterable, Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import pandas as pd
from markupsafe import Markup

from offload_lab import __version__
from offload_lab.analysis import summary
from offload_lab.analysis.comparison import compare, sim_device, tokens_of_meta
from offload_lab.analysis.ranks import is_multi_rank, rank_table, slowest_rank_run, split_ranks
from offload_lab.analysis.summary import as_runs
from offload_lab.engines.compare import COLUMNS as ENGINE_COLUMNS
from offload_lab.engines.compare import compare as compare_engines
from offload_lab.engines.compare import figure as engines_figure
from offload_lab.engines.errors import EngineError
from offload_lab.errors import OffloadLabError
from offload_lab.record.regime import issue_of
from offload_lab.record.run import Run
from offload_lab.simulation.confirm import Confirmation
from offload_lab.simulation.evidence import other_order
from offload_lab.simulation.profile import DeviceProfile
from offload_lab.simulation.recommend import Recommendation
from offload_lab.units import format_bytes
from offload_lab.views import figures as viz
from offload_lab.views import rank_figures
from offload_lab.views import report_data as rd
from offload_lab.views.report_recommend import front_figure, recommendation_data
from offload_lab.views.tables import noise_note
from offload_lab.views.text import fmt_seconds
from offload_lab.writing import atomic_write, kind_of

if TYPE_CHECKING:
    import plotly.graph_objects as go

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True,
                 "modeBarButtonsToRemove": ["lasso2d", "select2d", "autoScale2d"]}
_CPU_NOTE = ("On the cpu backend there is no DMA engine and no page-locking: the copy thread competes "
             "with compute for the same cores and memory bandwidth, so pinned and pageable runs take "
             "about the same time. On a GPU the gap depends on the issue order: runs in the "
             "before-compute order (every shipped H200 run) measure it, and the simulator reproduces "
             "them within its held-out band; its after-compute runs (offload-lab's default order) "
             "predict pageable copies hiding almost like pinned ones, unconfirmed by any GPU run yet.")


class ReportError(OffloadLabError, ValueError):
    """Arguments a report cannot be built from or saved to."""


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    # loaded through importlib.resources so the template is found inside an installed wheel
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("offload_lab.views", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "j2"), default=True),
        undefined=jinja2.StrictUndefined, trim_blocks=False, lstrip_blocks=False)
    return env.get_template("report.html.j2")


@lru_cache(maxsize=1)
def _css() -> str:
    return resources.files("offload_lab.views").joinpath("templates/report.css").read_text(encoding="utf-8")


def _reason_flags(reasons: Iterable[Any]) -> int:
    # the planner's reason strings say when a pin was given back or a layer demoted
    keys = ("given back", "demoted", "does not fit", "exceed")
    return sum(1 for r in reasons if isinstance(r, str) and any(k in r.lower() for k in keys))


class Report:
    """Figures and tables of a set of runs; :meth:`save` writes one offline HTML file.

    Attributes: ``runs``, ``plan``, ``title``, ``comparison`` (:func:`~offload_lab.analysis.comparison.compare`),
    ``engines`` (:func:`offload_lab.engines.compare`'s frame shown in the Engines section, or
    None), ``figures`` (``{name: plotly Figure}``), ``warnings`` (problems, list of str), ``notes``
    (context such as what the cpu backend can show).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> rep = report([offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)], plan=plan)
    >>> "timeline-0" in rep.figures and "plan-tier-map" in rep.figures
    True
    """

    def __init__(self, runs: list[Run], plan: Any = None, title: str | None = None,
                 recommendation: Any = None, confirmation: Any = None, engines: pd.DataFrame | None = None,
                 engines_context: str = ""):
        self.runs = runs
        self.engines, self.engines_context = engines, engines_context
        self.plan = plan
        self.recommendation, self.confirmation = recommendation, confirmation
        self.title = title or self._default_title()
        self.comparison = compare(runs, ranks="max") if runs else None
        # a multi-rank run reads as its node: each step as long as its slowest rank's
        self.metrics = [summary.metrics(slowest_rank_run(r) if is_multi_rank(r) else r) for r in runs]
        # a prediction of a plan whose copies block the host (or are staged) depends on the issue
        # order, so the report shows it under the other order too, unless that run is here already
        self.other_orders = _other_orders(runs)
        self.figures: dict[str, go.Figure] = {}
        if runs:
            self.figures["step-times"] = viz.step_times(runs)
            self.figures["bandwidth"] = viz.bandwidth(runs)
        for i, r in enumerate(runs):
            if is_multi_rank(r):  # per-rank summaries beside the rank lanes of the timeline
                self.figures[f"rank-steps-{i}"] = rank_figures.rank_steps(r)
                self.figures[f"rank-bandwidth-{i}"] = rank_figures.rank_bandwidth(r)
            self.figures[f"timeline-{i}"] = viz.timeline(r)
            # memory samples and placement are per process: a multi-rank run shows its first rank's
            first = next(iter(split_ranks(r).values())) if is_multi_rank(r) else r
            self.figures[f"memory-{i}"] = viz.memory(first)
            self.figures[f"tier-map-{i}"] = viz.tier_map(first)
        if plan is not None:
            self.figures["plan-tier-map"] = viz.tier_map(plan)
            self.figures["host-ledger"] = viz.host_ledger(plan)
        if runs or plan is not None:
            self.figures["tier-bytes"] = viz.tier_bytes(([plan] if plan is not None else []) + runs)
        if recommendation is not None and recommendation.best is not None:
            self.figures["recommend-front"] = front_figure(recommendation)
        if engines is not None:
            self.figures["engines"] = engines_figure(engines)  # it escapes its strings
        peak_runs = [r for r in runs if r.meta.get("startup_peak_bytes") is not None and r.meta.get("init_strategy")]
        if plan is not None:
            # a plan's prediction is only comparable with runs of the same model
            name = getattr(getattr(plan, "spec", None), "name", None)
            peak_runs = [r for r in peak_runs if r.meta.get("model") == name]
        elif peak_runs:
            models = [r.meta.get("model") for r in peak_runs]
            common = max(set(models), key=models.count)
            peak_runs = [r for r in peak_runs if r.meta.get("model") == common]
        if plan is not None or peak_runs:
            self.figures["startup-peaks"] = viz.startup_peaks(([plan] if plan is not None else []) + peak_runs)
        self.warnings = self._collect_warnings()
        self.notes = self._collect_notes()
        self._html: str | None = None

    # -- content -------------------------------------------------------------------------------
    def _default_title(self) -> str:
        models = sorted({str(r.meta.get("model")) for r in self.runs if r.meta.get("model")})
        if not models and self.plan is not None:
            models = [str(getattr(getattr(self.plan, "spec", None), "name", ""))]
        return "offload-lab report" + (f" · {', '.join(m for m in models if m)}" if any(models) else "")

    def _collect_warnings(self) -> list[str]:
        out: list[str] = []
        p = self.plan
        if p is not None:
            out += [f"plan: {w}" for w in (getattr(p, "warnings", None) or [])]
            led = getattr(p, "ledger", None) or {}
            if led.get("fits") is False:
                out.append(f"plan: does not fit host memory — net new anonymous "
                           f"{format_bytes(led.get('net_anonymous_bytes'))} vs spendable "
                           f"{format_bytes(led.get('spendable'))}")
            if "reason" in p.layers:
                n = _reason_flags(p.layers["reason"])
                if n:
                    out.append(f"plan: {n} layer(s) degraded (pin given back or demoted); see the per-layer reasons")
        for r in self.runs:
            tag = f"run {r.label!r}" + (" (simulated)" if r.simulated else "")
            out += [f"{tag}: {w}" for w in (r.meta.get("warnings") or []) if isinstance(w, str)]
            rp = r.meta.get("plan") if isinstance(r.meta.get("plan"), dict) else {}
            out += [f"{tag} plan: {w}" for w in (rp.get("warnings") or []) if isinstance(w, str)]
            led = rp.get("ledger") if isinstance(rp.get("ledger"), dict) else rp
            if led.get("fits") is False:
                out.append(f"{tag}: its plan does not fit host memory (ledger fits=False)")
            if not len(r.steps):
                out.append(f"{tag}: no measured steps (warm-up dropped {r.meta.get('warmup_dropped', 0)})")
            noise = noise_note(r)
            if noise:
                out.append(noise)
        return out

    def _collect_notes(self) -> list[str]:
        out = []
        if any(r.backend == "cpu" for r in self.runs):
            out.append("cpu backend: " + _CPU_NOTE)
        sims = [r for r in self.runs if r.simulated]
        if sims and len(sims) < len(self.runs):
            out.append(f"{len(sims)} of {len(self.runs)} runs are simulated: read them as predictions "
                       f"next to the measured runs, not as measurements")
        return out

    def _fig_html(self, name: str) -> Markup:
        fig = self.figures[name]
        h = fig.layout.height or 320
        # plotly.js itself sits once in <head>, so no figure carries it. Trusted as markup: plotly
        # writes it from figures whose strings were escaped when they were built, and its JSON
        # escapes "<", ">" and "/" so no label can close the script element
        return Markup(fig.to_html(
            include_plotlyjs=False, full_html=False, config=PLOTLY_CONFIG, validate=False,
            div_id=f"fig-{name}", default_width="100%", default_height=f"{h}px"))

    def _context(self) -> dict[str, Any]:
        import plotly
        from plotly.offline import get_plotlyjs

        runs = rd.run_rows(self.runs, self.comparison, self.metrics, self.other_orders) if self.runs else []
        for row, r in zip(runs, self.runs):
            row["ranks"] = _rank_rows(r) if is_multi_rank(r) else []
        written = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        return {
            "title": self.title, "runs": runs, "n_sim": sum(r.simulated for r in self.runs),
            "backends": ", ".join(sorted({r.backend for r in self.runs})),
            "devices": ", ".join(sorted({rd.device_text(r) for r in self.runs if r.meta.get("device_name")})),
            "plan": rd.plan_data(self.plan, viz.tier_color) if self.plan is not None else None,
            "rec": None if self.recommendation is None else _rec_data(self.recommendation, self.confirmation),
            "engines": None if self.engines is None else {"rows": rd.engine_rows(self.engines),
                                                          "context": self.engines_context},
            "warnings": self.warnings, "notes": self.notes, "noisy_limit": f"{summary.NOISY_SPREAD:g}",
            "figures": {name: self._fig_html(name) for name in self.figures},
            "generator": f"offload-lab {__version__} · plotly {plotly.__version__} · written {written}",
            # trusted markup made here, not from any run: the stylesheet and plotly.js itself
            "css": Markup(_css()), "plotly_js": Markup(get_plotlyjs()),
        }

    def to_html(self) -> str:
        """The whole report as one HTML document (plotly.js included once).

        >>> import offload_lab
        >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
        >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
        >>> run = offload_lab.simulate(plan, "h200", steps=1, label="<b>x</b>")
        >>> "&lt;b&gt;x&lt;/b&gt;" in report([run]).to_html()
        True
        """
        if self._html is None:
            self._html = _template().render(**self._context()) + "\n"
        return self._html

    def save(self, path: str | os.PathLike = "offload-report.html") -> Path:
        """Write the report to ``path`` (one HTML file, works offline) and return the path.

        ``path`` must be a regular file or a new path (:mod:`offload_lab.writing`): a device,
        FIFO or socket raises :class:`~offload_lab.writing.OutputError`, a directory
        :class:`ReportError`; the file is written whole, then renamed into place.

        >>> import offload_lab
        >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
        >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
        >>> rep = report([offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=1)])
        >>> rep.save("/tmp/offload-report-doctest.html").suffix
        '.html'
        """
        if not isinstance(path, (str, os.PathLike)):
            raise ReportError(f"report path {path!r} is not a path; expected a str or os.PathLike "
                              f"such as 'offload-report.html'")
        p = Path(path)
        if kind_of(p) == "directory":
            raise ReportError(f"report path {str(p)!r} is a directory; expected a file path such as "
                              f"{str(p / 'offload-report.html')!r}")
        return atomic_write(p, self.to_html(), what="report path", example="offload-report.html")

    def _repr_html_(self) -> str:
        # an iframe keeps the report's CSS and plotly.js out of the notebook page and survives
        # nbconvert; sandbox without allow-same-origin keeps its scripts away from the kernel page
        return (f'<iframe srcdoc="{html.escape(self.to_html(), quote=True)}" sandbox="allow-scripts" '
                f'style="width:100%;height:900px;border:1px solid #ddd" '
                f'title="{html.escape(self.title, quote=True)}"></iframe>')

    def __repr__(self) -> str:
        return (f"<Report {self.title!r}: {len(self.runs)} run(s), {len(self.figures)} figures, "
                f"{len(self.warnings)} warning(s)>")


def _other_orders(runs: list[Run]) -> list[Run | None]:
    """Per run, its plan predicted in the other issue order, unless no such prediction is needed
    (a measured run, pinned copies only) or the report holds it already."""
    def twin(r: Run, x: Run) -> bool:  # the same prediction in the other order
        return (x is not r and x.simulated and issue_of(x) != issue_of(r) and sim_device(x) == sim_device(r)
                and tokens_of_meta(x.meta) == tokens_of_meta(r.meta) and rd.same_plan(x, r))

    return [None if not r.simulated or any(twin(r, x) for x in runs) else other_order(r) for r in runs]


def _engines_frame(engines: Any, plan: Any, device: Any, runs: list[Run]) -> tuple[pd.DataFrame | None, str]:
    """What the Engines section shows: ``engines`` as given (a frame of
    :func:`offload_lab.engines.compare`), or that comparison made for ``plan``'s model, host,
    device memory and tokens on ``device`` (else the device of the first simulated run of it)."""
    if isinstance(engines, pd.DataFrame):
        missing = [c for c in ENGINE_COLUMNS if c not in engines.columns]
        if missing:
            raise ReportError(f"engines frame lacks columns {missing}; expected the frame "
                              f"offload_lab.engines.compare() returns, True, False or None")
        return engines, "as given"
    if engines is None:
        engines = plan is not None and device is not None
    if not isinstance(engines, bool):
        raise ReportError(f"engines {engines!r:.80} is not True, False, None or a frame of "
                          f"offload_lab.engines.compare()")
    if device is not None and plan is None:
        raise ReportError(f"device {device!r:.80} is for the Engines section, which compares engines on "
                          f"the plan's model: pass plan= too")
    if not engines:
        return None, ""
    if plan is None:
        raise ReportError("engines=True compares engines on the plan's model: pass plan= (and device=)")
    name = plan.spec.name
    if device is None:  # the device the report's own predictions of this model were made on
        device = next((r.meta.get("device_name") for r in runs if r.simulated and r.meta.get("model") == name
                       and r.meta.get("device_name") in DeviceProfile.names()), None)
        if device is None:
            raise ReportError(f"engines=True needs a device: pass device= (a DeviceProfile or one of "
                              f"{', '.join(DeviceProfile.names())})")
    params = plan.params or {}
    tokens = (plan.ledger or {}).get("device_tokens")
    try:
        frame = compare_engines(plan.spec, device, host=plan.host, device_memory=params.get("device_memory"),
                                tokens=tokens)
    except EngineError as e:
        raise ReportError(f"engines: {e}") from None
    dev = device.name if isinstance(device, DeviceProfile) else str(device)
    host = format_bytes(plan.host.available) if getattr(plan, "host", None) is not None else "probed"
    mem = params.get("device_memory")
    return frame, (f"{name} on {dev}, host available {host}"
                   + (f", device memory {format_bytes(int(mem))}" if mem else "")
                   + (f", {int(tokens)} tokens" if tokens else ""))


def _rec_data(rec: Any, confirmation: Any) -> dict[str, Any]:
    return recommendation_data(rec, confirmation)
def _rank_rows(run: Run) -> list[list[str]]:
    """The per-rank table of a multi-rank run's section, as formatted cells."""
    def gbps(x: float) -> str:
        return f"{x:.3g} GB/s" if x == x else "—"

    return [[f"rank {int(t.rank)}" + (" · straggler" if t.straggler else ""), str(t.node or "—"),
             fmt_seconds(t.step_s), fmt_seconds(t.slowest_step_s), fmt_seconds(t.behind_s),
             gbps(t.copy_gbps), gbps(t.pinned_gbps), gbps(t.pageable_gbps), format_bytes(t.bytes_moved)]
            for t in rank_table(run).itertuples()]


def report(runs: Run | Iterable[Run] | Mapping[str, Run] | None, plan: Any = None,
           title: str | None = None, recommendation: Any = None, confirmation: Any = None,
           device: DeviceProfile | str | None = None, engines: bool | pd.DataFrame | None = None) -> Report:
    """Build a :class:`Report` of ``runs`` (measured and/or simulated) and optionally their plan.

    ``runs`` may be one Run, a list, or a ``{label: Run}`` mapping; it may be empty only when a
    ``plan`` is given (a plan-only report). ``recommendation`` (from :func:`offload_lab.recommend`)
    adds its best plan, front and explanation; ``confirmation`` (from ``rec.confirm(...)``) its
    predicted vs measured table.

    An **Engines** section (other engines' offload settings for the plan's model, simulated side
    by side: :func:`offload_lab.engines.compare` and its figure) is added when ``plan`` and
    ``device`` (a :class:`~offload_lab.DeviceProfile` or a shipped name) are both given, or
    with ``engines=True`` (``device`` then defaults to that of a simulated run of the plan's
    model); ``engines`` may also be a frame ``engines.compare`` returned, shown as it is, and
    ``engines=False`` leaves the section out. It simulates about 13 engine settings (a few
    seconds for a 14B model), so it is made only when asked.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> rep = report([offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=1)])
    >>> rep.runs[0].simulated
    True
    """
    if plan is not None and not viz.is_plan(plan):
        raise ReportError(f"plan {plan!r:.80} of type {type(plan).__name__} is not an offload_lab.Plan; "
                          f"expected the result of offload_lab.plan() or None")
    if title is not None and not isinstance(title, str):
        raise ReportError(f"title {title!r} is not a string; expected a str or None")
    if runs is None or (isinstance(runs, (list, tuple, dict)) and not runs and plan is not None):
        if plan is None:
            raise ReportError("runs None is empty and no plan was given; expected at least one "
                              "offload_lab.Run or a plan=")
        run_list: list[Run] = []
    else:
        run_list = as_runs(runs)
    if recommendation is not None and not isinstance(recommendation, Recommendation):
        raise ReportError(f"recommendation {recommendation!r:.80} is not a Recommendation; expected the "
                          f"result of offload_lab.recommend() or None")
    if confirmation is not None and not isinstance(confirmation, Confirmation):
        raise ReportError(f"confirmation {confirmation!r:.80} is not a Confirmation; expected the result of "
                          f"rec.confirm(model, fn) or None")
    frame, context = _engines_frame(engines, plan, device, run_list)
    return Report(run_list, plan=plan, title=title, recommendation=recommendation, confirmation=confirmation,
                  engines=frame, engines_context=context)




__all__ = ["Report", "ReportError", "report"]
