"""The writers of the formats in :mod:`offload_lab.views.exporters`, one function each.

Every writer takes ``(runs_or_run, path, **options)``, writes through
:mod:`offload_lab.writing` (whole, onto a regular file or a new path) and returns the path
written. They are thin: the formats themselves are :meth:`Run.save`,
:func:`~offload_lab.record.chrome_trace.to_chrome_trace`, :func:`~offload_lab.views.report.report`
and :func:`~offload_lab.views.tables.comparison_frame` with :func:`~offload_lab.views.text.text_table`.

>>> import tempfile, pathlib, offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
>>> p = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
>>> run = offload_lab.simulate(p, "h200", steps=1)
>>> out = write_text(run, pathlib.Path(tempfile.mkdtemp()) / "sim.txt")
>>> out.read_text().splitlines()[0].split()[:3]
['run', 'backend', 'tiers']
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from offload_lab.record.chrome_trace import to_chrome_trace
from offload_lab.record.run import Run
from offload_lab.views.report import report
from offload_lab.views.tables import comparison_frame
from offload_lab.views.text import text_table
from offload_lab.writing import atomic_write

__all__ = ["NUMERIC_COLUMNS", "comparison_text", "write_chrome_trace", "write_html", "write_text", "write_zip"]

#: the columns of the comparison table that read as numbers, right-aligned
NUMERIC_COLUMNS = ("step", "ratio", "stall", "exposed copy", "overlap", "vs bound")


def comparison_text(runs: Run | Iterable[Run] | Mapping[str, Run]) -> str:
    """The comparison of ``runs`` as a plain-text table (the table the commands, the magic and
    the widgets show)."""
    return text_table(comparison_frame(runs), right=NUMERIC_COLUMNS)


def _one_run(run: Any, fmt: str) -> Run:
    if not isinstance(run, Run):
        raise TypeError(f"the {fmt} writer needs an offload_lab Run, got {type(run).__name__}")
    return run


def write_chrome_trace(run: Run, path: str | os.PathLike) -> Path:
    """``run`` as Chrome trace-event JSON (``.gz`` in the name: compressed)."""
    to_chrome_trace(_one_run(run, "chrome-trace"), path)
    return Path(path)


def write_html(runs: Run | Iterable[Run] | Mapping[str, Run], path: str | os.PathLike, *,
               plan: Any = None, title: str | None = None, recommendation: Any = None) -> Path:
    """The offline HTML report of ``runs`` (and ``plan``), as :func:`offload_lab.report` makes it."""
    return report(runs, plan=plan, title=title, recommendation=recommendation).save(path)


def write_text(runs: Run | Iterable[Run] | Mapping[str, Run], path: str | os.PathLike) -> Path:
    """The comparison table of ``runs`` as a UTF-8 text file."""
    return atomic_write(path, comparison_text(runs) + "\n", what="text path", example="runs.txt")


def write_zip(run: Run, path: str | os.PathLike) -> Path:
    """``run`` as :meth:`Run.save` writes it (``.zip`` appended to a name that lacks it)."""
    return _one_run(run, "zip").save(path)
