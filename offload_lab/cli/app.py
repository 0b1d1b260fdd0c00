"""The ``offload-lab`` command: ``demo``, ``plan``, ``profile``, ``simulate``, ``report``, ``catalog``.

``offload-lab demo`` is the main job: it profiles a catalog model, scaled down to fit this
machine, under several plans (all pinned, all pageable, mapped from a safetensors checkpoint,
half the layers pinned) on CUDA when there is a GPU, else on the CPU backend; adds simulated runs
of the full-size model on reference device profiles; and writes one offline HTML report.

Bad input (an unknown model or device, a bad size or tier, a missing or corrupt file) ends with
exit status 2 and one line ``offload-lab: error: ...`` naming the value and what is accepted.
Only the library's own errors (``ValueError`` subclasses defined in ``offload_lab``) and
``OSError`` are turned into that line: anything else is a bug and keeps its traceback.

This module imports nothing heavy at the top, so ``offload-lab --help`` answers at once; torch,
pandas and plotly are imported by the subcommands that need them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from offload_lab import __version__
from offload_lab.units import SizeError, format_bytes, parse_size

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

    from offload_lab.model.spec import ModelSpec
    from offload_lab.planning.planner import Plan
    from offload_lab.record.run import Run

__all__ = ["main", "build_parser", "CliError", "Progress", "Sizing", "choose_size", "resolve_spec",
           "text_table"]

PROG = "offload-lab"
DEFAULT_MODEL = "wan2.1-t2v-1.3b"
DEFAULT_REPORT = "offload-report.html"
#: the simulated runs of ``demo``: the full-size model on these shipped device profiles
DEMO_DEVICES = ("h200", "rtx4090-pcie4")
#: ``simulate`` plans for a hypothetical host of this size unless ``--host`` says otherwise: the
#: machine being simulated is not this one, so probing this machine's memory would mislead
SIM_HOST = "256GiB"
#: candidate width scales for the CPU demo, largest first
_CPU_SCALES = (1.0, 0.75, 0.5, 0.35, 0.25, 0.18, 0.125, 0.09, 0.0625)
_PROBE_BLOCK_BYTES = 24 * 2**20
_TIERS = ("pinned", "pageable", "mapped")
_ORDERS = ("execution", "reverse", "largest", "strided")
_CPU_NOTE = (
    "note: the cpu backend has no DMA engine and no page-locking: 'pinned' there only "
    "means the copy runs on a copy thread, overlapping compute when a core is free, while 'pageable' "
    "and 'mapped' copy on the calling thread; every copy is a memcpy through the same memory "
    "bandwidth. With compute on every core pinned and pageable take about the same time by nature, "
    "and a gap measured on a CPU{here} is thread overlap, not page-locking. The pinned-vs-pageable "
    "story is told by GPU runs and by the simulator{where}, each labelled for what it is."
)


class CliError(ValueError):
    """Command-line input the library could not check itself (a MODEL that is no model, ...)."""


# -- small formatting helpers (seconds, ratios, percentages: viz.fmt_*) --------------------------
def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def text_table(frame: pd.DataFrame, right: Sequence[str] = ()) -> str:
    """A frame as aligned plain text: columns left-aligned, those named in ``right`` right-aligned.

    >>> import pandas as pd
    >>> print(text_table(pd.DataFrame({"run": ["pinned", "pageable"], "step": ["1.03 s", "1.9 s"]}),
    ...                  right=("step",)))
    run         step
    pinned    1.03 s
    pageable   1.9 s
    """
    cols = [str(c) for c in frame.columns]
    cells = [[str(v) for v in row] for row in frame.itertuples(index=False)]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if c in right else v.ljust(w)
                         for v, w, c in zip(values, widths, cols)).rstrip()

    return "\n".join([line(cols)] + [line(r) for r in cells])


def _comparison_text(runs: Sequence[Run]) -> str:
    """The comparison of ``runs`` as a plain-text table (the table the magic and widgets show)."""
    from offload_lab.views.figures import comparison_frame

    return text_table(comparison_frame(runs),
                      right=("step", "ratio", "stall", "exposed copy", "overlap", "vs bound"))


# -- progress -----------------------------------------------------------------------------------
class Progress:
    """A plain-text progress bar on stderr.

    On a terminal the bar is redrawn in place; otherwise (a CI log, a pipe) one line is written
    per stage, so logs stay readable. Work is counted in units (e.g. one per profiled step).
    """

    width = 28

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = max(1, int(total))
        self.done = 0
        self.text = ""
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self._drawn = 0

    def _line(self) -> str:
        frac = min(1.0, self.done / self.total)
        fill = int(round(frac * self.width))
        bar = "#" * fill + "." * (self.width - fill)
        return f"[{bar}] {frac:4.0%} {time.perf_counter() - self.t0:6.1f}s  {self.text}"

    def _draw(self, newline: bool = False) -> None:
        line = self._line()
        if self.tty:
            # pad over the previous, possibly longer, line instead of relying on terminal codes
            pad = max(0, self._drawn - len(line))
            self.stream.write("\r" + line + " " * pad + ("\n" if newline else ""))
            self._drawn = 0 if newline else len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def stage(self, text: str) -> None:
        """Start a new stage of work, shown beside the bar."""
        self.text = text
        self._draw()

    def advance(self, n: int = 1, text: str | None = None) -> None:
        """Count ``n`` units as done (redrawn only on a terminal, to keep logs short)."""
        self.done += n
        if text is not None:
            self.text = text
        if self.tty:
            self._draw()

    def steps(self, name: str) -> Callable[[int, int], None]:
        """A ``progress(done, total)`` callback for :func:`offload_lab.profile`."""
        def callback(done: int, total: int) -> None:
            self.advance(1, f"{name}: step {done}/{total}")
        return callback

    def print(self, text: str = "") -> None:
        """Print ``text`` to stdout without tearing a bar drawn on the same terminal."""
        if self.tty and self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
            self._drawn = 0
        print(text, flush=True)
        if self.tty:
            self._draw()

    def close(self, text: str = "done") -> None:
        """Fill the bar and end its line."""
        self.done = self.total
        self.text = text
        self._draw(newline=True)


# -- argument types -----------------------------------------------------------------------------
def _size_type(what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return parse_size(text, what)
        except SizeError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = what  # argparse names the type in its messages
    return parse


def _int_type(lo: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is not an integer; expected an int ≥ {lo}") from None
        if n < lo:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is less than {lo}; expected an int ≥ {lo}")
        return n
    parse.__name__ = what
    return parse


def _scale_type(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = float("nan")
    if not 0 < s <= 1:
        raise argparse.ArgumentTypeError(f"scale {text!r} is not a number in (0, 1]; e.g. 0.25 "
                                         f"(widths × 0.25, bytes about × 1/16)")
    return s


def _tokens_type(text: str) -> int | str:
    """An int, or a resolution name that the spec resolves later (``480p``)."""
    t = text.strip()
    if t.isdigit():
        n = int(t)
        if n < 1:
            raise argparse.ArgumentTypeError(f"tokens {text!r} must be ≥ 1, or a resolution such as 480p")
        return n
    if not t:
        raise argparse.ArgumentTypeError("tokens '' is empty; expected an int or a resolution such as 480p")
    return t


def _id_list(text: str) -> list[int | str]:
    return [int(p) if p.isdigit() else p for p in (s.strip() for s in text.split(",")) if p]


def _resident_type(text: str) -> int | float | list[int | str]:
    t = text.strip()
    if "," in t or (t and not t.replace(".", "", 1).isdigit()):
        ids = _id_list(t)
        if not ids:
            raise argparse.ArgumentTypeError(f"resident {text!r} lists no layers")
        return ids
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"resident {text!r} is not a count (8), a fraction (0.5) or layer ids (0,1 or blocks.0)"
        ) from None


def _order_type(text: str) -> str | list[int | str]:
    t = text.strip()
    if t in _ORDERS:
        return t
    if "," in t or t.isdigit() or "." in t:
        return _id_list(t)
    raise argparse.ArgumentTypeError(
        f"order {text!r} is not one of {', '.join(_ORDERS)} or a comma-separated list of layer ids "
        f"such as 3,1,2 or blocks.3,blocks.1"
    )


# -- the parser ---------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``offload-lab: error: ...`` and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{PROG}: error: {_one_line(message)} (see '{self.prog} --help')\n")
        sys.exit(2)


def _plan_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("plan options")
    g.add_argument("--pin-budget", type=_size_type("pin budget"), metavar="SIZE",
                   help="most host memory to page-lock, e.g. 8GiB (default: all the host can spend)")
    g.add_argument("--host", type=_size_type("host"), metavar="SIZE",
                   help=f"plan for a hypothetical host with SIZE available, e.g. 64GiB "
                        f"(default: probe this machine; simulate: {SIM_HOST})")
    g.add_argument("--resident", type=_resident_type, default=0, metavar="N|FRACTION|IDS",
                   help="layers kept on the device: a count per group, a fraction such as 0.5, "
                        "or layer ids such as 0,1 or blocks.0,blocks.1 (default 0)")
    g.add_argument("--residency", choices=("leading", "strided"), default="leading",
                   help="which layers stay resident: the first ones or spread evenly (default leading)")
    g.add_argument("--order", type=_order_type, default="execution", metavar="POLICY|IDS",
                   help="who gets pins first: execution, reverse, largest, strided, or ids such as "
                        "3,1,2 (default execution)")
    g.add_argument("--prefetch", type=_int_type(0, "prefetch"), default=1, metavar="N",
                   help="streamed layers in flight ahead of the running one (default 1)")
    g.add_argument("--tier", choices=_TIERS,
                   help="force every streamed layer into one tier (default: the planner's choice)")
    return p


def _run_options(backend: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("run options")
    g.add_argument("--steps", type=_int_type(1, "steps"), metavar="N",
                   help="measured steps per run")
    if backend:
        g.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto",
                       help="cuda when a GPU is there, else cpu (default auto)")
        g.add_argument("--threads", type=_int_type(1, "threads"), metavar="N",
                       help="torch intra-op threads on the cpu backend (default: every core)")
    return p


_EPILOGS = {
    "main": f"""\
commands:
  demo       profile a scaled catalog model under four plans, add simulated full-size runs,
             write {DEFAULT_REPORT} (the main job; no arguments needed)
  plan       where each layer of a model would live, and why
  profile    run a synthetic model under a plan and save the measured run
  simulate   predict a plan's timeline on a device profile and save the simulated run
  report     one offline HTML report from saved runs
  catalog    the shipped models and device profiles

examples:
  offload-lab demo
  offload-lab plan wan2.1-t2v-14b --pin-budget 8GiB --host 64GiB
  offload-lab simulate minimax-h3 --device h200 --tier pageable --out h3-pageable.zip
  offload-lab report runs/*.zip --out report.html

Sizes accept 8GiB, 512MiB, 1.5GB, 8e9. Each command has --help.""",
    "demo": f"""\
examples:
  offload-lab demo                          # Wan2.1 T2V-1.3B, writes {DEFAULT_REPORT}
  offload-lab demo --quick --out /tmp/r.html
  offload-lab demo --model minimax-h3 --backend cpu --save-runs runs/

The measured runs use a synthetic model with the catalog model's architecture, scaled so each
profile takes a few seconds here (the choice and its reason are printed). On the cpu backend
pinned and pageable take about the same time by nature; the simulated full-size runs (and GPU
runs) show the difference.""",
    "plan": """\
examples:
  offload-lab plan wan2.1-t2v-14b --pin-budget 8GiB --host 64GiB
  offload-lab plan minimax-h3 --resident 35 --residency strided --host 128GiB
  offload-lab plan ckpt/model.safetensors.index.json --tier mapped --json > plan.json

MODEL is a catalog name (offload-lab catalog), a .safetensors file, a directory of them, a
*.safetensors.index.json, or a model spec JSON (ModelSpec.to_json).""",
    "profile": """\
examples:
  offload-lab profile wan2.1-t2v-1.3b --tier pinned --out pinned.zip
  offload-lab profile wan2.1-t2v-1.3b --scale 0.25 --layers 4 --tokens 256 --tier pageable --out pageable.zip
  offload-lab profile ckpt/model.safetensors --tier mapped --out mapped.zip

MODEL is a catalog name or a spec JSON (a synthetic model with its architecture is built, scaled
by --scale / --layers; chosen to take a few seconds per step here when not given), or a
checkpoint written by offload_lab.synthetic.save (loaded memory-mapped).""",
    "simulate": f"""\
examples:
  offload-lab simulate wan2.1-t2v-14b --device h200 --tier pinned --out pinned.zip
  offload-lab simulate wan2.1-t2v-14b --device rtx4090-pcie4 --pin-budget 8GiB --tokens 720p
  offload-lab simulate minimax-h3 --device profiles/mine.json --host 128GiB --out h3.zip

Plans for a hypothetical {SIM_HOST} host unless --host is given. Device profiles:
offload-lab catalog --devices.""",
    "report": f"""\
examples:
  offload-lab report pinned.zip pageable.zip
  offload-lab report runs/ --plan plan.json --title "pinned vs pageable" --out report.html
  offload-lab report ours.zip their_trace.json.gz --title "offload-lab vs their offload"

A .json / .json.gz argument is read as a torch.profiler (Kineto) trace.
Writes one self-contained HTML file (default {DEFAULT_REPORT}) that opens offline.""",
    "catalog": """\
examples:
  offload-lab catalog
  offload-lab catalog wan2.1-t2v-14b
  offload-lab catalog --devices""",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``offload-lab`` argument parser (subcommands demo, plan, profile, simulate, report, catalog)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog=PROG, formatter_class=fmt, epilog=_EPILOGS["main"],
                     description="See, predict and tune layer-wise weight offload in diffusion-model inference.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    plan_opts, run_opts = _plan_options(), _run_options()

    p = sub.add_parser("demo", formatter_class=fmt, epilog=_EPILOGS["demo"], parents=[run_opts],
                       help="the main job: measured and simulated runs of a catalog model, one HTML report",
                       description="Profile a catalog model, scaled to this machine, under all-pinned,\n"
                                   "all-pageable, mapped and half-pinned plans; add simulated runs of\n"
                                   "the full-size model; write one offline HTML report.")
    p.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME",
                   help=f"catalog model (default {DEFAULT_MODEL})")
    p.add_argument("--out", default=DEFAULT_REPORT, metavar="PATH",
                   help=f"report file (default {DEFAULT_REPORT})")
    p.add_argument("--quick", action="store_true",
                   help="fewer layers, tokens and steps (a smoke test; seconds, not a measurement)")
    p.add_argument("--save-runs", metavar="DIR", help="also save every run as DIR/<name>.zip")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("plan", formatter_class=fmt, epilog=_EPILOGS["plan"], parents=[plan_opts],
                       help="where each layer would live, and why",
                       description="Plan where each layer's weights live between uses: the per-layer\n"
                                   "table with reasons, the budget ledger and warnings.")
    p.add_argument("model", metavar="MODEL", help="catalog name, .safetensors file/dir/index, or spec JSON")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (Plan.from_dict reads it)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("profile", formatter_class=fmt, epilog=_EPILOGS["profile"],
                       parents=[plan_opts, run_opts], help="measure a synthetic model under a plan",
                       description="Run a synthetic model of MODEL under a plan and save the measured Run.")
    p.add_argument("model", metavar="MODEL", help="catalog name, spec JSON, or a synthetic checkpoint")
    p.add_argument("--warmup", type=_int_type(0, "warmup"), default=1, metavar="N",
                   help="steps run first and dropped (default 1)")
    p.add_argument("--scale", type=_scale_type, metavar="S", help="width scale in (0, 1] (default: chosen)")
    p.add_argument("--layers", type=_int_type(1, "layers"), metavar="N",
                   help="layers per group (default: chosen)")
    p.add_argument("--tokens", type=_int_type(1, "tokens"), metavar="N", help="video tokens (default: chosen)")
    p.add_argument("--init", choices=("grouped", "naive"), default="grouped",
                   help="group initialisation strategy (default grouped)")
    p.add_argument("--label", help="run label (default: from the tiers)")
    p.add_argument("--out", required=True, metavar="RUN.zip", help="where to save the run")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("simulate", formatter_class=fmt, epilog=_EPILOGS["simulate"],
                       parents=[plan_opts, _run_options(backend=False)],
                       help="predict a plan's timeline on a device profile",
                       description="Simulate a plan of MODEL on a device profile; the run is labelled\n"
                                   "simulated.")
    p.add_argument("model", metavar="MODEL", help="catalog name, .safetensors file/dir/index, or spec JSON")
    p.add_argument("--device", required=True, metavar="NAME|PATH",
                   help="device profile: a shipped name (offload-lab catalog --devices) or a JSON file")
    p.add_argument("--tokens", type=_tokens_type, metavar="480p|N",
                   help="video tokens or a resolution (default: the model's smallest, 480p)")
    p.add_argument("--passes", type=_int_type(1, "passes"), default=1, metavar="N",
                   help="forwards per step, e.g. 2 for classifier-free guidance (default 1)")
    p.add_argument("--warmup", type=_int_type(0, "warmup"), default=0, metavar="N",
                   help="steps simulated first and dropped (default 0)")
    p.add_argument("--label", help="run label (always ends with '(simulated)')")
    p.add_argument("--out", metavar="RUN.zip", help="where to save the run (default: print only)")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("report", formatter_class=fmt, epilog=_EPILOGS["report"],
                       help="an offline HTML report from saved runs",
                       description="Write one self-contained HTML report from saved runs.")
    p.add_argument("runs", nargs="+", metavar="RUN.zip",
                   help="saved runs (or directories of them), or torch.profiler traces (.json, .json.gz)")
    p.add_argument("--out", default=DEFAULT_REPORT, metavar="PATH", help=f"report file (default {DEFAULT_REPORT})")
    p.add_argument("--title", help="report title")
    p.add_argument("--plan", metavar="PLAN.json", help="a plan (offload-lab plan --json) to show with the runs")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("catalog", formatter_class=fmt, epilog=_EPILOGS["catalog"],
                       help="the shipped models and device profiles",
                       description="List the shipped models (or one model's details) and device profiles.")
    p.add_argument("name", nargs="?", metavar="NAME", help="show one model's details")
    p.add_argument("--devices", action="store_true", help="list the device profiles")
    p.set_defaults(func=cmd_catalog)
    return parser


# -- shared steps -------------------------------------------------------------------------------
def resolve_spec(text: str) -> tuple[ModelSpec, str]:
    """``(spec, kind)`` for a MODEL argument; kind is ``catalog``, ``safetensors`` or ``json``.

    >>> spec, kind = resolve_spec("Wan2.1-T2V-14B")
    >>> spec.name, kind
    ('wan2.1-t2v-14b', 'catalog')
    """
    from offload_lab.model import catalog
    from offload_lab.model.spec import ModelSpec, SpecError

    known = catalog.names()
    key = text.strip().lower().removesuffix(".json")
    p = Path(text)
    looks_like_path = p.exists() and (os.sep in text or p.suffix in (".json", ".safetensors") or p.is_dir())
    if key in known and not looks_like_path:
        return catalog.load(key), "catalog"
    accepted = (f"a catalog name ({', '.join(known)}), a .safetensors file, a directory of them, "
                f"a *.safetensors.index.json, or a model spec JSON")
    if not p.exists():
        raise CliError(f"MODEL {text!r} is not a catalog model nor an existing file; accepted: {accepted}")
    if p.is_dir() or p.name.endswith(".safetensors") or p.name.endswith(".index.json"):
        return ModelSpec.from_safetensors(p), "safetensors"
    if p.suffix == ".json":
        try:
            return ModelSpec.from_json(p), "json"
        except (SpecError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
            why = (f" ({e})" if isinstance(e, SpecError)
                   else " (not UTF-8 text)" if isinstance(e, UnicodeDecodeError) else "")
            raise CliError(f"MODEL {text!r} is not an offload-lab model spec JSON{why}; "
                           f"accepted: {accepted}") from None
    raise CliError(f"MODEL {text!r} is a file of an unknown kind; accepted: {accepted}")


def _make_plan(spec: ModelSpec, args: argparse.Namespace, host: Any = None, **overrides: Any) -> Plan:
    """plan() from the plan options; warnings are kept in ``Plan.warnings`` and printed by us."""
    from offload_lab.planning.hostmem import HostMemory
    from offload_lab.planning.planner import PlanWarning, plan

    if getattr(args, "host", None) is not None:
        host = HostMemory(available=args.host)
    kwargs = {"pin_budget": args.pin_budget, "resident": args.resident, "residency": args.residency,
              "order": args.order, "prefetch": args.prefetch, "tier": args.tier, "host": host}
    kwargs.update(overrides)
    with warnings.catch_warnings():
        # the CLI prints Plan.warnings itself, once and readably
        warnings.simplefilter("ignore", PlanWarning)
        return plan(spec, **kwargs)


def _host_line(p: Plan) -> str:
    h = p.host
    if h is None:
        return "host: unknown"
    what = "this machine (probed)" if h.source == "probe" else h.source
    return (f"host: {what}: {format_bytes(h.available)} available, reserve {format_bytes(h.reserve)}, "
            f"spendable {format_bytes(h.spendable)}")


def _resolve_backend(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise CliError("--backend 'cuda' was asked for but torch sees no CUDA device; accepted here: cpu or auto")
    return name


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _set_threads(backend: str, threads: int | None) -> str | None:
    """Fix torch's intra-op threads for the cpu backend; returns why, for the sizing notes."""
    if backend != "cpu":
        return None
    import torch

    n = threads or _cores()
    torch.set_num_threads(n)
    passive = os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
    return (f"{n} torch thread(s) on {_cores()} core(s)"
            + (", OpenMP workers wait passively so a core taken by the copy thread or another "
               "process slows a step instead of stalling it" if passive else ""))


def _say(text: str = "") -> None:
    print(text, flush=True)


# -- sizing the synthetic model -----------------------------------------------------------------
@dataclass
class Sizing:
    """How big a synthetic stand-in of a catalog model to build here, and why."""

    scale: float
    layers: dict[str, int]
    tokens: int
    text_tokens: int
    why: list[str] = field(default_factory=list)

    def describe(self) -> str:
        groups = ", ".join(f"{n} {g}" for g, n in self.layers.items())
        return (f"scale {self.scale:g} × {groups}, {self.tokens} video tokens, "
                f"{self.text_tokens} text tokens")


def _layer_counts(spec: ModelSpec, n: int | None) -> dict[str, int]:
    return {g.name: g.num_layers if n is None else min(g.num_layers, n) for g in spec.groups}


def _scaled_spec(spec: ModelSpec, scale: float, layers: dict[str, int]) -> ModelSpec:
    from offload_lab.model import synthetic

    # the meta device allocates nothing: shapes only, so trying many sizes is free
    return synthetic.spec_of(synthetic.build(spec, scale=scale, layers=layers, device="meta"))


def _time_forward(model: nn.Module, inputs: dict[str, Any], repeats: int = 2) -> float:
    import torch

    best = math.inf
    with torch.no_grad():
        model(**inputs)  # first call pays one-off costs (allocator, kernel selection)
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(**inputs)
            best = min(best, time.perf_counter() - t0)
    return best


def choose_size(spec: ModelSpec, backend: str, quick: bool = False, scale: float | None = None,
                layers: int | None = None, tokens: int | None = None) -> Sizing:
    """Pick a synthetic model size so that a profile takes a few seconds on this machine.

    ``cpu``: widths shrink (compute grows with width², and a 2-core CPU is ~1000× slower than a
    GPU) and depth is cut to 8 layers (4 with ``quick``); one block is timed at a small probe
    scale and FLOPs extrapolate to each candidate scale, the largest whose forward fits about
    1 s (0.2 s quick) is chosen. ``cuda``: full width (so each layer's copy-vs-compute balance
    is the real model's), depth cut only to what fits host and device memory comfortably.
    Explicit ``scale`` / ``layers`` / ``tokens`` are kept as given.
    """
    from offload_lab.model import flops, synthetic
    from offload_lab.planning.hostmem import HostMemory
    from offload_lab.views.figures import fmt_seconds

    biggest = max(layer.bytes for layer in spec.iter_layers())
    host = HostMemory.probe()
    why: list[str] = []
    full_layers = ", ".join(f"{g.num_layers} {g.name}" for g in spec.groups)
    why.append(f"the full model has {full_layers}: {format_bytes(spec.layer_bytes)} of layer weights "
               f"(largest layer {format_bytes(biggest)}); this host has {format_bytes(host.available)} available")
    if backend == "cuda":
        import torch

        tokens = tokens or (4096 if quick else 8192)
        text_tokens = int(spec.meta.get("text_tokens") or 512)
        free = torch.cuda.mem_get_info()[0]
        cap = min(host.available // 4, free // 4, 6 * 2**30)
        scale = scale or 1.0
        scaled_biggest = biggest * scale * scale
        if layers is None:
            n_fit = max(2, int(cap // max(1, scaled_biggest)))
            n = min(max(g.num_layers for g in spec.groups), n_fit, 12 if quick else 10**6)
        else:
            n = layers
        counts = _layer_counts(spec, n)
        why.append(f"cuda: full width keeps each layer's copy-vs-compute balance real; "
                   f"{sum(counts.values())} layers fit a cap of {format_bytes(cap)} "
                   f"(¼ of host and device memory, at most 6 GiB); {tokens} tokens make a layer's "
                   f"compute comparable to its pinned copy")
        return Sizing(scale, counts, tokens, text_tokens, why)

    n = layers or (4 if quick else 8)
    counts = _layer_counts(spec, n)
    tokens = tokens or (128 if quick else 256)
    text_tokens = 32 if quick else 64
    if scale is not None:
        why.append(f"scale {scale:g} as given")
        return Sizing(scale, counts, tokens, text_tokens, why)
    target = 0.2 if quick else 1.0
    probe_scale = round(min(0.5, math.sqrt(_PROBE_BLOCK_BYTES / biggest)), 3)
    probe = synthetic.build(spec, scale=probe_scale, layers=_layer_counts(spec, 1))
    inputs = synthetic.example_inputs(probe, tokens=tokens, text_tokens=text_tokens)
    t = _time_forward(probe, inputs)
    rate = flops.forward_flops(synthetic.spec_of(probe), tokens, text_tokens) / max(t, 1e-6)
    del probe, inputs
    why.append(f"cpu: one block at scale {probe_scale:g} took {fmt_seconds(t)} at "
               f"{tokens} tokens, about {rate / 1e9:.0f} GFLOP/s; the width scale is the largest whose "
               f"forward of {sum(counts.values())} layers should take ≤ {target:g} s")
    mem_cap = min(2**30, host.available // 12)
    chosen = None
    for c in _CPU_SCALES:
        s = _scaled_spec(spec, c, counts)
        est = flops.forward_flops(s, tokens, text_tokens) / rate
        if est <= target and s.layer_bytes <= mem_cap:
            chosen = (c, est, s.layer_bytes)
            break
    if chosen is None:
        c = _CPU_SCALES[-1]
        s = _scaled_spec(spec, c, counts)
        chosen = (c, flops.forward_flops(s, tokens, text_tokens) / rate, s.layer_bytes)
        why.append(f"even the smallest scale is slower than the target here (a busy machine?); using {c:g}")
    c, est, nbytes = chosen
    why.append(f"chose scale {c:g}: {format_bytes(nbytes)} of layer weights, a forward ≈ {fmt_seconds(est)}")
    return Sizing(c, counts, tokens, text_tokens, why)


# -- subcommands --------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace) -> int:
    """``offload-lab plan MODEL``: the plan table, ledger and warnings (or JSON)."""
    spec, kind = resolve_spec(args.model)
    p = _make_plan(spec, args)
    if args.json:
        d = p.to_dict()
        d["startup_peak"] = {s: p.startup_peak(s) for s in ("grouped", "naive")}
        print(json.dumps(d, indent=1, default=str))
        return 0
    groups = ", ".join(f"{g.name} ×{g.num_layers}" for g in spec.groups)
    _say(f"{spec.name} ({kind}): {groups}; {format_bytes(spec.layer_bytes)} of layer weights + "
         f"{format_bytes(spec.non_layer_bytes)} non-layer (always on the device)")
    _say(_host_line(p))
    _say()
    _say(text_table(p.table(), right=("layer", "size", "mapped", "pin rank")))
    _say()
    _say("ledger:")
    led = p.ledger
    for key in ("available", "reserve", "spendable", "budget", "pinned_bytes", "net_anonymous_bytes",
                "headroom"):
        if key in led:
            _say(f"  {key:<20} {format_bytes(led[key])}")
    _say(f"  {'fits':<20} {'yes' if led.get('fits') else 'NO'}")
    _say(f"init order: {', '.join(p.init_order)}; prefetch {p.prefetch}; startup peak on the device: "
         f"{format_bytes(p.startup_peak('grouped'))} grouped, {format_bytes(p.startup_peak('naive'))} naive")
    for w in p.warnings:
        _say(f"warning: {_one_line(w)}")
    _say(p.summary())
    return 0


def _build_for_profile(args: argparse.Namespace, backend: str) -> tuple[nn.Module, Sizing, str]:
    from offload_lab.model import synthetic

    p = Path(args.model)
    if p.exists() and (p.is_dir() or p.name.endswith((".safetensors", ".index.json"))):
        if args.scale is not None or args.layers is not None:
            raise CliError(f"--scale / --layers do not apply to a checkpoint ({args.model!r}); "
                           f"they size models built from a catalog name or spec JSON")
        model = synthetic.load(p, mmap=True)
        n = {g: len(model.get_submodule(g)) for g in synthetic.spec_of(model).group_names}
        tokens = args.tokens or (8192 if backend == "cuda" else 256)
        size = Sizing(float(model.offload_spec_meta.get("scale", 1.0)), n, tokens,
                      64 if backend == "cpu" else 512, [f"checkpoint {str(p)!r}, memory-mapped"])
        return model, size, "loaded"
    spec, _ = resolve_spec(args.model)
    size = choose_size(spec, backend, scale=args.scale, layers=args.layers, tokens=args.tokens)
    return synthetic.build(spec, scale=size.scale, layers=size.layers), size, "built"


def _writable(out: str | os.PathLike | None) -> None:
    """Refuse an output path that cannot be written before minutes of work, not after."""
    if out is None:
        return
    parent = Path(out).resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)  # saving would create it anyway
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise CliError(f"cannot write {str(out)!r}: {str(parent)!r} is not a writable directory "
                       f"({e.strerror or e})") from None


def cmd_profile(args: argparse.Namespace) -> int:
    """``offload-lab profile MODEL --out RUN.zip``: a measured run of a synthetic model."""
    from offload_lab.model import synthetic
    from offload_lab.record.runtime import profile

    _writable(args.out)

    backend = _resolve_backend(args.backend)
    threads = _set_threads(backend, args.threads)
    t0 = time.perf_counter()
    model, size, verb = _build_for_profile(args, backend)
    if threads:
        size.why.append(threads)
    for line in size.why:
        _say(f"sizing: {line}")
    _say(f"{verb} {size.describe()} in {time.perf_counter() - t0:.1f} s")
    spec = synthetic.spec_of(model)
    p = _make_plan(spec, args)
    _say(f"plan: {p.summary()}")
    for w in p.warnings:
        _say(f"warning: {_one_line(w)}")
    steps = args.steps or 3
    device = "cuda" if backend == "cuda" else "cpu"
    inputs = synthetic.example_inputs(model, tokens=size.tokens, text_tokens=size.text_tokens, device=device)
    bar = Progress(steps + args.warmup)
    bar.stage(f"profiling on {backend}")
    run = profile(model, lambda: model(**inputs), p, steps=steps, warmup=args.warmup, backend=backend,
                  init=args.init, label=args.label, progress=bar.steps(f"profiling on {backend}"))
    bar.close()
    path = run.save(args.out)
    _say(_comparison_text([run]))
    if backend == "cpu":
        _say(_CPU_NOTE.format(here="", where=" (offload-lab simulate)"))
    _say(f"saved {path.resolve()}")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    """``offload-lab simulate MODEL --device NAME``: a simulated run, labelled so."""
    from offload_lab.analysis import summary as analysis
    from offload_lab.simulation import DeviceProfile, simulate
    from offload_lab.views.figures import fmt_percent, fmt_ratio, fmt_seconds

    _writable(args.out)

    spec, _ = resolve_spec(args.model)
    profile = DeviceProfile.load(args.device)
    if args.tokens is None and not spec.meta.get("tokens"):
        raise CliError(f"MODEL {args.model!r} names no token count (only catalog specs do); "
                       f"pass --tokens N, e.g. --tokens 32760")
    if args.tokens is not None:
        from offload_lab.model.flops import resolve_tokens

        resolve_tokens(spec, args.tokens)  # a bad resolution fails before any output
    p = _make_plan(spec, args, host=SIM_HOST)
    _say(_host_line(p))
    _say(f"plan: {p.summary()}")
    for w in p.warnings:
        _say(f"warning: {_one_line(w)}")
    run = simulate(p, profile, steps=args.steps or 3, tokens=args.tokens, label=args.label,
                   warmup=args.warmup, passes=args.passes)
    m = analysis.metrics(run)
    kind = profile.provenance.get("kind", "estimated")
    _say(f"{run.label}: {fmt_seconds(m['step_s'])} per step (SIMULATED on the {kind} profile "
         f"{profile.name!r}, not measured)")
    _say(f"  stall {fmt_seconds(m['stall_s'])}, exposed copy {fmt_seconds(m['exposed_copy_s'])}, overlap "
         f"{fmt_percent(m['overlap'])}, {fmt_ratio(m['vs_bound'])} its {m['bound']['limit']}-bound of "
         f"{fmt_seconds(m['bound_s'])}")
    if args.out:
        _say(f"saved {run.save(args.out).resolve()}")
    return 0


def _load_runs(items: Sequence[str]) -> list[Run]:
    paths: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.zip"))
            if not found:
                raise CliError(f"directory {item!r} holds no saved runs (*.zip); accepted: RUN.zip files "
                               f"written by offload-lab profile / simulate or Run.save")
            paths += found
        elif not p.exists():
            raise CliError(f"run {item!r} does not exist; accepted: RUN.zip files written by "
                           f"offload-lab profile / simulate or Run.save, or directories of them")
        else:
            paths.append(p)
    return [_load_one(p) for p in paths]


def _load_one(path: Path) -> Run:
    """A saved run, or a torch.profiler / Kineto trace (read as a run of backend ``trace``)."""
    from offload_lab.record.run import Run

    if path.name.endswith((".json", ".json.gz")):
        from offload_lab.record.kineto import from_torch_profiler

        return from_torch_profiler(path)
    return Run.load(path)


def _write_report(runs: list[Run], out: str, plan: Plan | None, title: str | None) -> Path:
    from offload_lab.views.report import report

    try:
        return report(runs, plan=plan, title=title).save(out)
    except ImportError as e:
        # plotly is imported when the first figure is drawn; a GPU box may lack it
        if (e.name or "").split(".")[0] == "plotly":
            raise CliError("cannot write the report: plotly is not installed here "
                           "(pip install plotly)") from None
        raise


def cmd_report(args: argparse.Namespace) -> int:
    """``offload-lab report RUN.zip ...``: one offline HTML report."""
    _writable(args.out)
    runs = _load_runs(args.runs)
    plan = None
    if args.plan:
        from offload_lab.planning.planner import Plan, PlanError

        accepted = "accepted: the output of offload-lab plan MODEL --json"
        try:
            plan = Plan.from_json(Path(args.plan).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CliError(f"--plan {args.plan!r} is not JSON ({e}); {accepted}") from None
        except (PlanError, KeyError, TypeError) as e:
            why = str(e) if isinstance(e, PlanError) else "not an offload-lab plan"
            raise CliError(f"--plan {args.plan!r}: {why}; {accepted}") from None
    path = _write_report(runs, args.out, plan, args.title)
    _say(_comparison_text(runs))
    _say(f"report: {path.resolve()}")
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    """``offload-lab catalog [NAME] [--devices]``: the shipped models and device profiles."""
    from offload_lab import simulation as sim
    from offload_lab.model import catalog

    if args.devices:
        if args.name:
            raise CliError("catalog takes a model NAME or --devices, not both")
        # bandwidths are rates: GB/s in the header, plain numbers in the rows
        _say(f"{'device':<16} {'pinned':>8} {'pageable':>8} {'mapped':>8} {'TFLOP/s':>8}  compute  profile")
        _say(f"{'':<16} {'GB/s':>8} {'GB/s':>8} {'GB/s':>8}")
        nan = float("nan")
        for name in sim.names():
            d = sim.DeviceProfile.load(name)
            bw = d.bandwidths
            mapped = bw.get("mapped_warm", bw.get("mapped_cold", nan))
            tf = f"{d.tflops:.0f}" if d.tflops else "-"
            _say(f"{name:<16} {bw.get('pinned', nan):>8.1f} {bw.get('pageable', nan):>8.1f} {mapped:>8.1f} "
                 f"{tf:>8}  {d.compute_mode:<7}  {d.provenance.get('kind')}: {d.provenance.get('machine', '')}")
        _say("bandwidths in GB/s (1e9 bytes/s), host to device; use with offload-lab simulate MODEL --device NAME")
        return 0
    if args.name:
        return _catalog_details(catalog.load(args.name))
    rows = []
    for name in catalog.names():
        s = catalog.load(name)
        rows.append((name, str(s.meta.get("display_name", "")),
                     ", ".join(f"{g.name} ×{g.num_layers}" for g in s.groups),
                     str(sum(g.num_layers for g in s.groups)), format_bytes(s.layer_bytes),
                     format_bytes(s.total_bytes)))
    head = ("name", "model", "groups", "layers", "layer bytes", "total")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        _say("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    _say(f"device profiles: {', '.join(sim.names())} (offload-lab catalog --devices)")
    return 0


def _catalog_details(spec: ModelSpec) -> int:
    from offload_lab.model import flops

    meta = spec.meta
    _say(f"{spec.name}: {meta.get('display_name', spec.name)} (arch {meta.get('arch', '?')})")
    for g in spec.groups:
        sizes = sorted({layer.bytes for layer in g.layers})
        each = format_bytes(sizes[0]) if len(sizes) == 1 else f"{format_bytes(sizes[0])}–{format_bytes(sizes[-1])}"
        _say(f"  group {g.name}: {g.num_layers} layers × {each} ({g.block_class or 'block'}), "
             f"{format_bytes(g.bytes)}")
    dtypes = sorted({t.dtype for t in spec.tensors()})
    _say(f"  layer weights {format_bytes(spec.layer_bytes)}, non-layer {format_bytes(spec.non_layer_bytes)}, "
         f"total {format_bytes(spec.total_bytes)}; checkpoint views (mapped) {format_bytes(spec.mapped_bytes)}; "
         f"dtypes {', '.join(dtypes)}")
    tokens = meta.get("tokens") or {}
    if tokens:
        _say(f"  tokens: {', '.join(f'{k} {v:,}' for k, v in tokens.items())}; text tokens "
             f"{meta.get('text_tokens', '-')}; default {meta.get('default_steps', '-')} steps × "
             f"{meta.get('guidance_passes', 1)} guidance passes")
        res = min(tokens, key=tokens.get)
        try:
            per = {g.name: flops.layer_flops(spec, g.name, res) for g in spec.groups}
            _say(f"  FLOPs per layer forward at {res}: "
                 + ", ".join(f"{g} {v / 1e12:.2f} TFLOP" for g, v in per.items())
                 + f"; per step {flops.step_flops(spec, res) / 1e15:.2f} PFLOP")
        except ValueError:
            pass  # a spec the FLOPs model cannot read still lists its bytes
    dims = meta.get("dims") or {}
    if dims:
        _say("  dims: " + ", ".join(f"{k} {v}" for k, v in dims.items() if not isinstance(v, dict)))
    _say(f"try: offload-lab plan {spec.name} --pin-budget 8GiB  |  offload-lab simulate {spec.name} --device h200")
    return 0


# -- demo ---------------------------------------------------------------------------------------
@dataclass
class _Job:
    """One measured run of the demo: its label and plan, and the model it runs."""

    key: str
    label: str
    plan: Plan
    model: Any


def _shipped_gpu_runs(model: str) -> list[Run]:
    """Measured GPU runs of ``model`` shipped in the source tree (``data/runs``), 480p ones only.

    Absent from an installed wheel; the demo then simply has none to show.
    """
    from offload_lab.record.run import Run

    root = Path(__file__).resolve().parents[1] / "data" / "runs"
    out = []
    for p in sorted(root.glob("*/[0-9]*.zip")):
        try:
            r = Run.load(p)
        except ValueError:
            continue
        gc = r.meta.get("gpu_check", {})
        if r.meta.get("model") == model and r.backend == "cuda" and gc.get("tokens") == 32760:
            out.append(r)
    return out


def cmd_demo(args: argparse.Namespace) -> int:
    """``offload-lab demo``: measured runs of a scaled model, simulated full-size runs, one report."""
    _writable(args.out)
    t_start = time.perf_counter()
    import torch

    from offload_lab.model import catalog, synthetic
    from offload_lab.planning.hostmem import HostMemory
    from offload_lab.record.runtime import profile
    from offload_lab.simulation import DeviceProfile, simulate

    spec = catalog.load(args.model)
    backend = _resolve_backend(args.backend)
    why_backend = {"cuda": "a CUDA device is present", "cpu": "no CUDA device"}[backend] \
        if args.backend == "auto" else "as asked"
    name = spec.meta.get("display_name", spec.name)
    _say(f"offload-lab demo: {name} ({spec.name}) on the {backend} backend ({why_backend})")
    profiles = [DeviceProfile.load(d) for d in DEMO_DEVICES]  # fail early on a broken install
    quick = args.quick
    steps = args.steps or ((3 if quick else 5) if backend == "cuda" else (2 if quick else 3))
    warmup = 1 if (quick or backend == "cpu") else 2
    sim_steps = 2 if quick else 3
    n_jobs = 4
    bar = Progress(1 + n_jobs * (steps + warmup) + 2 + 1 + 2 * len(profiles) + 2)
    bar.stage("sizing the model for this machine")
    threads = _set_threads(backend, args.threads)
    size = choose_size(spec, backend, quick=quick)
    if threads:
        size.why.insert(1, threads)
    bar.advance(1)
    for line in size.why:
        bar.print(f"  sizing: {line}")
    bar.stage("building the synthetic model")
    model = synthetic.build(spec, scale=size.scale, layers=size.layers)
    sspec = synthetic.spec_of(model)
    device = "cuda" if backend == "cuda" else "cpu"
    inputs = synthetic.example_inputs(model, tokens=size.tokens, text_tokens=size.text_tokens, device=device)
    bar.advance(2)
    streamed = int(sspec.layer_bytes)
    with warnings.catch_warnings():
        from offload_lab.planning.planner import PlanWarning, plan

        warnings.simplefilter("ignore", PlanWarning)
        plans = {
            "pinned": plan(sspec, tier="pinned"),
            "pageable": plan(sspec, tier="pageable"),
            "partial": plan(sspec, pin_budget=streamed // 2),
        }
    pin_half = format_bytes(streamed // 2)
    jobs = [
        _Job("pinned", f"{backend}: all pinned", plans["pinned"], model),
        _Job("pageable", f"{backend}: all pageable", plans["pageable"], model),
    ]
    runs: dict[str, Run] = {}
    with tempfile.TemporaryDirectory(prefix="offload-lab-demo-") as tmp:
        bar.stage("saving a safetensors checkpoint for the mapped run")
        ckpt = synthetic.save(model, Path(tmp) / "model.safetensors")
        mapped_model = synthetic.load(ckpt, mmap=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlanWarning)
            mplan = plan(synthetic.spec_of(mapped_model), tier="mapped")
        bar.advance(1)
        jobs += [
            _Job("mapped", f"{backend}: mapped (mmap'd safetensors)", mplan, mapped_model),
            _Job("partial", f"{backend}: half pinned ({pin_half} budget)", plans["partial"], model),
        ]
        for job in jobs:
            bar.stage(f"profiling {job.label}")
            m = job.model
            runs[job.key] = profile(m, lambda m=m: m(**inputs), job.plan, steps=steps, warmup=warmup,
                                    backend=backend, label=job.label, progress=bar.steps(job.label))
        for job in jobs:
            job.model = None
        del mapped_model, m  # drop every view of the file before the directory goes
    del model
    if backend == "cuda":
        torch.cuda.empty_cache()

    bar.stage(f"simulating the full-size {name}")
    host = HostMemory(available=SIM_HOST)
    sim_runs: list[Run] = []
    for prof in profiles:
        for tier in ("pinned", "pageable"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PlanWarning)
                p = plan(spec, tier=tier, host=host)
            sim_runs.append(simulate(p, prof, steps=sim_steps,
                                     label=f"{prof.name}: all {tier}, full-size {spec.name}"))
            bar.advance(1)

    measured = [runs[j.key] for j in jobs]
    gpu_runs = _shipped_gpu_runs(spec.name)
    all_runs = measured + gpu_runs + sim_runs
    if args.save_runs:
        _save_runs(all_runs, Path(args.save_runs))
    bar.stage("writing the report")
    failed: CliError | None = None
    try:
        path = _write_report(all_runs, args.out, plans["partial"],
                             f"offload-lab demo: {name}, {backend} runs and simulated full-size runs")
    except CliError as e:
        # keep what was measured: print it and save the runs, then report the failure
        failed = e
    bar.close("report failed" if failed else f"done in {time.perf_counter() - t_start:.1f} s")

    _say()
    _say(f"measured on {backend} — synthetic {name}, {size.describe()}, {steps} steps after "
         f"{warmup} warm-up:")
    _say(_comparison_text(measured))
    if gpu_runs:
        _say()
        _say(f"MEASURED on {gpu_runs[0].meta.get('device_name', 'a GPU')} (shipped runs under data/runs, "
             f"scripts/gpu_check.py) — full-width synthetic {name}:")
        _say(_comparison_text(gpu_runs))
    for prof in profiles:
        group = [r for r in sim_runs if r.meta.get("profile", {}).get("name") == prof.name]
        _say()
        _say(f"SIMULATED on {prof.name} ({prof.provenance.get('kind', 'estimated')} profile) — "
             f"full-size {name}, {format_bytes(spec.layer_bytes)} of layer weights, one forward per step:")
        _say(_comparison_text(group))
    _say()
    if backend == "cpu":
        gap = runs["pageable"].step_time / runs["pinned"].step_time
        here = f" (here all pageable took {gap:.2f}× the all-pinned step)" if math.isfinite(gap) else ""
        _say(_CPU_NOTE.format(here=here, where="'s runs above"))
    if args.save_runs:
        _say(f"runs: {Path(args.save_runs).resolve()}")
    if failed is not None:
        saved = Path(args.save_runs) if args.save_runs else Path(args.out).with_suffix(".runs")
        if not args.save_runs:
            _save_runs(all_runs, saved)
            _say(f"runs: {saved.resolve()}")
        _say(f"build the report where plotly is installed: offload-lab report {saved.resolve()}")
        raise failed
    _say(f"report: {path.resolve()}")
    _say(f"total {time.perf_counter() - t_start:.1f} s")
    return 0


def _save_runs(runs: list[Run], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(runs):
        r.save(directory / f"{i:02d}-{_slug(r.label)}.zip")


def _slug(text: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in text.lower())
    return "-".join(p for p in out.split("-") if p)[:60]


# -- entry point --------------------------------------------------------------------------------
def _is_library_error(e: BaseException) -> bool:
    # a ValueError raised *by offload-lab* is bad input, reported in one line; one from numpy,
    # torch or our own arithmetic is a bug and must keep its traceback
    return any(c.__module__.split(".")[0] == "offload_lab" for c in type(e).__mro__
               if issubclass(c, ValueError))


def _os_message(e: OSError) -> str:
    if e.filename is not None:
        return f"cannot use {str(e.filename)!r}: {e.strerror or e}"
    return str(e)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``offload-lab`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    # OpenMP workers that spin-wait for each other stall a whole step (10-50×, seen on a busy
    # 2-core machine) when one of their cores is taken by the copy-engine thread or another
    # process; waiting passively keeps cpu-backend timings steady. It must be set before torch
    # loads OpenMP, and a user's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("no command given; choose one of demo, plan, profile, simulate, report, catalog")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        sys.stderr.write(f"\n{PROG}: interrupted\n")
        return 130
    except BrokenPipeError:
        # `offload-lab catalog | head`: the reader left; say nothing more
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stdout must stay open until exit
        return 0
    except OSError as e:
        sys.stderr.write(f"{PROG}: error: {_one_line(_os_message(e))}\n")
        return 2
    except ValueError as e:
        if not _is_library_error(e):
            raise
        sys.stderr.write(f"{PROG}: error: {_one_line(str(e))}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
