"""Trace import: real torch.profiler traces, real GPU traces, hand-checked fixtures,
malformed and truncated files."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import offload_lab
import offload_lab.record.kineto as ti
from offload_lab.record.kineto import (
    NO_GROUP,
    NO_LAYER,
    TraceFormatError,
    TraceImportError,
    TraceImportOptions,
    from_torch_profiler,
    iter_trace_events,
)
from offload_lab.record.run import EVENT_COLUMNS, LAYER_COLUMNS, STEP_COLUMNS, Run

DATA = Path(__file__).parent / "data" / "traces"
FIXTURE = DATA / "gpu_two_steps.json"
SAMPLED = DATA / "hta-sampled-rank0.json.gz"
ALEXNET = DATA / "hta-alexnet.json.gz"


# -- helpers ----------------------------------------------------------------------------------

def us(run: Run, frame: str = "events") -> pd.DataFrame:
    """The frame with times in whole microseconds (the fixture is written in µs)."""
    df = getattr(run, frame).copy()
    for c in [c for c in df.columns if c.endswith("_s")]:
        df[c.removesuffix("_s") + "_us"] = np.round(df.pop(c) * 1e6, 6)
    return df


def comparable_meta(run: Run) -> dict:
    return {k: v for k, v in run.meta.items() if k not in ("run", "created", "source", "label")}


def assert_same_run(a: Run, b: Run) -> None:
    for name in ("events", "layers", "steps"):
        fa, fb = getattr(a, name), getattr(b, name)
        if name == "events":
            fa, fb = fa.drop(columns="run"), fb.drop(columns="run")
        pd.testing.assert_frame_equal(fa, fb)
    assert comparable_meta(a) == comparable_meta(b)


def event_index(path: Path, pred) -> int:
    events = json.loads(path.read_text())["traceEvents"]
    return next(i for i, e in enumerate(events) if pred(e))


# -- the hand-checked GPU fixture ---------------------------------------------------------------
# tests/data/traces/gpu_two_steps.json (torch 2.x layout, times in µs, origin 1000):
#   step 1: prefetch blocks.0 -> Pinned 4000 B [1020,1060); blocks.0 kernels [1070,1090) [1095,1125);
#           prefetch blocks.1 -> Pageable 8000 B [1110,1180) from a cudaMemcpyAsync [1105,1185);
#           blocks.1 kernel [1220,1250); a DtoH copy; a kernel outside every layer [1310,1320)
#   step 2: the same with one kernel per layer, then a prefetch of blocks.0 for a step 3 that
#           was not recorded.

@pytest.fixture(scope="module")
def fixture_run() -> Run:
    return from_torch_profiler(FIXTURE)


def test_fixture_events_exact(fixture_run):
    ev = us(fixture_run).drop(columns=["run", "call", "rank", "dur_us"])
    expected = pd.DataFrame([
        # step group layer kind stream tier bytes start end
        (1, "blocks", 0, "copy", "copy", "pinned", 4000, 20.0, 60.0),
        (1, "blocks", 0, "compute", "compute", "pinned", 0, 70.0, 125.0),
        (1, "blocks", 1, "host_block", "host", "pageable", 8000, 105.0, 185.0),
        (1, "blocks", 1, "copy", "copy", "pageable", 8000, 110.0, 180.0),
        (1, "blocks", 1, "compute", "compute", "pageable", 0, 220.0, 250.0),
        (1, NO_GROUP, NO_LAYER, "compute", "compute", "unknown", 0, 310.0, 320.0),
        (2, "blocks", 0, "copy", "copy", "pinned", 4000, 420.0, 460.0),
        (2, "blocks", 0, "compute", "compute", "pinned", 0, 470.0, 490.0),
        (2, "blocks", 1, "host_block", "host", "pageable", 8000, 505.0, 585.0),
        (2, "blocks", 1, "copy", "copy", "pageable", 8000, 510.0, 580.0),
        (2, "blocks", 1, "compute", "compute", "pageable", 0, 620.0, 650.0),
    ], columns=["step", "group", "layer", "kind", "stream", "tier", "bytes", "start_us", "end_us"])
    assert list(fixture_run.events.columns) == EVENT_COLUMNS
    pd.testing.assert_frame_equal(ev, expected, check_dtype=False)
    assert fixture_run.events["run"].unique().tolist() == [fixture_run.meta["run"]]


def test_fixture_layers_and_steps_exact(fixture_run):
    layers = fixture_run.layers
    assert list(layers.columns) == LAYER_COLUMNS
    assert layers[["group", "layer", "tier", "bytes", "mapped_bytes", "streamed"]].values.tolist() == [
        ["blocks", 0, "pinned", 4000, 0, True], ["blocks", 1, "pageable", 8000, 0, True]]
    assert layers["pin_rank"].isna().all()
    assert layers["copy_s"].tolist() == pytest.approx([40e-6, 70e-6])
    assert layers["compute_s"].tolist() == pytest.approx([(55e-6 + 20e-6) / 2, 30e-6])  # medians
    assert layers["gbps"].tolist() == pytest.approx([4000 / 40e-6 / 1e9, 8000 / 70e-6 / 1e9])

    steps = fixture_run.steps
    assert list(steps.columns) == STEP_COLUMNS
    assert steps["step"].tolist() == [1, 2]
    assert steps["wall_s"].tolist() == pytest.approx([400e-6, 400e-6])
    assert steps["compute_s"].tolist() == pytest.approx([95e-6, 50e-6])
    assert steps["copy_s"].tolist() == pytest.approx([110e-6, 110e-6])
    assert steps["bytes_moved"].tolist() == [12000, 12000]
    # step 1: the pageable copy [110,180) overlaps blocks.0's compute [70,125) for 15 µs
    assert steps["overlap"].tolist() == pytest.approx([15 / 110, 0.0])


def test_fixture_meta(fixture_run):
    m = fixture_run.meta
    assert m["backend"] == "trace" and m["simulated"] is False and fixture_run.simulated is False
    assert m["label"] == "gpu_two_steps" and m["source"] == "gpu_two_steps.json"
    assert m["device_name"] == "NVIDIA Test GPU"
    assert m["streams"] == {"copy": [[0, 20]], "compute": [[0, 7]]}
    assert m["time_origin_us"] == 1000
    assert m["counts"]["events"] == 79
    assert m["counts"]["kernels"] == 6
    assert m["counts"]["memcpy_htod"]["pinned"] == {"count": 3, "bytes": 12000}
    assert m["counts"]["memcpy_htod"]["pageable"] == {"count": 2, "bytes": 16000}
    assert m["counts"]["profiler_steps"] == 2
    assert m["skipped"]["memcpy_not_htod"] == {"DtoH": {"count": 1, "bytes": 4}}
    assert m["skipped"]["copies_without_a_later_use"] == {"copy": 1, "host_block": 0}
    assert m["skipped"]["flow_and_python_rows"] == 24
    assert m["skipped"]["cpu_ops"] == 12
    assert m["layer_source"] == "labels" and m["compute_source"] == "kernels"
    assert repr(fixture_run).startswith("<Run 'gpu_two_steps' measured (trace), 2 steps")


def test_fixture_same_run_in_every_layout(tmp_path, monkeypatch, fixture_run):
    """Kineto blocks (skipping unused rows), one-line JSON, gzip, tiny chunks: one answer."""
    doc = json.loads(FIXTURE.read_text())
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps(doc))
    gz = tmp_path / "gpu_two_steps.json.gz"
    gz.write_bytes(gzip.compress(FIXTURE.read_bytes()))
    array_format = tmp_path / "array.json"  # the chrome "JSON Array Format"
    array_format.write_text(json.dumps(doc["traceEvents"], indent=2))
    for path in (flat, gz):
        assert_same_run(fixture_run, from_torch_profiler(path))
    arr = from_torch_profiler(array_format)
    pd.testing.assert_frame_equal(arr.events.drop(columns="run"), fixture_run.events.drop(columns="run"))
    assert arr.meta["device_name"] is None  # no deviceProperties in an array-only file
    # chunks of 7 characters: every event, key and number crosses a chunk edge somewhere;
    # 1500: many blocks of whole events, each framed without decoding its unused rows
    for chunk, low in ((7, 5), (1500, 300)):
        monkeypatch.setattr(ti.reader, "_CHUNK", chunk)
        monkeypatch.setattr(ti.reader, "_LOW", low)
        for path in (FIXTURE, flat, gz):
            assert_same_run(fixture_run, from_torch_profiler(path))


def test_iter_trace_events_yields_every_event(tmp_path):
    for path in (FIXTURE, ALEXNET):
        text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        assert list(iter_trace_events(path)) == json.loads(text)["traceEvents"]


def test_run_saves_and_loads(tmp_path, fixture_run):
    back = Run.load(fixture_run.save(tmp_path / "trace-run"))
    assert back.equals(fixture_run)
    assert offload_lab.from_torch_profiler is from_torch_profiler


# -- the two real GPU traces (Holistic Trace Analysis test data, MIT) ---------------------------

def test_hta_sampled_rank0_copies():
    run = from_torch_profiler(SAMPLED)
    copies = run.events[run.events["kind"] == "copy"]
    by_tier = copies.groupby("tier")["bytes"].agg(["size", "sum"])
    assert by_tier.loc["pageable"].tolist() == [16, 16416]
    assert by_tier.loc["pinned"].tolist() == [8, 4849696]
    assert set(copies["stream"]) == {"copy"}
    assert run.meta["streams"]["copy"] == [[0, 23], [0, 25]]
    # DtoH and DtoD copies move no weights: out of the lanes, counted in meta
    assert run.meta["skipped"]["memcpy_not_htod"] == {
        "DtoD": {"count": 8, "bytes": 209194904}, "DtoH": {"count": 8, "bytes": 6115}}
    # every pageable HtoD copy was issued by a cudaMemcpyAsync that blocked the host thread
    hb = run.events[run.events["kind"] == "host_block"]
    assert len(hb) == 16 and set(hb["tier"]) == {"pageable"} and set(hb["stream"]) == {"host"}
    assert (run.events.loc[run.events["kind"] == "compute", "stream"] == "compute").all()
    assert run.meta["counts"]["kernels"] == 1154
    assert run.steps["step"].tolist() == [551, 552]  # ProfilerStep#551, #552
    assert run.meta["device_name"] is None  # no deviceProperties in this trace: not guessed
    assert run.meta["counts"]["events"] == 4855
    # no layer annotations in a recommender model: every row is outside a layer
    assert len(run.layers) == 0 and set(run.events["layer"]) == {NO_LAYER}


def test_hta_alexnet_copies():
    run = from_torch_profiler(ALEXNET)
    copies = run.events[run.events["kind"] == "copy"]
    assert len(copies) == 16 and set(copies["tier"]) == {"pageable"}
    assert copies["bytes"].sum() == 244403360
    assert run.meta["device_name"] == "NVIDIA A100-PG509-200"
    assert run.steps["step"].tolist() == [0]  # no ProfilerStep: the whole trace is one step
    assert run.meta["counts"]["events"] == 1408
    assert run.steps["bytes_moved"].tolist() == [244403360]


# -- real torch.profiler runs on the CPU --------------------------------------------------------

class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x))


class Net(nn.Module):
    def __init__(self, n: int = 3, labels: bool = True) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        self.labels = labels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            if self.labels:
                with record_function(f"blocks.{i}"):
                    x = block(x)
            else:
                x = block(x)
        return x


def profiled(net: Net, steps: int = 4, **kw) -> profile:
    x = torch.randn(4, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
                     **kw) as prof:
            for _ in range(steps):
                with torch.no_grad():
                    net(x)
                prof.step()
    return prof


@pytest.fixture(scope="module")
def cpu_prof(tmp_path_factory) -> tuple[profile, Path]:
    """A finished profiler and the trace Kineto wrote for it (Kineto writes a trace once)."""
    prof = profiled(Net(n=3))
    path = tmp_path_factory.mktemp("cpu") / "cpu_trace.json"
    prof.export_chrome_trace(str(path))
    return prof, path


def test_cpu_profiler_trace_file(cpu_prof):
    run = from_torch_profiler(cpu_prof[1])
    assert run.steps["step"].tolist() == [2, 3]  # ProfilerStep#2, #3 (after wait + warmup)
    assert run.layers[["group", "layer", "tier", "bytes", "streamed"]].values.tolist() == [
        ["blocks", i, "unknown", 0, False] for i in range(3)]
    ev = run.events
    assert set(ev["kind"]) == {"compute"} and set(ev["stream"]) == {"compute"}
    per = ev.groupby(["step", "layer"]).size()
    assert per.tolist() == [1] * 6  # one compute interval per layer and step
    for step, g in ev.groupby("step"):
        b = run.steps.set_index("step").loc[step]
        assert (g["dur_s"] > 0).all()
        assert g["start_s"].is_monotonic_increasing and g["layer"].tolist() == [0, 1, 2]
        assert b["compute_s"] == pytest.approx(g["dur_s"].sum())
        assert b["wall_s"] >= b["compute_s"]
    assert (run.layers["compute_s"] > 0).all()
    assert run.meta["device_name"] == "cpu" and run.meta["compute_source"] == "cpu_annotations"
    assert run.meta["counts"]["memcpy_htod"]["pinned"]["count"] == 0


def test_live_profiler_object(cpu_prof):
    """A live profiler whose trace Kineto already wrote: written again by torch's Python
    exporter (one event per line, another layout), with the same frames as the file."""
    prof, path = cpu_prof
    run = from_torch_profiler(prof, label="eager")
    assert run.label == "eager" and run.meta["source"] == "torch.profiler (live)"
    from_file = from_torch_profiler(path)
    pd.testing.assert_frame_equal(run.layers, from_file.layers)
    # the two writers start their profiler span (the origin) at different times: compare
    # everything but the absolute start times
    a, b = (r.events.drop(columns="run") for r in (run, from_file))
    for df in (a, b):
        df[["start_s", "end_s"]] -= df["start_s"].min()
    pd.testing.assert_frame_equal(a, b, atol=1e-9, rtol=0)
    pd.testing.assert_frame_equal(run.steps.drop(columns="wall_s"), from_file.steps.drop(columns="wall_s"))


def test_live_profiler_object_first_export():
    run = from_torch_profiler(profiled(Net(n=2)))
    assert run.layers["layer"].tolist() == [0, 1] and run.steps["step"].tolist() == [2, 3]


def test_profiler_not_run_is_refused():
    with pytest.raises(TraceImportError, match="after the profiler has stopped"):
        from_torch_profiler(profile())


def test_nn_module_names_when_there_are_no_labels():
    """with_stack=True and no record_function: `nn.Module: Block_<i>` spans are the layers
    (not the root module, which has one instance, nor the Linear inside each block)."""
    run = from_torch_profiler(profiled(Net(n=3, labels=False), with_stack=True))
    assert run.meta["layer_source"] == "nn.Module"
    assert run.layers[["group", "layer"]].values.tolist() == [["Block", 0], ["Block", 1], ["Block", 2]]
    assert run.events.groupby(["step", "layer"]).size().tolist() == [1] * 6


def test_custom_layer_pattern(cpu_prof):
    run = from_torch_profiler(cpu_prof[1], layer_pattern=r"^blocks\.(?P<layer>\d+)$")
    assert run.layers[["group", "layer"]].values.tolist() == [["layers", i] for i in range(3)]
    assert run.meta["layer_source"] == "layer_pattern"
    # a CPU trace in which the pattern matches nothing has nothing to show: it says so, and how
    with pytest.raises(TraceFormatError, match=r"no layer found: the trace has \d+ events, \d+ of them complete \('ph': 'X': cpu_op") as e:
        from_torch_profiler(cpu_prof[1], layer_pattern=[r"^nothing(?P<layer>\d+)$"])
    assert "record_function" in str(e.value) and "offload_lab.copy" in str(e.value)


@pytest.mark.parametrize("bad, match", [
    (r"blocks\.\d+", "no named group 'layer'"),
    (r"(?P<layer>\d+", "not a valid regular expression"),
    (42, "not a regular expression"),
    ([], "empty list"),
])
def test_bad_layer_pattern(bad, match):
    with pytest.raises(TraceImportError, match=match):
        from_torch_profiler(FIXTURE, layer_pattern=bad)


def test_bad_input():
    with pytest.raises(TraceImportError, match="pass a path to a chrome trace"):
        from_torch_profiler(42)
    with pytest.raises(FileNotFoundError, match="no-such-trace.json"):
        from_torch_profiler("no-such-trace.json")
    assert issubclass(TraceFormatError, ValueError) and issubclass(TraceImportError, ValueError)


# -- malformed files ---------------------------------------------------------------------------

def kernel_index(corr: int) -> int:
    return event_index(FIXTURE, lambda e: e.get("cat") == "kernel" and e["args"]["correlation"] == corr)


def edit_event(text: str, corr: int, old: str, new: str, cat: str = "kernel") -> str:
    """Replace `old` by `new` inside the fixture event of category `cat` with that correlation."""
    m = re.search(rf'  \{{\n    "ph": "X",\n    "cat": "{cat}",(?:(?!\n  \}}).)*?"correlation": {corr},',
                  text, re.S)
    end = text.index("\n  }", m.start())
    body = text[m.start():end]
    assert old in body
    return text[:m.start()] + body.replace(old, new, 1) + text[end:]


MALFORMED = {
    "bad JSON in an event": (
        lambda t: edit_event(t, 3, '"dur": 30', '"dur": 30 30'),
        r"invalid JSON in event {k3} at byte \d+: Expecting ',' delimiter"),
    "no comma between events": (
        lambda t: t.replace('  },\n  {\n    "ph": "X",\n    "cat": "kernel"',
                            '  }\n  {\n    "ph": "X",\n    "cat": "kernel"', 1),
        r"expected ',' or '\]' between events, found '\{"),
    "event without ts": (
        lambda t: edit_event(t, 5, '    "ts": 1220,\n', ''),
        r"event {k5} \('void gemm_kernel.*'\) has no 'ts'"),
    "event without dur": (
        lambda t: edit_event(t, 5, '    "dur": 30,\n', ''),
        r"event {k5} \('void gemm_kernel.*'\) has no 'dur'"),
    "ts of the wrong type": (
        lambda t: edit_event(t, 5, '"ts": 1220', '"ts": "1220"'),
        r"event {k5} .* has 'ts' = '1220' \(str\); expected a number"),
    "args of the wrong type": (
        lambda t: edit_event(t, 5, '"args": {', '"args": [1], "x": {'),
        r"event {k5} .* has 'args' = \[1\] \(list\); expected an object"),
    "bytes of the wrong type": (
        lambda t: edit_event(t, 4, '"bytes": 8000', '"bytes": "8000"', cat="gpu_memcpy"),
        r"args.bytes = '8000'; expected an integer"),
    "an event that is not an object": (
        lambda t: t.replace('"traceEvents": [\n', '"traceEvents": [\n  42,\n', 1),
        r"event 0 is int 42; expected a JSON object"),
    "no traceEvents": (
        lambda t: '{"schemaVersion": 1, "traceName": "x"}',
        r"not a chrome trace: top level has no traceEvents \(keys: \['schemaVersion', 'traceName'\]\)"),
    "traceEvents not an array": (
        lambda t: '{"traceEvents": {"ph": "X"}}',
        r"traceEvents at byte 16 is not an array"),
    "not JSON at all": (lambda t: "hello", r"not a chrome trace: the top level is not a JSON object"),
    "empty file": (lambda t: "", r"not a chrome trace: the file is empty"),
    "no complete events": (lambda t: '{"traceEvents": [{"ph": "M", "ts": 1}]}', r"no complete \('ph': 'X'\) events"),
    "junk after the trace": (lambda t: t + "junk", r"unexpected data after the trace at byte \d+: 'junk'"),
}


def _json_ok(case: str) -> bool:
    try:
        json.loads(MALFORMED[case][0](FIXTURE.read_text()))
        return True
    except json.JSONDecodeError:
        return False


# every case in torch's layout (Kineto blocks); the valid-JSON ones also on one line (decoded
# event by event)
@pytest.mark.parametrize("case, layout", [(c, "kineto") for c in MALFORMED]
                         + [(c, "kineto-small-chunks") for c in MALFORMED]
                         + [(c, "flat") for c in MALFORMED if _json_ok(c)])
def test_malformed(case, layout, tmp_path, monkeypatch):
    if layout == "kineto-small-chunks":  # the bad event lies in one of many blocks
        monkeypatch.setattr(ti.reader, "_CHUNK", 1500)
        monkeypatch.setattr(ti.reader, "_LOW", 300)
    edit, pattern = MALFORMED[case]
    text = edit(FIXTURE.read_text())
    if layout == "flat":
        text = json.dumps(json.loads(text))
    path = tmp_path / "bad.json"
    path.write_text(text)
    pattern = pattern.replace("{k3}", str(kernel_index(3))).replace("{k5}", str(kernel_index(5)))
    with pytest.raises(TraceFormatError, match=pattern) as info:
        from_torch_profiler(path)
    assert str(info.value).startswith("bad.json: ")


def test_bad_json_in_a_cpu_op_of_a_one_line_trace(tmp_path):
    """One-line files are decoded event by event, so even rows the import ignores are checked."""
    events = json.loads(FIXTURE.read_text())["traceEvents"]
    i = next(i for i, e in enumerate(events) if e.get("cat") == "cpu_op")
    text = json.dumps({"traceEvents": events})
    where = text.index('"cat": "cpu_op"')
    text = text[:where] + '"cat": "cpu_op",,' + text[where + len('"cat": "cpu_op",'):]
    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(TraceFormatError, match=rf"invalid JSON in event {i} at byte {where + 16}: "):
        from_torch_profiler(tmp_path / "bad.json")


# -- truncated files ---------------------------------------------------------------------------

def complete_events_before(text: str, cut: int) -> int:
    """How many events of the fixture end before byte `cut` (its text is ASCII)."""
    start = text.index('"traceEvents": [')
    return len([m for m in re.finditer(r"\n  \}", text[start:cut])])


@pytest.mark.parametrize("fraction", [0.1, 0.37, 0.5, 0.83, 0.999])
def test_truncated_plain(fraction, tmp_path):
    text = FIXTURE.read_text()
    cut = int(len(text) * fraction)
    (tmp_path / "cut.json").write_text(text[:cut])
    n = complete_events_before(text, cut)
    after = f"after event {n - 1}" if n else "before the first event"
    with pytest.raises(TraceFormatError, match=rf"cut.json: truncated {after} at byte {cut}: "):
        from_torch_profiler(tmp_path / "cut.json")


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.9])
def test_truncated_gzip(fraction, tmp_path):
    data = gzip.compress(FIXTURE.read_bytes())
    (tmp_path / "cut.json.gz").write_bytes(data[:int(len(data) * fraction)])
    with pytest.raises(TraceFormatError, match=r"cut.json.gz: truncated (after event \d+|before the first "
                       r"event) at byte \d+ of the decompressed stream \(the gzip stream ends before its "
                       r"end marker\)"):
        from_torch_profiler(tmp_path / "cut.json.gz")


def test_truncated_gzip_of_a_real_trace(tmp_path):
    data = ALEXNET.read_bytes()
    (tmp_path / "alexnet.json.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match=r"truncated after event \d+ at byte \d+ of the decompressed"):
        from_torch_profiler(tmp_path / "alexnet.json.gz")


def test_corrupt_gzip(tmp_path):
    data = bytearray(gzip.compress(FIXTURE.read_bytes()))
    data[len(data) // 2: len(data) // 2 + 8] = b"\xff" * 8
    (tmp_path / "bad.json.gz").write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match=r"bad.json.gz: corrupt gzip data near byte \d+ of the "
                       r"decompressed stream"):
        from_torch_profiler(tmp_path / "bad.json.gz")


def test_gzip_checksum_is_checked(tmp_path):
    """A stream whose data inflates cleanly but whose CRC-32 (the trailer's first 4 bytes) is
    wrong is refused: the inflater checks it, ISA-L's as zlib's."""
    data = bytearray(gzip.compress(FIXTURE.read_bytes()))
    data[-8] ^= 0xFF
    (tmp_path / "crc.json.gz").write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match=r"crc.json.gz: corrupt gzip data near byte \d+ of the "
                       r"decompressed stream"):
        from_torch_profiler(tmp_path / "crc.json.gz")


def test_every_cut_raises_trace_format_error(tmp_path, monkeypatch):
    """Cut anywhere (small chunks, so cuts land on chunk edges too): a TraceFormatError, never
    another exception and never a silent partial Run."""
    monkeypatch.setattr(ti.reader, "_CHUNK", 64)
    monkeypatch.setattr(ti.reader, "_LOW", 32)
    text = FIXTURE.read_text().rstrip()
    path = tmp_path / "cut.json"
    for cut in range(0, len(text), 97):
        path.write_text(text[:cut])
        with pytest.raises(TraceFormatError):
            from_torch_profiler(path)


# the digests of the files as taken from Holistic Trace Analysis' test data (see
# tests/data/traces/README.md): a re-encoded or edited copy would test something else
HTA_SHA256 = {
    "hta-alexnet.json.gz": "b9febb1abc8cc729a2890fb6a4171de9867ba72c944437ee046067e7c89912dc",
    "hta-sampled-rank0.json.gz": "71b98c30a2751cc56d9bf78f8fb76467acd56e0be6a1f0da23c600941d29aafd",
}


def test_hta_traces_are_the_unmodified_copies_with_their_licence():
    import hashlib

    for name, digest in HTA_SHA256.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
    assert "MIT License" in (DATA / "LICENSE-HTA").read_text()


# -- one validated options object ---------------------------------------------------------------
SHIPPED = sorted(p for p in DATA.iterdir() if p.name.endswith((".json", ".json.gz")))


def test_default_options_are_todays_caps_and_give_the_same_runs():
    from offload_lab.reading import MAX_TRACE_BYTES

    opts = TraceImportOptions()
    assert (opts.max_bytes, opts.max_decompressed_bytes, opts.max_value_chars) == (
        MAX_TRACE_BYTES, MAX_TRACE_BYTES, ti.reader.MAX_VALUE_CHARS)
    assert opts.layer_pattern is None and opts.default_patterns
    assert [p.pattern for p in opts.patterns] == [ti.DEFAULT_LAYER_PATTERN]
    assert offload_lab.TraceImportOptions is TraceImportOptions
    assert len(SHIPPED) == 4
    for path in SHIPPED:
        assert_same_run(from_torch_profiler(path), from_torch_profiler(path, options=opts))


def test_options_carry_the_label_and_pattern_of_the_keywords():
    pattern = r"(?P<group>blocks)\.(?P<layer>\d+)"
    by_keywords = from_torch_profiler(FIXTURE, label="kw", layer_pattern=[pattern])
    opts = TraceImportOptions(label="kw", layer_pattern=[pattern])
    by_options = from_torch_profiler(FIXTURE, options=opts)
    assert_same_run(by_keywords, by_options)
    assert by_options.meta["label"] == "kw" and by_options.meta["layer_source"] == "layer_pattern"
    # compiled once, kept as a tuple: the object is frozen and hashable, equal to one built alike
    assert opts.layer_pattern == (re.compile(pattern),) and opts == TraceImportOptions(label="kw",
                                                                                       layer_pattern=pattern)
    assert hash(opts) == hash(TraceImportOptions(label="kw", layer_pattern=re.compile(pattern)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.max_bytes = 1


@pytest.mark.parametrize("kwargs, words", [
    ({"layer_pattern": r"blocks\.\d+"}, ["layer_pattern 'blocks\\\\.\\\\d+'", "no named group 'layer'"]),
    ({"layer_pattern": [r"(?P<layer>\d+)", 7]}, ["layer_pattern 7 is not a regular expression"]),
    ({"max_bytes": -1}, ["max_bytes = -1; accepted: an int ≥ 1"]),
    ({"max_decompressed_bytes": 0}, ["max_decompressed_bytes = 0; accepted: an int ≥ 1"]),
    ({"max_decompressed_bytes": 2.5}, ["max_decompressed_bytes = 2.5"]),
    ({"max_value_chars": True}, ["max_value_chars = True; accepted: an int ≥ 1048576"]),
    ({"max_value_chars": 100}, ["max_value_chars = 100", "1 MiB"]),
    ({"label": 5}, ["label = 5; accepted: a str or None"]),
])
def test_options_are_validated_in_one_line(kwargs, words):
    with pytest.raises(TraceImportError) as e:
        TraceImportOptions(**kwargs)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    assert isinstance(e.value, offload_lab.OffloadLabError)


def test_options_and_keywords_together_are_refused():
    with pytest.raises(TraceImportError) as e:
        from_torch_profiler(FIXTURE, "mine", options=TraceImportOptions())
    assert "\n" not in str(e.value) and "options=" in str(e.value) and "label='mine'" in str(e.value)
    with pytest.raises(TraceImportError, match=r"options= and layer_pattern="):
        from_torch_profiler(FIXTURE, layer_pattern=r"(?P<layer>\d+)", options=TraceImportOptions())
    with pytest.raises(TraceImportError, match=r"options = \{'max_bytes': 1\}; accepted: a TraceImportOptions"):
        from_torch_profiler(FIXTURE, options={"max_bytes": 1})


def test_a_lowered_value_cap_refuses_a_long_name(tmp_path):
    trace = json.loads(FIXTURE.read_text())
    trace["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "a" * (3 << 20), "pid": 1, "tid": 1,
                                 "ts": 1000, "dur": 1})
    p = tmp_path / "long_name.json"
    p.write_text(json.dumps(trace))
    assert len(from_torch_profiler(p).events) == len(from_torch_profiler(FIXTURE).events)
    small = TraceImportOptions(max_value_chars=1 << 20)
    with pytest.raises(TraceFormatError, match=r"long_name.json: a JSON value at byte \d+ goes on for more "
                                               r"than 1 MiB"):
        from_torch_profiler(p, options=small)
    with pytest.raises(TraceFormatError, match="goes on for more than 1 MiB"):
        list(iter_trace_events(p, small))
    # the shipped traces hold no value near that long
    assert_same_run(from_torch_profiler(FIXTURE, options=small), from_torch_profiler(FIXTURE))


def test_lowered_size_caps_are_honoured(tmp_path):
    with pytest.raises(TraceFormatError, match=r"of at most 1 KiB"):
        from_torch_profiler(FIXTURE, options=TraceImportOptions(max_bytes=1024))
    gz = tmp_path / "fixture.json.gz"
    gz.write_bytes(gzip.compress(FIXTURE.read_bytes()))
    assert gz.stat().st_size < 8 << 10 < FIXTURE.stat().st_size
    capped = TraceImportOptions(max_decompressed_bytes=8 << 10)
    with pytest.raises(TraceFormatError, match=r"fixture.json.gz: the trace holds more than 8 KiB of JSON once "
                                               r"decompressed"):
        from_torch_profiler(gz, options=capped)
    # the decompressed cap is for gzipped text; a plain file is bounded by max_bytes alone
    assert_same_run(from_torch_profiler(FIXTURE, options=capped), from_torch_profiler(FIXTURE))
