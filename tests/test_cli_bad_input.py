"""Every ``offload-lab`` subcommand over a corpus of bad inputs: exit status 2, exactly one line
on stderr naming the problem, no traceback, and nothing written.

The commands run in this process through :func:`offload_lab.cli.main` (an unexpected exception
would fail the test with its traceback); ``test_cli.py`` runs the real console script.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from offload_lab.cli import main

BIG = "99999999999999999999999"


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and modification time."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        out[str(p.relative_to(root))] = (st.st_size if p.is_file() else -1, st.st_mtime_ns)
    return out


@pytest.fixture()
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
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
        ["wan2.1-t2v-1.3b"],
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
        ["wan2.1-t2v-14b"],
    ],
    "report": [
        ["nope.zip"], ["corrupt.zip"], ["empty.zip"], ["adir"], ["corrupt.json"], [""],
        ["corrupt.zip", "--out", "corrupt.zip"], ["corrupt.zip", "--out", "exists.html"],
        ["corrupt.zip", "--out", "adir"], ["corrupt.zip", "--out", ""],
        ["corrupt.zip", "--plan", "nope.json"],
    ],
    "catalog": [["wan9-t2v"], ["minimax-h3", "--devices"], [""]],
    "demo": [
        ["--model", "wan9-t2v"], ["--out", "adir"], ["--out", "exists.html"], ["--out", ""],
        ["--save-runs", "exists.html"], ["--save-runs", ""], ["--steps", "100000000"],
        ["--backend", "tpu"], ["--threads", "0"],
    ],
}
CASES = [(sub, args) for sub, cases in BAD.items() for args in cases] + [([], [])]


@pytest.mark.parametrize("sub, args", CASES, ids=[" ".join([*(s if isinstance(s, list) else [s]), *a])
                                                  or "(none)" for s, a in CASES])
def test_bad_input_is_exit_2_one_line_and_writes_nothing(corpus: Path, capsys, sub, args) -> None:
    before = _tree(corpus)
    argv = [*([sub] if sub else []), *args]
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
    assert _tree(corpus) == before, argv


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
