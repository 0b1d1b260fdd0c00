"""Saved runs under hostile edits: every bad file is refused with RunFormatError naming it."""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from pathlib import Path

import pandas as pd
import pytest

import offload_lab
from offload_lab import Run
from offload_lab.record.run import MAX_MEMBER_BYTES, RunFormatError

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def run():
    spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    return offload_lab.simulate(plan, offload_lab.DeviceProfile.load("h200"), steps=2)


def _members(run, tmp_path):
    with zipfile.ZipFile(run.save(tmp_path / "good.zip")) as z:
        return {n: z.read(n) for n in z.namelist()}


def _write(tmp_path, members, name="bad.zip"):
    p = tmp_path / name
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, data in members.items():
            z.writestr(n, data)
    return p


def _parquet(df):
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def _refused(path, pattern):
    with pytest.raises(RunFormatError) as e:
        Run.load(path)
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg, msg
    assert re.search(pattern, msg), msg


def test_old_saved_runs_still_load():
    paths = sorted(ROOT.glob("tests/data/runs/*.zip")) + sorted(ROOT.glob("data/runs/**/*.zip"))
    assert len(paths) >= 5
    for p in paths:
        r = Run.load(p)
        assert len(r.steps) and set(r.events["kind"]) <= {"copy", "compute", "wait", "host_block"}


def test_save_then_load_the_same_path_with_or_without_zip(run, tmp_path):
    for given in (tmp_path / "a", tmp_path / "b.zip", tmp_path / "c.run"):
        written = run.save(given)
        assert written.suffix == ".zip" and written.is_file()
        assert Run.load(given).equals(run)
    assert not list(tmp_path.glob("*.tmp"))


def test_failed_save_leaves_no_tmp(run, tmp_path, monkeypatch):
    def broken(self, tmp):
        Path(tmp).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Run, "_write", broken)
    with pytest.raises(OSError, match="cannot write run"):
        run.save(tmp_path / "r.zip")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(Run, "_write", lambda self, tmp: (Path(tmp).write_bytes(b"x"), 1 / 0))
    with pytest.raises(ZeroDivisionError):
        run.save(tmp_path / "r.zip")
    assert list(tmp_path.iterdir()) == []


def test_oversized_member_is_refused_unread(run, tmp_path):
    m = _members(run, tmp_path)
    # 200 MB of zeros compresses to ~200 KB: refused on its size, never decompressed whole
    m["events.parquet"] = b"\0" * (200 * 1000 * 1000)
    p = _write(tmp_path, m)
    assert p.stat().st_size < 1 << 20
    _refused(p, rf"events\.parquet.*at most {MAX_MEMBER_BYTES} bytes")


@pytest.mark.parametrize(("edit", "pattern"), [
    ({"meta.json": b"[1, 2]"}, "expected an object"),
    ({"meta.json": b'"meta"'}, "expected an object"),
    ({"meta.json": b"{not json"}, "not JSON"),
    ({"meta.json": b"\xff\xfe"}, "not JSON"),
    ({"meta.json": b"[" * 100_000 + b"]" * 100_000}, "not JSON"),
    ({"meta.json": json.dumps({"format": "offload-lab/run", "version": 1}).encode()}, "no 'meta'"),
    ({"meta.json": json.dumps({"format": "offload-lab/run", "version": 99, "meta": {}}).encode()}, "version 99"),
    ({"meta.json": json.dumps({"format": "offload-lab/run", "version": 1, "meta": [1]}).encode()},
     "meta is a list"),
    ({"meta.json": json.dumps({"format": "offload-lab/run", "version": 1,
                               "meta": {"backend": ["cuda"]}}).encode()}, "'backend'"),
    ({"meta.json": json.dumps({"format": "offload-lab/run", "version": 1,
                               "meta": {"simulated": "yes"}}).encode()}, "'simulated'"),
    ({"meta.json": json.dumps({"format": "offload-lab/run", "version": 1,
                               "meta": {"label": {"a": 1}}}).encode()}, "'label'"),
    ({"events.parquet": b"PAR1 garbage PAR1"}, r"events\.parquet is not a readable parquet"),
    ({"steps.parquet": b""}, r"steps\.parquet is not a readable parquet"),
])
def test_bad_members_are_refused(run, tmp_path, edit, pattern):
    m = _members(run, tmp_path)
    m.update(edit)
    _refused(_write(tmp_path, m), pattern)


def test_deep_meta_is_refused(run, tmp_path):
    m = _members(run, tmp_path)
    deep: dict = {}
    for _ in range(200):
        deep = {"x": deep}
    m["meta.json"] = json.dumps({"format": "offload-lab/run", "version": 1, "meta": deep}).encode()
    _refused(_write(tmp_path, m), "nests deeper")


def test_wrong_columns_and_values_are_refused(run, tmp_path):
    m = _members(run, tmp_path)
    cases = [
        ("events", run.events.drop(columns=["kind"]), "lacks column"),
        ("events", run.events.assign(kind="teleport"), "'kind' holds 'teleport'"),
        ("events", run.events.assign(stream="warp"), "'stream' holds 'warp'"),
        ("events", run.events.assign(bytes="lots"), "'bytes' cannot hold integers"),
        ("steps", run.steps.assign(wall_s="slow"), "'wall_s' cannot hold numbers"),
        ("layers", run.layers.drop(columns=["tier", "bytes"]), "lacks column"),
        ("memory", pd.DataFrame({"nope": [1]}), "lacks column"),
    ]
    for frame, df, pattern in cases:
        bad = dict(m)
        bad[f"{frame}.parquet"] = _parquet(df)
        _refused(_write(tmp_path, bad, f"{frame}.zip"), pattern)


def test_run_html_is_self_contained_and_escaped(run):
    import subprocess
    import sys

    payload = "<script>alert(1)</script>&\"'"
    r = Run(run.events, run.layers, run.steps, run.memory, {**run.meta, "label": payload, "model": payload})
    out = r._repr_html_()
    assert "<script>" not in out and "&lt;script&gt;" in out
    # rendering a Run needs nothing downstream of record/
    code = ("import sys, offload_lab.record.run as m, pandas as pd; "
            "r = m.Run(m.empty_events(), pd.DataFrame(columns=m.LAYER_COLUMNS), pd.DataFrame(columns=m.STEP_COLUMNS), "
            "pd.DataFrame(columns=m.MEMORY_COLUMNS), {'backend': 'cpu'}); r._repr_html_(); "
            "print(sorted(k for k in sys.modules if k.startswith('offload_lab.analysis') or k.startswith('offload_lab.views')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
