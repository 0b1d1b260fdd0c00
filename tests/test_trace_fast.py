"""The trace import's fast path (framed blocks decoded whole by msgspec, read column-wise)
against the per-event loop, and the frames of a torch-shaped trace against an independent
reading of the same file with ``json.load``."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
from test_traceimport import assert_same_run as same_frames_and_meta
from test_traceimport import comparable_meta

import offload_lab.record.kineto as ti
from offload_lab.record.kineto import fast, from_torch_profiler
from offload_lab.record.run import Run

DATA = Path(__file__).parent / "data" / "traces"
SHIPPED = sorted(p for p in DATA.iterdir() if p.name.endswith((".json", ".json.gz")))
BENCH = Path(__file__).parents[1] / "benchmarks" / "trace_import.py"


def _bench():
    spec = importlib.util.spec_from_file_location("trace_import_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def assert_same_run(a: Run, b: Run) -> None:
    same_frames_and_meta(a, b)
    # the same JSON types too (an int origin stays an int)
    assert (json.dumps(comparable_meta(a), sort_keys=True, default=str)
            == json.dumps(comparable_meta(b), sort_keys=True, default=str))


@pytest.fixture()
def bench_trace(tmp_path) -> Path:
    """A trace as torch writes one for layer-wise offload: 3 steps of 4 blocks (the benchmark's)."""
    path = tmp_path / "bench.json"
    _bench().write_trace(path, events=4 * 63 * 3, layers=4)
    return path


def _imports(path: Path, monkeypatch, **kw) -> tuple[Run, Run, int]:
    """The run by the fast path (and how many blocks it took), and by the per-event loop."""
    taken = []
    apply = fast.collect_block

    def counted(*a):
        ok = apply(*a)
        taken.append(ok)
        return ok

    with monkeypatch.context() as m:
        m.setattr(fast, "collect_block", counted)
        quick = from_torch_profiler(path, **kw)
    with monkeypatch.context() as m:
        m.setattr(fast, "msgspec", None)  # as without msgspec installed
        assert not fast.available()
        slow = from_torch_profiler(path, **kw)
    return quick, slow, sum(taken)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_fast_path_gives_the_per_event_loops_run(path, monkeypatch):
    pytest.importorskip("msgspec")
    quick, slow, blocks = _imports(path, monkeypatch)
    assert_same_run(quick, slow)
    if path.name.startswith(("gpu_", "h200")):  # torch's own layout: framed, so read fast
        assert blocks >= 1


def test_fast_path_in_small_chunks_with_python_frames_and_a_pattern(bench_trace, tmp_path, monkeypatch):
    """Many blocks (lanes first seen in later ones), the one-event-per-line layout of torch's
    Python writer, and a custom pattern that reads Python frames: the same runs."""
    pytest.importorskip("msgspec")
    monkeypatch.setattr(ti.reader, "_CHUNK", 4096)
    monkeypatch.setattr(ti.reader, "_LOW", 1024)
    doc = json.loads(bench_trace.read_text())
    doc["traceEvents"].insert(5, {"ph": "X", "cat": "python_function", "name": "nn.Module: Block_0",
                                  "pid": 4242, "tid": 4242, "ts": doc["traceEvents"][5].get("ts", 0), "dur": 1})
    lines = tmp_path / "lines.json"
    lines.write_text('{"traceEvents": [\n' + ",\n".join(json.dumps(e, separators=(",", ":"))
                                                       for e in doc["traceEvents"]) + "\n]}")
    gz = tmp_path / "bench.json.gz"
    gz.write_bytes(gzip.compress(bench_trace.read_bytes()))
    for path in (bench_trace, gz, lines):
        quick, slow, blocks = _imports(path, monkeypatch)
        assert blocks > 3, path.name
        assert_same_run(quick, slow)
    pattern = r"(?P<group>blocks)\.(?P<layer>\d+)"
    quick, slow, _ = _imports(lines, monkeypatch, layer_pattern=pattern)
    assert_same_run(quick, slow)


def test_odd_rows_send_their_block_to_the_loop(bench_trace, tmp_path, monkeypatch):
    """A negative duration, a float byte count: the block they are in
    goes down the per-event loop, which counts or refuses them as before."""
    pytest.importorskip("msgspec")
    text = bench_trace.read_text()
    i = text.index('"cat": "kernel"')
    odd = (text[:i] + text[i:].replace('"dur": 30.000', '"dur": -30.000', 1)).replace(
        '"bytes": 8388608', '"bytes": 8388608.0', 1)
    p = tmp_path / "odd.json"
    p.write_text(odd)
    quick, slow, _ = _imports(p, monkeypatch)
    assert_same_run(quick, slow)
    assert quick.meta["skipped"]["negative_dur"] == 1


def _independent(path: Path) -> pd.DataFrame:
    """The events of the benchmark's trace shape, read straight from ``json.load``: one compute
    row per block and step (its kernels' span), one copy per HtoD memcpy labelled with the step
    of its block's next compute (the prefetch for a step that was not recorded dropped), one
    host_block per pageable cudaMemcpyAsync; times in µs from the first non-op complete row."""
    ev = json.loads(path.read_text())["traceEvents"]
    xs = [e for e in ev if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in xs if e["cat"] not in ("cpu_op", "python_function"))
    steps = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in xs
             if e["name"].startswith("ProfilerStep#")]
    step_at = lambda t: next(s for a, b, s in steps if a <= t < b)  # noqa: E731
    launch = {e["args"]["correlation"]: e for e in xs if e["cat"] == "cuda_runtime"}
    prefetch = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split(".")[1])) for e in xs
                if e["cat"] == "user_annotation" and e["name"].startswith("prefetch ")]
    rows, uses = [], {}
    for a in (e for e in xs if e["cat"] == "gpu_user_annotation"):
        ks = [k for k in xs if k["cat"] == "kernel" and a["ts"] <= k["ts"] < a["ts"] + a["dur"]]
        layer = int(a["name"].split(".")[1])
        step = step_at(launch[ks[0]["args"]["correlation"]]["ts"])
        start, end = min(k["ts"] for k in ks), max(k["ts"] + k["dur"] for k in ks)
        uses.setdefault(layer, []).append((end, step))
        rows.append(("compute", step, layer, 0, start, end))
    for c in (e for e in xs if e["cat"] == "gpu_memcpy"):
        call = launch[c["args"]["correlation"]]
        layer = next(n for a, b, n in prefetch if a <= call["ts"] < b)
        later = sorted(u for u in uses[layer] if u[0] > c["ts"] + c["dur"])
        if not later:
            continue
        step, nbytes = later[0][1], c["args"]["bytes"]
        tier = "pinned" if "Pinned" in c["name"] else "pageable"
        rows.append(("copy", step, layer, nbytes, c["ts"], c["ts"] + c["dur"], tier))
        if tier == "pageable":
            rows.append(("host_block", step, layer, nbytes, call["ts"], call["ts"] + call["dur"], tier))
    tiers = {r[2]: r[6] for r in rows if r[0] == "copy"}
    out = pd.DataFrame([(k, s, "blocks", lay, r[6] if len(r) > 6 else tiers.get(lay, "unknown"), b,
                         round(a - t0, 3), round(e - t0, 3)) for r in rows for k, s, lay, b, a, e in [r[:6]]],
                       columns=["kind", "step", "group", "layer", "tier", "bytes", "start_us", "end_us"])
    return out.sort_values(["kind", "start_us", "layer"]).reset_index(drop=True)


def test_frames_match_an_independent_reading_of_the_file(bench_trace):
    run = from_torch_profiler(bench_trace)
    ev = run.events
    got = pd.DataFrame({"kind": ev["kind"].astype(object), "step": ev["step"], "group": ev["group"].astype(object),
                        "layer": ev["layer"], "tier": ev["tier"].astype(object), "bytes": ev["bytes"],
                        "start_us": (ev["start_s"] * 1e6).round(3), "end_us": (ev["end_s"] * 1e6).round(3)})
    got = got.sort_values(["kind", "start_us", "layer"]).reset_index(drop=True)
    want = _independent(bench_trace)
    # 4 computes, 16 copies (4 per prefetch), 8 pageable host blocks a step; the last step's
    # prefetch of block 0 (pinned) has no later use
    assert len(want) == 3 * 4 + (3 * 16 - 4) + 3 * 8
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert run.steps["step"].tolist() == [0, 1, 2]
    assert run.meta["skipped"]["copies_without_a_later_use"]["copy"] == 4


def test_flows_after_the_last_op_are_counted_in_every_layout(tmp_path, monkeypatch):
    """Kineto writes the GPU rows after the CPU ones: blocks without an op still count their
    flow arrows, as a one-line file of the same events does."""
    path = DATA / "h200_offload_trace.json.gz"
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps(json.loads(gzip.decompress(path.read_bytes()))))
    events = json.loads(flat.read_text())["traceEvents"]
    flows = sum(1 for e in events if e.get("ph") in ("s", "f"))
    for reading in ("fast", "loop"):
        with monkeypatch.context() as m:
            if reading == "loop":
                m.setattr(fast, "msgspec", None)
            run = from_torch_profiler(path)
            assert run.meta["skipped"]["flow_and_python_rows"] == flows
            assert_same_run(run, from_torch_profiler(flat))


@pytest.mark.parametrize("depth, error", [(500, None), (5000, "nested too deeply for a JSON parser")])
def test_deep_nesting_in_a_used_row_reads_alike(depth, error, tmp_path, monkeypatch):
    """A kernel's args nested deeper than the stdlib parser takes is refused on both paths, with
    the same event and byte; shallower nesting is read on both."""
    pytest.importorskip("msgspec")
    text = (DATA / "gpu_two_steps.json").read_text()
    at = text.index('"args": {', text.index('"cat": "kernel"')) + len('"args": {')
    p = tmp_path / "deep.json"
    p.write_text(text[:at] + '"deep": ' + "[" * depth + "]" * depth + ", " + text[at:])
    outcomes = []
    for reading in ("fast", "loop"):
        with monkeypatch.context() as m:
            if reading == "loop":
                m.setattr(fast, "msgspec", None)
            try:
                outcomes.append(len(from_torch_profiler(p).events))
            except ti.TraceFormatError as e:
                outcomes.append(str(e))
    assert outcomes[0] == outcomes[1]
    if error:
        assert error in outcomes[0] and "event 13 at byte" in outcomes[0]


def test_an_unhashable_id_is_refused_alike(tmp_path, monkeypatch):
    pytest.importorskip("msgspec")
    text = (DATA / "gpu_two_steps.json").read_text()
    at = text.index('"pid":', text.index('"cat": "cuda_runtime"'))
    p = tmp_path / "ids.json"
    p.write_text(text[:at] + '"pid": [100], "x"' + text[at + len('"pid"'):])
    errors = []
    for reading in ("fast", "loop"):
        with monkeypatch.context() as m:
            if reading == "loop":
                m.setattr(fast, "msgspec", None)
            with pytest.raises(ti.TraceFormatError, match=r"has pid \[100\]") as e:
                from_torch_profiler(p)
            errors.append(str(e.value))
    assert errors[0] == errors[1]
