"""``offload-lab profile MODEL --out RUN.zip``: a measured run of a synthetic model under a plan
(``--pipeline DIR``: a local diffusers pipeline, :mod:`offload_lab.cli.pipeline`).

This command runs torch, so its module imports the runtime and the synthetic models at its top;
the parser names it by a string and imports it only when ``profile`` runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from offload_lab.cli import distributed
from offload_lab.cli.common import CPU_NOTE, CliError, one_line, resolve_backend, say, set_threads
from offload_lab.cli.inputs import is_checkpoint, make_plan, resolve_spec, resolve_tokens_arg
from offload_lab.cli.outputs import check_output, cleaned_up
from offload_lab.cli.pipeline import profile_pipeline
from offload_lab.cli.progress import Progress
from offload_lab.cli.results import comparison_text, write_report
from offload_lab.cli.sizing import Sizing, choose_size
from offload_lab.model import synthetic
from offload_lab.model.checkpoints import read_checkpoint
from offload_lab.record.runtime import profile

if TYPE_CHECKING:
    from torch import nn

__all__ = ["cmd_profile"]


def cmd_profile(args: argparse.Namespace) -> int:
    """``offload-lab profile MODEL --out RUN.zip``: a measured run of a synthetic model.

    Under ``torchrun --nproc-per-node N`` every rank profiles its own copy of the model under
    its share of the node's host memory, and rank 0 saves the gathered multi-rank run (and the
    ``--report``).

    >>> import tempfile, pathlib
    >>> from offload_lab.cli.app import build_parser
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "tiny.zip"
    >>> cmd_profile(build_parser().parse_args(["profile", "wan2.1-t2v-1.3b", "--scale", "0.02",
    ...     "--layers", "1", "--tokens", "16", "-n", "1", "--warmup", "0", "--backend", "cpu",
    ...     "--out", str(out)]))  # doctest: +ELLIPSIS
    sizing: ...
    saved ...tiny.zip
    0
    """
    if getattr(args, "pipeline", None) is not None:
        return profile_pipeline(args)
    if args.model is None:
        raise CliError("profile needs MODEL (a catalog name, spec JSON or synthetic checkpoint) or --pipeline DIR")
    # the inputs first (a corrupt MODEL is reported as such), then the outputs, then the work
    _check_profile_model(args)
    backend = resolve_backend(args.backend)
    out = check_output(args.out, args.force, inputs=[args.model], suffix=".zip")
    report_out = (check_output(args.report, args.force, inputs=[args.model], suffix=".html")
                  if getattr(args, "report", None) else None)
    ranks = distributed.launched()
    if ranks is None:
        return _profile_here(args, backend, out, report_out, None)
    with distributed.session(ranks, backend):
        return _profile_here(args, backend, out, report_out, ranks)


def _check_profile_model(args: argparse.Namespace) -> None:
    """Refuse a MODEL (or a ``--tokens`` it cannot read) before any output is looked at."""
    p = Path(args.model)
    if is_checkpoint(p):
        if args.scale is not None or args.layers is not None:
            raise CliError(f"--scale / --layers do not apply to a checkpoint ({args.model!r}); "
                           f"they size models built from a catalog name or spec JSON")
        read_checkpoint(p)  # the headers, as the load reads them; --tokens is read with the model
    else:
        spec, _ = resolve_spec(args.model)
        resolve_tokens_arg(spec, args.tokens)


def _build_for_profile(args: argparse.Namespace, backend: str) -> tuple[nn.Module, Sizing, str]:
    p = Path(args.model)
    if is_checkpoint(p):
        model = synthetic.load(p, mmap=True)
        n = {g: len(model.get_submodule(g)) for g in synthetic.spec_of(model).group_names}
        tokens = resolve_tokens_arg(synthetic.spec_of(model), args.tokens) or (8192 if backend == "cuda" else 256)
        size = Sizing(float(model.offload_spec_meta.get("scale", 1.0)), n, tokens,
                      64 if backend == "cpu" else 512, [f"checkpoint {str(p)!r}, memory-mapped"])
        return model, size, "loaded"
    spec, _ = resolve_spec(args.model)
    size = choose_size(spec, backend, scale=args.scale, layers=args.layers,
                       tokens=resolve_tokens_arg(spec, args.tokens))
    return synthetic.build(spec, scale=size.scale, layers=size.layers), size, "built"


def _profile_here(args: argparse.Namespace, backend: str, out: Path, report_out: Path | None,
                  ranks: Any) -> int:
    """Profile on this process (one rank of several when ``ranks`` is given); save on rank 0."""
    threads = set_threads(backend, args.threads)
    t0 = time.perf_counter()
    model, size, verb = _build_for_profile(args, backend)
    if threads:
        size.why.append(threads)
    for line in size.why:
        say(f"sizing: {line}")
    say(f"{verb} {size.describe()} in {time.perf_counter() - t0:.1f} s")
    if ranks is not None:
        say(f"ranks: {ranks.world_size} under torchrun; each plans against its share of the node's host memory")
    spec = synthetic.spec_of(model)
    p = make_plan(spec, args)
    say(f"plan: {p.summary()}")
    for w in p.warnings:
        say(f"warning: {one_line(w)}")
    steps = args.steps or 3
    device = ("cuda" if ranks is None else ranks.device) if backend == "cuda" else "cpu"
    inputs = synthetic.example_inputs(model, tokens=size.tokens, text_tokens=size.text_tokens, device=device)
    bar = Progress(steps + args.warmup)
    bar.stage(f"profiling on {backend}")
    run = profile(model, lambda: model(**inputs), p, steps=steps, warmup=args.warmup, backend=backend,
                  device=device if ranks is not None else None, init=args.init, label=args.label,
                  progress=bar.steps(f"profiling on {backend}"), gather=ranks is not None,
                  issue=args.issue)
    bar.close()
    if run is None:  # another rank than 0: rank 0 holds the gathered run
        return 0
    with cleaned_up(out):
        path = run.save(out)
    say(comparison_text([run]))
    if backend == "cpu":
        say(CPU_NOTE.format(here="", where=" (offload-lab simulate)"))
    say(f"saved {path.resolve()}")
    if report_out is not None:
        say(f"report {write_report([run], report_out, None, None).resolve()}")
    return 0
