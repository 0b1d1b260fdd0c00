"""Outputs at paths that are not regular files: FIFOs, device nodes, directories, links.

Every command and every save refuses a target that is not a regular file, ``--force`` or not,
in one line naming the path and what it is; the node is left as it was and nothing (no
``*.zip``, ``*.html``, ``*.tmp``) appears beside it. A link is written through, not replaced.

The matrix runs through :func:`offload_lab.cli.main` in this process, under an alarm so that a
write that opened a FIFO fails the test instead of hanging it; one real process per command
checks the console script on a device node with ``--force``, and one ``--out /dev/stdout``.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import offload_lab
from offload_lab.cli import main
from offload_lab.errors import OffloadLabError
from offload_lab.record.run import Run
from offload_lab.writing import OutputError, atomic_write, kind_of

RUN = Path(__file__).parent / "data" / "runs" / "pinned-p1.run.zip"
_SCRIPT = Path(sys.executable).parent / "offload-lab"
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "offload_lab"]

#: each writing command with its cheapest inputs; ``{out}`` is the output path under test
COMMANDS = {
    "report": ["report", "{run}", "--out", "{out}"],
    "export": ["export", "{run}", "--format", "chrome-trace", "--out", "{out}"],
    "simulate": ["simulate", "wan2.1-t2v-1.3b", "--device", "h200", "-n", "1", "--out", "{out}"],
    "demo": ["demo", "--quick", "--backend", "cpu", "--out", "{out}"],
    "profile": ["profile", "wan2.1-t2v-1.3b", "--scale", "0.02", "--layers", "1", "--tokens", "16",
                "-n", "1", "--warmup", "0", "--backend", "cpu", "--out", "{out}"],
    "profile --report": ["profile", "wan2.1-t2v-1.3b", "--scale", "0.02", "--layers", "1", "--tokens",
                         "16", "-n", "1", "--warmup", "0", "--backend", "cpu", "--out", "{dir}/p.zip",
                         "--report", "{out}"],
    "recommend": ["recommend", "minimax-h3", "--device", "h200", "--out", "{out}"],
    "calibrate": ["calibrate", "--model", "wan2.1-t2v-1.3b", "--layers", "1", "--scale", "0.02",
                  "--tokens", "16", "-n", "1", "--warmup", "0", "--backend", "cpu", "--out", "{out}"],
}


def make_node(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
        return
    try:  # a node like /dev/null: major 1, minor 3
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a device node here ({e.strerror})")


def is_node(path: Path, kind: str) -> bool:
    mode = os.lstat(path).st_mode
    return stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode)


@pytest.fixture()
def alarm() -> Iterator[None]:
    """Fail, instead of hanging forever, when something opens a FIFO nobody reads."""
    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("blocked for 60 s: a FIFO was opened")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture()
def place(tmp_path: Path) -> Path:
    shutil.copy(RUN, tmp_path / "run.zip")
    return tmp_path


def argv_for(name: str, place: Path, out: Path) -> list[str]:
    return [a.format(run=place / "run.zip", out=out, dir=place) for a in COMMANDS[name]]


@pytest.mark.parametrize("force", [False, True], ids=["", "--force"])
@pytest.mark.parametrize("kind", ["fifo", "chardev"])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_out_at_a_node_is_refused_and_the_node_kept(name: str, kind: str, force: bool, place: Path,
                                                    capsys: pytest.CaptureFixture, alarm: None) -> None:
    node = place / "node"
    make_node(node, kind)
    before = sorted(p.name for p in place.iterdir())
    status = main(argv_for(name, place, node) + (["--force"] if force else []))
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1, err
    what = "FIFO (named pipe)" if kind == "fifo" else "character device"
    assert lines[0].startswith(f"offload-lab: error: --{'report' if 'report ' in name else 'out'} "
                               f"{str(node)!r} is a {what}, not a regular file"), lines[0]
    assert is_node(node, kind)
    assert sorted(p.name for p in place.iterdir()) == before  # no node.zip, node.html, *.tmp


@pytest.mark.parametrize("name", ["simulate", "profile"])
def test_out_whose_zip_name_is_a_node_is_refused(name: str, place: Path, capsys, alarm) -> None:
    # --out NAME is saved as NAME.zip: that path is checked too, and NAME is not created
    make_node(place / "node.zip", "fifo")
    assert main([*argv_for(name, place, place / "node"), "--force"]) == 2
    assert "/node' (written as " in capsys.readouterr().err
    assert is_node(place / "node.zip", "fifo") and not (place / "node").exists()


def test_save_runs_at_a_node_is_refused(place: Path, capsys, alarm) -> None:
    make_node(place / "runs", "fifo")
    assert main(["demo", "--quick", "--out", str(place / "r.html"), "--save-runs",
                 str(place / "runs"), "--force"]) == 2
    assert "is a FIFO (named pipe), not a directory" in capsys.readouterr().err
    assert is_node(place / "runs", "fifo") and not (place / "r.html").exists()


# -- the console script itself ------------------------------------------------------------------
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


@pytest.mark.parametrize("name", ["report", "export", "simulate", "demo", "profile"])
def test_console_script_keeps_a_device_node_with_force(name: str, place: Path) -> None:
    node = place / "full"
    make_node(node, "chardev")
    r = _cli(*argv_for(name, place, node), "--force", cwd=place)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip().count("\n") == 0 and "is a character device" in r.stderr, r.stderr
    assert is_node(node, "chardev") and sorted(p.name for p in place.iterdir()) == ["full", "run.zip"]


def test_console_script_refuses_dev_stdout(place: Path) -> None:
    # /dev/stdout is a link to the process's stdout: here a pipe, never replaced by a file
    r = _cli("report", str(place / "run.zip"), "--out", "/dev/stdout", "--force", cwd=place)
    assert r.returncode == 2 and "'/dev/stdout' is a FIFO (named pipe)" in r.stderr, r.stderr
    assert os.path.islink("/dev/stdout")


# -- the Python saves ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run() -> Run:
    return Run.load(RUN)


@pytest.fixture(scope="module")
def small_report(run: Run) -> offload_lab.Report:
    return offload_lab.report([run])


def _saves(run: Run, rep: offload_lab.Report) -> dict:
    spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    prof = offload_lab.DeviceProfile.load("h200")
    return {"Run.save": run.save, "Report.save": rep.save, "ModelSpec.to_json": spec.to_json,
            "DeviceProfile.to_json": prof.to_json, "Run.to_chrome_trace": run.to_chrome_trace}


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
@pytest.mark.parametrize("save", ["Run.save", "Report.save", "ModelSpec.to_json", "DeviceProfile.to_json",
                                  "Run.to_chrome_trace"])
def test_python_saves_refuse_a_node(save: str, kind: str, run: Run, small_report, tmp_path: Path,
                                    alarm: None) -> None:
    node = tmp_path / "node"
    make_node(node, kind)
    refused = r"'.*node' is a (FIFO \(named pipe\)|character device), not a regular file"
    with pytest.raises(OutputError, match=refused) as e:
        _saves(run, small_report)[save](node)
    assert isinstance(e.value, OffloadLabError) and isinstance(e.value, ValueError)
    assert str(e.value).count("\n") == 0
    assert is_node(node, kind) and [p.name for p in tmp_path.iterdir()] == ["node"]


def test_run_save_checks_the_zip_name_too(run: Run, tmp_path: Path, alarm: None) -> None:
    make_node(tmp_path / "r.zip", "fifo")
    with pytest.raises(OutputError, match=r"'.*r' \(written as '.*r\.zip'\) is a FIFO"):
        run.save(tmp_path / "r")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.zip"]


def test_a_link_is_written_through_and_stays_a_link(run: Run, tmp_path: Path) -> None:
    target = tmp_path / "real.zip"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.zip"
    link.symlink_to(target)
    assert run.save(link) == link
    assert link.is_symlink() and Run.load(target).equals(run)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the file keeps its permissions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.zip", "real.zip"]


def test_a_failed_write_leaves_the_target_and_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "kept.txt"
    target.write_text("old")

    def fails(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, fails)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["kept.txt"]


def test_kind_of_never_opens_what_it_looks_at(tmp_path: Path, alarm: None) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert kind_of(tmp_path / "pipe") == "FIFO (named pipe)"
    assert kind_of(tmp_path / "loop") == "symbolic link loop"
    with pytest.raises(OutputError, match="is a symbolic link loop"):
        atomic_write(tmp_path / "loop", "x")


def test_synthetic_checkpoint_save_refuses_a_node(tmp_path: Path, alarm: None) -> None:
    from offload_lab import catalog, synthetic

    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.02, layers=1)
    make_node(tmp_path / "m.safetensors", "fifo")
    with pytest.raises(OutputError, match="m.safetensors' is a FIFO"):
        synthetic.save(model, tmp_path / "m.safetensors")
    assert is_node(tmp_path / "m.safetensors", "fifo")
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]
