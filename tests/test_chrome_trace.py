"""Runs exported as Chrome trace-event JSON (Perfetto, chrome://tracing), and ``offload-lab export``.

The checks follow the trace-event format's own rules (required fields per phase, complete
events on one thread nesting, metadata naming every process and thread) and compare every
exported slice against the run's own intervals.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import offload_lab
from offload_lab.record.chrome_trace import to_chrome_trace
from offload_lab.record.kineto import iter_trace_events

REPO = Path(__file__).resolve().parent.parent
SHIPPED_GPU_RUN = REPO / "data" / "runs" / "h200-2026-12-01" / "10-14B_pinned_p1.zip"
_NUMBER = (int, float)


def validate(trace: dict) -> None:
    """Fail unless ``trace`` is trace-event JSON a viewer reads without dropping anything."""
    json.dumps(trace, allow_nan=False)  # strict JSON: no NaN / Infinity
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    named_processes, named_threads = set(), set()
    for e in events:
        assert e["ph"] in ("X", "C", "M"), e
        assert isinstance(e["name"], str) and e["name"], e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["ts"], _NUMBER) and math.isfinite(e["ts"]), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], _NUMBER) and e["dur"] >= 0, e
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, _NUMBER) for v in e["args"].values()), e
        elif e["name"] == "process_name":
            named_processes.add(e["pid"])
        elif e["name"] == "thread_name":
            named_threads.add((e["pid"], e["tid"]))
    slices = [e for e in events if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in slices} <= named_threads
    assert {e["pid"] for e in events} <= named_processes
    # complete events of one thread must nest or follow each other (else viewers drop them)
    for _, group in pd.DataFrame([(e["pid"], e["tid"], e["ts"], e["ts"] + e["dur"]) for e in slices],
                                 columns=["pid", "tid", "s", "e"]).groupby(["pid", "tid"]):
        group = group.sort_values(["s", "e"], ascending=[True, False])
        open_ends: list[float] = []
        for s, e in zip(group["s"], group["e"]):
            while open_ends and open_ends[-1] <= s + 1e-6:
                open_ends.pop()
            assert not open_ends or e <= open_ends[-1] + 1e-6, ("partial overlap on one track", s, e)
            open_ends.append(e)


def thread_names(trace: dict) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            out.setdefault(e["pid"], set()).add(e["args"]["name"])
    return out


def process_names(trace: dict) -> list[str]:
    return [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]


def assert_every_interval(trace: dict, run: offload_lab.Run) -> None:
    """Each row of ``run.events`` is one slice with its name, kind, step, tier, bytes and times."""
    tid_stream = {(e["pid"], e["tid"]): e["args"]["name"].split(" ")[0] for e in trace["traceEvents"]
                  if e["ph"] == "M" and e["name"] == "thread_name"}
    got = sorted((e["name"], e["cat"], tid_stream[(e["pid"], e["tid"])], e["args"]["step"],
                  e["args"]["tier"], e["args"]["bytes"], round(e["ts"], 3), round(e["dur"], 3))
                 for e in trace["traceEvents"] if e["ph"] == "X")
    ev = run.events
    want = sorted((f"{r.group}.{r.layer}", r.kind, r.stream, int(r.step), r.tier, int(r.bytes),
                   round(r.start_s * 1e6, 3), round(r.dur_s * 1e6, 3)) for r in ev.itertuples())
    assert len(got) == len(want) == len(ev)
    for g, w in zip(got, want):
        assert g[:6] == w[:6]
        assert np.isclose(g[6], w[6], rtol=0, atol=1e-2) and np.isclose(g[7], w[7], rtol=0, atol=1e-2)


def assert_one_track_per_stream(trace: dict, run: offload_lab.Run) -> None:
    assert thread_names(trace) == {1: {f"{s} stream" for s in run.events["stream"].unique()}}


@pytest.fixture(scope="module")
def simulated() -> offload_lab.Run:
    spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    plan = offload_lab.plan(spec, pin_budget="8GiB", host=offload_lab.HostMemory(available="64GiB"))
    return offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)


# -- the trace of real runs ------------------------------------------------------------------------
def test_measured_cpu_run_exports_every_interval_on_its_stream(measured, tmp_path: Path) -> None:
    run = measured[0]
    assert {"copy", "compute"} <= set(run.events["kind"])
    trace = run.to_chrome_trace(tmp_path / "pinned.json")
    validate(trace)
    assert_one_track_per_stream(trace, run)
    assert_every_interval(trace, run)
    names = process_names(trace)
    assert len(names) == 1 and "measured" in names[0] and "cpu" in names[0]
    assert trace["otherData"]["simulated"] is False
    # the file holds what the dict holds, read back by the trace importer's own reader
    assert list(iter_trace_events(tmp_path / "pinned.json")) == json.loads(json.dumps(trace["traceEvents"]))


def test_simulated_run_is_named_simulated_with_memory_counters(simulated, tmp_path: Path) -> None:
    trace = to_chrome_trace(simulated, tmp_path / "sim.json.gz")
    validate(trace)
    assert_one_track_per_stream(trace, simulated)
    assert_every_interval(trace, simulated)
    (name,) = process_names(trace)
    assert name.lower().count("simulated") == 1, name
    assert trace["otherData"]["simulated"] is True
    # pageable layers block the host thread: the host has its own track
    assert "host stream" in thread_names(trace)[1]
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    mem = simulated.memory
    assert len(mem) and Counter(e["name"] for e in counters) == {"device memory": len(mem),
                                                                 "host memory": len(mem)}
    device = [e["args"]["device_bytes"] for e in counters if e["name"] == "device memory"]
    assert device == mem["device_bytes"].tolist()
    host = [e["args"] for e in counters if e["name"] == "host memory"]
    assert [h["pinned_bytes"] for h in host] == mem["pinned_bytes"].tolist()
    assert json.loads(gzip.decompress((tmp_path / "sim.json.gz").read_bytes())) == json.loads(json.dumps(trace))


def test_shipped_gpu_run_exports_as_measured_on_cuda() -> None:
    run = offload_lab.Run.load(SHIPPED_GPU_RUN)
    trace = run.to_chrome_trace()
    validate(trace)
    assert_one_track_per_stream(trace, run)
    assert_every_interval(trace, run)
    assert "cuda" in process_names(trace)[0]
    assert trace["otherData"]["device_name"] == run.meta["device_name"]


def test_saved_test_runs_all_export(tmp_path: Path) -> None:
    for path in sorted((REPO / "tests" / "data" / "runs").glob("*.zip")):
        run = offload_lab.Run.load(path)
        trace = to_chrome_trace(run)
        validate(trace)
        assert_every_interval(trace, run)


# -- ranks and overlapping intervals on one stream ----------------------------------------------------
def _hand_made_run(rows: list[tuple], rank: list[int] | None = None) -> offload_lab.Run:
    events = pd.DataFrame(rows, columns=["step", "group", "layer", "kind", "stream", "tier", "bytes",
                                         "start_s", "end_s"])
    layers = pd.DataFrame({"group": ["blocks"], "layer": [0], "tier": ["pinned"], "bytes": [10],
                           "mapped_bytes": [0], "streamed": [True], "pin_rank": [1]})
    run = offload_lab.Run.build(events, [{"step": 0, "start_s": 0.0, "end_s": 1.0}], layers,
                                meta={"backend": "cpu", "label": "hand made"})
    if rank is not None:
        ev = run.events.copy()
        ev["rank"] = rank
        run.events = ev
    return run


def test_one_process_per_rank_with_its_own_streams() -> None:
    rows = [(0, "blocks", 0, "copy", "copy", "pinned", 10, 0.0, 0.1),
            (0, "blocks", 0, "compute", "compute", "pinned", 0, 0.1, 0.3),
            (0, "blocks", 0, "copy", "copy", "pinned", 10, 0.0, 0.2),
            (0, "blocks", 0, "compute", "compute", "pinned", 0, 0.2, 0.4)]
    run = _hand_made_run(rows, rank=[0, 1, 0, 1])  # in the run's order: by start, then end
    trace = to_chrome_trace(run)
    validate(trace)
    assert thread_names(trace) == {1: {"copy stream", "compute stream"}, 2: {"copy stream", "compute stream"}}
    names = process_names(trace)
    assert any("rank 0" in n for n in names) and any("rank 1" in n for n in names)
    per_pid = Counter(e["pid"] for e in trace["traceEvents"] if e["ph"] == "X")
    assert per_pid == {1: 2, 2: 2}


def test_partly_overlapping_intervals_of_one_stream_get_a_second_track() -> None:
    # two managers' copy streams recorded as one "copy" stream: [0, 0.2) and [0.1, 0.3) overlap
    rows = [(0, "blocks", 0, "copy", "copy", "pinned", 10, 0.0, 0.2),
            (0, "blocks", 0, "copy", "copy", "pinned", 10, 0.1, 0.3),
            (0, "blocks", 0, "compute", "compute", "pinned", 0, 0.3, 0.5)]
    run = _hand_made_run(rows)
    trace = to_chrome_trace(run)
    validate(trace)
    assert thread_names(trace) == {1: {"copy stream", "copy stream (2)", "compute stream"}}
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 3


def test_rejects_what_is_not_a_run() -> None:
    with pytest.raises(TypeError, match="needs an offload_lab Run, got dict"):
        to_chrome_trace({"events": []})


# -- the command ---------------------------------------------------------------------------------
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "offload_lab", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def _one_line_error(r: subprocess.CompletedProcess, needle: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("offload-lab: error: ") and needle in lines[0], r.stderr


def test_export_command_writes_refuses_to_overwrite_and_forces(tmp_path: Path) -> None:
    src = tmp_path / "pinned.zip"
    src.write_bytes((REPO / "tests" / "data" / "runs" / "pinned-p1.run.zip").read_bytes())
    r = _cli("export", src, "--format", "chrome-trace", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "pinned.trace.json"
    trace = json.loads(out.read_text())
    validate(trace)
    assert_every_interval(trace, offload_lab.Run.load(src))
    before = out.read_bytes()
    _one_line_error(_cli("export", src, "--format", "chrome-trace", cwd=tmp_path), "--force")
    assert out.read_bytes() == before
    out.write_text("old")
    assert _cli("export", src, "--format", "chrome-trace", "--force", cwd=tmp_path).returncode == 0
    assert json.loads(out.read_text()) == trace


def test_export_command_errors_are_one_line(tmp_path: Path) -> None:
    _one_line_error(_cli("export", "missing.zip", "--format", "chrome-trace", cwd=tmp_path), "'missing.zip'")
    (tmp_path / "notes.zip").write_text("not a zip")
    _one_line_error(_cli("export", "notes.zip", "--format", "chrome-trace", "--out", "t.json", cwd=tmp_path),
                    "notes.zip")
    assert not (tmp_path / "t.json").exists()
    bad = _cli("export", "notes.zip", "--format", "svg", cwd=tmp_path)
    assert bad.returncode == 2 and "chrome-trace" in bad.stderr


def test_export_help_has_examples(tmp_path: Path) -> None:
    r = _cli("export", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "examples:" in r.stdout and "offload-lab export" in r.stdout
    assert "export" in _cli("--help", cwd=tmp_path).stdout
