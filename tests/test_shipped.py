"""Shipped data is found through the package, whatever the working directory: the measured runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import offload_lab
from offload_lab.shipped import ShippedDataError

ROOT = Path(__file__).resolve().parents[1]
ZIPS = sorted(ROOT.glob("data/runs/*/*.zip"))


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing of the repository is reachable from here by cwd
    return tmp_path


def test_every_shipped_run_is_found_from_outside_the_repository(elsewhere):
    runs = offload_lab.shipped_runs()
    assert len(runs) == len(ZIPS) > 0
    assert [r.label for r in runs] == [offload_lab.Run.load(p).label for p in ZIPS]
    assert not any(r.simulated for r in runs)


def test_runs_filtered_by_model(elsewhere):
    want = [p for p in ZIPS if offload_lab.Run.load(p).meta["model"] == "wan2.1-t2v-14b"]
    got = offload_lab.shipped_runs("Wan2.1-T2V-14B ")
    assert len(got) == len(want) > 0
    assert {r.meta["model"] for r in got} == {"wan2.1-t2v-14b"}
    assert offload_lab.shipped_runs("minimax-h3") == []  # a catalog model with no measurements


def test_bad_model_names_are_refused():
    with pytest.raises(ValueError, match="'wan9'.*catalog model.*wan2.1-t2v-14b"):
        offload_lab.shipped_runs("wan9")
    with pytest.raises(ValueError, match="model=3"):
        offload_lab.shipped_runs(3)


def test_a_package_without_its_data_names_the_paths_it_searched(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(ROOT / "offload_lab", site / "offload_lab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import offload_lab\n"
            "try:\n    offload_lab.shipped_runs()\n"
            "except offload_lab.shipped.ShippedDataError as e:\n    print(e)\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    msg = out.stdout.strip()
    assert msg.startswith("no shipped measured runs found")
    assert str(site / "offload_lab" / "_data" / "runs") in msg
    assert str(site / "data" / "runs") in msg
    assert issubclass(ShippedDataError, LookupError)
