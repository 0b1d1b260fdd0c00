"""A self-contained, offline HTML report of runs (and optionally the plan behind them).

One file, plotly.js embedded once in ``<head>``, every figure written with
``include_plotlyjs=False, full_html=False``; no network access is needed to open it. Every string
that reaches the HTML goes through :func:`html.escape`; strings inside figures travel as JSON,
which plotly writes with ``<``, ``>`` and ``/`` as ``\\u`` escapes, so a label such as
``</script>`` cannot end a script element (the tests check both).

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
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from offload_lab import __version__
from offload_lab.analysis import summary as analysis
from offload_lab.analysis.summary import as_runs
from offload_lab.record.run import Run
from offload_lab.units import format_bytes
from offload_lab.views import figures as viz

if TYPE_CHECKING:
    import plotly.graph_objects as go

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True,
                 "modeBarButtonsToRemove": ["lasso2d", "select2d", "autoScale2d"]}
_CPU_NOTE = ("On the cpu backend there is no DMA engine and no page-locking: the copy thread competes "
             "with compute for the same cores and memory bandwidth, so pinned and pageable runs take "
             "about the same time. The pinned-vs-pageable story is told by GPU runs and by the "
             "simulator on device profiles.")


class ReportError(ValueError):
    """Arguments a report cannot be built from or saved to."""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _badge(sim: bool) -> str:
    return '<span class="badge sim" title="predicted by the simulator, not measured">SIMULATED</span>' if sim else \
        '<span class="badge meas">measured</span>'


def _num(x: Any, fmt: str = "{:.3g}") -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return _e(x)
    return fmt.format(v) if math.isfinite(v) else "–"


def _secs(x: Any) -> str:
    try:
        return _e(viz.fmt_seconds(float(x)))
    except (TypeError, ValueError):
        return "–"


def _bytes(x: Any) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return _e(x) if x is not None else "–"
    return _e(format_bytes(x))


def _kv_table(rows: list[tuple[str, str]], cls: str = "kv") -> str:
    """Rows of (escaped key, already-escaped HTML value)."""
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="{cls}">{body}</table>'


def _ledger_rows(ledger: Mapping[str, Any]) -> list[tuple[str, str]]:
    names = [("available", "host available"), ("reserve", "reserve (max(5 %, 2 GiB))"),
             ("spendable", "spendable"), ("budget", "pin budget"), ("pinned_bytes", "pinned"),
             ("net_anonymous_bytes", "net new anonymous")]
    rows = [(_e(label), _bytes(ledger[k])) for k, label in names if k in ledger]
    if "fits" in ledger:
        fits = ledger["fits"]
        rows.append(("fits", '<span class="ok">yes</span>' if fits else '<span class="bad">NO</span>'))
    # every other number in the ledger is a byte count too (headroom, given_back, ...)
    rows += [(_e(k.replace("_", " ")), _bytes(v)) for k, v in ledger.items() if k not in dict(names) and k != "fits"]
    return rows


def _params_html(params: Mapping[str, Any]) -> str:
    """``pin budget 24.00 GiB · resident 0 · ...``: plan arguments, sizes in binary units."""
    out = []
    for k, v in params.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and ("budget" in k or "bytes" in k):
            v = format_bytes(v)
        elif isinstance(v, (list, tuple)):
            v = ", ".join(map(str, v)) or "–"
        out.append(f"{_e(k.replace('_', ' '))} <b>{_e('–' if v is None else v)}</b>")
    return " · ".join(out)


def _reason_flags(reasons: Iterable[Any]) -> int:
    # the planner's reason strings say when a pin was given back or a layer demoted
    keys = ("given back", "demoted", "does not fit", "exceed")
    return sum(1 for r in reasons if isinstance(r, str) and any(k in r.lower() for k in keys))


class Report:
    """Figures and tables of a set of runs; :meth:`save` writes one offline HTML file.

    Attributes: ``runs``, ``plan``, ``title``, ``comparison`` (:func:`analysis.compare`),
    ``figures`` (``{name: plotly Figure}``), ``warnings`` (problems, list of str), ``notes``
    (context such as what the cpu backend can show).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> rep = report([offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)], plan=plan)
    >>> "timeline-0" in rep.figures and "plan-tier-map" in rep.figures
    True
    """

    def __init__(self, runs: list[Run], plan: Any = None, title: str | None = None):
        self.runs = runs
        self.plan = plan
        self.title = title or self._default_title()
        self.comparison = analysis.compare(runs) if runs else None
        self.metrics = [analysis.metrics(r) for r in runs]
        self.figures: dict[str, go.Figure] = {}
        if runs:
            self.figures["step-times"] = viz.step_times(runs)
            self.figures["bandwidth"] = viz.bandwidth(runs)
        for i, r in enumerate(runs):
            self.figures[f"timeline-{i}"] = viz.timeline(r)
            self.figures[f"memory-{i}"] = viz.memory(r)
            self.figures[f"tier-map-{i}"] = viz.tier_map(r)
        if plan is not None:
            self.figures["plan-tier-map"] = viz.tier_map(plan)
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

    def _fig_html(self, name: str) -> str:
        fig = self.figures[name]
        h = fig.layout.height or 320
        # plotly.js itself sits once in <head> (see to_html), so no figure carries it
        return ('<div class="fig">' + fig.to_html(
            include_plotlyjs=False, full_html=False, config=PLOTLY_CONFIG, validate=False,
            div_id=f"fig-{name}", default_width="100%", default_height=f"{h}px") + "</div>")

    def _summary(self) -> str:
        parts = []
        if self.runs:
            n_sim = sum(r.simulated for r in self.runs)
            backends = sorted({r.backend for r in self.runs})
            devices = sorted({str(r.meta.get("device_name")) for r in self.runs if r.meta.get("device_name")})
            parts.append(f"<li>{len(self.runs)} run(s): {len(self.runs) - n_sim} measured, {n_sim} "
                         f"simulated · backends {_e(', '.join(backends))}"
                         + (f" · devices {_e(', '.join(devices))}" if devices else "") + "</li>")
            first = self.runs[0]
            for r, (_, row), m in zip(self.runs, self.comparison.iterrows(), self.metrics):
                sim = " " + _badge(True) if r.simulated else ""
                if r is first:
                    rel = "the reference"
                else:
                    rel = f"<b>{_e(viz.fmt_ratio(row['ratio']))}</b> of {_e(first.label)}"
                b = m["bound"]
                bound = (f"; {_num(m['vs_bound'], '{:.2f}')}× its {_e(b['limit'])}-bound "
                         f"of {_secs(b['bound_s'])} (link {_num(b['bandwidth_gbps'], '{:.3g}')} GB/s, "
                         f"{_e(b['bandwidth_source'])})") if math.isfinite(m["vs_bound"]) else ""
                parts.append(f"<li><b>{_e(r.label)}</b>{sim}: {_secs(row['step_s'])} per step, {rel}"
                             f" · stall {_secs(row['stall_s'])}, exposed copy {_secs(row['exposed_copy_s'])}"
                             f"{bound}</li>")
        if self.plan is not None:
            led = getattr(self.plan, "ledger", {}) or {}
            parts.append(f"<li>plan: {_e(analysis.tier_summary(self.plan.layers))} · pinned "
                         f"{_bytes(led.get('pinned_bytes'))} of budget {_bytes(led.get('budget'))}</li>")
        if self.warnings:
            parts.append(f'<li><a href="#warnings">{len(self.warnings)} warning(s)</a></li>')
        return "<ul>" + "".join(parts) + "</ul>"

    def _comparison_table(self) -> str:
        if self.comparison is None:
            return "<p>No runs.</p>"
        head = ["run", "backend", "tiers", "median step", "ratio", "stall", "exposed copy", "overlap",
                "bound", "measured / bound"]
        rows = []
        for r, (_, c) in zip(self.runs, self.comparison.iterrows()):
            cls = ' class="sim"' if r.simulated else ""
            rows.append(
                f"<tr{cls}><td>{_e(c['label'])} {_badge(bool(c['simulated']))}</td><td>{_e(c['backend'])}</td>"
                f"<td>{_e(c['tiers'])}</td><td>{_secs(c['step_s'])}</td><td>{_e(viz.fmt_ratio(c['ratio']))}</td>"
                f"<td>{_secs(c['stall_s'])}</td><td>{_secs(c['exposed_copy_s'])}</td>"
                f"<td>{_num(c['overlap'] * 100, '{:.0f}')} %</td><td>{_secs(c['bound_s'])}</td>"
                f"<td>{_num(c['vs_bound'], '{:.2f}')}</td></tr>")
        return (f'<table class="cmp" id="comparison-table"><thead><tr>{"".join(f"<th>{h}</th>" for h in head)}'
                f'</tr></thead><tbody>{"".join(rows)}</tbody></table>')

    def _run_section(self, i: int, r: Run, m: dict[str, Any]) -> str:
        gb = ", ".join(f"{_e(t)} {v:.3g} GB/s" for t, v in m["gbps"].items()) or "no copies"
        facts = _kv_table([
            ("backend", f"{_e(r.backend)} · {_e(r.meta.get('device_name') or '–')}"),
            ("tiers", _e(m["tiers"])),
            ("steps", f"{m['steps']} measured (warm-up dropped: {_e(r.meta.get('warmup_dropped', 0))})"),
            ("median step", f"{_secs(m['step_s'])} (compute {_secs(m['compute_s'])}, copy {_secs(m['copy_s'])})"),
            ("stall / exposed copy", f"{_secs(m['stall_s'])} / {_secs(m['exposed_copy_s'])}"),
            ("overlap", f"{_num(m['overlap'] * 100, '{:.0f}')} % of copy time under compute"),
            ("bytes per step", _bytes(m["bytes_moved"])),
            ("copy bandwidth", gb),
            ("bound", f"{_secs(m['bound_s'])} ({_e(m['bound']['limit'])}-bound) · measured / bound "
                      f"{_num(m['vs_bound'], '{:.2f}')}"),
        ])
        plan_meta = r.meta.get("plan") if isinstance(r.meta.get("plan"), dict) else {}
        led = plan_meta.get("ledger") if isinstance(plan_meta.get("ledger"), dict) else None
        params = {k: v for k, v in plan_meta.items() if k not in ("ledger", "warnings")}
        plan_html = ""
        if params or led:
            plan_html = ('<details><summary>plan of this run</summary>'
                         + (f"<p>{_params_html(params)}</p>" if params else "")
                         + (_kv_table(_ledger_rows(led)) if led else "") + "</details>")
        cls = "run sim" if r.simulated else "run"
        note = ('<p class="simnote">SIMULATED: predicted by the simulator'
                + (f" on profile {_e(self._profile_name(r))}" if self._profile_name(r) else "")
                + ", not measured.</p>") if r.simulated else ""
        return (f'<section class="{cls}" id="run-{i}"><h3>{_e(r.label)} {_badge(r.simulated)}</h3>{note}'
                f'{facts}{plan_html}{self._fig_html(f"timeline-{i}")}'
                f'<div class="pair">{self._fig_html(f"memory-{i}")}{self._fig_html(f"tier-map-{i}")}</div>'
                f'</section>')

    @staticmethod
    def _profile_name(r: Run) -> str | None:
        p = r.meta.get("profile")
        return str(p.get("name")) if isinstance(p, dict) and p.get("name") else None

    def _plan_section(self) -> str:
        p = self.plan
        if p is None:
            return ('<p>No plan given: pass <code>plan=</code> to see the ledger and every layer\'s reason. '
                    'Each run\'s own plan parameters are under its section.</p>')
        led = getattr(p, "ledger", {}) or {}
        extra = []
        order = getattr(p, "init_order", None)
        if order:
            extra.append(("init order", " → ".join(_e(g) for g in order)))
        if getattr(p, "prefetch", None) is not None:
            extra.append(("prefetch", _e(p.prefetch)))
        if isinstance(getattr(p, "params", None), Mapping):
            extra.append(("arguments", _params_html(p.params)))
        lay = p.layers
        rows = []
        for row in lay.itertuples(index=False):
            rank = getattr(row, "pin_rank", None)
            rows.append(f'<tr class="t-{_e(row.tier)}"><td>{_e(row.group)}</td><td>{_e(row.layer)}</td>'
                        f'<td><span class="dot" style="background:{viz.tier_color(str(row.tier))}"></span>'
                        f'{_e(row.tier)}</td><td>{_bytes(int(row.bytes))}</td>'
                        f'<td>{"–" if rank is None or pd.isna(rank) else _e(int(rank))}</td>'
                        f'<td>{_e(getattr(row, "reason", ""))}</td></tr>')
        open_ = " open" if len(lay) <= 60 else ""
        reasons = (f'<details{open_} id="reasons"><summary>per-layer decisions ({len(lay)} layers)</summary>'
                   '<table class="reasons"><thead><tr><th>group</th><th>layer</th><th>tier</th><th>bytes</th>'
                   f'<th>pin rank</th><th>reason</th></tr></thead><tbody>{"".join(rows)}</tbody></table></details>')
        figs = self._fig_html("plan-tier-map")
        peaks = self._fig_html("startup-peaks") if "startup-peaks" in self.figures else ""
        return (f'<div class="pair"><div>{_kv_table(_ledger_rows(led), "kv ledger")}{_kv_table(extra)}</div>'
                f'<div>{peaks}</div></div>{figs}{reasons}')

    def _environment(self) -> str:
        head = ["run", "backend", "device", "torch", "host memory", "created", "model", "prefetch", "init"]
        rows = []
        for r in self.runs:
            h = r.meta.get("host") if isinstance(r.meta.get("host"), dict) else {}
            host = (f"available {_bytes(h.get('available'))} of {_bytes(h.get('total'))}"
                    + (f", cgroup {_bytes(h['cgroup_limit'])}" if h.get("cgroup_limit") else "")
                    + (f" ({_e(h.get('source'))})" if h.get("source") else "")) if h else "–"
            rows.append("<tr>" + "".join(f"<td>{v}</td>" for v in [
                f"{_e(r.label)} {_badge(r.simulated) if r.simulated else ''}", _e(r.backend),
                _e(r.meta.get("device_name") or "–"), _e(r.meta.get("torch_version") or "–"), host,
                _e(r.meta.get("created") or "–"), _e(r.meta.get("model") or "–"),
                _e(r.meta.get("prefetch", "–")), _e(r.meta.get("init_strategy") or "–")]) + "</tr>")
        import plotly

        gen = (f"offload-lab {_e(__version__)} · plotly {_e(plotly.__version__)} · written "
               f"{_e(_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds'))}")
        table = (f'<table class="env"><thead><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr></thead>'
                 f'<tbody>{"".join(rows)}</tbody></table>') if rows else ""
        return f"{table}<p class=\"muted\">{gen}</p>"

    def to_html(self) -> str:
        """The whole report as one HTML document (plotly.js included once)."""
        if self._html is not None:
            return self._html
        from plotly.offline import get_plotlyjs

        n_sim = sum(r.simulated for r in self.runs)
        banner = (f'<div class="banner">{_badge(True)} {n_sim} of {len(self.runs)} run(s) in this report '
                  f'are simulated — predictions of the simulator, not measurements.</div>') if n_sim else ""
        nav = ['<a href="#summary">summary</a>', '<a href="#comparison">comparison</a>']
        nav += [f'<a href="#run-{i}">{_e(r.label)}{" (sim)" if r.simulated else ""}</a>'
                for i, r in enumerate(self.runs)]
        nav += ['<a href="#plan">plan</a>', '<a href="#environment">environment</a>',
                f'<a href="#warnings">warnings ({len(self.warnings)})</a>']
        comparison = ""
        if self.runs:
            comparison = (self._comparison_table()
                          + f'<div class="pair">{self._fig_html("step-times")}{self._fig_html("bandwidth")}</div>')
        runs = "".join(self._run_section(i, r, m) for i, (r, m) in enumerate(zip(self.runs, self.metrics)))
        peaks = self._fig_html("startup-peaks") if "startup-peaks" in self.figures and self.plan is None else ""
        warns = ('<ul class="warn">' + "".join(f"<li>{_e(w)}</li>" for w in self.warnings) + "</ul>") \
            if self.warnings else "<p>None.</p>"
        if self.notes:
            warns += '<h3>Notes</h3><ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in self.notes) + "</ul>"
        body = f"""<header><h1>{_e(self.title)}</h1>{banner}<nav>{" · ".join(nav)}</nav></header>
<section id="summary"><h2>Summary</h2>{self._summary()}</section>
<section id="comparison"><h2>Comparison</h2>{comparison}</section>
<section id="runs"><h2>Runs</h2>{runs or "<p>No runs.</p>"}</section>
<section id="plan"><h2>Plan: ledger and per-layer reasons</h2>{self._plan_section()}{peaks}</section>
<section id="environment"><h2>Environment</h2>{self._environment()}</section>
<section id="warnings"><h2>Warnings</h2>{warns}</section>"""
        self._html = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                      f'<meta name="viewport" content="width=device-width, initial-scale=1">'
                      f'<title>{_e(self.title)}</title><style>{_CSS}</style>'
                      f'<script type="text/javascript">{get_plotlyjs()}</script></head>'
                      f'<body>{body}</body></html>\n')
        return self._html

    def save(self, path: str | os.PathLike = "offload-report.html") -> Path:
        """Write the report to ``path`` (one HTML file, works offline) and return the path.

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
        if p.is_dir():
            raise ReportError(f"report path {str(p)!r} is a directory; expected a file path such as "
                              f"{str(p / 'offload-report.html')!r}")
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(self.to_html(), encoding="utf-8")
        os.replace(tmp, p)
        return p

    def _repr_html_(self) -> str:
        # an iframe keeps the report's CSS and plotly.js out of the notebook page and survives
        # nbconvert; sandbox without allow-same-origin keeps its scripts away from the kernel page
        return (f'<iframe srcdoc="{html.escape(self.to_html(), quote=True)}" sandbox="allow-scripts" '
                f'style="width:100%;height:900px;border:1px solid #ddd" '
                f'title="{_e(self.title)}"></iframe>')

    def __repr__(self) -> str:
        return (f"<Report {self.title!r}: {len(self.runs)} run(s), {len(self.figures)} figures, "
                f"{len(self.warnings)} warning(s)>")


def report(runs: Run | Iterable[Run] | Mapping[str, Run] | None, plan: Any = None,
           title: str | None = None) -> Report:
    """Build a :class:`Report` of ``runs`` (measured and/or simulated) and optionally their plan.

    ``runs`` may be one Run, a list, or a ``{label: Run}`` mapping; it may be empty only when a
    ``plan`` is given (a plan-only report).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> rep = report([offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=1)])
    >>> rep.runs[0].simulated
    True
    """
    if plan is not None and not viz._is_plan(plan):
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
    return Report(run_list, plan=plan, title=title)


_CSS = """
:root{--fg:#1d2330;--muted:#667085;--line:#e4e7ec;--sim:#b54708;--simbg:#fef0c7}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);margin:0;background:#f7f8fa}
header,section{max-width:1280px;margin:0 auto;padding:8px 24px}
header{padding-top:20px}
h1{font-size:22px;margin:0 0 8px}h2{font-size:18px;border-bottom:1px solid var(--line);padding-bottom:4px;margin-top:28px}
h3{font-size:16px;margin:16px 0 6px}
nav{font-size:13px;color:var(--muted);margin:6px 0}nav a{color:#175cd3;text-decoration:none}
.badge{display:inline-block;font-size:11px;font-weight:700;letter-spacing:.04em;padding:1px 7px;border-radius:9px;vertical-align:middle}
.badge.sim{background:var(--simbg);color:var(--sim);border:1px solid #fdb022}
.badge.meas{background:#ecfdf3;color:#027a48;border:1px solid #abefc6;font-weight:600}
.banner{background:var(--simbg);border:1px solid #fdb022;border-radius:6px;padding:8px 12px;margin:8px 0;color:#7a2e0e}
.simnote{color:var(--sim);font-weight:600;margin:2px 0 8px}
section.run{background:#fff;border:1px solid var(--line);border-radius:8px;margin:14px auto;padding:10px 16px}
section.run.sim{border-left:5px solid #fdb022}
table{border-collapse:collapse;font-size:13px;background:#fff}
th,td{border-bottom:1px solid var(--line);padding:4px 10px;text-align:left;vertical-align:top}
table.cmp td:nth-child(n+4){text-align:right;font-variant-numeric:tabular-nums}
table.cmp tr.sim td:first-child{border-left:4px solid #fdb022}
table.kv{margin-bottom:10px}
table.kv th{color:var(--muted);font-weight:500;white-space:nowrap}
table.reasons td:nth-child(-n+5){white-space:nowrap}
.dot{display:inline-block;width:9px;height:9px;border-radius:50%;margin-right:5px}
.fig{background:#fff;border:1px solid var(--line);border-radius:6px;margin:8px 0;padding:4px;min-width:0}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:12px;align-items:start}
@media (max-width:900px){.pair{grid-template-columns:1fr}}
details{margin:8px 0}summary{cursor:pointer;color:#175cd3}
.ok{color:#027a48;font-weight:600}.bad{color:#b42318;font-weight:700}
.muted{color:var(--muted);font-size:12px}
#warnings li{margin:3px 0}ul.warn li{color:#b42318}ul.notes li{color:var(--muted)}
"""

__all__ = ["Report", "ReportError", "report"]
