"""The PlanExplorer dashboard in a real JupyterLab, in headless Chromium: its tabs keep switching.

A user reported that "after reopening a browser tab the dashboard's tabs stopped switching".
This test drives what that user did, end to end: a JupyterLab server on localhost, a notebook
whose cell builds ``PlanExplorer("wan2.1-t2v-1.3b", host="64GiB", live=False)``, the cell run
once the kernel is idle, every dashboard tab clicked (the visible panel must be that tab's, and
its content must be that panel's), the notebook saved, then

1. the page reloaded, kernel alive → the tabs switch;
2. the browser tab closed and the notebook opened in a new page, kernel alive → the tabs switch;
3. the kernel restarted and the page reloaded, with the widget state saved in the notebook →
   the dashboard is drawn from the saved state and its tabs still switch (the tab bar is
   frontend-only), but nothing behind the controls runs any more, so the dashboard must say
   that the cell has to be run again — a plain HTML output of its own above the widget does, so
   it reads in case 4 too;
4. the same without saved widget state (JupyterLab's default) → JupyterLab shows
   "Error displaying widget: model not found" in place of the dashboard: there are no tabs at
   all, which is the most likely reading of "the tabs stopped switching".

Not reproduced (JupyterLab 4.6, ipywidgets 8.1, jupyterlab_widgets 3.0, Chromium): tabs that
are drawn but do not switch. With a live kernel (reload, new page) and with saved state after a
kernel restart, every click switched the panel. What a user sees after a kernel restart is
either a dashboard whose tabs switch but whose controls do nothing (saved state) or no
dashboard at all (no saved state); the dashboard's title now tells them to run the cell again.

Every wait is bounded (a failure, never a hang) and the server is always shut down.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest
from tiny_pipelines import LAYERS

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "dashboard.ipynb"
CELL = ('from offload_lab import PlanExplorer\n'
        'ex = PlanExplorer("wan2.1-t2v-1.3b", host="64GiB", live=False)\n'
        'ex')
TAB_NAMES = ["Timeline", "Tier map", "Plan", "Comparison", "Recommend", "Engines"]
RERUN_NOTE = "run this cell again"
WAIT_MS = 60_000        # a cold kernel importing torch on a busy 2-core machine is slow
SWITCH_MS = 10_000
CELL_MS = 120_000       # the first run of the cell imports torch and offload_lab in the kernel

TABS = ".jp-OutputArea .widget-tab"
# which tab is current, which panel(s) are visible, and what each visible panel holds
STATE_JS = """() => {
  const t = document.querySelector('.jp-OutputArea .widget-tab');
  if (!t) return null;
  const kids = [...t.querySelector('.widget-tab-contents').children];
  const shown = kids.map((k, i) => [i, k])
    .filter(([i, k]) => !k.classList.contains('lm-mod-hidden') && k.offsetParent !== null);
  const tabs = [...t.querySelectorAll('.lm-TabBar-tab')];
  return {current: tabs.findIndex(x => x.classList.contains('lm-mod-current')),
          titles: tabs.map(x => x.innerText.trim()),
          visible: shown.map(([i]) => i),
          text: shown.map(([i, k]) => k.innerText),
          plots: shown.map(([i, k]) => k.querySelectorAll('.main-svg').length)};
}"""
OUTPUT_TEXT_JS = "() => [...document.querySelectorAll('.jp-OutputArea')].map(o => o.innerText).join('\\n')"
# the visible text of the cell's outputs that are no widget: the notice to run the cell again,
# which must read even when JupyterLab has no model left to draw the dashboard from
NOTICE_JS = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
  .filter(o => o.offsetParent !== null && !o.querySelector('.jupyter-widgets') && !o.closest('.jupyter-widgets'))
  .map(o => o.innerText).join('\\n')"""


def _panel_holds(i: int, state: dict) -> bool:
    """Does the one visible panel hold what tab ``i`` shows (independent of its position)?"""
    text, plots = state["text"][0], state["plots"][0]
    return {
        0: plots == 0 and "HostMemory(" not in text,          # timeline: empty until Simulate
        1: plots >= 1,                                        # tier map: a plotly figure
        2: "HostMemory(available=64.00 GiB" in text and "pin budget" in text,  # the ledger
        3: "No runs kept yet" in text,                        # the comparison
        4: "Press Recommend" in text,                         # the recommendation, before a search
        5: "Press Compare engines" in text,                   # other engines, before a comparison
    }[i]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server over a temp root holding the dashboard notebook; shut down after."""
    from browser import JupyterLab, chromium_available, free_port

    why = chromium_available()
    if why:
        pytest.skip(why)
    pytest.importorskip("jupyterlab")
    pytest.importorskip("ipywidgets")
    import nbformat

    home = tmp_path_factory.mktemp("jupyter-home")
    root = home / "notebooks"
    root.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / NOTEBOOK)
    # save the widget state with the notebook, as a user who wants it kept across sessions does
    settings = home / "settings" / "@jupyter-widgets" / "jupyterlab-manager"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"saveState": True}))
    # no "get notified about Jupyter news?" toast over the dashboard in the screenshots
    news = home / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    server = JupyterLab(root, home, free_port(), secrets.token_hex(16))
    try:
        server.start(pythonpath=str(REPO))
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def context(lab):
    """A headless Chromium context (the Debian build) that may only reach the local server."""
    from browser import CHROMIUM, CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            ctx.set_default_timeout(WAIT_MS)
            # nothing outside the server: no fonts, news or extension index from the network
            ctx.route("**/*", lambda r: r.continue_() if r.request.url.startswith(lab.url)
                      or r.request.url.split(":", 1)[0] in ("data", "blob", "about") else r.abort())
            yield ctx
        finally:
            browser.close()


def _wait_kernel_idle(lab, page, timeout_s: float = WAIT_MS / 1000, path: str = NOTEBOOK) -> str:
    """Wait until the notebook's kernel exists and is idle, per the server and per the page."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        kid, last = lab.kernel_state(path)
        page_status = page.evaluate("() => { const e = document.querySelector("
                                    "'.jp-Notebook-ExecutionIndicator'); "
                                    "return e && e.getAttribute('data-status'); }")
        # the page's indicator reads "idle" before a kernel is attached: require both
        if kid is not None and last == "idle" and page_status == "idle":
            return kid
        time.sleep(0.25)
    raise AssertionError(f"the kernel of {path} was not idle after {timeout_s:.0f} s "
                         f"(server says {last!r}); server log: {lab.log_tail()}")


def _open(lab, context):
    page = context.new_page()
    page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-Cell")
    return page


def _state(page) -> dict:
    page.wait_for_selector(TABS, state="visible")
    return page.evaluate(STATE_JS)


def _check_tabs_switch(page, when: str) -> None:
    """Click every tab (then the first again): its panel alone is shown, with its own content."""
    state = _state(page)
    assert state["titles"] == TAB_NAMES, when
    for i in (1, 2, 3, 0):
        page.locator(f"{TABS} .lm-TabBar-tab").nth(i).click(timeout=SWITCH_MS)
        try:
            page.wait_for_function(f"() => {{ const s = ({STATE_JS})(); return s && s.current === {i} "
                                   f"&& s.visible.length === 1 && s.visible[0] === {i}; }}",
                                   timeout=SWITCH_MS)
        except Exception:
            raise AssertionError(f"{when}: clicking tab {TAB_NAMES[i]!r} did not show its panel: "
                                 f"{page.evaluate(STATE_JS)}") from None
        # a figure is drawn once the page has plotly.js: the first view of a fresh page loads it
        deadline = time.monotonic() + SWITCH_MS / 1000
        while not _panel_holds(i, state := page.evaluate(STATE_JS)) and time.monotonic() < deadline:
            page.wait_for_timeout(200)
        assert _panel_holds(i, state), f"{when}: tab {TAB_NAMES[i]!r} shows {state}"


def _run_cell(lab, page) -> None:
    """Run the notebook's one cell and wait for the dashboard's tabs (or say what it printed)."""
    page.click(".jp-Cell .jp-InputArea-editor")
    page.keyboard.press("Shift+Enter")
    try:
        page.wait_for_selector(TABS, state="visible", timeout=CELL_MS)
    except Exception:
        raise AssertionError(f"no dashboard; the cell's output: {page.evaluate(OUTPUT_TEXT_JS)!r}; "
                             f"server log: {lab.log_tail()}") from None


def test_tabs_switch_after_reload_reopen_and_kernel_restart(lab, context):
    page = _open(lab, context)
    kid = _wait_kernel_idle(lab, page)
    _run_cell(lab, page)
    _check_tabs_switch(page, "first run")
    assert RERUN_NOTE in page.evaluate(NOTICE_JS)

    # save (with the widget state), then reload the page: same kernel, widgets from the kernel
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=SWITCH_MS)
    page.reload(wait_until="domcontentloaded")
    _wait_kernel_idle(lab, page)
    _check_tabs_switch(page, "after reload, kernel alive")

    # "reopening a browser tab": close it, open the notebook in a new page
    page.close()
    page = _open(lab, context)
    assert _wait_kernel_idle(lab, page) == kid
    _check_tabs_switch(page, "in a new page, kernel alive")

    # restart the kernel: the models behind the views are gone; the saved state still draws
    lab.api("POST", f"/api/kernels/{kid}/restart", timeout=30)
    page.reload(wait_until="domcontentloaded")
    _wait_kernel_idle(lab, page)
    _check_tabs_switch(page, "after a kernel restart, saved widget state")
    assert RERUN_NOTE in page.evaluate(NOTICE_JS)  # and an output of its own says to run the cell again
    page.close()

    # without saved widget state (JupyterLab's default), a restarted kernel leaves no dashboard
    model = lab.api("GET", f"/api/contents/{NOTEBOOK}?content=1")
    assert model["content"]["metadata"].get("widgets"), "the widget state was not saved"
    del model["content"]["metadata"]["widgets"]
    lab.api("PUT", f"/api/contents/{NOTEBOOK}",
            {"type": "notebook", "format": "json", "content": model["content"]})
    page = _open(lab, context)
    _wait_kernel_idle(lab, page)
    page.wait_for_function("() => document.querySelector('.jp-OutputArea') && "
                           "document.querySelector('.jp-OutputArea').innerText.includes('model not found')",
                           timeout=WAIT_MS)
    assert page.query_selector(TABS) is None
    # where the dashboard cannot be drawn at all, the notice beside it still is
    assert RERUN_NOTE in page.evaluate(NOTICE_JS)
    page.close()


# -- the big dashboards and a pipeline's: the issue order, "unconfirmed", every tab laid out ---------
# a catalog name, or "pipeline": the spec of the tests' tiny diffusers WanPipeline
DASHBOARDS = ("wan2.1-t2v-14b", "minimax-h3", "pipeline")
PIPELINE_CELL = ("import offload_lab\n"
                 "from offload_lab import PlanExplorer\n"
                 "from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_pipeline\n"
                 f"pipe = tiny_wan_pipeline(layers={LAYERS})\n"
                 "ex = PlanExplorer(offload_lab.spec_of(pipe), host='64GiB', tokens=64, live=True)\n"
                 "ex")
# every description label and tab title in the dashboard that its box cuts (text wider than it)
CLIPPED_JS = """() => [...document.querySelectorAll(
    '.jp-OutputArea .widget-label, .jp-OutputArea .lm-TabBar-tabLabel, .jp-OutputArea .widget-tab .lm-TabBar-tab')]
  .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
  .map(e => [e.innerText.trim(), e.scrollWidth, e.clientWidth])"""
# the width of each slider's track, by its label: a squeezed one cannot be dragged
SLIDERS_JS = """() => [...document.querySelectorAll('.jp-OutputArea .widget-slider')]
  .map(w => [w.querySelector('.widget-label').innerText.trim(),
             w.querySelector('.slider-container').getBoundingClientRect().width])"""
ISSUE_JS = """() => { const w = [...document.querySelectorAll('.jp-OutputArea .widget-dropdown')]
  .find(w => w.querySelector('.widget-label').innerText.trim() === 'issue order');
  return w ? [...w.querySelectorAll('option')].map(o => o.textContent.replace(/\u00a0/g, ' ')) : null; }"""
# choose a dropdown's option as a user does (by the label before it and the option's text)
CHOOSE_JS = """([label, text]) => { const w = [...document.querySelectorAll('.jp-OutputArea .widget-dropdown')]
  .find(w => w.querySelector('.widget-label').innerText.trim() === label);
  const s = w.querySelector('select'); s.value = [...s.options].find(o => o.textContent.replace(/\u00a0/g, ' ') === text).value;
  s.dispatchEvent(new Event('change', {bubbles: true})); }"""
STATUS_HAS_JS = """(words) => [...document.querySelectorAll('.jp-OutputArea .widget-html')]
  .some(e => words.every(w => e.innerText.includes(w)))"""
# the drawn plotly figures in the visible tab panel
PANEL_FIGURES_JS = """() => { const t = document.querySelector('.jp-OutputArea .widget-tab');
  const k = [...t.querySelector('.widget-tab-contents').children]
    .find(k => !k.classList.contains('lm-mod-hidden') && k.offsetParent !== null);
  return k ? k.querySelectorAll('.js-plotly-plot .main-svg').length : -1; }"""
# the messages of widget views that failed to render ("Click to show javascript error")
WIDGET_ERRORS_JS = """() => [...document.querySelectorAll('.jp-OutputArea .jupyter-widgets.widget-error, .jp-OutputArea .widget-error')]
  .map(e => { e.click(); return e.innerText || e.textContent; })"""
# the figures each tab must show once Simulate (live), "pinned vs pageable" and Recommend ran
TAB_FIGURES = {"Timeline": 1, "Tier map": 1, "Plan": 0, "Comparison": 1, "Recommend": 1, "Engines": 0}


def _press(page, label: str) -> None:
    page.locator(".jp-OutputArea .widget-button", has_text=label).first.click(timeout=SWITCH_MS)


def _tab_layouts(page, name: str, shots: Path) -> list[str]:
    """Show every tab in turn: screenshot it under ``shots`` and say what is clipped or overlaps."""
    from browser import FIGURE_LAYOUT, layout_problems

    problems = []
    for i, title in enumerate(TAB_NAMES):
        page.locator(f"{TABS} .lm-TabBar-tab").nth(i).click(timeout=SWITCH_MS)
        page.wait_for_function(f"() => {{ const s = ({STATE_JS})(); return s && s.current === {i} "
                               f"&& s.visible.length === 1 && s.visible[0] === {i}; }}", timeout=SWITCH_MS)
        want = TAB_FIGURES[title]
        try:
            page.wait_for_function(f"() => ({PANEL_FIGURES_JS})() >= {want}", timeout=WAIT_MS)
        except Exception:
            raise AssertionError(f"{name}: tab {title!r} drew {page.evaluate(PANEL_FIGURES_JS)} figure(s), "
                                 f"expected {want}: {page.evaluate(WIDGET_ERRORS_JS)!r}; "
                                 f"{page.evaluate(OUTPUT_TEXT_JS)!r}") from None
        page.wait_for_timeout(300)  # plotly lays a legend out after the first paint
        # the notebook scrolls inside its panel, not the page: shoot the tab widget itself
        page.locator(TABS).first.screenshot(path=str(shots / f"{name}-{i}-{title.replace(' ', '-')}.png"))
        problems += [f"{title}: label cut {c}" for c in page.evaluate(CLIPPED_JS)]
        # figures of the hidden tabs have no box; those of this one must read
        shown = [f for f in page.evaluate(FIGURE_LAYOUT) if f["box"] is not None]
        problems += [f"{title}: {p}" for p in layout_problems(shown, legend_over_plot=True)]
    return problems


# the "front plan" dropdown's choice, and the centres of the points of the visible panel's plot
FRONT_CHOICE_JS = """() => { const w = [...document.querySelectorAll('.jp-OutputArea .widget-inline-hbox')]
  .find(w => w.querySelector(':scope > .widget-label')?.textContent.trim().startsWith('front plan'));
  return w.querySelector('select').selectedIndex; }"""
PANEL_POINTS_JS = """() => { const k = [...document.querySelectorAll('.jp-OutputArea .widget-tab-contents > *')]
  .find(c => c.offsetWidth > 0); const gd = k.querySelector('.js-plotly-plot'); gd.scrollIntoView();
  return [...gd.querySelectorAll('.scatterlayer .trace .points path')].map(p => {
    const r = p.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }); }"""


def _click_front_points(page) -> bool:
    """Click points of the Recommend tab's plot as a user does, until one loads another plan
    (the front plan dropdown changes); False if none did."""
    page.locator(f"{TABS} .lm-TabBar-tab").nth(TAB_NAMES.index("Recommend")).click(timeout=SWITCH_MS)
    before = page.evaluate(FRONT_CHOICE_JS)
    for x, y in page.evaluate(PANEL_POINTS_JS)[:4]:
        page.mouse.move(x, y)
        page.mouse.click(x, y)
        try:
            page.wait_for_function(f"() => ({FRONT_CHOICE_JS})() !== {before}", timeout=5000)
            return True
        except Exception:
            continue
    return False


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboards_show_the_issue_order_and_every_tab_reads(lab, context, name, tmp_path):
    import nbformat

    if name == "pipeline":
        pytest.importorskip("diffusers")
        cell = PIPELINE_CELL
    else:
        cell = f"from offload_lab import PlanExplorer\nex = PlanExplorer({name!r}, host='64GiB', live=True)\nex"
    path = f"{name}.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lab.root / path)
    page = context.new_page()
    # tall enough that a tab's screenshot holds the whole panel (the notebook scrolls inside)
    page.set_viewport_size({"width": 1400, "height": 2400})
    try:
        # a workspace of its own, reset: the page shows this notebook alone
        page.goto(f"{lab.url}/lab/workspaces/{name.replace('.', '-')}/tree/{path}?reset&token={lab.token}",
                  wait_until="domcontentloaded")
        page.wait_for_selector(".jp-Notebook .jp-Cell")
        _wait_kernel_idle(lab, page, CELL_MS / 1000, path)  # a kernel starts slowly on a busy machine
        _run_cell(lab, page)
        page.wait_for_function(STATUS_HAS_JS, arg=["simulated on"], timeout=CELL_MS)
        assert RERUN_NOTE in page.evaluate(NOTICE_JS)
        assert page.evaluate(ISSUE_JS) == ["after-compute", "before-compute"]
        assert page.evaluate(CLIPPED_JS) == []
        narrow = [(label, w) for label, w in page.evaluate(SLIDERS_JS) if w < 120]
        assert narrow == [], f"sliders too narrow to drag: {narrow}"
        # fill the comparison and the recommendation, then read every tab
        _press(page, "pinned vs pageable")
        _press(page, "Recommend")
        problems = _tab_layouts(page, name, tmp_path)
        assert problems == [], problems
        assert len(list(tmp_path.glob(f"{name}-*.png"))) == len(TAB_NAMES)
        # a pageable plan in the after-compute order: no GPU run backs it, and the status says so
        page.locator(f"{TABS} .lm-TabBar-tab").nth(0).click(timeout=SWITCH_MS)
        page.evaluate(CHOOSE_JS, ["forced tier", "pageable"])
        try:
            page.wait_for_function(STATUS_HAS_JS, arg=["pageable", "unconfirmed — no GPU run of this issue order yet",
                                                      "before-compute order"], timeout=WAIT_MS)
        except Exception:
            raise AssertionError(f"the status does not say unconfirmed: {page.evaluate(OUTPUT_TEXT_JS)!r}") from None
        assert page.evaluate(CLIPPED_JS) == []  # a longer status line moves nothing into a cut
        # a click on a point of the plans tried loads that plan
        assert _click_front_points(page), "no click on the Recommend plot loaded a plan"
    finally:
        page.close()
