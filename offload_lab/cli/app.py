"""The ``offload-lab`` command: ``demo``, ``plan``, ``profile``, ``simulate``, ``recommend``, ``report``, ``catalog``.

``offload-lab demo`` is the main job: it profiles a catalog model, scaled down to fit this
machine, under several plans (all pinned, all pageable, mapped from a safetensors checkpoint,
half the layers pinned) on CUDA when there is a GPU, else on the CPU backend; adds simulated runs
of the full-size model on reference device profiles; and writes one offline HTML report.

Bad input (an unknown model or device, a bad size or tier, a missing or corrupt file) ends with
exit status 2 and one line ``offload-lab: error: ...`` naming the value and what is accepted.
Only the library's own errors (:class:`~offload_lab.OffloadLabError`) and ``OSError`` are
turned into that line: anything else is a bug and keeps its traceback.

Output files follow one rule (:mod:`offload_lab.cli.outputs`): an existing file is overwritten
only with ``--force``, never when it is one of the command's inputs, and a directory, FIFO,
socket or device is never written to, ``--force`` or not. Inputs are read before outputs are
looked at.

This module holds the parser and :func:`main`. Each subcommand is a module of its own
(``plan_cmd``, ``profile_cmd``, ``simulate_cmd``, ``recommend``, ``report_cmd``, ``catalog_cmd``,
``export``, ``calibrate``, ``demo``) that imports what it needs at its top; the parser names it
by a ``"module:function"`` string and :func:`main` imports only the one that runs, so
``offload-lab --help`` answers at once and ``catalog`` never loads torch. This module imports
only light modules (:mod:`offload_lab.cli.common`, the plan options, the export registry):
app → command modules → :mod:`~offload_lab.cli.inputs` / :mod:`~offload_lab.cli.results` →
:mod:`~offload_lab.cli.common`, and nothing imports app.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from offload_lab import __version__
from offload_lab.cli.common import DEFAULT_REPORT, PROG, SIM_HOST, CliError, one_line
from offload_lab.cli.outputs import FORCE_HELP
from offload_lab.errors import OffloadLabError
from offload_lab.planning.options import (
    MAX_LAYERS,
    MAX_PASSES,
    STRATEGIES,
    OptionError,
    add_plan_arguments,
    add_run_arguments,
    argparse_type,
    parse_budget,
    parse_choice,
    parse_count,
    parse_tokens,
)
from offload_lab.views import exporters
from offload_lab.views.text import text_table
from offload_lab.vocabulary import BACKENDS, ENGINES

__all__ = ["main", "build_parser", "CliError", "text_table", "PROG"]

DEFAULT_MODEL = "wan2.1-t2v-1.3b"


# -- the parser ---------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``offload-lab: error: ...`` and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{PROG}: error: {one_line(message)} (see '{self.prog} --help')\n")
        sys.exit(2)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help columns wide enough for every subcommand name on one line.

    argparse measures a subcommand without the extra indent it prints it at, so the longest
    names (``recommend``, ``calibrate``) would sit alone with their help on the next line.
    """

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):
            longest = max((len(name) for name in action.choices), default=0)
            self._action_max_length = max(self._action_max_length,
                                          longest + self._current_indent + self._indent_increment)


def _scale_type(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = float("nan")
    if not 0 < s <= 1:
        raise argparse.ArgumentTypeError(f"scale {text!r} is not a number in (0, 1]; e.g. 0.25 "
                                         f"(widths × 0.25, bytes about × 1/16)")
    return s


def _count(what: str, lo: int, hi: int) -> object:
    return argparse_type(parse_count, what, what, lo, hi)


def _threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=_count("threads", 1, 1024), metavar="N",
                        help="torch intra-op threads on the cpu backend (default: every core)")


def _output(parser: argparse.ArgumentParser, help: str, **kwargs: object) -> None:
    """``--out`` and ``--force``: every command that writes follows the same overwrite rule."""
    parser.add_argument("--out", help=help, **kwargs)
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)


_EPILOGS = {
    "engines": """\
examples:
  offload-lab engines wan2.1-t2v-14b --device rtx4090-pcie4 --host-available 64GiB --device-memory 24GiB
  offload-lab engines wan2.1-t2v-1.3b --device h200 --host-available 64GiB --calls 2
  offload-lab engines wan2.1-t2v-14b --device rtx4090-pcie4 --engine diffusers-group --engine sglang-layerwise

Every step time is SIMULATED (offload-lab's simulator with the device profile); each engine's
settings are modelled as an offload-lab plan (offload_lab.engines.as_plan), its assumptions in
plan.params["engine"]["notes"]. "pinned" is what the engine's pins really lock on the host.""",
    "main": """\
examples:
  offload-lab demo
  offload-lab plan wan2.1-t2v-14b --pin-budget 8GiB --host 64GiB
  offload-lab simulate minimax-h3 --device h200 --tier pageable --out h3-pageable.zip
  offload-lab recommend wan2.1-t2v-14b --device rtx4090-pcie4 --host-available 64GiB --device-memory 24GiB
  offload-lab report runs/*.zip --out report.html

Sizes accept 8GiB, 512MiB, 1.5GB, 8e9. An output file that exists is overwritten only with
--force, and never when it is one of the command's inputs; a device, FIFO or directory is
never written to. Each command has --help.""",
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
  torchrun --nproc-per-node 4 -m offload_lab profile wan2.1-t2v-1.3b --out ranks.zip --report ranks.html

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
    "recommend": """\
examples:
  offload-lab recommend wan2.1-t2v-14b --device rtx4090-pcie4 --host-available 64GiB --device-memory 24GiB
  offload-lab recommend minimax-h3 --device h200 --host-available 128GiB --tokens 720p --calls 2
  offload-lab recommend wan2.1-t2v-14b --device rtx5090-pcie5 --host-available 32GiB --out rec.html

Searches resident count and pattern, prefetch depth, pin order, pin budget and forced tiers;
keeps the plans whose host memory and estimated device peak fit; step times are simulated on
the device profile. --device-memory defaults to the profile's memory size. Exit status 1 when
no plan fits.""",
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
    "export": """\
examples:
  offload-lab export pinned.zip --format chrome-trace              # writes pinned.trace.json
  offload-lab export sim.zip --format chrome-trace --out sim.json.gz --force
  offload-lab export sim.zip --format html                         # writes sim.html
  offload-lab export their_trace.json.gz --format zip              # a trace as a saved run

RUN is a run saved by offload-lab profile / simulate or Run.save, or a torch.profiler trace
(.json, .json.gz). Open a chrome-trace at https://ui.perfetto.dev or chrome://tracing.""",
    "calibrate": """\
examples:
  offload-lab calibrate --model wan2.1-t2v-14b --layers 4 --out my-gpu.json
  offload-lab calibrate --model wan2.1-t2v-1.3b --layers 4 --tokens 480p,1024 --out my-gpu.json
  offload-lab calibrate --model wan2.1-t2v-1.3b --layers 2 --scale 0.1 --tokens 16 --backend cpu --out cpu.json

Use the profile anywhere a device is named: offload-lab simulate MODEL --device my-gpu.json,
PlanExplorer(spec, profile=DeviceProfile.load("my-gpu.json")). On a GPU the default token
counts are the model's 480p and 1,024 (two counts fit the launch floor of a block); on the cpu
backend, the sized count only.""",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``offload-lab`` argument parser (subcommands demo, plan, profile, simulate, recommend, report,
    catalog, export, calibrate, engines).

    >>> args = build_parser().parse_args(["simulate", "minimax-h3", "--device", "h200", "-b", "8GiB"])
    >>> args.command, args.pin_budget == 8 * 2**30, args.force
    ('simulate', True, False)
    """
    fmt = _HelpFormatter
    parser = _Parser(prog=PROG, formatter_class=fmt, epilog=_EPILOGS["main"],
                     description="See, predict and tune layer-wise weight offload in diffusion-model inference.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    # the one list of commands: each subcommand's own help line, so it cannot drift from them
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, title="commands")
    _add_demo(sub, fmt)
    _add_plan(sub, fmt)
    _add_profile(sub, fmt)
    _add_simulate(sub, fmt)
    _add_recommend(sub, fmt)
    _add_report(sub, fmt)
    _add_catalog(sub, fmt)
    _add_export(sub, fmt)
    _add_calibrate(sub, fmt)
    _add_engines(sub, fmt)
    return parser


_MODEL_HELP = "catalog name, .safetensors file/dir/index, or spec JSON"
#: each subcommand's function, imported by ``main`` only when it runs (the module imports torch,
#: pandas or plotly as its command needs; the parser must not)
_FUNCS = {"demo": "offload_lab.cli.demo:cmd_demo", "engines": "offload_lab.cli.engines:run", "recommend": "offload_lab.cli.recommend:cmd_recommend",
          "export": "offload_lab.cli.export:run", "calibrate": "offload_lab.cli.calibrate:run",
          **{n: f"offload_lab.cli.{n}_cmd:cmd_{n}" for n in ("plan", "profile", "simulate", "report", "catalog")}}


def _command(sub: argparse._SubParsersAction, fmt: type, name: str, help: str,
             description: str) -> argparse.ArgumentParser:
    """A subcommand's parser; ``main`` imports its function only when it runs."""
    p = sub.add_parser(name, formatter_class=fmt, epilog=_EPILOGS[name], help=help,
                       description=description)
    p.set_defaults(func=_FUNCS[name])
    return p


def _model_command(sub: argparse._SubParsersAction, fmt: type, name: str, help: str,
                   description: str, model_help: str = _MODEL_HELP,
                   host_help: str = "default: probe this machine",
                   model_optional: bool = False) -> argparse.ArgumentParser:
    """A subcommand of a MODEL with the plan options."""
    p = _command(sub, fmt, name, help, description)
    p.add_argument("model", metavar="MODEL", help=model_help, nargs="?" if model_optional else None)
    add_plan_arguments(p, host_help=host_help)
    return p


def _add_demo(sub: argparse._SubParsersAction, fmt: type) -> None:
    p = _command(sub, fmt, "demo", "the main job: measured and simulated runs of a catalog model, one HTML report",
                 "Profile a catalog model, scaled to this machine, under all-pinned,\n"
                 "all-pageable, mapped and half-pinned plans; add simulated runs of\n"
                 "the full-size model; write one offline HTML report.")
    add_run_arguments(p, warmup_default=None)
    _threads(p)
    p.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME",
                   help=f"catalog model (default {DEFAULT_MODEL})")
    p.add_argument("--quick", action="store_true",
                   help="fewer layers, tokens and steps: a smoke test, not a measurement (15-30 s "
                        "on a 2-core CPU, torch's start-up included; longer on a busy machine)")
    p.add_argument("--save-runs", metavar="DIR", help="also save every run as DIR/<name>.zip")
    _output(p, f"report file (default {DEFAULT_REPORT})", default=DEFAULT_REPORT, metavar="PATH")


def _add_plan(sub: argparse._SubParsersAction, fmt: type) -> None:
    p = _model_command(sub, fmt, "plan", "where each layer would live, and why",
                       "Plan where each layer's weights live between uses: the per-layer\n"
                       "table with reasons, the budget ledger and warnings.")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (Plan.from_dict reads it)")


def _add_profile(sub: argparse._SubParsersAction, fmt: type) -> None:
    p = _model_command(sub, fmt, "profile", "measure a synthetic model (or a diffusers pipeline) under a plan",
                       "Run a synthetic model of MODEL under a plan and save the measured Run;\n"
                       "or, with --pipeline DIR, a local diffusers pipeline, one plan per component.",
                       model_help="catalog name, spec JSON, or a synthetic checkpoint (not with --pipeline)",
                       model_optional=True)
    add_run_arguments(p)
    _threads(p)
    p.add_argument("--scale", type=_scale_type, metavar="S", help="width scale in (0, 1] (default: chosen)")
    p.add_argument("--layers", type=_count("layers", 1, MAX_LAYERS), metavar="N",
                   help="layers per group (default: chosen)")
    p.add_argument("--tokens", type=argparse_type(parse_tokens, "tokens"), metavar="480p|N",
                   help="video tokens or a resolution (default: chosen for this machine)")
    p.add_argument("--init", type=argparse_type(parse_choice, "init", "init", STRATEGIES), default="grouped",
                   metavar="|".join(STRATEGIES), help="group initialisation strategy (default grouped)")
    p.add_argument("--label", help="run label (default: from the tiers)")
    p.add_argument("--report", metavar="PATH",
                   help="also write an HTML report of the run (under torchrun: rank 0 writes both)")
    g = p.add_argument_group("pipeline options (with --pipeline)")
    g.add_argument("--pipeline", metavar="DIR",
                   help="a diffusers-format directory (model_index.json, component folders); -n is its "
                        "denoising steps, --warmup its warm-up requests")
    for flag, what, dflt in (("--height", "frame height in pixels", 64), ("--width", "frame width in pixels", 64),
                             ("--frames", "frames of video", 5)):
        g.add_argument(flag, type=_count(flag[2:], 1, 4096), default=dflt, metavar="N",
                       help=f"{what} (default {dflt})")
    g.add_argument("--guidance", type=float, default=5.0, metavar="G",
                   help="guidance scale; above 1 the denoiser runs twice per step (default 5.0)")
    _output(p, "where to save the run", required=True, metavar="RUN.zip")


def _add_simulate(sub: argparse._SubParsersAction, fmt: type) -> None:
    p = _model_command(sub, fmt, "simulate", "predict a plan's timeline on a device profile",
                       "Simulate a plan of MODEL on a device profile; the run is labelled\n"
                       "simulated.", host_help=f"default: {SIM_HOST}, not this machine")
    add_run_arguments(p, backend=False, warmup_default=0)
    p.add_argument("--device", required=True, metavar="NAME|PATH",
                   help="device profile: a shipped name (offload-lab catalog --devices) or a JSON file")
    p.add_argument("--tokens", type=argparse_type(parse_tokens, "tokens"), metavar="480p|N",
                   help="video tokens or a resolution (default: the model's smallest, 480p)")
    p.add_argument("--passes", type=_count("passes", 1, MAX_PASSES), default=1, metavar="N",
                   help="forwards per step, e.g. 2 for classifier-free guidance (default 1)")
    p.add_argument("--ranks-per-node", type=_count("ranks-per-node", 1, 64), default=1, metavar="K",
                   help="K ranks of one node copying at once, each planned against 1/K of --host "
                        "(an estimate; default 1)")
    p.add_argument("--label", help="run label (shown with '(simulated)' after it)")
    _output(p, "where to save the run (default: print only)", metavar="RUN.zip")


def _add_recommend(sub: argparse._SubParsersAction, fmt: type) -> None:
    p = _command(sub, fmt, "recommend", "which plans fit a device and a host, and which is fastest",
                 "Search the plan space of MODEL with the simulator: keep the plans that fit\n"
                 "the host and the device, print the fastest, the Pareto front and why.")
    p.add_argument("model", metavar="MODEL", help=_MODEL_HELP)
    p.add_argument("--device", required=True, metavar="NAME|PATH",
                   help="device profile: a shipped name (offload-lab catalog --devices) or a JSON file")
    p.add_argument("--host-available", metavar="SIZE", default=SIM_HOST,
                   help=f"host memory available to the plan, e.g. 64GiB (default {SIM_HOST}, not this machine)")
    p.add_argument("--device-memory", metavar="SIZE",
                   help="device memory, e.g. 24GiB (default: the profile's memory size)")
    p.add_argument("-b", "--pin-budget", type=argparse_type(parse_budget, "pin budget"), metavar="SIZE",
                   help="most host memory to page-lock (default: everything the host can spend)")
    p.add_argument("--tokens", type=argparse_type(parse_tokens, "tokens"), metavar="480p|N",
                   help="video tokens or a resolution (default: the model's smallest, 480p)")
    p.add_argument("--calls", type=_count("calls", 1, MAX_PASSES), default=1, metavar="N",
                   help="forwards per step, e.g. 2 for classifier-free guidance (default 1)")
    p.add_argument("--tolerance", type=argparse_type(_parse_tolerance, "tolerance"), default=0.01, metavar="SHARE",
                   help="plans within this share of the fastest step keep the pace, e.g. 0.01 or 1%% "
                        "(default 0.01); among them the fewest pinned bytes, then the smallest device peak win")
    p.add_argument("--title", help="report title")
    _output(p, "write a report of the recommendation to PATH (default: print only)", metavar="PATH")


def _parse_tolerance(text: str) -> float:
    """``0.01`` or ``1%`` -> 0.01 (a share of the fastest step in [0, 1))."""
    t = str(text).strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise OptionError(f"tolerance {text!r} is not a number; accepted: a share in [0, 1) such as 0.01, "
                         f"or a percentage such as 1%") from None
    if not 0 <= v < 1:
        raise OptionError(f"tolerance {text!r} is outside [0, 1); accepted: e.g. 0.01 or 1%")
    return v


def _add_report(sub: argparse._SubParsersAction, fmt: type) -> None:
    p = _command(sub, fmt, "report", "an offline HTML report from saved runs",
                 "Write one self-contained HTML report from saved runs.")
    p.add_argument("runs", nargs="+", metavar="RUN.zip",
                   help="saved runs (or directories of them), or torch.profiler traces (.json, .json.gz)")
    p.add_argument("--title", help="report title")
    p.add_argument("--plan", metavar="PLAN.json", help="a plan (offload-lab plan --json) to show with the runs")
    _output(p, f"report file (default {DEFAULT_REPORT})", default=DEFAULT_REPORT, metavar="PATH")


def _add_catalog(sub: argparse._SubParsersAction, fmt: type) -> None:
    p = _command(sub, fmt, "catalog", "the shipped models and device profiles",
                 "List the shipped models (or one model's details) and device profiles.")
    p.add_argument("name", nargs="?", metavar="NAME", help="show one model's details")
    p.add_argument("--devices", action="store_true", help="list the device profiles")


def _add_export(sub: argparse._SubParsersAction, fmt: type) -> None:
    # the formats, their help and their suffixes are the registry's: one entry there is one here
    formats = [exporters.get(n) for n in exporters.names()]
    p = _command(sub, fmt, "export", "a saved run as a file other tools open (Perfetto, a browser, ...)",
                 "Write a saved run in a format other tools open.")
    p.add_argument("run", metavar="RUN", help="a saved run (RUN.zip) or a torch.profiler trace")
    p.add_argument("--format", required=True, choices=[e.name for e in formats],
                   help="; ".join(f"{e.name}: {e.description}" for e in formats))
    p.add_argument("--out", metavar="PATH",
                   help="output file (default: RUN with the format's suffix, "
                        + ", ".join(f"{e.suffix} for {e.name}" for e in formats)
                        + "; a chrome-trace named .gz is compressed)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)


def _positive(what: str, lo: int = 1) -> object:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < lo:
            raise argparse.ArgumentTypeError(f"--{what} {text!r}; accepted: an integer >= {lo}")
        return n
    return parse


def _calibrate_scale(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = float("nan")
    if not 0 < s <= 1:
        raise argparse.ArgumentTypeError(f"--scale {text!r}; accepted: a number in (0, 1]")
    return s



def _add_engines(sub: argparse._SubParsersAction, fmt: type) -> None:
    """``engines``' options (its work is :func:`offload_lab.cli.engines.run`).

    >>> a = build_parser().parse_args(["engines", "wan2.1-t2v-14b", "--device", "h200", "--calls", "2"])
    >>> a.command, a.device, a.calls, a.host_available
    ('engines', 'h200', 2, '256GiB')
    """
    p = _command(sub, fmt, "engines", "diffusers', SGLang's and offload-lab's offload settings simulated side by side",
                 "Simulate other engines' offload settings (diffusers group / model offload, SGLang's\n"
                 "layerwise offload) beside offload-lab's plans: one row per engine setting.")
    p.add_argument("model", metavar="MODEL", help="catalog name, .safetensors file/dir/index, or spec JSON")
    p.add_argument("--device", required=True, metavar="NAME|PATH",
                   help="device profile: a shipped name (offload-lab catalog --devices) or a JSON file")
    p.add_argument("--host-available", metavar="SIZE", default=SIM_HOST,
                   help=f"host memory available, e.g. 64GiB (default {SIM_HOST}, not this machine)")
    p.add_argument("--device-memory", metavar="SIZE", help="device memory, e.g. 24GiB (default: the profile's)")
    p.add_argument("--tokens", type=argparse_type(parse_tokens, "tokens"), metavar="480p|N",
                   help="video tokens or a resolution (default: the model's smallest, 480p)")
    p.add_argument("--calls", type=argparse_type(lambda t: parse_count(t, "calls", 1, MAX_PASSES), "calls"),
                   default=1, metavar="N", help="forwards per step, e.g. 2 for classifier-free guidance (default 1)")
    p.add_argument("--engine", action="append", choices=list(ENGINES), metavar="NAME",
                   help=f"only this engine (repeatable; default all: {', '.join(ENGINES)})")

def _add_calibrate(sub: argparse._SubParsersAction, fmt: type) -> None:
    """``calibrate``'s options (its work is :func:`offload_lab.cli.calibrate.run`).

    >>> a = build_parser().parse_args(["calibrate", "--model", "wan2.1-t2v-14b", "--out", "g.json"])
    >>> a.model, a.layers, a.tokens, a.force
    ('wan2.1-t2v-14b', 4, None, False)
    """
    p = _command(sub, fmt, "calibrate", "a device profile of this machine from a short run of a few layers",
                 "Profile a few layers of MODEL on this machine (all pinned and all pageable)\n"
                 "and fit a device profile that predicts the full model.")
    p.add_argument("--model", required=True, metavar="NAME", help="catalog model name (offload-lab catalog)")
    p.add_argument("--layers", type=_positive("layers"), default=4, metavar="N",
                   help="layers per group to run (default 4)")
    p.add_argument("--scale", type=_calibrate_scale, metavar="S",
                   help="width scale in (0, 1] (default: 1 on cuda, chosen to fit on cpu)")
    p.add_argument("--tokens", metavar="LIST",
                   help="comma-separated video token counts or resolutions (default: 480p,1024 on cuda)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="where to run (default: cuda when available)")
    p.add_argument("-n", "--steps", type=_positive("steps"), default=3, metavar="N",
                   help="measured steps per run (default 3)")
    p.add_argument("--warmup", type=_positive("warmup", 0), default=1, metavar="N",
                   help="warm-up steps dropped per run (default 1)")
    p.add_argument("--threads", type=_positive("threads"), metavar="N",
                   help="torch intra-op threads on the cpu backend (default: every core)")
    p.add_argument("--name", help="profile name (default: from the device)")
    p.add_argument("--save-runs", metavar="DIR", help="also save the measured short runs here")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="where to write the profile")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)


# -- entry point --------------------------------------------------------------------------------
def _os_message(e: OSError) -> str:
    if e.filename is not None:
        return f"cannot use {str(e.filename)!r}: {e.strerror or e}"
    return str(e)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``offload-lab`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Bad input returns 2 after one line on stderr.

    >>> main(["catalog", "no-such-model"])
    2
    """
    # OpenMP workers that spin-wait for each other stall a whole step (10-50×, seen on a busy
    # 2-core machine) when one of their cores is taken by the copy-engine thread or another
    # process; waiting passively keeps cpu-backend timings steady. It must be set before torch
    # loads OpenMP, and a user's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("no command given; choose one of demo, plan, profile, simulate, recommend, report, catalog, "
                     "export, calibrate, engines")
    try:
        module, _, name = args.func.partition(":")
        return int(getattr(importlib.import_module(module), name)(args) or 0)
    except KeyboardInterrupt:
        sys.stderr.write(f"\n{PROG}: interrupted\n")
        return 130
    except BrokenPipeError:
        # `offload-lab catalog | head`: the reader left; say nothing more
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stdout must stay open until exit
        return 0
    except OSError as e:
        sys.stderr.write(f"{PROG}: error: {one_line(_os_message(e))}\n")
        return 2
    except OffloadLabError as e:
        # bad input the library refused on purpose; a ValueError from numpy, torch or our own
        # arithmetic is a bug and keeps its traceback
        sys.stderr.write(f"{PROG}: error: {one_line(str(e))}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
