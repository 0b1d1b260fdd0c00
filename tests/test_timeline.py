"""The Run: frames contract, derived summaries, lossless save/load, bad files."""

from __future__ import annotations

import zipfile

import pytest
import torch

import offload_lab
from offload_lab import HostMemory, Run, catalog, synthetic
from offload_lab.record.run import (
    EVENT_COLUMNS,
    LAYER_COLUMNS,
    MEMORY_COLUMNS,
    STEP_COLUMNS,
    RunFormatError,
)


@pytest.fixture(scope="module")
def run():
    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.04, layers=4, dtype=torch.float32)
    inputs = synthetic.example_inputs(model, tokens=32)
    plan = offload_lab.plan(offload_lab.spec_of(model), pin_budget=2 * 400_000, prefetch=1,
                            host=HostMemory(available="64GiB"))
    return offload_lab.profile(model, lambda: model(**inputs), plan, steps=2, warmup=1, backend="cpu",
                               label="mixed <b>tiers</b>")


def test_frames_have_exactly_the_contract_columns(run):
    assert list(run.events.columns) == EVENT_COLUMNS
    assert list(run.layers.columns) == LAYER_COLUMNS
    assert list(run.steps.columns) == STEP_COLUMNS
    assert list(run.memory.columns) == MEMORY_COLUMNS
    assert set(run.events["kind"]) <= {"copy", "compute", "wait", "host_block"}
    assert set(run.events["stream"]) <= {"copy", "compute", "host"}
    assert run.meta["backend"] == "cpu" and run.simulated is False
    assert len(run.memory) > 0 and (run.memory["device_bytes"] >= 0).all()


def test_step_summary_agrees_with_events(run):
    ev = run.events
    for row in run.steps.itertuples():
        e = ev[ev["step"] == row.step]
        assert row.compute_s == pytest.approx(e.loc[e["kind"] == "compute", "dur_s"].sum())
        assert row.copy_s == pytest.approx(e.loc[e["kind"] == "copy", "dur_s"].sum())
        assert row.bytes_moved == e.loc[e["kind"] == "copy", "bytes"].sum()
        assert row.wall_s >= row.compute_s
        assert 0 <= row.overlap <= 1


def test_save_load_round_trip_is_lossless(run, tmp_path):
    path = run.save(tmp_path / "r")
    assert path.suffix == ".zip"
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == ["events.parquet", "layers.parquet", "memory.parquet",
                                        "meta.json", "steps.parquet"]
    again = Run.load(path)
    assert again.equals(run)
    for name in ("events", "layers", "steps", "memory"):
        assert getattr(again, name).dtypes.equals(getattr(run, name).dtypes)
    assert again.meta == run.meta


def test_load_refuses_what_is_not_a_run(tmp_path):
    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    with pytest.raises(RunFormatError, match="cannot read run"):
        Run.load(tmp_path / "junk.zip")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("meta.json", "{}")
    with pytest.raises(RunFormatError, match="missing"):
        Run.load(tmp_path / "other.zip")


def test_meta_must_be_plain_data(run):
    with pytest.raises(RunFormatError, match="not JSON data"):
        Run(run.events, run.layers, run.steps, run.memory, {"bad": object()})


def test_measured_gpu_runs_shipped_load():
    from pathlib import Path

    runs = [Run.load(p) for p in sorted(Path(__file__).parents[1].glob("data/runs/*/*.zip"))]
    assert runs, "data/runs holds the measured GPU runs"
    by = {r.label: r for r in runs}
    pinned, pageable = by["14B pinned p1"], by["14B pageable p1"]
    assert pinned.backend == "cuda" and "H200" in pinned.meta["device_name"]
    # the same streamed bytes per step in both
    assert pinned.steps["bytes_moved"].iloc[0] == pageable.steps["bytes_moved"].iloc[0] == 40 * 702_788_608
    assert pageable.step_time > 1.5 * pinned.step_time
