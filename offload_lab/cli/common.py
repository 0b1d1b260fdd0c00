"""What every ``offload-lab`` command shares and the parser needs too: the error class, the
constants, printing, the backend and thread choice, run paths.

This is the bottom of :mod:`offload_lab.cli`: it imports nothing of the CLI and nothing that
pulls in pandas, torch or plotly (torch is imported by :func:`resolve_backend` and
:func:`set_threads` when they run), so :mod:`offload_lab.cli.app` can import it and
``offload-lab --help`` stays instant. The helpers that read a MODEL, a device profile or a
saved run are :mod:`offload_lab.cli.inputs`; those that print and write results
:mod:`offload_lab.cli.results`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from offload_lab.errors import OffloadLabError
from offload_lab.units import format_bytes
from offload_lab.writing import REGULAR, kind_of

if TYPE_CHECKING:
    from offload_lab.planning.planner import Plan

__all__ = ["PROG", "SIM_HOST", "DEFAULT_REPORT", "CPU_NOTE", "CliError", "one_line", "say",
           "resolve_backend", "cores", "set_threads", "host_line", "run_paths"]

PROG = "offload-lab"
DEFAULT_REPORT = "offload-report.html"
#: ``simulate`` plans for a hypothetical host of this size unless ``--host`` says otherwise: the
#: machine being simulated is not this one, so probing this machine's memory would mislead
SIM_HOST = "256GiB"

CPU_NOTE = (
    "note: the cpu backend has no DMA engine and no page-locking: 'pinned' there only "
    "means the copy runs on a copy thread, overlapping compute when a core is free, while 'pageable' "
    "and 'mapped' copy on the calling thread; every copy is a memcpy through the same memory "
    "bandwidth. With compute on every core pinned and pageable take about the same time by nature, "
    "and a gap measured on a CPU{here} is thread overlap, not page-locking. On a GPU the gap "
    "depends on the runtime's issue order: GPU runs in the before-compute order (every shipped H200 "
    "run in data/runs) measure pageable copies blocking the host with nothing overlapping, and the "
    "simulator{where} reproduces them within its held-out band; its after-compute rows (offload-lab's "
    "default order) predict pageable copies hiding almost like pinned ones, a prediction no GPU run "
    "has confirmed yet (marked unconfirmed)."
)

_RUN_FILES = "RUN.zip files written by offload-lab profile / simulate or Run.save"


class CliError(OffloadLabError, ValueError):
    """Command-line input the library could not check itself (a MODEL that is no model, ...)."""


def one_line(text: str) -> str:
    """``text`` with every run of whitespace, newlines included, as one space.

    >>> one_line("a\\n  b ")
    'a b'
    """
    return " ".join(str(text).split())


def say(text: str = "") -> None:
    """Print one line of a command's output at once (a pipe or a log sees it as it happens)."""
    print(text, flush=True)


def resolve_backend(name: str) -> str:
    """``--backend`` as the backend to run on: ``auto`` is ``cuda`` when torch sees a device."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise CliError("--backend 'cuda' was asked for but torch sees no CUDA device; accepted here: cpu or auto")
    return name


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def set_threads(backend: str, threads: int | None) -> str | None:
    """Fix torch's intra-op threads for the cpu backend; returns why, for the sizing notes."""
    if backend != "cpu":
        return None
    import torch

    n = threads or cores()
    torch.set_num_threads(n)
    passive = os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
    return (f"{n} torch thread(s) on {cores()} core(s)"
            + (", OpenMP workers wait passively so a core taken by the copy thread or another "
               "process slows a step instead of stalling it" if passive else ""))


def host_line(p: Plan) -> str:
    """The host a plan was made for, in one line: what it is and what it may spend."""
    h = p.host
    if h is None:
        return "host: unknown"
    what = "this machine (probed)" if h.source == "probe" else h.source
    return (f"host: {what}: {format_bytes(h.available)} available, reserve {format_bytes(h.reserve)}, "
            f"spendable {format_bytes(h.spendable)}")


def run_paths(items: Sequence[str]) -> list[Path]:
    """The saved runs named on the command line, a directory standing for its ``*.zip`` files;
    a missing path, an empty directory or a FIFO is refused unread."""
    paths: list[Path] = []
    for item in items:
        p = Path(item)
        if not item.strip():
            raise CliError(f"run '' is empty; accepted: {_RUN_FILES}, or directories of them")
        if p.is_dir():
            found = sorted(p.glob("*.zip"))
            if not found:
                raise CliError(f"directory {item!r} holds no saved runs (*.zip); accepted: {_RUN_FILES}")
            paths += found
        elif not p.exists():
            raise CliError(f"run {item!r} does not exist; accepted: {_RUN_FILES}, or directories of them")
        elif kind_of(p) != REGULAR:
            # reading a FIFO would wait for a writer forever
            raise CliError(f"run {item!r} is a {kind_of(p)}, not a file; accepted: {_RUN_FILES}, "
                           f"or directories of them")
        else:
            paths.append(p)
    return paths
