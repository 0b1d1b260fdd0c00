"""The export formats, one registry (``offload_lab.views.exporters``), and ``offload-lab export``.

Every registered format writes a saved test run to a file that is read back by what reads that
format (``Run.load``, ``json``, the HTML text); the command offers exactly the registry's
names. The CLI's layout keeps ``offload-lab --help`` and ``catalog`` free of torch and plotly.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import markupsafe
import pandas as pd
import pytest

from offload_lab.cli import main
from offload_lab.cli.app import build_parser
from offload_lab.record.run import FRAMES, Run
from offload_lab.views import exporters
from offload_lab.views.exporters import ExportFormatError
from offload_lab.views.text import fmt_seconds

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "tests" / "data" / "runs"
RUN = RUNS / "pinned-p1.run.zip"
LABEL = 'pinned <p1> & "co" (cpu, measured)'


@pytest.fixture()
def run() -> Run:
    r = Run.load(RUN)
    r.meta["label"] = LABEL  # markup in the label: the html must escape it
    return r


def _zip(run: Run, path: Path) -> None:
    back = Run.load(path)
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(back, name), getattr(run, name), check_like=True)
    assert back.label == run.label


def _chrome(run: Run, path: Path) -> None:
    trace = json.loads(path.read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert slices and trace["otherData"]["label"] == run.label


def _html(run: Run, path: Path) -> None:
    text = path.read_text()
    assert text.lstrip().lower().startswith("<!doctype html")
    assert str(markupsafe.escape(LABEL)) in text  # as the report's template escapes it
    assert LABEL not in text  # never raw


def _text(run: Run, path: Path) -> None:
    text = path.read_text()
    assert fmt_seconds(run.step_time) in text and LABEL in text
    assert text.splitlines()[0].split()[:4] == ["run", "backend", "tiers", "step"]


#: how each format's file is read back; a format registered without a check here fails the test
READ_BACK = {"zip": _zip, "chrome-trace": _chrome, "html": _html, "text": _text}


def test_every_registered_format_has_a_read_back_check() -> None:
    assert sorted(READ_BACK) == exporters.names()


@pytest.mark.parametrize("name", exporters.names())
def test_each_exporter_writes_a_file_that_reads_back(name: str, run: Run, tmp_path: Path) -> None:
    exporter = exporters.get(name)
    assert exporter.name == name and exporter.suffix.startswith(".") and exporter.description
    assert "\n" not in exporter.description
    out = exporter.write(run, tmp_path / f"run{exporter.suffix}")
    assert out == tmp_path / f"run{exporter.suffix}" and out.is_file()
    READ_BACK[name](run, out)
    # a list of one run is the run
    again = exporter.write([run], tmp_path / f"again{exporter.suffix}")
    READ_BACK[name](run, again)


def test_zip_is_run_save_and_appends_its_suffix(run: Run, tmp_path: Path) -> None:
    out = exporters.get("zip").write(run, tmp_path / "bare")
    assert out == tmp_path / "bare.zip"
    assert out.read_bytes() == run.save(tmp_path / "saved.zip").read_bytes()


def test_formats_of_several_runs_hold_them_all(tmp_path: Path) -> None:
    runs = [Run.load(RUNS / "pinned-p1.run.zip"), Run.load(RUNS / "pageable-p1.run.zip")]
    text = exporters.get("text").write(runs, tmp_path / "both.txt").read_text()
    assert all(r.label in text and fmt_seconds(r.step_time) in text for r in runs)
    page = exporters.get("html").write(runs, tmp_path / "both.html", title="two <runs>").read_text()
    assert "two &lt;runs&gt;" in page and all(r.label in page for r in runs)
    with pytest.raises(ExportFormatError, match=r"^format 'zip' holds one run, got 2; accepted: one Run"):
        exporters.get("zip").write(runs, tmp_path / "both.zip")
    assert not (tmp_path / "both.zip").exists()


def test_an_unknown_format_is_one_line_naming_the_accepted() -> None:
    with pytest.raises(ExportFormatError) as e:
        exporters.get("svg")
    assert str(e.value) == "format 'svg' is not one of chrome-trace, html, text, zip"


def test_a_writer_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    # a path is not a run: read it with Run.load first
    with pytest.raises(TypeError, match="the zip writer needs an offload_lab Run, got str"):
        exporters.get("zip").write(str(RUN), tmp_path / "x.zip")
    with pytest.raises(TypeError, match="the chrome-trace writer needs an offload_lab Run, got PosixPath"):
        exporters.get("chrome-trace").write(RUN, tmp_path / "x.trace.json")
    assert not list(tmp_path.iterdir())


# -- the command ---------------------------------------------------------------------------------
def _export_action() -> argparse.Action:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in sub.choices["export"]._actions if "--format" in a.option_strings)


def test_export_offers_exactly_the_registry() -> None:
    action = _export_action()
    assert list(action.choices) == exporters.names()
    for name in exporters.names():
        assert f"{name}: {exporters.get(name).description}" in action.help


@pytest.mark.parametrize("name", exporters.names())
def test_export_command_writes_each_format_beside_the_run(name: str, tmp_path: Path, capsys) -> None:
    src = tmp_path / "pinned.zip"
    src.write_bytes(RUN.read_bytes())
    out = tmp_path / f"out{exporters.get(name).suffix}"
    # zip's default path is RUN itself, which the output rule refuses: name the output
    args = ["--out", str(out)] if name == "zip" else []
    assert main(["export", str(src), "--format", name, *args]) == 0
    written = out if name == "zip" else tmp_path / f"pinned{exporters.get(name).suffix}"
    assert written.is_file()
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {written.resolve()}: {name} of 'pinned-p1 (cpu, measured)' (measured)")
    if name == "zip":
        _zip(Run.load(src), written)


def test_export_zip_over_its_own_input_is_one_line(tmp_path: Path, capsys) -> None:
    src = tmp_path / "pinned.zip"
    src.write_bytes(RUN.read_bytes())
    assert main(["export", str(src), "--format", "zip"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is also an input of this command" in err


def test_export_unknown_format_is_one_line_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["export", str(RUN), "--format", "svg"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("offload-lab: error: ") and "'svg'" in err
    assert all(f"'{n}'" in err for n in exporters.names())


# -- what the light paths import -------------------------------------------------------------------
LIGHT = ("torch", "plotly", "diffusers")


def _loaded_after(code: str) -> list[str]:
    probe = (f"import sys\n{code}\n"
             f"print(sorted(m for m in {LIGHT + ('pandas',)!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1].replace("'", '"'))


def test_help_and_the_export_registry_import_neither_torch_plotly_nor_pandas() -> None:
    code = ("import contextlib, io\nfrom offload_lab.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    main(['--help'])\n"
            "import offload_lab.views.exporters")
    assert _loaded_after(code) == []


def test_catalog_imports_neither_torch_nor_plotly() -> None:
    code = ("import contextlib, io\nfrom offload_lab.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['catalog']) == 0 and main(['catalog', '--devices']) == 0")
    assert not set(_loaded_after(code)) & set(LIGHT)
