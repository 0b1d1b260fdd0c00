"""The walkthrough notebooks: kept as code, in sync, stripped, executed headless, exported to HTML.

Each notebook is a jupytext percent-format script, ``notebooks/<name>.py`` (the source to review,
edit and lint), with its ``.ipynb`` committed beside it for readers who open it in Jupyter. After
editing a script, rewrite its notebook (``--update`` keeps the cell ids of unchanged cells)::

    jupytext --to ipynb --update notebooks/01_quickstart.py

Executing a notebook costs a kernel and up to a few minutes, so each notebook is executed once
per session and shared by the tests that read it (marked ``notebook`` and ``slow``; deselect with
``-m "not slow"``). The export test is the one that matters for readers: plotly >= 6.1 renders
figures in a kernel as a mimetype that ``jupyter nbconvert --to html`` drops, so the exported
HTML must still hold every figure's div and the plotly.js bundle.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# at least this many figures must survive export (the notebooks show more on a GPU)
MIN_FIGURES = {"01_quickstart.ipynb": 9, "wan21_offload.ipynb": 8, "minimax_h3_offload.ipynb": 10,
               "diffusers_pipeline.ipynb": 4}
NAMES = list(MIN_FIGURES)
_CACHE: dict[str, dict] = {}

nbformat = pytest.importorskip("nbformat")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return torch.cuda.is_available()


def _jupyter() -> list[str]:
    exe = Path(sys.executable).with_name("jupyter")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "jupyter"]


_SHOW_OWN_DEPRECATIONS = ("import warnings\n"
                          "warnings.filterwarnings('always', category=DeprecationWarning, "
                          "module=r'offload_lab(\\.|$)')")


def own_deprecations(nb) -> list[str]:
    """The DeprecationWarning lines an executed notebook printed from offload_lab's modules."""
    return [line for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stderr"
            for line in o.get("text", "").splitlines()
            if "DeprecationWarning" in line and "offload_lab" in line]


def executed(name: str, tmp_root: Path) -> dict:
    """Execute ``name`` once (nbclient, headless), export it to HTML; cache the result."""
    if name in _CACHE:
        return _CACHE[name]
    from nbclient import NotebookClient

    work = tmp_root / name.removesuffix(".ipynb")
    work.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # every DeprecationWarning raised from offload_lab's own modules is shown (Python hides them
    # outside __main__), so the executed test can fail on it; the cell is taken out again after
    nb.cells.insert(0, nbformat.v4.new_code_cell(_SHOW_OWN_DEPRECATIONS))
    # run from a directory outside the checkout, as a user's copy of the notebook would be:
    # whatever the notebook reads (catalog, device profiles, shipped runs) must come through the
    # package, never from paths relative to the working directory
    old = os.environ.get("OFFLOAD_LAB_NOTEBOOK_OUT")
    os.environ["OFFLOAD_LAB_NOTEBOOK_OUT"] = str(work / "out")
    start = time.perf_counter()
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(work)}}).execute()
    finally:
        if old is None:
            os.environ.pop("OFFLOAD_LAB_NOTEBOOK_OUT", None)
        else:
            os.environ["OFFLOAD_LAB_NOTEBOOK_OUT"] = old
    seconds = time.perf_counter() - start
    nb.cells.pop(0)
    path = work / name
    nbformat.write(nb, path)
    subprocess.run([*_jupyter(), "nbconvert", "--to", "html", str(path)], check=True,
                   capture_output=True, timeout=300)
    html = path.with_suffix(".html")
    print(f"{name}: executed in {seconds:.0f} s; exported {html.stat().st_size / 2**20:.1f} MiB")
    _CACHE[name] = {"nb": nb, "seconds": seconds, "html": html, "out": work / "out"}
    return _CACHE[name]


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("notebooks")


def _text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            parts.append(o.get("text", ""))
            parts.extend(str(v) for k, v in o.get("data", {}).items() if k in ("text/plain", "text/html"))
    return "\n".join(parts)


# -- the committed notebooks ------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_in_sync_with_its_script(name):
    import jupytext  # a dev dependency: a missing one must fail, not skip the sync check
    script = NOTEBOOKS / name.replace(".ipynb", ".py")
    want = [(c.cell_type, c.source) for c in jupytext.read(script).cells]
    got = [(c.cell_type, c.source) for c in nbformat.read(NOTEBOOKS / name, as_version=4).cells]
    assert got == want, (f"notebooks/{name} differs from {script.name}: run "
                         f"`jupytext --to ipynb --update notebooks/{script.name}`")


def test_every_notebook_has_a_script_and_no_generator_is_left():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.py")) == sorted(n[:-6] for n in NAMES)
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(NAMES)
    assert not (ROOT / "scripts" / "make_notebooks.py").exists()


def test_notebook_scripts_pass_ruff():
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip("ruff is not installed beside this python")
    proc = subprocess.run([str(ruff), "check", "--no-cache", str(NOTEBOOKS)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("name", NAMES)
def test_notebooks_are_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert "widgets" not in nb.metadata


# -- executed -----------------------------------------------------------------------------------------
@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes_headless(name, tmp_root):
    res = executed(name, tmp_root)
    nb = res["nb"]
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors[0]
    assert not own_deprecations(nb), own_deprecations(nb)
    text = _text(nb)
    assert "simulated" in text.lower()
    if not _has_cuda():
        assert "skipped: no CUDA device here" in text
    # every notebook writes its report where the environment says
    assert list(res["out"].glob("*.html")), list(res["out"].iterdir())


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_figures_survive_nbconvert_html(name, tmp_root):
    res = executed(name, tmp_root)
    outputs = [o.get("data", {}) for c in res["nb"].cells for o in c.get("outputs", [])]
    mimetype = [d for d in outputs if "application/vnd.plotly.v1+json" in d]
    # every figure output carries text/html next to the plotly mimetype nbconvert would drop
    assert all("plotly-graph-div" in d.get("text/html", "") for d in mimetype)
    shown = sum(d.get("text/html", "").count('class="plotly-graph-div"') for d in outputs)
    assert shown >= MIN_FIGURES[name]
    html = res["html"].read_text(encoding="utf-8")
    figures = len(re.findall(r'class="plotly-graph-div"', html))
    assert figures >= shown, (figures, shown)
    assert len(re.findall(r"Plotly\.newPlot\(", html)) >= figures
    # plotly.js itself is inlined once, so the page draws offline; the saved widget state holds
    # one more copy, whatever the number of figures: the one every figure view of the dashboard
    # shares (no widget carries a copy of its own)
    assert 1 <= len(re.findall(r"\* plotly\.js v\d", html)) <= 2
    plotly_js = Path(importlib.util.find_spec("plotly").origin).parent / "package_data" / "plotly.min.js"
    assert res["html"].stat().st_size < 3 * plotly_js.stat().st_size, res["html"].stat().st_size


@pytest.mark.notebook
@pytest.mark.slow
def test_quickstart_magic_and_explorer_outputs(tmp_root):
    nb = executed("01_quickstart.ipynb", tmp_root)["nb"]
    sources = {c.source.splitlines()[0]: c for c in nb.cells if c.cell_type == "code"}
    line = sources["%offload_profile -n 2 -b 1MiB model model(**inputs)"]
    assert any("text/html" in o.get("data", {}) and "plotly-graph-div" in o["data"]["text/html"]
               for o in line.outputs)
    explorer = next(c for c in nb.cells if c.source.startswith("ex.live.value"))
    printed = "".join(o.get("text", "") for o in explorer.outputs)
    assert "no errors" in printed
    # the dashboard's timeline is the plan printed in the same cell, not the last tier arm
    assert "timeline shows the plan above: True" in printed
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert any(m["model_name"] == "OutputModel" and m["state"].get("outputs") for m in state.values())


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.browser
def test_exported_notebooks_draw_offline_in_chromium(tmp_root):
    """Open each exported notebook in headless Chromium with the network cut: every static
    figure must be drawn by the inlined plotly.js (widget views need CDN scripts; not counted)."""
    from browser import Visit, chromium_available, open_pages

    why = chromium_available()
    if why:
        pytest.skip(why)
    pages = {n: executed(n, tmp_root)["html"] for n in NAMES}
    for name, page in zip(pages, open_pages([Visit(p) for p in pages.values()], timeout_ms=120_000)):
        assert page.figures >= MIN_FIGURES[name] and page.rendered == page.figures, \
            (name, page.figures, page.rendered)
        # the widget views' own scripts fail offline; plotly's must not
        assert not [e for e in page.page_errors if "Plotly" in e], (name, page.page_errors)


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("name", ["01_quickstart.ipynb", "wan21_offload.ipynb"])
def test_shipped_gpu_runs_are_found_from_a_copied_notebook(name, tmp_root):
    """Executed outside the checkout, the notebooks still find the measured H200 runs."""
    shipped = sorted((ROOT / "data" / "runs").rglob("*.zip"))
    assert shipped
    text = _text(executed(name, tmp_root)["nb"])
    assert "no measured GPU runs" not in text
    # the labels of two shipped H200 runs, as the comparison table shows them
    assert "14B pinned p1" in text and "14B pageable p1" in text


def test_quickstart_explains_rerunning_on_a_gpu():
    nb = nbformat.read(NOTEBOOKS / "01_quickstart.ipynb", as_version=4)
    md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "Rerun on a real GPU" in md
    for needed in ("torch.version.cuda", "torch.cuda.is_available()", "--stage smoke",
                   "offload_lab.Run.load(path)", "gpu_runs.tar", "PlanExplorer"):
        assert needed in md, needed
