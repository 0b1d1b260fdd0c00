"""``offload-lab export RUN --format NAME``: a saved run as a file other tools open.

The formats are the registry :mod:`offload_lab.views.exporters` (``chrome-trace`` for Perfetto
and ``chrome://tracing``, ``html``, ``text``, ``zip``); the parser's ``--format`` choices and
help are read from it. The output follows the rule of every command
(:mod:`offload_lab.cli.outputs`): checked once RUN has been read, an existing file overwritten
only with ``--force``, never RUN itself nor a device, FIFO, socket or directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from offload_lab.cli.inputs import load_run
from offload_lab.cli.outputs import check_output, cleaned_up
from offload_lab.errors import OffloadLabError
from offload_lab.views import exporters
from offload_lab.writing import REGULAR, kind_of

__all__ = ["ExportError", "run", "default_out"]


class ExportError(OffloadLabError, ValueError):
    """An export the command cannot do: a missing run, an output that exists, ..."""


def default_out(run_path: str, fmt: str) -> Path:
    """Where ``export`` writes when ``--out`` is not given: beside RUN, with the format's suffix.

    >>> str(default_out("runs/pinned.zip", "chrome-trace"))
    'runs/pinned.trace.json'
    >>> str(default_out("trace.json.gz", "chrome-trace")), str(default_out("trace.json.gz", "zip"))
    ('trace.trace.json', 'trace.zip')
    """
    p = Path(run_path)
    stem = p.name
    for suffix in (".json.gz", ".json", ".zip"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return p.with_name(stem + exporters.get(fmt).suffix)


def run(args: argparse.Namespace) -> int:
    """Carry out ``offload-lab export``; returns the exit status (0)."""
    exporter = exporters.get(args.format)
    src = Path(args.run)
    if kind_of(src) != REGULAR:  # missing, a directory, or a FIFO that would never be read to the end
        raise ExportError(f"run {str(src)!r} is not a file; accepted: a RUN.zip written by "
                          f"offload-lab profile / simulate or Run.save, or a torch.profiler trace")
    loaded = load_run(src)  # the input first: a corrupt RUN is reported as such
    out = check_output(args.out if args.out else default_out(args.run, args.format), args.force,
                       inputs=[src], suffix=exporter.suffix if exporter.appends_suffix else None,
                       example=f"run{exporter.suffix}")
    with cleaned_up(out):
        path = exporter.write(loaded, out)
    kind = "simulated" if loaded.simulated else "measured"
    opens = f"; {exporter.opens}" if exporter.opens else ""
    print(f"wrote {path.resolve()}: {exporter.name} of {loaded.label!r} ({kind}){opens}", flush=True)
    return 0
