"""What the ``offload-lab`` commands print and write about their runs: the comparison table,
what a prediction rests on, the HTML report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from offload_lab.cli.common import CliError
from offload_lab.cli.outputs import cleaned_up
from offload_lab.planning.planner import Plan
from offload_lab.record.run import Run
from offload_lab.simulation.evidence import UNCONFIRMED_TEXT
from offload_lab.views.export_writers import comparison_text
from offload_lab.views.exporters import get as exporter

__all__ = ["comparison_text", "evidence_head", "evidence_line", "write_report"]


def evidence_head(ev: dict[str, Any]) -> str:
    """The short form of a simulated run's ``meta["evidence"]``: its ± band, or why there is none."""
    status, band = ev.get("status"), ev.get("band")
    if status == "held-out" and isinstance(band, (int, float)):
        return f"held-out ± {band * 100:.1f} %"
    if status == "unconfirmed":
        return UNCONFIRMED_TEXT
    if status == "derived":
        return "derived — no measured run of this device"
    return "no evidence recorded"


def evidence_line(run: Run) -> str:
    """What a simulated step rests on: a ± band with the runs behind it, or why there is none."""
    ev = run.meta.get("evidence") or {}
    return f"{evidence_head(ev)} — {ev.get('basis', 'no evidence recorded')}"


def write_report(runs: list[Run], out: str | os.PathLike, plan: Plan | None, title: str | None,
                 recommendation: Any = None) -> Path:
    """The HTML report of ``runs`` at ``out`` (nothing left behind when it fails)."""
    try:
        with cleaned_up(Path(out)):
            return exporter("html").write(runs, out, plan=plan, title=title, recommendation=recommendation)
    except ImportError as e:
        # plotly is imported when the first figure is drawn; a GPU box may lack it
        if (e.name or "").split(".")[0] == "plotly":
            raise CliError("cannot write the report: plotly is not installed here "
                           "(pip install plotly)") from None
        raise
