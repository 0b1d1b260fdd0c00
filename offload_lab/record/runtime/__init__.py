"""The offload runtime: apply a plan to a live module, stream its layers, record a Run."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from offload_lab.checks import check_bool, check_int
from offload_lab.model.pipeline import is_pipeline
from offload_lab.planning.pipeline import PipelinePlan
from offload_lab.record.gather import gather as gather_runs
from offload_lab.record.run import Run
from offload_lab.record.runtime.backends import ISSUE_ORDERS
from offload_lab.record.runtime.manager import (
    BACKENDS,
    INIT_STRATEGIES,
    LayerHooks,
    OffloadError,
    OffloadManager,
)
from offload_lab.record.runtime.options import OffloadOptions, resolve_options
from offload_lab.record.runtime.pipeline import PipelineManager

if TYPE_CHECKING:
    from offload_lab.planning.planner import Plan

__all__ = ["OffloadManager", "OffloadError", "OffloadOptions", "LayerHooks", "offload", "profile", "cpu_threads",
           "BACKENDS", "INIT_STRATEGIES", "ISSUE_ORDERS"]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def cpu_threads(backend: str = "cpu") -> Iterator[int]:
    """Inside the block, torch's intra-op threads leave one core to the copy engine (cpu backend).

    By default OpenMP workers spin-wait for each other between parallel regions: with a
    thread per core, the copy-engine thread (or any other process) taking one of those cores
    stalls the whole team, and a step runs 5-50x slower than it does with
    ``OMP_WAIT_POLICY=PASSIVE``, which only takes effect when set before torch loads. So
    unless that policy was set, the block runs with ``min(current, cores - 1)`` threads (at
    least 1); with it, the threads are left as they are. The user's thread count is restored
    on leaving. Yields the thread count used. Other backends (``"cuda"``) change nothing;
    ``"auto"`` is the cpu backend when torch sees no GPU.

    >>> before = torch.get_num_threads()
    >>> with cpu_threads("cpu") as n:
    ...     n == torch.get_num_threads() >= 1
    True
    >>> torch.get_num_threads() == before
    True
    """
    before = torch.get_num_threads()
    cpu = backend == "cpu" or (backend == "auto" and not torch.cuda.is_available())
    passive = os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"
    n = before if not cpu or passive else min(before, max(1, _cores() - 1))
    if n == before:
        yield n
        return
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def offload(model: nn.Module, plan: Plan, backend: str = "auto", device: torch.device | str | None = None,
            init: str = "grouped", label: str | None = None,
            record_memory: bool = True, scheduler: Any = "auto", issue: str = "after-compute",
            stage_threads: int = 1, options: OffloadOptions | None = None) -> Iterator[OffloadManager]:
    """Run ``model`` under ``plan`` inside the block; leaving it restores the model exactly.

    ``model`` may be a diffusers pipeline with a :class:`~offload_lab.planning.pipeline.PipelinePlan`
    (one plan per component, one Run holding them all). Without ``m.step()`` markers, steps are
    found from the pipeline's ``scheduler.step`` or one per call (``run.meta["steps_from"]``);
    ``scheduler`` names the object whose ``step`` closes a step (``"auto"``: the scheduler of the
    diffusers pipeline that holds ``model``; ``None``: none).
    ``backend="auto"`` picks ``cuda`` when a GPU is there, else ``cpu``. ``init`` is the group
    initialisation strategy (``"grouped"``: all groups offloaded, then non-layer weights moved
    once; ``"naive"``: each group offloaded then the whole model moved, in declared order).
    ``issue`` is when copies that block the host are issued: ``"after-compute"`` (behind the
    running block's kernels; the copy stream waits only for the compute that last read the
    buffer it fills) or ``"before-compute"`` (from the pre-hook, after the copy stream waits
    for all queued compute: what other runtimes do). ``stage_threads`` threads share each
    ``staged`` layer's host memcpy into its pinned staging buffer. ``options`` is all of these
    as one :class:`~offload_lab.record.runtime.options.OffloadOptions` (then leave the keywords out).

    Leaving gives every parameter and buffer its original tensor back (same storage, offset,
    strides, values, dtype, device, ``requires_grad``). Calls from several threads are served
    one at a time; a backward through an offloaded layer raises :class:`OffloadError`.

    >>> import offload_lab
    >>> from offload_lab import synthetic
    >>> model = synthetic.build(offload_lab.catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=4)
    >>> plan = offload_lab.plan(offload_lab.spec_of(model), tier="pageable")
    >>> inputs = synthetic.example_inputs(model, tokens=64)
    >>> with offload_lab.offload(model, plan, backend="cpu") as m:
    ...     for _ in range(2):
    ...         with m.step():
    ...             _ = model(**inputs)
    >>> m.run.steps["bytes_moved"].tolist() == [plan.layers["bytes"].sum()] * 2
    True
    """
    opts = resolve_options(options, backend=backend, device=device, init=init, label=label,
                           record_memory=record_memory, scheduler=scheduler, issue=issue,
                           stage_threads=stage_threads)
    manager = _manager(model, plan, opts)
    with manager:
        yield manager


def _manager(model: Any, plan: Any, options: OffloadOptions) -> OffloadManager:
    """The manager for a module and a Plan, or for a diffusers pipeline and a PipelinePlan."""
    if is_pipeline(model) or isinstance(plan, PipelinePlan):
        if not is_pipeline(model):
            raise OffloadError(f"a PipelinePlan needs the diffusers pipeline it was made for, got "
                               f"{type(model).__name__}; for one component pass plan[name]")
        if not isinstance(plan, PipelinePlan):
            raise OffloadError(f"a pipeline needs a PipelinePlan (plan_pipeline(spec_of(pipe))), got "
                               f"{type(plan).__name__}; to offload one component pass pipe.<component>")
        return PipelineManager(model, plan, options=options)
    return OffloadManager(model, plan, options=options)


def profile(model: nn.Module, fn: Callable[[], Any], plan: Plan, steps: int = 3, warmup: int = 1,
            backend: str = "auto", device: torch.device | str | None = None, init: str = "grouped",
            label: str | None = None, progress: Callable[[int, int], None] | None = None,
            requests: int = 1, gather: bool = False, issue: str = "after-compute",
            stage_threads: int = 1, options: OffloadOptions | None = None) -> Run | None:
    """Call ``fn()`` once per step under the plan and return the measured :class:`Run`.

    The first ``warmup`` steps are run but dropped from the frames (``meta['warmup_dropped']``).
    The model is restored on return, on error and on Ctrl-C. ``progress(done, total)`` is
    called after each step. ``gather=True`` (under ``torch.distributed``: every rank calls it)
    returns all ranks' runs as one multi-rank Run on rank 0 and ``None`` on the others
    (:func:`offload_lab.gather`); when one rank raises, it tells the others, which raise
    :class:`~offload_lab.record.gather.GatherError` naming it.

    For a diffusers pipeline (``model``) and a :class:`~offload_lab.planning.pipeline.PipelinePlan`,
    ``fn()`` is one request (``lambda: pipe(**kw)``): it is called ``warmup`` times to warm up,
    then ``requests`` times; the steps are the pipeline's own (one per ``scheduler.step``), those
    of the warm-up requests dropped; ``steps`` is not used. ``progress`` counts requests.
    ``backend``, ``device``, ``init``, ``label``, ``issue`` and ``stage_threads`` (or ``options``)
    are :func:`offload`'s. On the cpu backend torch's threads are sized for the duration of the
    call (:func:`cpu_threads`) and restored after.

    >>> import offload_lab
    >>> from offload_lab import synthetic
    >>> model = synthetic.build(offload_lab.catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=4)
    >>> inputs = synthetic.example_inputs(model, tokens=64)
    >>> plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned", prefetch=1)
    >>> run = offload_lab.profile(model, lambda: model(**inputs), plan, steps=2, backend="cpu")
    >>> len(run.steps), run.meta["warmup_dropped"]
    (2, 1)
    """
    check_int("steps", steps, minimum=1, error=OffloadError)
    check_int("warmup", warmup, minimum=0, error=OffloadError)
    if not callable(fn):
        raise OffloadError(f"fn must be a callable taking no arguments, got {type(fn).__name__}")
    check_bool("gather", gather, error=OffloadError)
    opts = resolve_options(options, backend=backend, device=device, init=init, label=label, issue=issue,
                           stage_threads=stage_threads)
    if not gather:
        with cpu_threads(opts.backend):
            return _profile(model, fn, plan, steps, warmup, progress, requests, opts)
    try:
        with cpu_threads(opts.backend):
            run = _profile(model, fn, plan, steps, warmup, progress, requests, opts)
    except BaseException as e:
        gather_runs(None, failed=e)  # tell the other ranks before raising here
        raise
    return gather_runs(run)


def _profile(model: nn.Module, fn: Callable[[], Any], plan: Plan, steps: int, warmup: int,
             progress: Callable[[int, int], None] | None, requests: int, options: OffloadOptions) -> Run:
    if is_pipeline(model):
        return _profile_requests(model, fn, plan, requests, warmup, progress, options)
    total = steps + warmup
    with offload(model, plan, options=options) as m:
        with torch.no_grad():
            for k in range(total):
                with m.step():
                    fn()
                if progress is not None:
                    progress(k + 1, total)
        return m.build_run(warmup=warmup)


def _profile_requests(pipe: Any, fn: Callable[[], Any], plan: Any, requests: int, warmup: int,
                      progress: Callable[[int, int], None] | None, options: OffloadOptions) -> Run:
    """:func:`profile` of a pipeline: whole requests, steps from the pipeline's scheduler."""
    check_int("requests", requests, minimum=1, error=OffloadError)
    total = requests + warmup
    with offload(pipe, plan, options=options) as m:
        dropped = 0
        with torch.no_grad():
            for k in range(total):
                fn()
                if k + 1 == warmup:
                    dropped = len(m._group_steps()[0])
                if progress is not None:
                    progress(k + 1, total)
        run = m.build_run(warmup=dropped)
    run.meta["requests"] = requests
    run.meta["warmup_requests"] = warmup
    return run
