"""Open an HTML file in headless Chromium (the Debian one, never a downloaded browser), offline.

Used by the report tests; also runnable by hand::

    .venv/bin/python tests/browser.py offload-report.html artifacts/report.png

>>> page = open_html("offload-report.html", screenshot="artifacts/report.png")  # doctest: +SKIP
>>> page.console_errors, page.figures == page.rendered  # doctest: +SKIP
([], True)
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("OFFLOAD_LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# the report writes one .plotly-graph-div per figure; plotly.js adds .js-plotly-plot and an SVG
_ALL_DRAWN = ("() => document.readyState === 'complete' && [...document.querySelectorAll('.plotly-graph-div')]"
              ".every(d => d.classList.contains('js-plotly-plot') && d.querySelector('.main-svg'))")
_FIGURES = "document.querySelectorAll('.plotly-graph-div').length"
_RENDERED = ("[...document.querySelectorAll('.plotly-graph-div.js-plotly-plot')]"
             ".filter(d => d.querySelector('.main-svg')).length")


@dataclass
class PageResult:
    """What a page did when loaded: errors, figures found and rendered, requests refused, probes."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    blocked_requests: list[str] = field(default_factory=list)
    figures: int = 0          # figure divs (.plotly-graph-div), in the page and its frames
    rendered: int = 0         # of those, how many plotly.js drew (.js-plotly-plot with a .main-svg)
    probes: dict[str, Any] = field(default_factory=dict)
    frame_probes: dict[str, list[Any]] = field(default_factory=dict)  # one value per frame


def chromium_available() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (install Debian's chromium; set OFFLOAD_LAB_CHROMIUM)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the python package playwright is not installed (pip install playwright; no browser download)"
    return None


@dataclass
class Visit:
    """One page to open: its path, where to save a full-page screenshot, JavaScript probes.

    ``frame_probes`` are evaluated in the page and in every frame of it (a sandboxed iframe's
    window cannot be read from the page, so a payload that ran inside one is only seen there).
    """

    path: str | os.PathLike
    screenshot: str | os.PathLike | None = None
    probes: dict[str, str] = field(default_factory=dict)
    frame_probes: dict[str, str] = field(default_factory=dict)


def open_html(path: str | os.PathLike, screenshot: str | os.PathLike | None = None,
              probes: dict[str, str] | None = None, **kw: Any) -> PageResult:
    """Load ``path`` from a ``file://`` URL with networking off; report errors and plotly figures.

    ``probes`` maps a name to a JavaScript expression evaluated after load (its value is returned
    in ``PageResult.probes``). Any request that is not ``file:``/``data:``/``about:``/``blob:`` is
    aborted and listed in ``blocked_requests``; the context is also ``offline``.
    """
    return open_pages([Visit(path, screenshot, probes or {})], **kw)[0]


def _router(res: PageResult):
    # one argument only: playwright passes (route, request) to a handler that takes two
    def route(r) -> None:
        if r.request.url.split(":", 1)[0] in ("file", "data", "about", "blob"):
            r.continue_()
        else:
            res.blocked_requests.append(r.request.url)
            r.abort()

    return route


def open_pages(visits: list[Visit], width: int = 1280, height: int = 900,
               timeout_ms: int = 30_000) -> list[PageResult]:
    """:func:`open_html` for several pages in one browser (a Chromium start costs seconds)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    results = []
    profile = tempfile.mkdtemp(prefix="offload-lab-chromium-")
    try:
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                offline=True, viewport={"width": width, "height": height})
            try:
                for visit in visits:
                    res = PageResult()
                    results.append(res)

                    route = _router(res)

                    def on_dialog(d, res=res):
                        res.dialogs.append(f"{d.type}: {d.message}")
                        d.dismiss()

                    page = ctx.new_page()
                    page.route("**/*", route)
                    page.on("console", lambda m, res=res: res.console_errors.append(m.text)
                            if m.type == "error" else None)
                    page.on("pageerror", lambda e, res=res: res.page_errors.append(str(e)))
                    page.on("dialog", on_dialog)
                    page.goto(Path(visit.path).resolve().as_uri(), wait_until="load", timeout=timeout_ms)
                    # plotly draws asynchronously after newPlot: wait until every figure has its
                    # SVG, in the page and in any iframe (a notebook's _repr_html_ is an iframe)
                    for frame in page.frames:
                        try:
                            frame.wait_for_function(_ALL_DRAWN, timeout=timeout_ms)
                        except PlaywrightTimeout:
                            pass  # counted below: figures > rendered says which did not draw
                        res.figures += frame.evaluate(_FIGURES)
                        res.rendered += frame.evaluate(_RENDERED)
                    for name, expr in visit.probes.items():
                        res.probes[name] = page.evaluate(expr)
                    for name, expr in visit.frame_probes.items():
                        res.frame_probes[name] = [frame.evaluate(expr) for frame in page.frames]
                    if visit.screenshot is not None:
                        Path(visit.screenshot).parent.mkdir(parents=True, exist_ok=True)
                        page.screenshot(path=str(visit.screenshot), full_page=True)
                    page.close()
            finally:
                ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return results


# -- layout of every figure, read from the DOM plotly.js drew ---------------------------------
# per figure div: its box, its title's box (title + subtitle), every axis title's box, the
# legend's box and whether the legend scrolls, and each plot area's box (the drag rectangles:
# one per subplot); boxes are [left, top, right, bottom] in page pixels, null when absent
FIGURE_LAYOUT = """[...document.querySelectorAll('.plotly-graph-div.js-plotly-plot')].map(d => {
  const box = e => { const b = e.getBoundingClientRect();
    return (b.width > 0 && b.height > 0) ? [b.left, b.top, b.right, b.bottom] : null; };
  const boxes = s => [...d.querySelectorAll(s)].map(box).filter(b => b);
  const title = [...d.querySelectorAll('.infolayer > .g-gtitle, .infolayer > .g-gtitle-subtitle')]
    .map(box).filter(b => b);
  const bar = d.querySelector('.legend .scrollbar');
  return {id: d.id, box: box(d), titles: title,
          axis_titles: boxes('.infolayer [class^="g-x"][class$="title"] text, .infolayer [class^="g-y"][class$="title"] text'),
          legend: d.querySelector('.legend') ? box(d.querySelector('.legend .bg') || d.querySelector('.legend')) : null,
          legend_scrolls: !!bar && Number(bar.getAttribute('height') || 0) > 0,
          plots: boxes('.draglayer .nsewdrag')};
})"""


def _overlap(a: list[float], b: list[float], slack: float = 1.0) -> bool:
    return a[0] < b[2] - slack and b[0] < a[2] - slack and a[1] < b[3] - slack and b[1] < a[3] - slack


def layout_problems(figures: list[dict], min_plot_px: float = 200.0, min_panel_px: float = 48.0,
                    legend_over_plot: bool = False) -> list[str]:
    """What is wrong with the layout of each figure probed by :data:`FIGURE_LAYOUT`: a title
    over an axis title, a legend outside its figure or scrolling, a plot area under
    ``min_plot_px`` wide or tall (a subplot of it under ``min_panel_px`` tall), and with
    ``legend_over_plot`` a legend drawn over a plot area. An empty list when every figure reads."""
    out = []
    for f in figures:
        name = f["id"]
        if f["box"] is None:
            out.append(f"{name}: not laid out (no box)")
            continue
        for t in f["titles"]:
            for a in f["axis_titles"]:
                if _overlap(t, a):
                    out.append(f"{name}: the title {t} overlaps an axis title {a}")
        lg = f["legend"]
        if lg is not None:
            fb = f["box"]
            if lg[0] < fb[0] - 1 or lg[1] < fb[1] - 1 or lg[2] > fb[2] + 1 or lg[3] > fb[3] + 1:
                out.append(f"{name}: the legend {lg} lies outside the figure {fb}")
            if f["legend_scrolls"]:
                out.append(f"{name}: the legend scrolls")
            if legend_over_plot:
                out += [f"{name}: the legend {lg} lies over the plot area {p}"
                        for p in f["plots"] if _overlap(lg, p)]
        if f["plots"]:
            # the plot area: all subplots together; a panel of a few bars may be short, never a sliver
            ps = f["plots"]
            w = max(p[2] for p in ps) - min(p[0] for p in ps)
            h = max(p[3] for p in ps) - min(p[1] for p in ps)
            if w < min_plot_px or h < min_plot_px:
                out.append(f"{name}: a plot area of {w:.0f} × {h:.0f} px (under {min_plot_px:.0f} px)")
            for p in ps:
                if p[2] - p[0] < min_plot_px or p[3] - p[1] < min_panel_px:
                    out.append(f"{name}: a subplot of {p[2] - p[0]:.0f} × {p[3] - p[1]:.0f} px")
    return out


# -- a real JupyterLab server, for the dashboard tests ------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class JupyterLab:
    """A JupyterLab server in its own process: ``url``, ``token``, ``root`` and the REST calls used.

    Every JupyterLab directory (config, data, settings, workspaces, runtime) lives under ``home``
    so no user setting or kernelspec changes what the test sees; the kernel is this Python.
    """

    root: Path
    home: Path
    port: int
    token: str
    proc: Any = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """Call the server's REST API; returns the decoded JSON (or None for an empty reply)."""
        import json
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def start(self, timeout_s: float = 60.0, pythonpath: str | None = None) -> JupyterLab:
        """Start the server and wait (bounded) until its REST API answers."""
        import subprocess
        import time

        env = {**os.environ, "HOME": str(self.home),
               "JUPYTER_CONFIG_DIR": str(self.home / "config"),
               "JUPYTER_DATA_DIR": str(self.home / "data"),
               "JUPYTER_RUNTIME_DIR": str(self.home / "runtime"),
               "JUPYTERLAB_SETTINGS_DIR": str(self.home / "settings"),
               "JUPYTERLAB_WORKSPACES_DIR": str(self.home / "workspaces"),
               "JUPYTER_PLATFORM_DIRS": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        self.log = self.home / "jupyterlab.log"
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
               "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--LabApp.extension_manager=readonly", "--ServerApp.allow_root=True"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.root)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyterlab exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                self.api("GET", "/api/status", timeout=2)
                return self
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"jupyterlab did not answer on port {self.port} in {timeout_s:.0f} s: "
                           f"{self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        """The end of the server's log (its kernel errors show up here)."""
        try:
            return self.log.read_text(errors="replace")[-n:] if self.log else ""
        except OSError:
            return ""

    def kernel_state(self, path: str) -> tuple[str | None, str | None]:
        """(kernel id, execution state) of the session open on notebook ``path``, else (None, None)."""
        for s in self.api("GET", "/api/sessions"):
            if s.get("path") == path and s.get("kernel"):
                k = self.api("GET", f"/api/kernels/{s['kernel']['id']}")
                return k["id"], k.get("execution_state")
        return None, None

    def stop(self, timeout_s: float = 15.0) -> None:
        """Shut the server down (its kernels with it); kill it when it does not stop in time."""
        import signal
        import subprocess

        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.api("POST", "/api/shutdown", timeout=5)
        except OSError:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


if __name__ == "__main__":
    r = open_html(sys.argv[1], screenshot=sys.argv[2] if len(sys.argv) > 2 else None)
    print(r)
