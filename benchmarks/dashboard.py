"""Dashboard redraw time in a real JupyterLab: a control changed in the page → the timeline redrawn.

For each dashboard (``PlanExplorer(name, host="64GiB")``, live: every change simulates), the
notebook cell is run in JupyterLab in headless Chromium (the project's browser test harness,
``tests/browser.py``), then each control change of :data:`CHANGES` is made in the page as a
user makes it (a dropdown chosen, a slider's readout typed and Enter pressed) and timed in the
page from the change to the first animation frame in which the Timeline tab shows a new,
drawn plotly figure, or the figure on display redrawn in place with a new figure (the count of
figures a ``PlotView`` drew; plotly.js's ``plotly_afterplot`` for an older checkout's
``FigureWidget``). Prints the median and the max per dashboard with the machine's load average
(the kernel and the browser share its cores; a busy machine reads slower)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/dashboard.py            # both dashboards
    PYTHONPATH=$PWD .venv/bin/python benchmarks/dashboard.py minimax-h3 --repeat 2
    PYTHONPATH=$PWD .venv/bin/python benchmarks/dashboard.py minimax-h3 --messages  # and what the page received

Speed is measured here, never asserted in a test.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

MODELS = ("wan2.1-t2v-14b", "minimax-h3")
#: (control description, kind, value): a dropdown's option text or a slider's typed value; each
#: changes the plan or a simulator option, so each one makes a new timeline (the last one undoes
#: the first, so the list can be repeated)
CHANGES = [
    ("forced tier", "select", "pageable"), ("issue order", "select", "before-compute"),
    ("calls per step", "select", "2 calls (guidance)"), ("issue order", "select", "after-compute"),
    ("prefetch depth", "slider", "2"), ("forced tier", "select", "pinned"),
    ("calls per step", "select", "1 call"), ("prefetch depth", "slider", "0"),
    ("forced tier", "select", "planner's choice"), ("pin budget", "slider", "8"),
    ("issue order", "select", "before-compute"), ("pin budget", "slider", "3"),
    ("prefetch depth", "slider", "1"), ("issue order", "select", "after-compute"),
    ("pin order", "select", "reverse"), ("forced tier", "select", "pageable"),
    ("pin order", "select", "execution"), ("forced tier", "select", "planner's choice"),
]
#: the changes a dashboard without the issue-order and calls controls also has (an A/B run
#: against an older checkout: ``--repo OLD --changes common``)
COMMON = [("forced tier", "select", "pageable"), ("prefetch depth", "slider", "2"),
          ("forced tier", "select", "pinned"), ("prefetch depth", "slider", "0"),
          ("forced tier", "select", "planner's choice"), ("pin budget", "slider", "8"),
          ("pin budget", "slider", "3"), ("prefetch depth", "slider", "1"),
          ("pin order", "select", "reverse"), ("pin order", "select", "execution")]
# every change differs from the state the one before leaves, the first from the last (a repeat)
CELL_MS = 180_000
STEP_MS = 30_000

# the widget whose description label starts with the text: its <select> or its slider readout
_FIND = """(d) => [...document.querySelectorAll('.jp-OutputArea .widget-inline-hbox')]
  .find(w => { const l = w.querySelector(':scope > .widget-label');
               return l && l.textContent.trim().startsWith(d); })"""
_TIMELINE = "document.querySelector('.jp-OutputArea .widget-tab .widget-tab-contents').children[0]"
# mark the figures on display (and hear when plotly.js redraws one in place: the figure's widget
# got a new figure), and start the clock
_ARM = f"""() => {{ const p = {_TIMELINE};
  p.querySelectorAll('.js-plotly-plot').forEach(e => {{ e.dataset.benchOld = '1'; e.__benchRedrawn = false;
    e.__benchFigures = e.dataset.figures;
    if (!e.__benchHeard && e.on) {{ e.on('plotly_afterplot', () => {{ e.__benchRedrawn = true; }}); e.__benchHeard = true; }} }});
  window.__benchIdle = null; window.__benchBusy = false;
  const ind = document.querySelector('.jp-Notebook-ExecutionIndicator');
  if (window.__benchObs) window.__benchObs.disconnect();
  window.__benchObs = new MutationObserver(() => {{ const st = ind.getAttribute('data-status');
    if (st === 'busy') window.__benchBusy = true;
    else if (st === 'idle' && window.__benchBusy && window.__benchIdle === null) window.__benchIdle = performance.now(); }});
  if (ind) window.__benchObs.observe(ind, {{attributes: true, attributeFilter: ['data-status']}});
  window.__benchT0 = performance.now(); }}"""
_SELECT = f"""([d, text]) => {{ const w = ({_FIND})(d); const s = w.querySelector('select');
  const o = [...s.options].find(o => o.textContent.replace(/\u00a0/g, ' ') === text);
  if (!o) throw new Error('no option ' + text + ' in ' + d);
  ({_ARM})(); s.value = o.value; s.dispatchEvent(new Event('change', {{bubbles: true}})); }}"""
# a new figure on display, drawn, or the one on display redrawn in place: the time since the
# clock started; a change whose timeline is the one on display already (an in-place update sends
# nothing then): minus the time to the kernel's idle, once nothing was drawn for 1 s after it
# (else null)
_DRAWN = f"""() => {{ const p = {_TIMELINE};
  // a PlotView counts the figures it drew (a resize redraws too, and is no new figure)
  const redrawn = e => e.dataset.figures === undefined ? e.__benchRedrawn : e.dataset.figures !== e.__benchFigures;
  const fresh = [...p.querySelectorAll('.js-plotly-plot')].filter(e => (!e.dataset.benchOld || redrawn(e)) && e.querySelector('.main-svg .bars, .main-svg .plot'));
  if (fresh.length) return performance.now() - window.__benchT0;
  const idle = window.__benchIdle;
  return idle !== null && performance.now() - idle > 1000 ? -(idle - window.__benchT0) : null; }}"""


# every message the page receives from the server: (time, size), for --messages
_HEAR_WS = """(() => { const Ws = window.WebSocket; window.__benchWs = [];
  window.WebSocket = function (...a) { const ws = new Ws(...a);
    ws.addEventListener('message', (e) => { const d = e.data;
      window.__benchWs.push([performance.now(), typeof d === 'string' ? d.length : (d.byteLength || d.size || 0)]); });
    return ws; };
  window.WebSocket.prototype = Ws.prototype; Object.assign(window.WebSocket, Ws); })();"""
# the messages since the clock started: how many, and when the largest arrived (ms) and its size
_HEARD = """() => { const m = window.__benchWs.filter(([t]) => t >= window.__benchT0);
  const big = m.reduce((a, b) => (b[1] > a[1] ? b : a), [window.__benchT0, 0]);
  return [m.length, big[0] - window.__benchT0, big[1]]; }"""


def _notebook(root: Path, name: str) -> str:
    import nbformat

    cell = (f"from offload_lab import PlanExplorer\n"
            f"ex = PlanExplorer({name!r}, host='64GiB', live=True)\nex")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = f"{name}.ipynb"
    nbformat.write(nb, root / path)
    return path


def _wait_idle(lab, page, path: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        kid, state = lab.kernel_state(path)
        ind = page.evaluate("() => { const e = document.querySelector('.jp-Notebook-ExecutionIndicator');"
                            " return e && e.getAttribute('data-status'); }")
        if kid and state == "idle" and ind == "idle":
            return
        time.sleep(0.25)
    raise TimeoutError(f"kernel of {path} not idle after {timeout_s:.0f} s: {lab.log_tail()}")


def measure(page, changes: list[tuple[str, str, str]], messages: bool = False) -> list[float]:
    """Make each change in the page; the ms from each to its redrawn timeline (negative: to the
    kernel's idle, for a change that left the timeline as it was shown). ``messages``: also
    print, per change, the messages the page received (the page must hear its websocket)."""
    times = []
    for desc, kind, value in changes:
        if kind == "select":
            page.evaluate(_SELECT, [desc, value])
        else:
            readout = page.evaluate_handle(f"(d) => ({_FIND})(d).querySelector('.widget-readout')", desc)
            readout.as_element().click()
            page.keyboard.press("Control+A")
            page.keyboard.type(value)
            page.evaluate(_ARM)
            page.keyboard.press("Enter")
        handle = page.wait_for_function(_DRAWN, polling="raf", timeout=STEP_MS)
        times.append(float(handle.json_value()))
        page.wait_for_timeout(300)  # let the kernel's last messages (status line) land
        if messages:
            n, at, size = page.evaluate(_HEARD)
            print(f"  {desc} -> {value}: redrawn at {times[-1]:.0f} ms; {n} messages received, the "
                  f"largest ({size / 1000:.0f} kB) at {at:.0f} ms", flush=True)
    return times


def run(models: list[str], repeat: int = 1, repo: Path = REPO,
        changes: list[tuple[str, str, str]] = CHANGES, messages: bool = False) -> dict[str, list[float]]:
    from browser import CHROMIUM, CHROMIUM_ARGS, JupyterLab, free_port
    from playwright.sync_api import sync_playwright

    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="offload-dash-bench-") as tmp:
        home = Path(tmp)
        root = home / "notebooks"
        root.mkdir()
        paths = {m: _notebook(root, m) for m in models}
        lab = JupyterLab(root, home, free_port(), secrets.token_hex(16))
        lab.start(pythonpath=str(repo))
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
                ctx.route("**/*", lambda r: r.continue_() if r.request.url.startswith(lab.url)
                          or r.request.url.split(":", 1)[0] in ("data", "blob", "about") else r.abort())
                for i, m in enumerate(models):
                    page = ctx.new_page()
                    if messages:
                        page.add_init_script(_HEAR_WS)
                    # a workspace of its own, reset: the page shows this notebook alone
                    page.goto(f"{lab.url}/lab/workspaces/bench{i}/tree/{paths[m]}?reset&token={lab.token}",
                              wait_until="domcontentloaded")
                    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=CELL_MS)
                    _wait_idle(lab, page, paths[m])
                    page.click(".jp-Cell .jp-InputArea-editor")
                    page.keyboard.press("Shift+Enter")
                    page.wait_for_selector(".jp-OutputArea .widget-tab", timeout=CELL_MS)
                    page.wait_for_function(f"() => {_TIMELINE}.querySelector('.js-plotly-plot .main-svg')",
                                           timeout=CELL_MS)
                    _wait_idle(lab, page, paths[m])
                    out[m] = [t for _ in range(repeat) for t in measure(page, changes, messages)]
                    print(f"{m}: {', '.join(f'{t:.0f}' for t in out[m])} ms", flush=True)
                    page.close()
                browser.close()
        finally:
            lab.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--repeat", type=int, default=1, help="run the list of changes this many times")
    ap.add_argument("--json", help="also write the times (ms) here")
    ap.add_argument("--repo", type=Path, default=REPO,
                    help="the checkout whose offload_lab the kernel imports (default: this one)")
    ap.add_argument("--changes", choices=("all", "common"), default="all",
                    help="common: only controls older dashboards have too (tier, prefetch, budget, pin order)")
    ap.add_argument("--messages", action="store_true",
                    help="also print, per change, how many messages the page received and when the largest came")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    times = run(args.models, args.repeat, args.repo.resolve(), CHANGES if args.changes == "all" else COMMON,
                args.messages)
    load1 = os.getloadavg()
    print(f"kernel imports {args.repo.resolve()}; changes: {args.changes}")
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
          f"after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} ({os.cpu_count()} cores)")
    for m, signed in times.items():
        ts = [abs(t) for t in signed]  # a change that left the timeline as it was: its time to idle
        same = [-t for t in signed if t < 0]
        print(f"{m:16s} {len(ts)} changes: median {statistics.median(ts):.0f} ms, max {max(ts):.0f} ms, "
              f"min {min(ts):.0f} ms  (goal: median <= 150 ms, max <= 300 ms)"
              + (f"; {len(same)} left the timeline as shown (nothing redrawn; counted at the kernel's "
                 f"idle: {', '.join(f'{t:.0f}' for t in same)} ms)" if same else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"load": [load0, load1], "ms": times}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
