"""report: one self-contained offline HTML file; escaped; opened in headless Chromium."""

from __future__ import annotations

import html
import re
import warnings
from pathlib import Path

import markupsafe
import pandas as pd
import pytest

import offload_lab
from offload_lab import catalog, engines
from offload_lab.record.run import Run
from offload_lab.views.report import Report, ReportError, report

HOST = offload_lab.HostMemory(available="256GiB")
XSS = "</script><script>alert(1)</script>"
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


class Html(str):
    """The report's text with a short repr: a failing `x in text` must not print 5 MB."""

    def __repr__(self) -> str:
        return f"<report HTML, {len(self)} chars>"


def read(path: Path) -> Html:
    return Html(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def h3_plan():
    """A degraded plan: forced pinned on a small host, so most layers are demoted (with warnings)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return offload_lab.plan(catalog.load("minimax-h3"), tier="pinned",
                                host=offload_lab.HostMemory(available="24GiB"))


@pytest.fixture(scope="module")
def simulated(h3_plan) -> list[Run]:
    return [offload_lab.simulate(h3_plan, "h200", steps=3, label="h3 on h200")]


@pytest.fixture(scope="module")
def saved(tmp_path_factory, measured, simulated, h3_plan) -> tuple[Report, Path]:
    rep = report(measured + simulated, plan=h3_plan, title=f"pinned vs pageable {XSS}")
    return rep, rep.save(tmp_path_factory.mktemp("report") / "offload-report.html")


def test_report_has_every_section_and_figure(saved, measured, simulated):
    rep, path = saved
    text = read(path)
    for section in ("summary", "comparison", "runs", "plan", "environment", "warnings"):
        assert f'<section id="{section}">' in text
    for i in range(len(measured) + len(simulated)):
        assert f'id="run-{i}"' in text
        for kind in ("timeline", "memory", "tier-map"):
            assert f"{kind}-{i}" in rep.figures
    assert {"step-times", "bandwidth", "plan-tier-map", "startup-peaks"} <= set(rep.figures)
    assert text.count('class="plotly-graph-div"') == len(rep.figures)
    assert 'id="comparison-table"' in text and 'id="reasons"' in text


def test_plotly_js_is_embedded_once_and_nothing_is_fetched(saved):
    _, path = saved
    text = read(path)
    from plotly.offline import get_plotlyjs

    bundle = get_plotlyjs()
    # booleans, not `in` on a 5 MB string: pytest would spend half a minute diffing it
    count = text.count(bundle)
    assert count == 1, f"plotly.js embedded {count} times"
    rest = text.replace(bundle, "")
    assert "plotly.js v" not in rest  # and no second, different bundle
    # no remote scripts, styles or images outside the bundle: the file must work offline
    remote = re.findall(r"""<(?:script|link|img|iframe)[^>]+(?:src|href)=["']?(?:https?:)?//[^"' >]*""", rest, re.I)
    assert remote == []
    assert ("cdn.plot.ly" in rest) is False


def test_every_string_is_escaped(saved):
    _, path = saved
    text = read(path)
    assert (XSS in text) is False
    assert ("<script>alert(1)" in text) is False
    assert (html.escape(XSS) in text) is True  # in the tables, headings and nav
    # every <script> the report opens is one it closes itself: no label ended one early
    assert len(re.findall(r"<script\b", text)) == len(re.findall(r"</script>", text))


def test_simulated_badges_and_banner(saved, measured, simulated):
    rep, path = saved
    text = read(path)
    assert 'class="banner"' in text
    # a badge in the comparison table, the run's heading, the environment table and the banner
    assert text.count('class="badge sim"') >= 4
    assert 'section class="run sim" id="run-2"' in text
    assert "SIMULATED: predicted by the simulator on profile h200" in text
    assert "SIMULATED" in rep.figures["timeline-2"].layout.title.text
    assert "SIMULATED" not in rep.figures["timeline-0"].layout.title.text


def test_warnings_list_degraded_plan(saved, h3_plan):
    rep, path = saved
    assert h3_plan.warnings
    assert any(w.startswith("plan: ") and h3_plan.warnings[0] in w for w in rep.warnings)
    assert any("degraded" in w for w in rep.warnings)
    text = read(path)
    assert str(markupsafe.escape(h3_plan.warnings[0])) in text
    assert any("cpu backend" in n for n in rep.notes)


def test_plan_ledger_and_every_reason(saved, h3_plan):
    _, path = saved
    text = read(path)
    assert "pin budget" in text and "net new anonymous" in text
    for reason in set(h3_plan.layers["reason"]):
        assert str(markupsafe.escape(reason)) in text


def test_environment_from_meta(saved, measured):
    _, path = saved
    text = read(path)
    assert html.escape(measured[0].meta["torch_version"]) in text
    assert "h200 (simulated)" in text


def test_repr_html_is_an_isolated_iframe(saved):
    rep, _ = saved
    frag = rep._repr_html_()
    assert frag.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in frag
    assert "<script" not in frag  # all of it lives, escaped, inside the srcdoc attribute
    assert html.unescape(frag.split('srcdoc="', 1)[1].split('" sandbox=', 1)[0]) == rep.to_html()


def test_plan_only_report(h3_plan, tmp_path):
    rep = report([], plan=h3_plan)
    assert set(rep.figures) == {"plan-tier-map", "startup-peaks", "host-ledger", "tier-bytes"}
    assert "minimax-h3" in rep.title
    assert rep.save(tmp_path / "plan.html").stat().st_size > 0


def test_bad_arguments(measured, tmp_path):
    with pytest.raises(ReportError, match="no plan was given"):
        report(None)
    with pytest.raises(ValueError, match="empty"):
        report([])
    with pytest.raises(ReportError, match="'pinned' of type str is not an offload_lab.Plan"):
        report(measured, plan="pinned")
    with pytest.raises(ReportError, match="title 3 is not a string"):
        report(measured, title=3)
    rep = report(measured[:1])
    with pytest.raises(ReportError, match="is a directory"):
        rep.save(tmp_path)
    with pytest.raises(ReportError, match="is not a path"):
        rep.save(3)


def test_saved_runs_make_the_same_report(tmp_path, measured):
    loaded = [Run.load(r.save(tmp_path / f"r{i}.zip")) for i, r in enumerate(measured)]
    rep = report(loaded)
    assert rep.comparison["label"].tolist() == [r.label for r in measured]
    assert len(rep.figures) == 2 + 3 * len(measured) + 1 + 1  # + bytes per tier


PROBES = {
    "table_rows": "document.querySelectorAll('#comparison-table tbody tr').length",
    "badges": "document.querySelectorAll('.badge.sim').length",
    "xss_as_text": f"document.body.innerText.includes({XSS!r})",
    "xss_in_svg": f"[...document.querySelectorAll('.main-svg text')].some(t => t.textContent.includes({XSS!r}))",
    "scripts": "document.scripts.length",
    "reasons": "document.querySelectorAll('#reasons tbody tr').length",
}


@pytest.fixture(scope="module")
def browsed(saved, tmp_path_factory):
    """The saved report and a notebook-like page holding _repr_html_, opened in one Chromium."""
    from browser import Visit, chromium_available, open_pages

    why = chromium_available()
    if why:
        pytest.fail(f"browser test cannot run: {why}")
    rep, path = saved
    notebook = tmp_path_factory.mktemp("notebook") / "notebook.html"
    notebook.write_text(f"<!DOCTYPE html><html><body>{rep._repr_html_()}</body></html>", encoding="utf-8")
    return open_pages([Visit(path, ARTIFACTS / "report.png", PROBES), Visit(notebook)])


@pytest.mark.browser
def test_report_renders_offline_in_headless_chromium(saved, browsed):
    rep, _ = saved
    page = browsed[0]
    assert page.console_errors == [] and page.page_errors == [], (page.console_errors, page.page_errors)
    assert page.dialogs == []  # alert(1) never ran
    assert page.blocked_requests == []  # the report asked the network for nothing
    assert page.figures == len(rep.figures) == page.rendered
    assert page.probes["table_rows"] == len(rep.runs)
    assert page.probes["badges"] >= 4
    assert page.probes["xss_as_text"] and page.probes["xss_in_svg"]
    assert page.probes["scripts"] == 1 + len(rep.figures)  # plotly.js once, one call per figure
    assert page.probes["reasons"] == len(rep.plan.layers)
    assert (ARTIFACTS / "report.png").stat().st_size > 50_000


@pytest.mark.browser
def test_repr_html_renders_in_an_iframe(saved, browsed):
    rep, _ = saved
    page = browsed[1]
    assert page.page_errors == [] and page.console_errors == [] and page.dialogs == []
    assert page.figures == page.rendered == len(rep.figures)


def test_cpu_runs_do_not_pair_a_gpu_estimate_with_what_they_hold(measured):
    # the cpu backend has no device memory: the planner's estimate and what the backend holds
    # are two rows, never "predicted X · measured Y"
    assert all(r.backend == "cpu" and isinstance(r.meta.get("device_peak"), dict) for r in measured)
    text = Html(report(measured).to_html())
    assert text.count("<th>device peak (planner estimate)</th>") == len(measured)
    assert text.count("<th>cpu backend holds (measured)</th>") == len(measured)
    assert "(estimate) · measured" not in text


def test_warnings_from_run_meta(simulated, tmp_path):
    # a saved run whose plan did not fit, with a warning from its producer
    run = Run.load(simulated[0].save(tmp_path / "sim.zip"))
    run.meta["plan"]["ledger"]["fits"] = False
    run.meta["warnings"] = ["copy stream <b>stalled</b>"]
    rep = report([run])
    assert any("does not fit host memory" in w for w in rep.warnings)
    assert any(w.endswith("copy stream <b>stalled</b>") for w in rep.warnings)
    assert "copy stream &lt;b&gt;stalled&lt;/b&gt;" in Html(rep.to_html())


def test_engines_section_when_asked(tmp_path):
    """A plan and a device: the Engines table (one row per engine setting) and its figure;
    without a device, no section and nothing simulated for it."""
    spec = catalog.load("wan2.1-t2v-1.3b")
    p = offload_lab.plan(spec, host=offload_lab.HostMemory(available="64GiB"), device_memory="24GiB")
    rep = report([], plan=p, device="h200")
    text = read(rep.save(tmp_path / "engines.html"))
    assert '<section id="engines">' in text and 'href="#engines"' in text and "fig-engines" in text
    assert len(rep.engines) == len(engines.grid()) and "engines" in rep.figures
    table = text[text.index('id="engines-table"'):text.index("</table>", text.index('id="engines-table"'))]
    assert table.count("<tr") == len(engines.grid()) + 1  # the header, then one row each
    for cell in ("diffusers-group", "use_stream=True", "sglang-layerwise", "recommended", "held-out",
                 "pinned (locked)"):
        assert html.escape(cell) in table, cell
    # what diffusers' pins really lock (each tensor rounded up to a power of two), not the bytes
    locked = engines.pinned_bytes(engines.as_plan(spec, "diffusers-group", use_stream=True, host="64GiB"))
    assert int(rep.engines.loc[0, "pinned_bytes"]) == locked > p.spec.total_bytes
    assert f"<td>{offload_lab.units.format_bytes(locked)}</td>" in table
    # the same, from a simulated run's device; off when asked off; nothing when not asked
    run = offload_lab.simulate(p, "h200", steps=1)
    assert report([run], plan=p, engines=True).engines["settings"].tolist() == rep.engines["settings"].tolist()
    assert report([run], plan=p, device="h200", engines=False).engines is None
    plain = report([run], plan=p)
    assert plain.engines is None and "engines" not in plain.figures and 'id="engines"' not in plain.to_html()
    # a frame is shown as given, its strings escaped in the table and the figure
    frame = rep.engines.head(2).copy()
    frame.loc[0, "settings"] = XSS
    given = report([run], plan=p, engines=frame)
    page = given.to_html()
    assert XSS not in page and html.escape(XSS) in page
    assert XSS not in given.figures["engines"].data[0].y[0]


def test_engines_bad_arguments():
    spec = catalog.load("wan2.1-t2v-1.3b")
    p = offload_lab.plan(spec, host=offload_lab.HostMemory(available="64GiB"))
    with pytest.raises(ReportError, match="engines=True needs a device"):
        report([], plan=p, engines=True)
    with pytest.raises(ReportError, match="pass plan= too"):
        report([offload_lab.simulate(p, "h200", steps=1)], device="h200")
    with pytest.raises(ReportError, match="'a100'"):
        report([], plan=p, device="a100")
    with pytest.raises(ReportError, match="engines 'yes' is not True"):
        report([], plan=p, engines="yes")
    with pytest.raises(ReportError, match="lacks columns"):
        report([], plan=p, engines=pd.DataFrame({"engine": ["x"]}))
