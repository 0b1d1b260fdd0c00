"""Packaging: one version, every shipped data directory in the wheel, and the wheel checker itself.

The wheel is built and checked in a fresh environment by ``scripts/wheel_smoke.sh`` (CI); these
tests keep the configuration it relies on true, and show that its data check catches a file
missing from, or changed in, an installed package.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import offload_lab

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _smoke():
    spec = importlib.util.spec_from_file_location("wheel_smoke", REPO / "scripts" / "wheel_smoke.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_version_lives_in_one_place() -> None:
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "offload_lab/__init__.py"
    assert re.fullmatch(r"\d+\.\d+\.\d+", offload_lab.__version__)


def test_changelog_names_this_version_and_the_run_format() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, flags=re.M)
    assert releases and releases[0] == offload_lab.__version__
    from offload_lab.record.run import FORMAT

    assert f'"format": "{FORMAT}"' in text and "### Version 1" in text


def test_every_data_directory_ships_in_wheel_and_sdist() -> None:
    wheel = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    sdist = PYPROJECT["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]
    kinds = sorted(d.name for d in (REPO / "data").iterdir() if d.is_dir())
    assert {"models", "devices", "runs"} <= set(kinds)
    for kind in kinds:
        assert wheel.get(f"data/{kind}") == f"offload_lab/_data/{kind}", kind
        # the wheel is built from the sdist: what the sdist leaves out the wheel cannot force-include
        assert f"data/{kind}" in sdist, kind


def test_core_stays_without_notebook_tools() -> None:
    core = " ".join(PYPROJECT["project"]["dependencies"])
    for extra in ("ipywidgets", "jupyterlab", "diffusers", "mkdocs"):
        assert extra not in core
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"notebook", "diffusers", "docs", "dev"} <= set(extras)
    assert any(r.startswith("offload-lab[") and "notebook" in r and "docs" in r for r in extras["dev"])
    # the pipeline tests need diffusers, transformers and accelerate: the test command gets them
    assert any(r.startswith("offload-lab[") and "diffusers" in r for r in extras["dev"])
    assert {"diffusers", "transformers", "accelerate"} <= {r.split(">")[0] for r in extras["diffusers"]}


def _tree(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def test_wheel_check_fails_on_a_missing_or_changed_data_file(tmp_path: Path) -> None:
    smoke = _smoke()
    checkout, pkg = tmp_path / "checkout", tmp_path / "site" / "offload_lab"
    files = {"models/a.json": b"{}", "runs/gpu/r.zip": b"zip", "models/.keep": b""}
    _tree(checkout / "data", files)
    _tree(pkg / "_data", {k: v for k, v in files.items() if k != "models/.keep"})
    smoke.data_files(checkout, pkg)  # complete: passes
    (pkg / "_data" / "runs" / "gpu" / "r.zip").unlink()
    with pytest.raises(SystemExit, match=r"data/runs files missing from the wheel .*gpu/r\.zip"):
        smoke.data_files(checkout, pkg)
    _tree(pkg / "_data", {"runs/gpu/r.zip": b"other"})
    with pytest.raises(SystemExit, match=r"data/runs files differ in the wheel: \['gpu/r\.zip'\]"):
        smoke.data_files(checkout, pkg)
