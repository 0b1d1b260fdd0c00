"""The documentation site builds with warnings as errors and documents every public name.

CI builds the site once (``mkdocs build --strict``) and hands it over in ``OFFLOAD_LAB_SITE``;
without it the test builds the site itself.
"""

from __future__ import annotations

import dataclasses
import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import offload_lab

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("OFFLOAD_LAB_SITE")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(REPO / "mkdocs.yml"),
                        "-d", str(out)], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_every_public_name_is_in_the_api_reference(site: Path) -> None:
    page = (site / "api" / "index.html").read_text()
    anchors = set(re.findall(r'id="(offload_lab\.[A-Za-z_][A-Za-z0-9_.]*)"', page))
    missing = [n for n in offload_lab.__all__ if f"offload_lab.{n}" not in anchors]
    assert not missing, f"not in the API reference: {missing}"
    # documented from the docstrings, examples included, not just named
    assert "Chrome trace-event JSON" in page and "&gt;&gt;&gt;" in page


def test_every_page_of_the_nav_is_built(site: Path) -> None:
    nav = re.findall(r"^\s+- [^:]+: (\S+)\.md$", (REPO / "mkdocs.yml").read_text(), flags=re.M)
    assert "api" in nav and "index" in nav
    for page in nav:
        assert (site / ("index.html" if page == "index" else f"{page}/index.html")).is_file(), page


def _hooks():
    spec = importlib.util.spec_from_file_location("docstrings_hook", REPO / "docs" / "hooks" / "docstrings.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_doctests_become_code_blocks_and_roles_inline_code() -> None:
    text = ("Read :class:`~offload_lab.record.run.Run` frames.\n\n"
            '>>> run.meta["simulated"]  # doctest: +SKIP\nTrue\n\nAfter.')
    out = _hooks().fence_doctests(text)
    assert out == ("Read `Run` frames.\n\n```pycon\n>>> run.meta[\"simulated\"]\nTrue\n```\n\nAfter.")


# what inspecting a value finds when the attribute has no docstring of its own: the builtin's
_BUILTIN_DOCS = ("str(object=", "int([x])", "bool(x) ->", "Convert a string or number to a floating",
                 "Built-in immutable sequence", "dict() -> new empty dictionary")
_TAG = re.compile(r"<(?:script|link|img|iframe|source)\b[^>]*>", re.I)
_URL = re.compile(r"""\b(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


def _pages(site: Path) -> list[Path]:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 10, pages
    return pages


def test_no_page_shows_a_builtin_docstring(site: Path) -> None:
    hits = [(p.relative_to(site).as_posix(), s) for p in _pages(site)
            for s in _BUILTIN_DOCS if s in html.unescape(p.read_text())]
    assert not hits, hits
    # dataclass fields are documented by what is written under them, defaults or not
    page = (site / "api" / "index.html").read_text()
    for field in ("Component.uses", "Component.spec", "HostMemory.available", "DeviceProfile.hook_s"):
        assert f'id="offload_lab.{field}"' in page, field
    assert "Forward passes per request" in page


def test_no_page_loads_anything_from_the_network(site: Path) -> None:
    hits = [(p.relative_to(site).as_posix(), tag) for p in _pages(site)
            for tag in _TAG.findall(p.read_text()) if _URL.search(tag)]
    assert not hits, hits[:5]
    # code is coloured at build time (Pygments), so it reads the same offline
    assert '<span class="kn">' in (site / "index.html").read_text()


@dataclasses.dataclass
class _Fields:
    plain: int
    """Written under the field."""
    counted: int = 1
    """Also written."""
    bare: str = "x"


def test_attribute_docstrings_come_from_the_source_never_from_the_value() -> None:
    hooks = _hooks()
    assert hooks.source_attribute_docstrings(_Fields) == {"plain": "Written under the field.",
                                                          "counted": "Also written."}
    # an int's __doc__ is int's: it says nothing about the attribute holding it
    assert hooks._inherited_doc(1) and hooks._inherited_doc("x") and hooks._inherited_doc((1, 2))
    assert not hooks._inherited_doc(_hooks) and not hooks._inherited_doc(_Fields)
