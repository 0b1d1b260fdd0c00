"""The measured H200 runs shipped under data/runs: what they must show, read back as data."""

from __future__ import annotations

from pathlib import Path

import offload_lab

ROOT = Path(__file__).resolve().parents[1]
BLOCK_13B = 92_881_408  # Wan2.1 T2V-1.3B block, bf16 (reference table)


def _runs(pattern: str) -> dict:
    return {r.label: r for r in (offload_lab.Run.load(p) for p in sorted(ROOT.glob(f"data/runs/h200-*/{pattern}")))}


def test_diffusers_group_offloading_observed_beside_ours():
    runs = _runs("diffusers-*.zip")
    ours = runs["offload-lab pinned p1"]
    theirs = runs["diffusers group offload (block_level, stream)"]
    assert ours.backend == "cuda" and theirs.backend == "observe"
    # the observer saw every block arrive, once per step, from pinned host memory
    assert (theirs.steps["bytes_moved"] == 30 * BLOCK_13B).all()
    assert set(theirs.layers["tier"]) == {"pinned"}
    table = offload_lab.compare([ours, theirs])
    assert list(table["backend"]) == ["cuda", "observe"]
    assert table["ratio"].iloc[1] > 1.0  # diffusers' block-level offload was the slower of the two here


def test_report_takes_measured_observed_and_trace_runs(tmp_path):
    runs = list(_runs("diffusers-*.zip").values())
    runs.append(offload_lab.from_torch_profiler(ROOT / "tests/data/traces/h200_offload_trace.json.gz"))
    path = offload_lab.report(runs, title="offload-lab vs diffusers on an H200").save(tmp_path / "r.html")
    html = path.read_text()
    assert "diffusers group offload" in html and "observe" in html and "trace" in html
