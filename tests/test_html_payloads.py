"""Every HTML-producing path, fed script payloads, opened in headless Chromium: nothing runs.

The payloads travel where users' strings travel: run labels, a spec name (from a checkpoint
directory or a shared plan JSON), a report title. Each page is checked three ways: no payload
set ``window.__pwned`` (in the page or any frame), no element a payload would create exists,
and the payload's text is shown literally.
"""

from __future__ import annotations

import json
import warnings

import pytest

import offload_lab
from offload_lab import catalog, engines
from offload_lab.planning.planner import Plan
from offload_lab.views import figures as viz
from offload_lab.views.report import report

PAYLOADS = [
    "<script>window.__pwned=1</script>",
    "<img src=x onerror=\"window.__pwned=2\">",
    "\"><svg onload=\"window.__pwned=3\">",
]
HOST = offload_lab.HostMemory(available="64GiB")
# what a payload would create if it were parsed as markup
INJECTED = ("document.querySelectorAll('img[onerror], svg[onload]').length + [...document.scripts]"
            ".filter(s => s.text.trim().startsWith('window.__pwned')).length")
PWNED = "typeof window.__pwned === 'undefined'"


def _text_has(p: str) -> str:
    return f"document.body.innerText.includes({json.dumps(p)})"


def _svg_has(p: str) -> str:
    return f"[...document.querySelectorAll('.main-svg text')].some(t => t.textContent.includes({json.dumps(p)}))"


def _engines_has(p: str) -> str:
    # shown literally in the Engines table and in its figure's tick labels
    return (f"document.querySelector('#engines-table').innerText.includes({json.dumps(p)}) && "
            f"[...document.querySelectorAll('#fig-engines .ytick text')].some(t => t.textContent.includes({json.dumps(p)}))")


@pytest.fixture(scope="module")
def hostile_plan() -> Plan:
    spec = catalog.load("wan2.1-t2v-1.3b")
    d = offload_lab.plan(spec, pin_budget="1GiB", host=HOST).to_dict()
    d["spec"]["name"] = PAYLOADS[0]
    return Plan.from_dict(d)


@pytest.fixture(scope="module")
def hostile_runs(hostile_plan):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [offload_lab.simulate(hostile_plan, "h200", steps=2, label=p) for p in PAYLOADS]


LABELS = [f"rtx4090-pcie4 · 480p tokens · {t}" for t in ("pinned", "pageable", "8GiB pin budget")]


@pytest.fixture(scope="module")
def label_runs():
    """A realistic set: one device and token count, three tiers; the tier is what tells them apart."""
    spec = catalog.load("wan2.1-t2v-14b")
    host = offload_lab.HostMemory(available="256GiB")
    plans = [offload_lab.plan(spec, tier="pinned", host=host), offload_lab.plan(spec, tier="pageable", host=host),
             offload_lab.plan(spec, pin_budget="8GiB", host=host)]
    return [offload_lab.simulate(p, "h200", steps=2, tokens="480p", label=lab)
            for p, lab in zip(plans, LABELS)]


@pytest.fixture(scope="module")
def pages(tmp_path_factory, hostile_plan, hostile_runs, label_runs):
    from browser import Visit, chromium_available, open_pages

    why = chromium_available()
    if why:
        pytest.fail(f"browser test cannot run: {why}")
    d = tmp_path_factory.mktemp("payloads")
    # the Engines section: a compare() frame whose settings are the payloads
    frame = engines.compare(hostile_plan.spec, "h200", host=HOST, engines="sglang-layerwise")
    frame["settings"] = PAYLOADS
    rep = report(hostile_runs, plan=hostile_plan, title=PAYLOADS[2], engines=frame)
    rep_path = rep.save(d / "report.html")
    notebook = d / "notebook.html"
    cells = [hostile_plan._repr_html_()] + [r._repr_html_() for r in hostile_runs] + [rep._repr_html_()]
    notebook.write_text("<!DOCTYPE html><html><body>" + "".join(f"<div class='cell'>{c}</div>" for c in cells)
                        + "</body></html>", encoding="utf-8")
    figs = [viz.timeline(hostile_runs[1]), viz.step_times(hostile_runs), viz.bandwidth(hostile_runs),
            viz.memory(hostile_runs[2]), viz.tier_map(hostile_plan), viz.tier_map(hostile_runs[0]),
            viz.startup_peaks([hostile_plan]), viz.step_times(label_runs)]
    body = "".join(f.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"f{i}")
                   for i, f in enumerate(figs))
    fig_page = d / "figures.html"
    fig_page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{body}</body></html>",
                        encoding="utf-8")
    common = {"pwned": PWNED, "injected": INJECTED}
    ticks = ("[...document.querySelectorAll('#f7 .ytick text')].map(t => t.textContent)")
    title = "document.querySelector('#f7 .gtitle').textContent"
    return rep, open_pages([
        Visit(rep_path, probes={f"text{i}": _text_has(p) for i, p in enumerate(PAYLOADS)}
              | {f"svg{i}": _svg_has(p) for i, p in enumerate(PAYLOADS)}
              | {f"engines{i}": _engines_has(p) for i, p in enumerate(PAYLOADS)}, frame_probes=common),
        Visit(notebook, probes={"plan_name": _text_has(PAYLOADS[0])}
              | {f"text{i}": _text_has(p) for i, p in enumerate(PAYLOADS)}, frame_probes=common),
        Visit(fig_page, probes={f"svg{i}": _svg_has(p) for i, p in enumerate(PAYLOADS)}
              | {"ticks": ticks, "title": title}, frame_probes=common),
    ])


@pytest.mark.browser
@pytest.mark.parametrize("which", ["report", "notebook", "figures"])
def test_no_payload_runs(pages, which):
    page = pages[1][["report", "notebook", "figures"].index(which)]
    assert page.page_errors == [] and page.dialogs == [], (page.page_errors, page.dialogs)
    assert page.frame_probes["pwned"] and all(page.frame_probes["pwned"]), page.frame_probes
    assert page.frame_probes["injected"] == [0] * len(page.frame_probes["injected"])
    assert page.blocked_requests == []


@pytest.mark.browser
def test_payloads_are_shown_as_text(pages):
    rep, (report_page, notebook, figures) = pages
    for i in range(len(PAYLOADS)):
        # in the report's tables and headings, and in its figures' SVG text
        assert report_page.probes[f"text{i}"] and report_page.probes[f"svg{i}"], i
        assert report_page.probes[f"engines{i}"], i
        assert figures.probes[f"svg{i}"], i
    # Plan._repr_html_ shows the spec name; the runs' tables show their labels
    assert notebook.probes["plan_name"]
    assert all(notebook.probes[f"text{i}"] for i in range(len(PAYLOADS)))
    # and the report inside its sandboxed iframe drew every figure
    assert notebook.figures == notebook.rendered >= len(rep.figures)


@pytest.mark.browser
def test_labels_show_what_differs_in_the_browser(pages):
    figures = pages[1][2]
    ticks = figures.probes["ticks"]
    assert len(ticks) == 3
    # each bar's label names its tier, uncut; what all share is in the title, once
    for tier, tick in zip(("8GiB pin budget", "pageable", "pinned"), ticks):
        assert tier in tick and "…" not in tick, ticks
        assert "rtx4090" not in tick, ticks
    assert "rtx4090-pcie4 · 480p tokens" in figures.probes["title"]
    assert "…" not in figures.probes["title"]
