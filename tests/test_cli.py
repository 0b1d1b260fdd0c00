"""The ``offload-lab`` command, run as a real process (the console script, else ``python -m``).

Every process runs in a temporary directory, never in the checkout: a command's default
output (``offload-report.html``) must neither land there nor meet one left by ``demo``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

_SCRIPT = Path(sys.executable).parent / "offload-lab"
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "offload_lab"]
SUBCOMMANDS = ("demo", "plan", "profile", "simulate", "report", "catalog")


def cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    if cwd is None:  # a fresh empty directory of its own
        with tempfile.TemporaryDirectory(prefix="offload-lab-cli-") as tmp:
            return cli(*args, cwd=Path(tmp), timeout=timeout)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # tests must not reach for a GPU another test holds, nor vary with one
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env)


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith("offload-lab: error: "), line
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in line, (n, line)
    return line


# -- help and version ---------------------------------------------------------------------------
@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_each_subcommand_has_help_with_examples(sub: str) -> None:
    r = cli(sub, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: offload-lab {sub}")
    assert "examples:" in r.stdout
    assert f"offload-lab {sub}" in r.stdout.split("examples:", 1)[1]


def test_top_level_help_and_version() -> None:
    r = cli("--help")
    assert r.returncode == 0
    for sub in SUBCOMMANDS:
        assert sub in r.stdout
    # one list of commands, each on one line with its help
    section = r.stdout.split("commands:", 1)[1].split("examples:", 1)[0]
    entries = [ln.split() for ln in section.splitlines() if ln.startswith("    ") and ln[4] != " "]
    listed = [e[0] for e in entries]
    assert len(listed) == len(set(listed)) and set(SUBCOMMANDS) | {"recommend", "calibrate"} <= set(listed)
    assert r.stdout.count("commands:") == 1 and all(len(e) > 1 for e in entries), entries
    v = cli("--version")
    assert v.returncode == 0 and v.stdout.startswith("offload-lab 0.")


# -- plan and catalog ---------------------------------------------------------------------------
def test_plan_pins_what_the_budget_allows() -> None:
    # Wan2.1 T2V-14B blocks are 670 MiB: 12 of them fit 8 GiB, the other 28 stay pageable
    r = cli("plan", "wan2.1-t2v-14b", "--pin-budget", "8GiB", "--host", "64GiB")
    assert r.returncode == 0, r.stderr
    assert "40 layers: 12 pinned, 28 pageable" in r.stdout
    assert "ledger:" in r.stdout and "pinned: rank 1" in r.stdout
    # the headroom printed is what the plan leaves: 64 − 3.2 reserve − 26.18 GiB it copies out of the file
    assert "headroom after plan  34.62 GiB (of 60.80 GiB before" in r.stdout
    # pinned and pageable stores are copies: nothing in the mapped column
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("blocks      0"))
    assert row.split()[:5] == ["blocks", "0", "pinned", "670.23", "MiB"] and row.split()[5] == "True"
    staged = cli("plan", "wan2.1-t2v-14b", "--pin-budget", "1GiB", "--staging", "--host", "64GiB")
    assert staged.returncode == 0, staged.stderr
    assert "not staged: 2 × 670.23 MiB staging buffers = 1.31 GiB > 1.00 GiB of pin budget" in staged.stdout
    j = cli("plan", "wan2.1-t2v-14b", "--pin-budget", "8GiB", "--host", "64GiB", "--json")
    assert j.returncode == 0, j.stderr
    d = json.loads(j.stdout)
    assert sum(row["tier"] == "pinned" for row in d["layers"]) == 12
    assert d["ledger"]["fits"] is True


def test_catalog_lists_models_details_and_devices() -> None:
    r = cli("catalog")
    assert r.returncode == 0, r.stderr
    for name in ("minimax-h3", "wan2.1-i2v-14b", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b"):
        assert name in r.stdout
    one = cli("catalog", "minimax-h3")
    assert one.returncode == 0 and "token_refiner.blocks: 2 layers" in one.stdout
    dev = cli("catalog", "--devices")
    assert dev.returncode == 0 and "h200" in dev.stdout and "rtx4090-pcie4" in dev.stdout


# -- bad input: exit 2, one line naming the value -----------------------------------------------
@pytest.mark.parametrize("args, needles", [
    (["plan", "wan9-t2v"], ["'wan9-t2v'", "wan2.1-t2v-1.3b"]),
    (["plan", "wan2.1-t2v-14b", "--pin-budget", "8XB"], ["'8XB'", "GiB"]),
    (["plan", "wan2.1-t2v-14b", "--pin-budget", "8"], ["'8'", "unit"]),
    (["plan", "wan2.1-t2v-14b", "--tier", "locked"], ["'locked'", "pinned", "pageable", "mapped"]),
    (["plan", "wan2.1-t2v-14b", "--order", "3,3"], ["twice"]),
    (["simulate", "wan2.1-t2v-14b", "--device", "a100"], ["'a100'", "h200"]),
    (["simulate", "wan2.1-t2v-14b", "--device", "h200", "--tokens", "4k"], ["'4k'", "480p"]),
    (["report", "no-such-run.zip"], ["'no-such-run.zip'"]),
    (["plan", "missing/model.safetensors"], ["'missing/model.safetensors'", "safetensors"]),
    ([], ["no command"]),
])
def test_bad_input_gives_exit_2_and_one_line(args: list[str], needles: list[str], tmp_path: Path) -> None:
    assert_one_line_error(cli(*args, cwd=tmp_path), *needles)


def test_corrupt_files_give_one_line(tmp_path: Path) -> None:
    bad_run = tmp_path / "broken.zip"
    bad_run.write_bytes(b"PK\x03\x04 not really a zip")
    assert_one_line_error(cli("report", bad_run, cwd=tmp_path), "broken.zip")
    # the input is read before the output is looked at: an existing default output changes nothing
    (tmp_path / "offload-report.html").write_text("left by an earlier run")
    assert_one_line_error(cli("report", bad_run, cwd=tmp_path), "broken.zip")
    bad_spec = tmp_path / "spec.json"
    bad_spec.write_text('{"hello": 1}')
    assert_one_line_error(cli("plan", bad_spec), "spec.json")
    bad_st = tmp_path / "model.safetensors"
    bad_st.write_bytes(b"\xff" * 16)
    assert_one_line_error(cli("plan", bad_st), "model.safetensors")
    latin = tmp_path / "latin1.json"
    latin.write_bytes('{"name": "café"}'.encode("latin-1"))
    assert_one_line_error(cli("plan", latin), "latin1.json", "UTF-8")
    # --plan is read after the runs: a trace stands in for a saved run
    trace = Path(__file__).parent / "data" / "traces" / "gpu_two_steps.json"
    assert_one_line_error(cli("report", trace, "--plan", latin, cwd=tmp_path), "latin1.json", "UTF-8")
    assert_one_line_error(cli("report", trace, "--plan", bad_spec, cwd=tmp_path), "spec.json",
                          "offload-lab plan")


# -- profile -> simulate -> report --------------------------------------------------------------
def test_profile_simulate_report_round_trip(tmp_path: Path) -> None:
    r = cli("profile", "wan2.1-t2v-1.3b", "--scale", "0.05", "--layers", "2", "--tokens", "64",
            "--steps", "1", "--warmup", "0", "--backend", "cpu", "--tier", "pageable",
            "--label", "tiny pageable", "--out", tmp_path / "measured.zip")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "measured.zip").exists() and "tiny pageable" in r.stdout
    s = cli("simulate", "wan2.1-t2v-1.3b", "--device", "h200", "--tier", "pinned", "--steps", "1",
            "--out", tmp_path / "sim.zip")
    assert s.returncode == 0, s.stderr
    assert "(simulated)" in s.stdout and "SIMULATED" in s.stdout
    out = tmp_path / "report.html"
    rep = cli("report", tmp_path / "measured.zip", tmp_path / "sim.zip", "--out", out, "--title", "round trip")
    assert rep.returncode == 0, rep.stderr
    html = out.read_text()
    assert "tiny pageable" in html and "SIMULATED" in html and 'id="comparison-table"' in html
    assert str(out.resolve()) in rep.stdout


# -- the main job -------------------------------------------------------------------------------
@pytest.mark.slow
def test_demo_quick_end_to_end(demo_quick) -> None:
    # the demo process is the session's (conftest.py): the layout test opens the same report
    r, report = demo_quick
    assert r.returncode == 0, r.stderr
    html = report.read_text()
    assert 'id="comparison-table"' in html and "SIMULATED" in html
    for label in ("cpu: all pinned", "cpu: all pageable", "cpu: mapped", "cpu: half pinned",
                  "h200: all pinned", "rtx4090-pcie4: all pageable"):
        assert label in html and label in r.stdout, label
    assert "sizing:" in r.stdout and "about the same time" in r.stdout
    assert f"report: {report.resolve()}" in r.stdout
    assert "100%" in r.stderr  # the progress bar ran to the end
    # the measured H200 runs shipped in the source tree are shown, labelled with their machine
    assert "MEASURED on NVIDIA H200" in r.stdout and "1.3B pageable p1" in html


@pytest.fixture(scope="module")
def sim_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``simulate`` run file for the report tests that only read it (one process, not one each)."""
    out = tmp_path_factory.mktemp("cli-sim") / "sim.zip"
    s = cli("simulate", "wan2.1-t2v-1.3b", "--device", "h200", "--steps", "1", "--out", out)
    assert s.returncode == 0, s.stderr
    return out


def test_report_without_plotly_is_one_clear_line(sim_zip: Path, tmp_path: Path) -> None:
    # the GPU machines have torch and pandas but no plotly: say so instead of a traceback
    code = ("import sys; sys.modules['plotly'] = None\n"
            "from offload_lab.cli.app import main\n"
            f"sys.exit(main(['report', {str(sim_zip)!r}, '--out', {str(tmp_path / 'r.html')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert_one_line_error(r, "plotly is not installed")
    assert not (tmp_path / "r.html").exists()


def test_report_reads_profiler_traces_beside_runs(sim_zip: Path, tmp_path: Path) -> None:
    trace = Path(__file__).parent / "data" / "traces" / "h200_offload_trace.json.gz"
    r = cli("report", sim_zip, trace, "--out", tmp_path / "mix.html")
    assert r.returncode == 0, r.stderr
    assert "h200_offload_trace" in r.stdout and "3 pinned, 3 pageable" in r.stdout
    (tmp_path / "cut.json").write_text('{"traceEvents": [')
    assert_one_line_error(cli("report", tmp_path / "cut.json", cwd=tmp_path), "truncated")


def test_unwritable_output_is_refused_before_the_work(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    r = cli("profile", "wan2.1-t2v-1.3b", "--scale", "0.05", "--layers", "2",
            "--out", tmp_path / "file" / "run.zip")
    assert_one_line_error(r, "cannot write", "not a writable directory")
    assert "profiling" not in r.stderr + r.stdout
