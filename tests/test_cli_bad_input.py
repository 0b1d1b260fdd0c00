"""Every ``offload-lab`` subcommand over a corpus of bad inputs: exit status 2, exactly one line
on stderr naming the problem, no traceback, and nothing written.

The commands run in this process through :func:`offload_lab.cli.main` (an unexpected exception
would fail the test with its traceback); ``test_cli.py`` runs the real console script. Every
message names only options its command has (read from the parser), and never a Python keyword
argument the command line cannot take.
"""

from __future__ import annotations

import argparse
import io
import keyword
import os
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from offload_lab.cli import main
from offload_lab.cli.app import build_parser
from offload_lab.record.run import Run

BIG = "99999999999999999999999"


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and modification time."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        out[str(p.relative_to(root))] = (st.st_size if p.is_file() else -1, st.st_mtime_ns)
    return out


RUNS = Path(__file__).parent / "data" / "runs"


@pytest.fixture(scope="module")
def hostile_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Saved runs that load but cannot be analysed: no events, negative durations."""
    d = tmp_path_factory.mktemp("hostile-runs")
    r = Run.load(RUNS / "pinned-p1.run.zip")
    Run(events=r.events.iloc[0:0], layers=r.layers, steps=r.steps, memory=r.memory,
        meta=r.meta).save(d / "noevents.zip")
    # a run with negative durations cannot be built, so its frame is written into the zip as a
    # crafted file would be: the loader must refuse it in one line
    neg = r.events.copy()
    neg["dur_s"] = -neg["dur_s"]
    neg["end_s"] = neg["start_s"] + neg["dur_s"]
    with zipfile.ZipFile(RUNS / "pinned-p1.run.zip") as src, \
            zipfile.ZipFile(d / "negative.zip", "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "events.parquet":
                buf = io.BytesIO()
                neg.to_parquet(buf)
                data = buf.getvalue()
            dst.writestr(name, data)
    return d


@pytest.fixture()
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostile_runs: Path) -> Path:
    shutil.copy(RUNS / "pinned-p1.run.zip", tmp_path / "good.zip")
    for p in hostile_runs.iterdir():
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "corrupt.zip").write_bytes(b"PK\x03\x04 not really a zip")
    (tmp_path / "empty.zip").write_bytes(b"")
    (tmp_path / "corrupt.json").write_text("{")
    (tmp_path / "object.json").write_text('{"hello": 1}')
    (tmp_path / "latin1.json").write_bytes('{"name": "café"}'.encode("latin-1"))
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    (tmp_path / "exists.html").write_text("<p>keep me</p>")
    (tmp_path / "exists.zip").write_text("keep me")
    (tmp_path / "adir").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


BAD = {
    "plan": [
        ["wan9-t2v"], [""], ["adir"], ["corrupt.json"], ["object.json"], ["latin1.json"],
        ["model.safetensors"], ["missing/model.safetensors"],
        ["wan2.1-t2v-14b", "-b", "1e400"], ["wan2.1-t2v-14b", "-b", "1e308GiB"],
        ["wan2.1-t2v-14b", "-b", "-1GiB"], ["wan2.1-t2v-14b", "-b", ""],
        ["wan2.1-t2v-14b", "--host", "1e400"], ["wan2.1-t2v-14b", "--host", ""],
        ["wan2.1-t2v-14b", "--resident", "-3"], ["wan2.1-t2v-14b", "--resident", ""],
        ["wan2.1-t2v-14b", "--resident", BIG], ["wan2.1-t2v-14b", "--resident", "blocks.99"],
        ["wan2.1-t2v-14b", "--order", ""], ["wan2.1-t2v-14b", "--order", "3,3"],
        ["wan2.1-t2v-14b", "-p", "-1"], ["wan2.1-t2v-14b", "-p", BIG],
        ["wan2.1-t2v-14b", "--tier", ""], ["wan2.1-t2v-14b", "--tier", "resident"],
        ["wan2.1-t2v-14b", "--residency", "sideways"],
    ],
    "profile": [
        ["wan9-t2v", "--out", "r.zip"], ["wan2.1-t2v-1.3b", "--out", "adir"],
        ["wan2.1-t2v-1.3b", "--out", "exists.zip"], ["wan2.1-t2v-1.3b", "--out", "exists"],
        ["wan2.1-t2v-1.3b", "--out", ""], ["corrupt.json", "--out", "r.zip"],
        ["wan2.1-t2v-1.3b", "--out", "r.zip", "--steps", "0"],
        ["wan2.1-t2v-1.3b", "--out", "r.zip", "--steps", "100000000"],
        ["wan2.1-t2v-1.3b", "--out", "r.zip", "--tokens", BIG],
        ["wan2.1-t2v-1.3b", "--out", "r.zip", "--tokens", ""],
        ["wan2.1-t2v-1.3b", "--out", "r.zip", "--tokens", "-5"],
        ["wan2.1-t2v-1.3b", "--out", "r.zip", "--layers", "0"],
        ["wan2.1-t2v-1.3b", "--out", "r.zip", "--scale", "2"],
        ["wan2.1-t2v-1.3b", "--out", "r.zip", "--threads", "0"],
        ["wan2.1-t2v-1.3b", "--out", "r.zip", "--init", "lazy"],
        ["wan2.1-t2v-1.3b", "--out", "r.zip", "--backend", "tpu"],
        ["wan2.1-t2v-1.3b", "--out", "r.zip", "-b", "1e400"],
        ["wan2.1-t2v-1.3b"], ["--pipeline", "adir", "--out", "exists.zip"],
        ["model.safetensors", "--out", "exists.zip"],
    ],
    "simulate": [
        ["wan9-t2v", "--device", "h200"], ["wan2.1-t2v-14b", "--device", "a100"],
        ["wan2.1-t2v-14b", "--device", "adir"], ["wan2.1-t2v-14b", "--device", "corrupt.json"],
        ["wan2.1-t2v-14b", "--device", ""], ["wan2.1-t2v-14b", "--device", "latin1.json"],
        ["wan2.1-t2v-14b", "--device", "h200", "--out", "adir"],
        ["wan2.1-t2v-14b", "--device", "h200", "--out", "exists.zip"],
        ["wan2.1-t2v-14b", "--device", "h200", "--steps", "100000000"],
        ["wan2.1-t2v-14b", "--device", "h200", "--steps", "-1"],
        ["wan2.1-t2v-14b", "--device", "h200", "--tokens", BIG],
        ["wan2.1-t2v-14b", "--device", "h200", "--tokens", "4k"],
        ["wan2.1-t2v-14b", "--device", "h200", "--passes", "0"],
        ["wan2.1-t2v-14b", "--device", "h200", "--passes", "1000000"],
        ["wan2.1-t2v-14b", "--device", "h200", "--warmup", "-1"],
        ["wan2.1-t2v-14b", "--device", "h200", "--host", "1e308GiB"],
        ["wan2.1-t2v-14b"], ["wan2.1-t2v-14b", "--device", "corrupt.json", "--out", "exists.zip"],
        ["wan2.1-t2v-14b", "--device", "h200", "--resident", "blocks.99", "--out", "exists.zip"],
    ],
    "report": [
        ["nope.zip"], ["corrupt.zip"], ["empty.zip"], ["adir"], ["corrupt.json"], [""],
        ["corrupt.zip", "--out", "corrupt.zip"], ["corrupt.zip", "--out", "exists.html"],
        ["corrupt.zip", "--out", "adir"], ["corrupt.zip", "--out", ""],
        ["corrupt.zip", "--plan", "nope.json"],
        ["good.zip", "--out", "good.zip"], ["good.zip", "--out", "exists.html"],
        ["good.zip", "--out", "adir"], ["good.zip", "--out", ""], ["good.zip", "--plan", "nope.json"],
        ["good.zip", "--plan", "corrupt.json", "--out", "exists.html"],
        ["noevents.zip"], ["negative.zip"],
    ],
    "export": [
        ["nope.zip", "--format", "chrome-trace"], ["corrupt.zip", "--format", "chrome-trace"],
        ["adir", "--format", "chrome-trace"], ["good.zip", "--format", "svg"],
        ["corrupt.zip", "--format", "chrome-trace", "--out", "exists.html"],
        ["good.zip", "--format", "chrome-trace", "--out", "adir"],
        ["good.zip", "--format", "chrome-trace", "--out", "exists.html"],
        ["good.zip", "--format", "chrome-trace", "--out", "good.zip", "--force"],
    ],
    "recommend": [
        ["wan9-t2v", "--device", "h200"], ["minimax-h3", "--device", "a100"],
        ["minimax-h3", "--device", "corrupt.json", "--out", "exists.html"],
        ["minimax-h3", "--device", "h200", "--host-available", "lots"],
        ["minimax-h3", "--device", "h200", "--device-memory", "-1GiB"],
        ["minimax-h3", "--device", "h200", "--tokens", "4k"],
        ["minimax-h3", "--device", "h200", "--out", "adir"],
        ["minimax-h3", "--device", "h200", "--out", "exists.html"],
    ],
    "calibrate": [
        ["--model", "wan9-t2v", "--out", "exists.html"], ["--model", "wan2.1-t2v-1.3b", "--out", "adir"],
        ["--model", "wan2.1-t2v-1.3b", "--out", "exists.html"],
        ["--model", "wan2.1-t2v-1.3b", "--tokens", "4k", "--out", "exists.html"],
        ["--model", "wan2.1-t2v-1.3b", "--out", "p.json", "--save-runs", "exists.html"],
        ["--model", "wan2.1-t2v-1.3b", "--out", "p.json", "--layers", "0"],
    ],
    "catalog": [["wan9-t2v"], ["minimax-h3", "--devices"], [""]],
    "demo": [
        ["--model", "wan9-t2v"], ["--out", "adir"], ["--out", "exists.html"], ["--out", ""],
        ["--save-runs", "exists.html"], ["--save-runs", ""], ["--steps", "100000000"],
        ["--backend", "tpu"], ["--threads", "0"], ["--model", "wan9-t2v", "--out", "exists.html"],
    ],
}
CASES = [(sub, args) for sub, cases in BAD.items() for args in cases] + [([], [])]
IDS = [" ".join([*(s if isinstance(s, list) else [s]), *a]) or "(none)" for s, a in CASES]


def _error_line(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    """Run ``argv``; the one ``offload-lab: error:`` line it must end with (exit status 2)."""
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's own errors
        status = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert status == 2, (argv, status, err)
    assert len(lines) == 1, (argv, err)
    assert lines[0].startswith("offload-lab: error: "), lines[0]
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("sub, args", CASES, ids=IDS)
def test_bad_input_is_exit_2_one_line_and_writes_nothing(corpus: Path, capsys, sub, args) -> None:
    before = _tree(corpus)
    argv = [*([sub] if sub else []), *args]
    _error_line(capsys, argv)
    assert _tree(corpus) == before, argv


# -- messages name only what the command line accepts -------------------------------------------
def _options() -> dict[str | None, set[str]]:
    """Each subcommand's option strings (``None``: the top-level parser's), from the parser."""
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out: dict[str | None, set[str]] = {None: set(parser._option_string_actions)}
    for name, p in subs.choices.items():
        out[name] = set(p._option_string_actions)
    return out


OPTIONS = _options()
_OPTION = re.compile(r"(?<![\w-])--?[a-zA-Z][\w-]*")
_COMMAND = re.compile(r"offload-lab ([a-z]+)\b")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_KWARG = re.compile(r"(?<![\w.-])([A-Za-z_]\w*)=(?!=)")


def misnamed(sub: str | None, line: str) -> list[str]:
    """The options and keyword arguments ``line`` names that ``sub`` does not take.

    An option after ``offload-lab OTHER`` in the same clause belongs to that other command.

    >>> misnamed("report", "offload-lab: error: --plan 'x': accepted: offload-lab plan MODEL --json")
    []
    >>> misnamed("report", "offload-lab: error: run 'r' has no copies; pass bandwidth= in GB/s or --device")
    ['bandwidth=', '--device']
    """
    text = _QUOTED.sub("''", line.removeprefix("offload-lab: error: "))
    bad = [f"{m.group(1)}=" for m in _KWARG.finditer(text) if not keyword.iskeyword(m.group(1))]
    for m in _OPTION.finditer(text):
        clause = re.split(r"[;(]", text[: m.start()])[-1]
        named = [c for c in _COMMAND.findall(clause) if c in OPTIONS]
        owner = named[-1] if named else sub
        if m.group() not in OPTIONS[owner]:
            bad.append(m.group())
    return bad


@pytest.mark.parametrize("sub, args", [
    pytest.param(s, a, id=i) for (s, a), i in zip(CASES, IDS)])
def test_errors_name_only_the_commands_own_options(corpus: Path, capsys, sub, args) -> None:
    line = _error_line(capsys, [*([sub] if sub else []), *args])
    assert not misnamed(sub or None, line), line


# -- inputs are read before outputs are looked at -------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["report", "corrupt.zip", "--out", "exists.html"], "corrupt.zip"),
    (["report", "good.zip", "--plan", "corrupt.json", "--out", "exists.html"], "corrupt.json"),
    (["export", "corrupt.zip", "--format", "chrome-trace", "--out", "exists.html"], "corrupt.zip"),
    (["profile", "corrupt.json", "--out", "exists.zip"], "corrupt.json"),
    (["profile", "model.safetensors", "--out", "exists.zip"], "model.safetensors"),
    (["profile", "--pipeline", "adir", "--out", "exists.zip"], "model_index.json"),
    (["simulate", "wan2.1-t2v-14b", "--device", "corrupt.json", "--out", "exists.zip"], "corrupt.json"),
    (["simulate", "wan2.1-t2v-14b", "--device", "h200", "--resident", "blocks.99", "--out", "exists.zip"],
     "blocks.99"),
    (["recommend", "minimax-h3", "--device", "corrupt.json", "--out", "exists.html"], "corrupt.json"),
    (["calibrate", "--model", "wan9-t2v", "--out", "exists.html"], "wan9-t2v"),
    (["calibrate", "--model", "wan2.1-t2v-1.3b", "--tokens", "4k", "--out", "exists.html"], "4k"),
    (["demo", "--model", "wan9-t2v", "--out", "exists.html"], "wan9-t2v"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_bad_input_is_reported_before_an_existing_output(corpus: Path, capsys, argv, needle) -> None:
    line = _error_line(capsys, argv)
    assert needle in line and "already exists" not in line, line


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_files_are_one_line(corpus: Path, capsys) -> None:
    locked = corpus / "locked.zip"
    locked.write_text("x")
    locked.chmod(0)
    assert main(["report", str(locked)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# -- outputs: one rule across commands ---------------------------------------------------------------
def test_report_refuses_to_overwrite_its_own_input_even_with_force(corpus: Path, capsys) -> None:
    assert main(["simulate", "wan2.1-t2v-1.3b", "--device", "h200", "-n", "1", "--out", "run.zip"]) == 0
    data = (corpus / "run.zip").read_bytes()
    for extra in ([], ["--force"]):
        assert main(["report", "run.zip", "--out", "run.zip", *extra]) == 2
        assert "also an input" in capsys.readouterr().err
        assert (corpus / "run.zip").read_bytes() == data
    # a directory of runs is an input too, and so is --plan
    (corpus / "runs").mkdir()
    (corpus / "run.zip").rename(corpus / "runs" / "run.zip")
    assert main(["report", "runs", "--out", "runs/run.zip", "--force"]) == 2
    assert "also an input" in capsys.readouterr().err


def test_existing_outputs_need_force(corpus: Path, capsys) -> None:
    sim = ["simulate", "wan2.1-t2v-1.3b", "--device", "h200", "-n", "1"]
    assert main([*sim, "--out", "run"]) == 0  # saved as run.zip
    capsys.readouterr()
    assert main([*sim, "--out", "run"]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert main([*sim, "--out", "run.zip", "--force"]) == 0
    assert main(["report", "run.zip", "--out", "exists.html"]) == 2
    assert "--force" in capsys.readouterr().err
    assert (corpus / "exists.html").read_text() == "<p>keep me</p>"
    assert main(["report", "run.zip", "--out", "exists.html", "--force"]) == 0
    assert "keep me" not in (corpus / "exists.html").read_text()
    assert not list(corpus.glob("*.tmp"))


@pytest.mark.parametrize("sub", ["demo", "profile", "simulate", "report"])
def test_help_states_the_overwrite_rule(sub: str, capsys) -> None:
    with pytest.raises(SystemExit):
        main([sub, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--force overwrite output files that already exist" in text
    assert "never written over one of the command's inputs" in text


def test_profile_accepts_resolutions_like_simulate(corpus: Path, capsys) -> None:
    # a resolution is read from the model's spec; 480p of the 1.3B model is 32760 tokens
    assert main(["simulate", "wan2.1-t2v-1.3b", "--device", "h200", "-n", "1", "--tokens", "480p"]) == 0
    assert main(["profile", "wan2.1-t2v-1.3b", "--tokens", "480p", "--scale", "0.02", "--layers", "1",
                 "-n", "1", "--warmup", "0", "--backend", "cpu", "--out", "p.zip"]) == 0
    assert "32760 video tokens" in capsys.readouterr().out
