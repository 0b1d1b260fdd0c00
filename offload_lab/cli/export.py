"""``offload-lab export RUN --format chrome-trace``: a saved run as a file other tools open.

``chrome-trace`` writes the Chrome trace-event JSON that Perfetto (ui.perfetto.dev) and
``chrome://tracing`` open: one track per stream per rank, one slice per interval named
``group.layer``, memory counters (:mod:`offload_lab.record.chrome_trace`). The output follows
the rule of every command (:mod:`offload_lab.cli.outputs`): checked once RUN has been read, an
existing file overwritten only with ``--force``, never RUN itself nor a device, FIFO, socket or
directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from offload_lab.cli.outputs import FORCE_HELP, check_output
from offload_lab.errors import OffloadLabError
from offload_lab.writing import REGULAR, kind_of

__all__ = ["FORMATS", "ExportError", "add_parser", "run", "default_out"]

#: format name -> the suffix its files get by default
FORMATS = {"chrome-trace": ".trace.json"}

_EPILOG = """\
examples:
  offload-lab export pinned.zip --format chrome-trace              # writes pinned.trace.json
  offload-lab export sim.zip --format chrome-trace --out sim.json.gz --force

RUN is a run saved by offload-lab profile / simulate or Run.save, or a torch.profiler trace
(.json, .json.gz). Open the file at https://ui.perfetto.dev or chrome://tracing."""


class ExportError(OffloadLabError, ValueError):
    """An export the command cannot do: a missing run, an output that exists, ..."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to ``subparsers`` (``ArgumentParser.add_subparsers()``).

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="offload-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["export", "run.zip", "--format", "chrome-trace"])
    >>> args.command, args.run, args.format, args.out, args.force
    ('export', 'run.zip', 'chrome-trace', None, False)
    """
    p = subparsers.add_parser(
        "export", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG,
        help="a saved run as a Chrome trace (Perfetto, chrome://tracing)",
        description="Write a saved run in a format other tools open.")
    p.add_argument("run", metavar="RUN", help="a saved run (RUN.zip) or a torch.profiler trace")
    p.add_argument("--format", required=True, choices=sorted(FORMATS),
                   help="chrome-trace: trace-event JSON for Perfetto and chrome://tracing")
    p.add_argument("--out", metavar="PATH",
                   help="output file (default: RUN with .trace.json; a .gz name is compressed)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(func="offload_lab.cli.export:run")
    return p


def default_out(run_path: str, fmt: str) -> Path:
    """Where ``export`` writes when ``--out`` is not given: beside RUN, with the format's suffix.

    >>> str(default_out("runs/pinned.zip", "chrome-trace"))
    'runs/pinned.trace.json'
    >>> str(default_out("trace.json.gz", "chrome-trace"))
    'trace.trace.json'
    """
    p = Path(run_path)
    stem = p.name
    for suffix in (".json.gz", ".json", ".zip"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return p.with_name(stem + FORMATS[fmt])


def _load(path: Path) -> Any:
    from offload_lab.record.run import Run

    if kind_of(path) != REGULAR:  # missing, a directory, or a FIFO that would never be read to the end
        raise ExportError(f"run {str(path)!r} is not a file; accepted: a RUN.zip written by "
                          f"offload-lab profile / simulate or Run.save, or a torch.profiler trace")
    if path.name.endswith((".json", ".json.gz")):
        from offload_lab.record.kineto import from_torch_profiler

        return from_torch_profiler(path)
    return Run.load(path)


def run(args: argparse.Namespace) -> int:
    """Carry out ``offload-lab export``; returns the exit status (0)."""
    src = Path(args.run)
    loaded = _load(src)  # the input first: a corrupt RUN is reported as such
    out = check_output(args.out if args.out else default_out(args.run, args.format), args.force,
                       inputs=[src], example=f"run{FORMATS[args.format]}")
    trace = loaded.to_chrome_trace(out)
    n = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
    kind = "simulated" if loaded.simulated else "measured"
    print(f"wrote {out.resolve()}: {n} intervals of {loaded.label!r} ({kind}); "
          f"open it at https://ui.perfetto.dev or chrome://tracing", flush=True)
    return 0
