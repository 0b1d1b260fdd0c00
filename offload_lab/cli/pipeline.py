"""``offload-lab profile --pipeline DIR``: a local diffusers pipeline, one plan per component.

Everything that can be refused is refused before a weight is loaded or a file written: a
directory that is not a diffusers pipeline, an index naming a library or class offload-lab does
not load, custom code or files outside the directory
(:mod:`offload_lab.model.pipeline_index`), a pipeline with no layer group in any component, a
missing diffusers install. The pipeline is loaded with ``from_pretrained`` (its weights stay
on the files' pages with accelerate installed, so ``--tier mapped`` serves them from there),
run once per warm-up request and once measured, and the run saved (and ``--report``).

Every plan option of the single-model path applies to each component (``--resident``,
``--residency``, ``--order``, ``--staging``, ``--tier``, ``--prefetch``, ``--pin-budget``), as
does ``--issue``; ``--scale``, ``--layers`` and ``--tokens`` size a synthetic model and are
refused here in one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from offload_lab.cli.common import CliError, resolve_backend, say, set_threads
from offload_lab.cli.outputs import check_output, cleaned_up
from offload_lab.cli.progress import Progress
from offload_lab.cli.results import comparison_text
from offload_lab.model.load import spec_of
from offload_lab.model.pipeline import is_pipeline_dir, pipeline_spec_from_dir
from offload_lab.model.pipeline_index import check_pipeline_index
from offload_lab.planning.options import plan_kwargs
from offload_lab.planning.pipeline import plan_pipeline
from offload_lab.planning.planner import PlanWarning
from offload_lab.record.runtime import profile

__all__ = ["PROMPT", "check_pipeline_dir", "request_kwargs", "profile_pipeline"]

#: the prompt used when the pipeline has a text encoder (a fixed one: runs compare)
PROMPT = "a red fox running through fresh snow"


def check_pipeline_dir(path: str) -> Any:
    """The directory's :class:`~offload_lab.model.pipeline.PipelineSpec`, or a one-line CliError.

    >>> check_pipeline_dir("/nonexistent")
    Traceback (most recent call last):
    ...
    offload_lab.cli.common.CliError: --pipeline '/nonexistent' is not a directory; expected a diffusers pipeline directory (model_index.json and one folder per component)
    """
    root = Path(path)
    what = "a diffusers pipeline directory (model_index.json and one folder per component)"
    if not root.is_dir():
        raise CliError(f"--pipeline {str(root)!r} is not a directory; expected {what}")
    if not is_pipeline_dir(root):
        raise CliError(f"--pipeline {str(root)!r} has no model_index.json, so it is not a pipeline; "
                       f"expected {what}")
    ps = pipeline_spec_from_dir(root)
    if all(c.unit for c in ps.components.values()):
        raise CliError(f"no component of {str(root)!r} ({', '.join(ps.components)}) has a layer group "
                       f"(tensors named <list>.<i>.…, an nn.ModuleList of blocks): nothing to offload layer by layer")
    return ps


def _load(root: Path, names: dict[str, Any]) -> Any:
    if importlib.util.find_spec("diffusers") is None:
        raise CliError("--pipeline needs diffusers, transformers and accelerate: "
                       "pip install 'offload-lab[diffusers]'")
    index = check_pipeline_index(root)
    # components the directory lists without weights are passed as None, as diffusers asks
    absent = {n: None for n in index.absent}
    cls = index.pipeline_class()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # safetensors only: a pickle file beside them is never unpickled
        pipe = cls.from_pretrained(root, local_files_only=True, use_safetensors=True, **absent)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _text_width(pipe: Any) -> int:
    cfg = getattr(getattr(pipe, "transformer", None) or getattr(pipe, "unet", None), "config", {})
    for key in ("text_dim", "joint_attention_dim", "cross_attention_dim", "caption_channels"):
        v = cfg.get(key) if hasattr(cfg, "get") else None
        if isinstance(v, int):
            return v
    raise CliError("the pipeline has no text encoder and its denoiser's config names no text width "
                   "(text_dim, joint_attention_dim, cross_attention_dim); cannot make prompt embeddings")


def request_kwargs(pipe: Any, args: argparse.Namespace, seed: int = 0) -> dict[str, Any]:
    """One request's keyword arguments: the prompt, or seeded random prompt embeddings when the
    pipeline has no text encoder; size, steps and guidance from the options; tensors out."""
    kw: dict[str, Any] = dict(height=args.height, width=args.width, num_frames=args.frames,
                              num_inference_steps=args.steps or 4, guidance_scale=args.guidance,
                              output_type="pt", generator=torch.Generator().manual_seed(seed))
    if getattr(pipe, "text_encoder", None) is None:
        g = torch.Generator().manual_seed(seed)
        width = _text_width(pipe)
        kw["prompt_embeds"] = torch.randn(1, 12, width, generator=g)
        kw["negative_prompt_embeds"] = torch.randn(1, 12, width, generator=g)
    else:
        kw["prompt"] = PROMPT
    return kw


def profile_pipeline(args: argparse.Namespace) -> int:
    """The ``--pipeline`` path of ``offload-lab profile``."""
    if args.model is not None:
        raise CliError(f"give MODEL {args.model!r} or --pipeline DIR, not both")
    synthetic_only = [f"--{k}" for k in ("scale", "layers", "tokens") if getattr(args, k, None) is not None]
    if synthetic_only:
        raise CliError(f"{', '.join(synthetic_only)} size a synthetic model; a --pipeline runs its own "
                       f"weights (use --height, --width, --frames for the request's size)")
    check_pipeline_dir(args.pipeline)  # the input first, then the outputs
    out = check_output(args.out, args.force, inputs=[args.pipeline], suffix=".zip")
    report_out = (check_output(args.report, args.force, inputs=[args.pipeline], suffix=".html")
                  if getattr(args, "report", None) else None)
    backend = resolve_backend(args.backend)
    set_threads(backend, args.threads)
    t0 = time.perf_counter()
    pipe = _load(Path(args.pipeline), {})
    steps = args.steps or 4
    passes = 2 if args.guidance > 1 else 1
    ps = spec_of(pipe).with_uses(steps=steps, passes=passes)
    say(f"loaded {ps!r} in {time.perf_counter() - t0:.1f} s")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        pp = plan_pipeline(ps, host=args.host, **plan_kwargs(args))
    say(repr(pp))
    warm = args.warmup if args.warmup is not None else 1
    bar = Progress(1 + warm)
    bar.stage(f"profiling on {backend}")
    run = profile(pipe, lambda: pipe(**request_kwargs(pipe, args)), pp, warmup=warm, requests=1,
                  backend=backend, init=args.init, label=args.label, issue=args.issue,
                  progress=bar.steps(f"profiling on {backend}"))
    bar.close()
    with cleaned_up(out):
        path = run.save(out)
    say(f"{len(run.steps)} steps ({run.meta['steps_from']}), calls per step "
        f"{sorted(set(int(c) for c in run.steps['calls']))}")
    say(comparison_text([run]))
    say(f"saved {path.resolve()}")
    if report_out is not None:
        from offload_lab.views.report import report  # heavy: plotly, only with --report

        with cleaned_up(report_out):
            say(f"report {report(run).save(report_out).resolve()}")
    return 0
