"""The offload runtime: apply a plan to a live module, stream its layers, record a Run."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from offload_lab.record.run import Run
from offload_lab.record.runtime.backends import ISSUE_ORDERS
from offload_lab.record.runtime.manager import (
    BACKENDS,
    INIT_STRATEGIES,
    OffloadError,
    OffloadManager,
)

if TYPE_CHECKING:
    from offload_lab.planning.planner import Plan

__all__ = ["OffloadManager", "OffloadError", "offload", "profile", "BACKENDS", "INIT_STRATEGIES",
           "ISSUE_ORDERS"]


@contextlib.contextmanager
def offload(model: nn.Module, plan: Plan, backend: str = "auto", device: torch.device | str | None = None,
            init: str = "grouped", label: str | None = None,
            record_memory: bool = True, issue: str = "after-compute",
            stage_threads: int = 1) -> Iterator[OffloadManager]:
    """Run ``model`` under ``plan`` inside the block; leaving it restores the model exactly.

    ``backend="auto"`` picks ``cuda`` when a GPU is there, else ``cpu``. ``init`` is the group
    initialisation strategy (``"grouped"``: all groups offloaded, then non-layer weights moved
    once; ``"naive"``: each group offloaded then the whole model moved, in declared order).
    ``issue`` is when copies that block the host are issued: ``"after-compute"`` (behind the
    running block's kernels; the copy stream waits only for the compute that last read the
    buffer it fills) or ``"before-compute"`` (from the pre-hook, after the copy stream waits
    for all queued compute: what other runtimes do). ``stage_threads`` threads share each
    ``staged`` layer's host memcpy into its pinned staging buffer.

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
    manager = OffloadManager(model, plan, backend=backend, device=device, init=init, label=label,
                             record_memory=record_memory, issue=issue, stage_threads=stage_threads)
    with manager:
        yield manager


def profile(model: nn.Module, fn: Callable[[], Any], plan: Plan, steps: int = 3, warmup: int = 1,
            backend: str = "auto", device: torch.device | str | None = None, init: str = "grouped",
            label: str | None = None, progress: Callable[[int, int], None] | None = None,
            issue: str = "after-compute", stage_threads: int = 1) -> Run:
    """Call ``fn()`` once per step under the plan and return the measured :class:`Run`.

    The first ``warmup`` steps are run but dropped from the frames (``meta['warmup_dropped']``).
    The model is restored on return, on error and on Ctrl-C. ``progress(done, total)`` is
    called after each step; ``issue`` and ``stage_threads`` are :func:`offload`'s.

    >>> import offload_lab
    >>> from offload_lab import synthetic
    >>> model = synthetic.build(offload_lab.catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=4)
    >>> inputs = synthetic.example_inputs(model, tokens=64)
    >>> plan = offload_lab.plan(offload_lab.spec_of(model), tier="pinned", prefetch=1)
    >>> run = offload_lab.profile(model, lambda: model(**inputs), plan, steps=2, backend="cpu")
    >>> len(run.steps), run.meta["warmup_dropped"]
    (2, 1)
    """
    if not isinstance(steps, int) or steps < 1:
        raise OffloadError(f"steps {steps!r} must be an integer ≥ 1")
    if not isinstance(warmup, int) or warmup < 0:
        raise OffloadError(f"warmup {warmup!r} must be an integer ≥ 0")
    if not callable(fn):
        raise OffloadError(f"fn must be a callable taking no arguments, got {type(fn).__name__}")
    total = steps + warmup
    with offload(model, plan, backend=backend, device=device, init=init, label=label, issue=issue,
                 stage_threads=stage_threads) as m:
        with torch.no_grad():
            for k in range(total):
                with m.step():
                    fn()
                if progress is not None:
                    progress(k + 1, total)
        return m.build_run(warmup=warmup)
