"""Test-wide settings.

OpenMP threads that spin-wait for a core held by another thread (the cpu backend's copy
engine, or another process) make CPU timings swing tenfold; waiting passively keeps them
steady. It must be set before torch starts its thread pool, hence here.

Tests write only to temporary directories: in a git checkout the session fails when it ends
with untracked files (not ignored ones) that were not there when it started.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


import shutil  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

CHECKOUT = Path(__file__).resolve().parent.parent


def untracked_files(root: Path = CHECKOUT) -> set[str] | None:
    """Untracked, not ignored files under ``root`` (git's view); ``None`` outside a git checkout."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "-z"], cwd=root,
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return {entry[3:] for entry in r.stdout.split("\0") if entry.startswith("?? ")}


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller looks, not each xdist worker
        session.config._untracked_at_start = untracked_files()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = getattr(session.config, "_untracked_at_start", None)
    if before is None:
        return
    after = untracked_files()
    new = sorted((after or set()) - before)
    if not new:
        return
    shown = ", ".join(new[:10]) + (f" and {len(new) - 10} more" if len(new) > 10 else "")
    message = (f"tests wrote {len(new)} new untracked file(s) into the checkout {str(CHECKOUT)!r}: "
               f"{shown}; tests must write only under tmp_path")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "files left in the checkout", red=True)
        reporter.write_line(message)
    else:
        print(message)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED

XSS = "</script><script>alert(1)</script>"


@pytest.fixture(scope="session")
def measured():
    """cpu-backend runs of a tiny Wan-shaped model; the pageable one has a hostile label."""
    import offload_lab
    from offload_lab import catalog, synthetic

    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=3)
    inputs = synthetic.example_inputs(model, tokens=32)
    spec = offload_lab.spec_of(model)
    host = offload_lab.HostMemory(available="256GiB")
    runs = []
    for tier, label in (("pinned", "pinned"), ("pageable", XSS)):
        plan = offload_lab.plan(spec, tier=tier, host=host)
        runs.append(offload_lab.profile(model, lambda: model(**inputs), plan, steps=2, warmup=1,
                                        backend="cpu", label=label))
    return runs


# -- the tiny diffusers pipeline (tiny_pipelines.py), one of each per session --------------------
@pytest.fixture(scope="session")
def tiny_pipe():
    """A tiny random WanPipeline (6 transformer blocks, no text encoder)."""
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    from tiny_pipelines import LAYERS

    from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_pipeline

    return tiny_wan_pipeline(layers=LAYERS)


@pytest.fixture(scope="session")
def tiny_reference(tiny_pipe):
    """``tiny_pipe``'s frames without offload."""
    from tiny_pipelines import frames

    return frames(tiny_pipe)


@pytest.fixture(scope="session")
def tiny_saved(tiny_pipe, tmp_path_factory):
    """``tiny_pipe`` written by ``save_pretrained`` in small shards; tests must not edit it."""
    from tiny_pipelines import save

    return save(tiny_pipe, tmp_path_factory.mktemp("tiny_wan"))


@pytest.fixture(scope="session")
def tiny_loaded(tiny_saved):
    """``tiny_saved`` loaded by ``from_pretrained``: its weights on the files' pages."""
    from tiny_pipelines import load

    return load(tiny_saved)


@pytest.fixture(scope="session")
def tiny_loaded_reference(tiny_loaded):
    """``tiny_loaded``'s own frames without offload: what offload of it must reproduce."""
    from tiny_pipelines import frames

    return frames(tiny_loaded)


# -- the shipped H200 runs and their held-out fits, computed once per session ---------------------
H200_RUNS = CHECKOUT / "data" / "runs" / "h200-2026-12-01"


@pytest.fixture(scope="session")
def h200_runs() -> dict:
    """Every shipped H200 run (``data/runs/h200-2026-12-01/*.zip``) by file stem, loaded once."""
    if not H200_RUNS.exists():
        pytest.skip("the shipped H200 runs are not in this checkout")
    from offload_lab import Run

    return {f.stem: Run.load(f) for f in sorted(H200_RUNS.glob("*.zip"))}


@pytest.fixture(scope="session")
def h200_main_held_out(h200_main_runs):
    """``held_out`` (every scheme) over the main stage's runs, the numbered files: the very runs
    ``scripts/calibrate_h200.py`` fits. One profile per run and scheme takes seconds each, so the
    tests that read the table share it; they must not edit it."""
    from offload_lab.simulation.heldout import held_out

    return held_out(h200_main_runs)


class _LooProfiles(dict):
    """Run name -> the profile ``heldout.fit`` makes from the other numbered runs (a leave-one-out
    fold), fitted the first time a test asks for it."""

    def __init__(self, runs: dict) -> None:
        super().__init__()
        self.runs = runs

    def __missing__(self, name: str):
        from offload_lab.simulation.calibration import tokens_of
        from offload_lab.simulation.heldout import fit

        run = self.runs[name]
        prof = fit([r for n, r in self.runs.items() if n != name], run.meta.get("model"), tokens_of(run))
        self[name] = prof
        return prof


@pytest.fixture(scope="session")
def h200_main_runs(h200_runs) -> dict:
    """The main stage's shipped H200 runs (the numbered files), what the profile is fitted on."""
    return {n: r for n, r in h200_runs.items() if n[:1].isdigit()}


@pytest.fixture(scope="session")
def h200_loo_profiles(h200_main_runs) -> _LooProfiles:
    """The leave-one-out profiles of the numbered runs, each fitted once for the session."""
    return _LooProfiles(h200_main_runs)


@pytest.fixture(scope="session")
def demo_quick(tmp_path_factory):
    """``offload-lab demo --quick --backend cpu`` run once as a real process in an empty temp
    directory: ``(completed process, report path)``. The CLI test reads its output, the layout
    test opens its report; a demo takes a while, so they share one."""
    import sys

    script = Path(sys.executable).parent / "offload-lab"  # the console script, else python -m, as test_cli
    command = [str(script)] if script.exists() else [sys.executable, "-m", "offload_lab"]
    cwd = tmp_path_factory.mktemp("demo")
    report = cwd / "tmp" / "report.html"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    r = subprocess.run([*command, "demo", "--quick", "--backend", "cpu", "--out", str(report)],
                       capture_output=True, text=True, cwd=cwd, timeout=600, env=env)
    return r, report
