"""Trace import under hostile numbers, and a plain CPU profile with no layers in it."""

from __future__ import annotations

import copy
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from offload_lab.record.kineto import TraceFormatError, from_torch_profiler

FIXTURE = Path(__file__).parent / "data" / "traces" / "gpu_two_steps.json"


@pytest.fixture(scope="module")
def trace():
    return json.loads(FIXTURE.read_text())


def _load(tmp_path, doc):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))  # json writes NaN / Infinity literals, as a broken writer would
    return from_torch_profiler(p)


def _edit(trace, pick, key, value, in_args=False):
    doc = copy.deepcopy(trace)
    hits = [e for e in doc["traceEvents"] if pick(e)]
    assert hits
    for e in hits[:1]:
        (e["args"] if in_args else e)[key] = value
    return doc


def _sane(run):
    for frame in ("events", "steps"):
        df = getattr(run, frame)
        num = df.select_dtypes("number")
        assert np.isfinite(num.drop(columns=["overlap"], errors="ignore").to_numpy(dtype=float)).all(), frame
    assert (run.events["bytes"] >= 0).all() and (run.steps["bytes_moved"] >= 0).all()
    assert run.steps["wall_s"].notna().all()


def is_kernel(e):
    return e.get("cat") == "kernel"


def is_copy(e):
    return e.get("cat") == "gpu_memcpy"


@pytest.mark.parametrize(("pick", "key", "value"), [
    (is_kernel, "dur", math.nan), (is_kernel, "dur", math.inf), (is_kernel, "ts", math.nan),
    (is_kernel, "ts", -math.inf), (is_copy, "dur", math.nan), (is_copy, "ts", 1e300),
])
def test_non_finite_times_are_counted_and_skipped(tmp_path, trace, pick, key, value):
    good = from_torch_profiler(FIXTURE)
    run = _load(tmp_path, _edit(trace, pick, key, value))
    _sane(run)
    assert run.meta["skipped"]["non_finite_or_absurd_times"] == 1
    kind = "compute" if pick is is_kernel else "copy"
    assert (run.events["kind"] == kind).sum() <= (good.events["kind"] == kind).sum()


@pytest.mark.parametrize("value", [-4000, 2 ** 70, -(2 ** 70)])
def test_bad_memcpy_bytes_are_counted_and_skipped(tmp_path, trace, value):
    good = from_torch_profiler(FIXTURE)
    run = _load(tmp_path, _edit(trace, is_copy, "bytes", value, in_args=True))
    _sane(run)
    assert run.meta["skipped"]["memcpy_bytes_negative_or_absurd"] == 1
    assert (run.events["kind"] == "copy").sum() == (good.events["kind"] == "copy").sum() - 1


def test_huge_step_numbers_are_counted_and_skipped(tmp_path, trace):
    doc = _edit(trace, lambda e: str(e.get("name", "")).startswith("ProfilerStep#"), "name",
                "ProfilerStep#100000000000000000000000")
    run = _load(tmp_path, doc)
    _sane(run)
    assert run.meta["skipped"]["step_numbers_too_large"] == 1
    assert run.steps["step"].max() < 2 ** 53


def test_huge_layer_index_and_correlation_do_not_overflow(tmp_path, trace):
    doc = copy.deepcopy(trace)
    for e in doc["traceEvents"]:
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("blocks."):
            e["name"] = "blocks.99999999999999999999999"
            break
    for e in doc["traceEvents"]:
        if is_kernel(e):
            e["args"]["correlation"] = 2 ** 70
            break
    _sane(_load(tmp_path, doc))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = torch.relu(b(x))
        return x


def test_plain_cpu_profile_without_layers_says_how_to_get_them(tmp_path):
    """A real torch.profiler CPU trace of a model with no labels and no stacks."""
    net, x = _Net(), torch.randn(4, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
            for _ in range(2):
                net(x)
    path = tmp_path / "plain.json"
    prof.export_chrome_trace(str(path))
    with pytest.raises(TraceFormatError) as e:
        from_torch_profiler(path)
    msg = str(e.value)
    assert "no layer found" in msg and "cpu_op" in msg and "\n" not in msg
    for hint in ("record_function", "with_stack=True", "layer_pattern", "offload_lab.copy <group>.<i>"):
        assert hint in msg, hint
