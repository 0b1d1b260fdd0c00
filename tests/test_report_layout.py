"""Every figure of a report reads in the browser: no title over an axis title, the legend inside
its figure and not scrolling, a plot area of at least 200 px each way, every pin rank shown.

Three kinds of report, opened in one headless Chromium: the demo's (Wan2.1 on the cpu backend
with simulated GPU runs), a simulated MiniMax-H3 report with its plan, and a report of a real
diffusers pipeline run on the cpu backend.
"""

from __future__ import annotations

import warnings

import pytest

import offload_lab
from offload_lab import catalog

# per figure: its id, the pin ranks its tier-map bars print, and how many layers are pinned
RANK_TEXT = """[...document.querySelectorAll('.plotly-graph-div.js-plotly-plot')]
  .filter(d => d.id.includes('tier-map')).map(d => ({id: d.id,
    shown: [...d.querySelectorAll('.bartext')].map(t => t.textContent).filter(t => t),
    pinned: d.data.filter(t => t.name === 'pinned').reduce((n, t) => n + (t.text || []).length, 0),
    labelled_resident: d.data.filter(t => t.name === 'resident').some(t => (t.text || []).some(x => x))}))"""
LEGENDS = """Object.fromEntries([...document.querySelectorAll('.plotly-graph-div.js-plotly-plot')]
  .map(d => [d.id, [...d.querySelectorAll('.legend .legendtext')].map(t => t.textContent)]))"""


def _h3_report(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = catalog.load("minimax-h3")
        host = offload_lab.HostMemory(available="96GiB")
        plan = offload_lab.plan(spec, pin_budget="24GiB", host=host)
        runs = [offload_lab.simulate(plan, "h200", steps=2, label="h3 · pin budget 24 GiB")]
        runs += [offload_lab.simulate(offload_lab.plan(spec, tier=t, host=host), "h200", steps=2,
                                      label=f"h3 · all {t}") for t in ("pageable", "mapped")]
    rep = offload_lab.report(runs, plan=plan)
    return rep, rep.save(path)


def _pipeline_report(pipe, path):
    from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_call

    pp = offload_lab.plan_pipeline(offload_lab.spec_of(pipe).with_uses(steps=2), tier="pinned")
    runs = [offload_lab.profile(pipe, lambda: pipe(**tiny_wan_call(steps=2)), pp, backend="cpu",
                                warmup=1, label="tiny wan pipeline · pinned")]
    rep = offload_lab.report(runs)
    return rep, rep.save(path)


@pytest.fixture(scope="module")
def pages(tmp_path_factory, tiny_pipe, demo_quick):
    """The three reports, written to a temp dir and opened in one browser."""
    from browser import FIGURE_LAYOUT, Visit, chromium_available, open_pages

    why = chromium_available()
    if why:
        pytest.fail(f"browser test cannot run: {why}")
    d = tmp_path_factory.mktemp("layout")
    # the demo's report from the session's one `demo --quick` process (conftest.py)
    proc, demo = demo_quick
    assert proc.returncode == 0, proc.stderr
    reports = {"demo": (None, demo), "h3": _h3_report(d / "h3.html"),
               "pipeline": _pipeline_report(tiny_pipe, d / "pipeline.html")}
    probes = {"layout": FIGURE_LAYOUT, "ranks": RANK_TEXT, "legends": LEGENDS}
    results = open_pages([Visit(p, None, probes) for _, p in reports.values()])
    return {k: (rep, res) for (k, (rep, _)), res in zip(reports.items(), results)}


def _check(page, rep=None) -> None:
    from browser import layout_problems

    assert page.console_errors == [] and page.page_errors == [], (page.console_errors, page.page_errors)
    assert page.figures == page.rendered > 0
    if rep is not None:
        assert page.figures == len(rep.figures)
    assert layout_problems(page.probes["layout"]) == []
    for m in page.probes["ranks"]:
        # every pinned layer's rank is drawn, and no resident layer carries one
        assert len(m["shown"]) == m["pinned"], m
        assert not m["labelled_resident"], m
    for fig, names in page.probes["legends"].items():
        blocked = [n for n in names if n.startswith("host blocked")]
        assert "host blocked (staging copy)" not in names, fig
        assert len(blocked) == len(set(blocked)), (fig, names)


@pytest.mark.browser
@pytest.mark.slow
def test_demo_report_layout(pages):
    rep, page = pages["demo"]
    _check(page)
    ids = {f["id"] for f in page.probes["layout"]}
    assert {"fig-startup-peaks", "fig-host-ledger", "fig-tier-bytes"} <= ids
    # cpu runs and GPU runs never share an axis: two panels, each with its own unit
    peaks = next(f for f in page.probes["layout"] if f["id"] == "fig-startup-peaks")
    assert len(peaks["plots"]) == 2
    legends = page.probes["legends"]
    assert any("host blocked by a mapped read" in v for k, v in legends.items() if k.startswith("fig-timeline"))


@pytest.mark.browser
def test_simulated_h3_report_layout(pages):
    rep, page = pages["h3"]
    _check(page, rep)
    # the H3 plan maps tens of layers: ranks on all pinned ones, not only on the first nine
    plan_map = next(m for m in page.probes["ranks"] if m["id"] == "fig-plan-tier-map")
    assert plan_map["pinned"] > 9 and len(plan_map["shown"]) == plan_map["pinned"]


@pytest.mark.browser
def test_pipeline_report_layout(pages):
    rep, page = pages["pipeline"]
    _check(page, rep)
