"""The cuda backend on a real GPU: the same checks scripts/gpu_check.py runs first (skipped without CUDA).

Without a GPU these paths still import (see test_cuda_path_imports); their measured results
from an H200 are shipped in data/runs/h200-*/smoke.json.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts/gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cuda_path_imports():
    from offload_lab.record.runtime.backends import CudaBackend
    from offload_lab.record.runtime.stores import exact_pinned

    assert callable(exact_pinned) and CudaBackend.name == "cuda"
    assert callable(_gpu_check().smoke)


def test_shipped_h200_smoke_results():
    for path in ROOT.glob("data/runs/h200-*/smoke.json"):
        res = json.loads(path.read_text())
        assert all(res["identical"].values()), res["identical"]
        assert all(res["restored"].values())
        for init, r in res["startup_peak"].items():
            assert abs(r["measured"] / r["predicted"] - 1) < 0.03, init
        assert res["startup_peak"]["grouped"]["measured"] < res["startup_peak"]["naive"]["measured"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_backend_exact_restored_and_startup_peaks():
    res = _gpu_check().smoke(torch.device("cuda"), log=lambda m: None)
    assert all(res["identical"].values()), res["identical"]
    assert all(res["restored"].values())
    assert res["released"] and all(res["released"].values()), res["released"]
    peaks = res["startup_peak"]
    assert peaks["grouped"]["measured"] < peaks["naive"]["measured"]
    for r in peaks.values():
        assert abs(r["measured"] / r["predicted"] - 1) < 0.03
