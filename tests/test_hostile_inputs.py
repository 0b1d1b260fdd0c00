"""Hostile inputs, one bounded corpus per class: paths that are no regular file, files past
their cap, saved runs that decode to far more than they store, runs whose numbers cannot be
what their columns say, and traces nested too deeply or holding nothing to show. Each is
refused quickly, in one line, naming what is wrong; every run that loads can be viewed."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import offload_lab
from offload_lab import Run
from offload_lab.errors import OffloadLabError
from offload_lab.model.spec import ModelSpec, SpecError
from offload_lab.reading import (
    MAX_JSON_BYTES,
    InputFileError,
    MissingInputError,
    check_input,
    read_json,
    read_text,
)
from offload_lab.record.kineto import TraceFormatError, from_torch_profiler
from offload_lab.record.run import MAX_FRAME_ROWS, RunFormatError
from offload_lab.simulation import DeviceProfile
from offload_lab.simulation.errors import ProfileError

ROOT = Path(__file__).parents[1]
SAVED = ROOT / "tests" / "data" / "runs" / "pinned-p0.run.zip"


def _one_line(e: BaseException, *needles: str) -> str:
    msg = str(e)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


def _without_hanging(fn, fifo: Path | None = None, timeout: float = 30.0):
    """``fn()``'s exception (or None), failing the test if it blocks (a FIFO opened for reading)."""
    out: dict = {}

    def call():
        try:
            fn()
            out["error"] = None
        except BaseException as e:  # noqa: BLE001 - returned to the test
            out["error"] = e

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if fifo is not None:  # release the reader stuck in open()
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            t.join(5)
        pytest.fail("reading blocked")
    return out["error"]


# -- 1. paths that are no regular file, files past their cap ------------------------------------
@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "pipe.json"
    os.mkfifo(p)
    return p


def test_check_input_names_what_a_path_is(tmp_path, fifo):
    cases = [(fifo, "a FIFO"), ("/dev/zero", "a character device"), (tmp_path, "a directory")]
    for path, what in cases:
        err = _without_hanging(lambda path=path: read_json(path, "plan", MAX_JSON_BYTES), fifo)
        assert isinstance(err, InputFileError) and isinstance(err, OffloadLabError), repr(err)
        _one_line(err, repr(str(path)), what, "not a regular file", "accepted: a regular file of at most 64 MiB")
    with pytest.raises(MissingInputError) as e:
        check_input(tmp_path / "absent.json", "plan", MAX_JSON_BYTES)
    assert isinstance(e.value, FileNotFoundError)
    _one_line(e.value, "no such plan", "absent.json")


def test_a_file_over_its_cap_is_refused_by_its_size(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: no disk is used
        f.truncate(int(6.2 * 2**30))
    t = time.perf_counter()
    with pytest.raises(InputFileError) as e:
        read_json(big, "plan", MAX_JSON_BYTES)
    assert time.perf_counter() - t < 1
    _one_line(e.value, "6.2 GiB, over the cap of 64 MiB")


@pytest.mark.parametrize(("body", "needle"), [
    (b"\xff\xfe{", "not UTF-8"),
    (b"[" * 100_000, "nested too deeply"),
    (b'{"a": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", "nested too deeply"),
    (b"{nope", "not valid JSON"),
    (b"", "not valid JSON"),
])
def test_bad_json_files_are_one_line(tmp_path, body, needle):
    p = tmp_path / "x.json"
    p.write_bytes(body)
    reader = read_text if needle == "not UTF-8" else read_json
    with pytest.raises(InputFileError) as e:
        reader(p, "plan", MAX_JSON_BYTES)
    _one_line(e.value, needle, str(p))


def test_every_json_reader_refuses_a_fifo_and_a_device(tmp_path, fifo):
    readers = [(ModelSpec.from_json, SpecError), (DeviceProfile.from_json, ProfileError),
               (ModelSpec.from_safetensors, SpecError), (offload_lab.load, ValueError),
               (Run.load, RunFormatError), (from_torch_profiler, TraceFormatError)]
    for path in (fifo, Path("/dev/zero")):
        for read, cls in readers:
            err = _without_hanging(lambda read=read, path=path: read(path), fifo)
            assert isinstance(err, cls), (read, path, repr(err))
            _one_line(err, "not a regular file")


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "offload_lab", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("plan", ["fifo", "/dev/zero"])
def test_report_plan_that_is_no_file_is_one_line_exit_2(tmp_path, fifo, plan):
    target = str(fifo) if plan == "fifo" else plan
    out = tmp_path / "r.html"
    try:
        r = _cli("report", str(SAVED), "--plan", target, "--out", str(out), timeout=120)
    except subprocess.TimeoutExpired:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)) if plan == "fifo" else None
        pytest.fail(f"offload-lab report --plan {target} did not return")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "--plan" in lines[0] and target in lines[0], lines[0]
    assert ("FIFO" if plan == "fifo" else "character device") in lines[0], lines[0]
    assert not out.exists()


# -- 2. saved runs that decode to far more than they store --------------------------------------
@pytest.fixture(scope="module")
def good_run():
    spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    return offload_lab.simulate(plan, "h200", steps=2)


def _members(run: Run, tmp_path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(run.save(tmp_path / "good.zip")) as z:
        return {n: z.read(n) for n in z.namelist()}


def _zip(tmp_path: Path, members: dict[str, bytes], name: str = "bad.zip") -> Path:
    p = tmp_path / name
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, data in members.items():
            z.writestr(n, data)
    return p


def _row_groups(table: pa.Table, times: int, **kw) -> bytes:
    """``table`` written ``times`` over as row groups: a constant column stays a few bytes each."""
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, table.schema, compression="zstd", **kw) as w:
        for _ in range(times):
            w.write_table(table, row_group_size=len(table))
    return buf.getvalue()


_MEASURE = textwrap.dedent("""
    import resource, sys, time
    from offload_lab import Run
    from offload_lab.record.run import RunFormatError
    Run.load(sys.argv[2])  # imports and first-use allocations out of the measurement
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    try:
        Run.load(sys.argv[1])
        print("LOADED")
    except RunFormatError as e:
        print("REFUSED", e)
    print("SECONDS", time.perf_counter() - t)
    print("GROWTH_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
""")


def test_a_parquet_bomb_of_3e8_rows_is_refused_fast_and_small(good_run, tmp_path):
    m = _members(good_run, tmp_path)
    one = pa.table({"step": pa.array(np.ones(1_000_000, dtype="int64"))})
    m["events.parquet"] = _row_groups(one, 300, use_dictionary=True)  # 3×10^8 rows
    assert len(m["events.parquet"]) < 16 << 20
    bomb = _zip(tmp_path, m)
    good = good_run.save(tmp_path / "ok.zip")
    r = subprocess.run([sys.executable, "-c", _MEASURE, str(bomb), str(good)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert "REFUSED" in out, r.stdout
    assert "events.parquet" in out["REFUSED"] and "300,000,000 rows" in out["REFUSED"], out["REFUSED"]
    assert float(out["SECONDS"]) < 2.0, out
    assert int(out["GROWTH_KIB"]) < 200 * 1024, out


def test_a_long_string_repeated_by_its_dictionary_is_refused(good_run, tmp_path):
    # 100 k rows pointing at one 32 KiB dictionary entry: ~3 GiB of text from a few KB
    m = _members(good_run, tmp_path)
    group = pa.DictionaryArray.from_arrays(pa.array(np.zeros(100_000, "int32")), pa.array(["g" * 32768]))
    m["events.parquet"] = _row_groups(pa.table({"group": group}), 1, use_dictionary=True)
    assert len(m["events.parquet"]) < 16 << 20
    with pytest.raises(RunFormatError) as e:
        Run.load(_zip(tmp_path, m))
    _one_line(e.value, "events.parquet", "text columns decode to more than")


def test_nested_columns_and_rows_past_the_cap_are_refused(good_run, tmp_path):
    m = _members(good_run, tmp_path)
    m["memory.parquet"] = _row_groups(pa.table({"t_s": pa.array([[0.0] * 1000], pa.list_(pa.float64()))}), 1)
    with pytest.raises(RunFormatError) as e:
        Run.load(_zip(tmp_path, m))
    _one_line(e.value, "memory.parquet", "nested column(s) ['t_s']")
    m = _members(good_run, tmp_path)
    m["steps.parquet"] = _row_groups(pa.table({"step": pa.array(np.zeros(MAX_FRAME_ROWS // 4 + 1, "int64"))}), 4)
    with pytest.raises(RunFormatError) as e:
        Run.load(_zip(tmp_path, m))
    _one_line(e.value, "steps.parquet", f"{4 * (MAX_FRAME_ROWS // 4 + 1):,} rows")


# -- 3. runs whose numbers cannot be what their columns say -------------------------------------
def _saved_with(run: Run, tmp_path: Path, frame: str, df: pd.DataFrame) -> Path:
    m = _members(run, tmp_path)
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    m[f"{frame}.parquet"] = buf.getvalue()
    return _zip(tmp_path, m)


def _first(df: pd.DataFrame, **cols) -> pd.DataFrame:
    df = df.copy()
    for c, v in cols.items():
        df[c] = df[c].astype("float64") if isinstance(v, float) and df[c].dtype != "float64" else df[c]
        df.loc[0, c] = v
    return df


BAD_VALUES = [
    ("steps", {"wall_s": math.nan}, "steps column 'wall_s' holds nan"),
    ("steps", {"wall_s": -math.inf}, "steps column 'wall_s' holds -inf"),
    ("steps", {"wall_s": 0.0}, "steps column 'wall_s' holds 0.0"),
    ("steps", {"step": 10**18}, "steps column 'step' holds 1000000000000000000"),
    ("steps", {"overlap": 3.0}, "steps column 'overlap' holds 3.0"),
    ("steps", {"bytes_moved": -1}, "steps column 'bytes_moved' holds -1"),
    ("events", {"layer": -5}, "events column 'layer' holds -5"),
    ("events", {"step": 10**18}, "events column 'step' holds 1000000000000000000"),
    ("events", {"bytes": -7}, "events column 'bytes' holds -7"),
    ("events", {"start_s": math.nan}, "events column 'start_s' holds nan"),
    ("events", {"end_s": math.inf}, "events column 'end_s' holds inf"),
    ("events", {"dur_s": -0.5}, "events column 'dur_s' holds -0.5"),
    ("events", {"rank": -1}, "events column 'rank' holds -1"),
    ("layers", {"gbps": -3.0}, "layers column 'gbps' holds -3.0"),
    ("layers", {"copy_s": math.inf}, "layers column 'copy_s' holds inf"),
    ("memory", {"t_s": -1.0}, "memory column 't_s' holds -1.0"),
    ("memory", {"device_bytes": -(2**40)}, "memory column 'device_bytes' holds"),
]


@pytest.mark.parametrize(("frame", "cols", "needle"), BAD_VALUES, ids=[f"{f}-{next(iter(c))}" for f, c, _ in BAD_VALUES])
def test_bad_numbers_are_refused_at_load_naming_the_column(good_run, tmp_path, frame, cols, needle):
    df = getattr(good_run, frame)
    if frame == "memory" and not len(df):
        df = pd.DataFrame({"t_s": [0.0], "device_bytes": [1], "pinned_bytes": [0], "anon_bytes": [0],
                           "mapped_bytes": [0], "rank": [0]})
    p = _saved_with(good_run, tmp_path, frame, _first(df, **cols))
    with pytest.raises(RunFormatError) as e:
        Run.load(p)
    _one_line(e.value, str(p), needle, "accepted:")


def test_an_event_that_ends_before_it_starts_is_refused(good_run, tmp_path):
    ev = good_run.events.copy()
    ev.loc[0, ["start_s", "end_s", "dur_s"]] = [2.0, 1.0, -1.0]
    with pytest.raises(RunFormatError) as e:
        Run.load(_saved_with(good_run, tmp_path, "events", ev))
    _one_line(e.value, "ends before it starts")
    ev = good_run.events.copy()
    ev.loc[0, "dur_s"] = ev.loc[0, "dur_s"] + 100.0
    with pytest.raises(RunFormatError) as e:
        Run.load(_saved_with(good_run, tmp_path, "events", ev))
    _one_line(e.value, "dur_s other than end_s - start_s")


def test_builders_refuse_bad_numbers_too(good_run):
    with pytest.raises(RunFormatError, match="'wall_s' holds nan"):
        Run(good_run.events, good_run.layers, _first(good_run.steps, wall_s=math.nan), good_run.memory,
            good_run.meta)


def test_every_run_that_loads_can_be_compared_and_reported(good_run, tmp_path):
    """A fuzz corpus of runs that keep to the contract at its edges: none crashes a view."""
    from offload_lab.analysis.comparison import compare
    from offload_lab.views.report import report

    ev, st, lay, mem = good_run.events, good_run.steps, good_run.layers, good_run.memory
    empty_ev = ev.iloc[:0]
    zero = ev.copy()
    copies = zero["kind"] == "copy"
    zero.loc[copies, "end_s"] = zero.loc[copies, "start_s"]
    zero.loc[copies, "dur_s"] = 0.0
    corpus = {
        "no events": (empty_ev, lay, st, mem),
        "no steps": (ev, lay, st.iloc[:0], mem),
        "nothing": (empty_ev, lay.iloc[:0], st.iloc[:0], mem.iloc[:0]),
        "no copies": (ev[ev["kind"] != "copy"], lay, st.assign(bytes_moved=0, overlap=math.nan), mem),
        "zero-length copies": (zero, lay.assign(gbps=math.nan), st, mem),
        "layer -1": (ev.assign(layer=-1, group=""), lay, st, mem),
        "huge numbers": (ev.assign(step=10**9 - 1), lay, st.assign(step=10**9 - 1, wall_s=1e12), mem),
    }
    loaded = []
    for name, (e, la, s, me) in corpus.items():
        p = Run(e, la, s, me, {**good_run.meta, "label": name}).save(tmp_path / f"{len(loaded)}.zip")
        run = Run.load(p)
        loaded.append(run)
        for runs in ([run], [good_run, run], [run, good_run]):
            try:
                df = compare(runs)
            except offload_lab.analysis.summary.AnalysisError as err:  # refused in one line, never a crash
                _one_line(err, "cannot be bounded")
                assert "bandwidth=" not in str(err)
                continue
            assert len(df) == len(runs)
        try:
            report([run]).save(tmp_path / f"{len(loaded)}.html")
        except offload_lab.analysis.summary.AnalysisError as err:
            _one_line(err, "cannot be bounded")
    assert len(loaded) == len(corpus)


def test_a_single_run_without_a_step_time_has_a_note_not_an_index_error(good_run):
    from offload_lab.analysis.comparison import compare

    lone = Run(good_run.events, good_run.layers, good_run.steps.iloc[:0], good_run.memory, good_run.meta)
    df = compare([lone])
    assert math.isnan(df["ratio"].iloc[0]) and "has no measured step time" in df["ratio_note"].iloc[0]


def test_a_run_that_moved_bytes_without_timed_copies_says_what_it_lacks(good_run):
    from offload_lab.analysis.summary import AnalysisError, bound

    meta = {k: v for k, v in good_run.meta.items() if k != "profile"}
    run = Run(good_run.events.iloc[:0], good_run.layers, good_run.steps, good_run.memory, meta)
    with pytest.raises(AnalysisError) as e:
        bound(run)
    msg = _one_line(e.value, "moved", "0 copy row(s)", "no device profile")
    assert "bandwidth=" not in msg


# -- 4. traces nested too deeply, or holding nothing to show ------------------------------------
@pytest.mark.parametrize("where", ["event", "header"])
def test_a_deeply_nested_trace_is_a_trace_format_error(tmp_path, where):
    deep = "[" * 100_000 + "]" * 100_000
    body = ('{"traceEvents": [' + deep + "]}" if where == "event"
            else '{"deviceProperties": ' + deep + ', "traceEvents": []}')
    p = tmp_path / "deep.json"
    p.write_text(body)
    with pytest.raises(TraceFormatError) as e:
        from_torch_profiler(p)
    _one_line(e.value, "deep.json", "nested too deeply")


def test_a_trace_of_unlabelled_complete_events_says_what_it_holds(tmp_path):
    n = 100_000
    ev = '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": %d, "dur": 1}'
    p = tmp_path / "ops.json"
    p.write_text('{"traceEvents": [' + ",".join(ev % i for i in range(n)) + "]}")
    t = time.perf_counter()
    with pytest.raises(TraceFormatError) as e:
        from_torch_profiler(p)
    assert time.perf_counter() - t < 10
    msg = _one_line(e.value, "no layer found", f"{n:,} of them complete", "cpu_op ×100,000", "record_function")
    assert "has no complete" not in msg


def test_a_trace_value_longer_than_any_event_is_refused(tmp_path):
    from offload_lab.record.kineto import TraceImportOptions

    p = tmp_path / "long.json"
    p.write_text('{"traceEvents": [{"ph": "X", "name": "' + "a" * (4 << 20) + '"}]}')
    with pytest.raises(TraceFormatError) as e:
        from_torch_profiler(p, options=TraceImportOptions(max_value_chars=1 << 20))
    _one_line(e.value, "goes on for more than 1 MiB")


def test_the_trace_cap_bounds_the_decompressed_text(tmp_path):
    import gzip

    from offload_lab.record.kineto import TraceImportOptions

    p = tmp_path / "wide.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (16 << 20) + b"]}"))
    assert p.stat().st_size < 1 << 20
    with pytest.raises(TraceFormatError) as e:
        from_torch_profiler(p, options=TraceImportOptions(max_decompressed_bytes=4 << 20))
    _one_line(e.value, "more than 4 MiB of JSON once decompressed")


def test_caps_are_what_the_docs_say():
    doc = (ROOT / "docs" / "frames.md").read_text()
    from offload_lab.record import run as run_module
    from offload_lab.record import schema

    assert f"{run_module.MAX_FRAME_ROWS:,} rows" in doc
    assert f"{schema.MAX_INDEX - 1:,}" in doc and schema.MAX_INDEX == 10**9
    assert f"{run_module.MAX_FRAME_BYTES >> 30} GiB decoded" in doc
    assert f"| {MAX_JSON_BYTES >> 20} MiB" in doc
