"""The user documentation: every page exists and is linked, its links resolve, it covers what the
code offers (commands, options, frame columns, meta keys), and nothing in the repository points
users at things they do not have (design notes, tracker numbers, paths outside the repository)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import offload_lab

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = ["concepts.md", "planner.md", "frames.md", "simulator.md", "cli.md", "notebook.md",
         "gpu.md", "architecture.md"]
COMMANDS = ["demo", "plan", "profile", "simulate", "report", "catalog"]


def test_every_page_exists_and_the_readme_links_it():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in PAGES:
        assert (DOCS / page).is_file(), page
        assert f"(docs/{page})" in readme, page
    assert not (DOCS / "internals.md").exists()


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "data" / "runs" / "README.md",
            ROOT / "benchmarks" / "RESULTS.md", ROOT / "tests" / "data" / "traces" / "README.md"]


def test_relative_links_resolve():
    for md in _markdown_files():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # an absolute URL
            assert (md.parent / target).exists(), f"{md.relative_to(ROOT)} links {target!r}"


# the patterns are assembled so that this file does not match them itself
_FORBIDDEN = re.compile("|".join([
    "DESIGN " + "§", "shared" + "/", "iss" + "ue [0-9]", r"\b" + "le" + r"nt\b",
    r"(?<![\w.])\(" + r"done\)",  # a status mark, not a call such as f(done)
]), re.IGNORECASE)
_TEXT = {".py", ".md", ".json", ".txt", ".toml", ".sh", ".csv", ".html", ".ipynb", ".cfg", ".yml",
         ".yaml"}


@pytest.mark.parametrize("top", ["offload_lab", "docs", "data", "scripts", "benchmarks", "tests",
                                 "notebooks", "README.md"])
def test_nothing_refers_to_what_users_do_not_have(top):
    paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
    hits = []
    for p in paths:
        if not p.is_file() or p.suffix not in _TEXT or "__pycache__" in p.parts:
            continue
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if _FORBIDDEN.search(line):
                hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not hits, "\n".join(hits)


def _help(*args: str) -> str:
    code = "import sys; from offload_lab.cli import main; sys.argv[0] = 'offload-lab'; sys.exit(main())"
    env = {**os.environ, "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-c", code, *args, "--help"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_cli_page_covers_every_subcommand_and_option():
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    listed = re.findall(r"^    (\w+)  ", _help(), flags=re.MULTILINE)
    assert set(COMMANDS) <= set(listed), listed
    for command in listed:
        assert f"## `offload-lab {command}`" in page, command
        options = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", _help(command)))
        missing = sorted(o for o in options if o not in page)
        assert not missing, f"docs/cli.md lacks {command} {missing}"


def test_notebook_page_covers_every_magic_option():
    pytest.importorskip("IPython")
    from offload_lab.notebook.magic import OffloadMagics

    page = (DOCS / "notebook.md").read_text(encoding="utf-8")
    parser = OffloadMagics.offload_profile.parser
    options = [s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")]
    missing = [o for o in options if f"`{o}" not in page]
    assert options and not missing, missing


def test_frames_page_lists_every_column_and_the_format():
    page = (DOCS / "frames.md").read_text(encoding="utf-8")
    spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    plan = offload_lab.plan(spec, host=offload_lab.HostMemory(available="64GiB"))
    run = offload_lab.simulate(plan, "h200", steps=2)
    for frame in ("events", "layers", "steps", "memory"):
        section = page.split(f"## `run.{frame}`", 1)[1].split("\n## ", 1)[0]
        for column in getattr(run, frame).columns:
            assert f"`{column}`" in section, (frame, column)
    for key in ("run", "label", "backend", "simulated", "model", "plan", "prefetch", "created",
                "warmup_dropped", "profile", "passes"):
        assert key in run.meta and f"`{key}`" in page, key
    assert '"format": "offload-lab/run", "version": 1' in page


def _doc_figures():
    import importlib.util

    spec = importlib.util.spec_from_file_location("doc_figures", ROOT / "scripts" / "doc_figures.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("doc_figures", mod)  # its dataclass looks its module up there
    spec.loader.exec_module(sys.modules["doc_figures"])
    return sys.modules["doc_figures"]


def test_figures_quoted_from_commands_are_current():
    # the fast figures (h200 compute curve, recommend's best plans, the cli recommend sample);
    # `scripts/doc_figures.py` rewrites them, `--check` (without --cheap) checks the rest too
    figures = _doc_figures()
    assert figures.run(figures.PAGES, check=True, cheap=True) == []
    names = {m.group(1) for p in figures.PAGES for m in figures.MARK.finditer(p.read_text(encoding="utf-8"))}
    assert names == set(figures.FIGURES)


def test_a_stale_figure_is_named_and_rewritten(tmp_path):
    figures = _doc_figures()
    page = tmp_path / "page.md"
    page.write_text("floor <!-- figures:h200-compute -->1.44 ms, 502 TFLOP/s<!-- /figures -->.\n", encoding="utf-8")
    assert figures.run([page], check=True) == ["page.md: h200-compute"]
    assert "1.44 ms" in page.read_text(encoding="utf-8")  # --check writes nothing
    assert figures.run([page], check=False) == ["page.md: h200-compute"]
    assert figures.run([page], check=True) == [] and "1.393 ms, 502.7 TFLOP/s" in page.read_text(encoding="utf-8")
    page.write_text("<!-- figures:no-such -->x<!-- /figures -->", encoding="utf-8")
    with pytest.raises(SystemExit, match="unknown figure 'no-such'"):
        figures.run([page], check=True)
