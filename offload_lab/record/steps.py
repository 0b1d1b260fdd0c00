"""Calls and steps: how a recorder groups the forwards it saw into steps without loop edits.

A *call* is one top-level forward of a recorded module (nested forwards of the same module do
not count). Every call is recorded whether or not a step is open. Steps come from, in order:

1. ``explicit`` — the user's ``with m.step():`` blocks; the calls inside one are that step's;
2. ``scheduler`` — each ``scheduler.step(...)`` of the pipeline the module belongs to closes a
   denoising step: the calls since the previous one are that step's (classifier-free guidance
   makes 2);
3. ``calls`` — otherwise every call is its own step.

The grouping is decided when the run is built, from what was seen, so a run is never silently
empty: calls recorded outside any explicit step still become steps.

>>> seen = [Call(0, 0.0, 1.0, None, 0), Call(1, 1.0, 2.0, None, 0), Call(2, 2.5, 3.0, None, 1)]
>>> steps, how = group_calls(seen, explicit=[], ticks=[2.2])
>>> [(s.first, s.calls, s.start, s.end) for s in steps], how
([(0, [0, 1], 0.0, 2.2), (1, [2], 2.5, 3.0)], 'scheduler')
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field
from typing import Any

STEPS_FROM = ("explicit", "scheduler", "calls")


@dataclass
class Call:
    """One top-level forward: its id, start/end markers, explicit step (or None), tick epoch."""

    cid: int
    start: Any
    end: Any
    explicit: int | None
    epoch: int
    root: str = ""


@dataclass
class StepGroup:
    """One step of the run: its markers and the call ids in it, in order."""

    first: int
    calls: list[int] = field(default_factory=list)
    start: Any = None
    end: Any = None
    explicit: int | None = None
    epoch: int | None = None


def group_calls(calls: list[Call], explicit: list[dict], ticks: list[Any]) -> tuple[list[StepGroup], str]:
    """Steps (in time order) from the calls, the explicit step bounds and the scheduler ticks.

    ``explicit`` rows hold ``start``, ``end`` and ``before`` (calls started before the step
    opened); ``ticks[k]`` is the end marker of the k-th ``scheduler.step``. Returns the steps and
    how they were found (one of :data:`STEPS_FROM`: the strongest rule any step used).

    >>> group_calls([Call(0, 0.0, 1.0, None, 0), Call(1, 1.0, 2.0, None, 0)], [], [])[1]
    'calls'
    """
    steps: list[StepGroup] = []
    used: set[str] = set()
    by_explicit: dict[int, list[int]] = {}
    for c in calls:
        if c.explicit is not None:
            by_explicit.setdefault(c.explicit, []).append(c.cid)
    free = [c for c in calls if c.explicit is None]
    # explicit steps slot in before the first free call that started after they opened
    order: list[tuple[int, int, Any]] = [(b["before"], 0, k) for k, b in enumerate(explicit)]
    order += [(c.cid, 1, c) for c in free]
    order.sort(key=lambda t: (t[0], t[1]))
    open_group: StepGroup | None = None
    for _, kind, item in order:
        if kind == 0:
            open_group = None
            b = explicit[item]
            steps.append(StepGroup(len(steps), by_explicit.get(item, []), b["start"], b["end"], item))
            used.add("explicit")
            continue
        c: Call = item
        if ticks and open_group is not None and open_group.epoch == c.epoch:
            open_group.calls.append(c.cid)
            open_group.end = ticks[c.epoch] if c.epoch < len(ticks) else c.end
            continue
        g = StepGroup(len(steps), [c.cid], c.start, c.end)
        if ticks:
            g.epoch = c.epoch
            g.end = ticks[c.epoch] if c.epoch < len(ticks) else c.end
            used.add("scheduler")
        else:
            used.add("calls")
        steps.append(g)
        open_group = g
    how = next((s for s in STEPS_FROM if s in used), "calls" if not explicit else "explicit")
    return steps, how


# -- the pipeline a module belongs to, and its scheduler --------------------------------------------
def _is_pipeline(obj: Any) -> bool:
    return any(k.__name__ == "DiffusionPipeline" for k in type(obj).__mro__)


def owning_pipeline(module: Any) -> Any:
    """The diffusers pipeline that holds ``module`` as a component, or None.

    Only looked for when diffusers is imported (a pipeline cannot exist otherwise).

    >>> from torch import nn
    >>> owning_pipeline(nn.Linear(2, 2)) is None
    True
    """
    if _is_pipeline(module):
        return module
    if "diffusers" not in sys.modules:
        return None
    for ref in gc.get_referrers(module):
        if _is_pipeline(ref):
            return ref
        if isinstance(ref, dict):
            for owner in gc.get_referrers(ref):
                if _is_pipeline(owner) and getattr(owner, "__dict__", None) is ref:
                    return owner
    return None


def scheduler_of(target: Any) -> Any:
    """The scheduler object whose ``step`` closes a denoising step for ``target``, or None.

    ``target`` is a pipeline, a component of one, or a scheduler itself (anything with a
    callable ``step`` that is not a torch module).

    >>> from torch import nn
    >>> scheduler_of(nn.Linear(2, 2)) is None
    True
    """
    from torch import nn

    if target is None:
        return None
    if not isinstance(target, nn.Module) and not _is_pipeline(target) and callable(getattr(target, "step", None)):
        return target
    pipe = owning_pipeline(target)
    sched = getattr(pipe, "scheduler", None) if pipe is not None else None
    return sched if callable(getattr(sched, "step", None)) else None


class SchedulerWrap:
    """``scheduler.step`` wrapped on the instance while recording; :meth:`restore` undoes it.

    The class's method is never touched: the wrapper is an instance attribute, removed on
    restore (or the instance's own earlier attribute put back), so nothing global is left.
    """

    def __init__(self, scheduler: Any, on_step: Any):
        self.scheduler = scheduler
        self._had = "step" in vars(scheduler)
        self._prev = vars(scheduler).get("step")
        inner = scheduler.step

        def step(*args: Any, **kwargs: Any) -> Any:
            try:
                return inner(*args, **kwargs)
            finally:
                on_step()

        self._wrapper = step
        scheduler.step = step

    def restore(self) -> None:
        """Put ``scheduler.step`` back as it was (idempotent)."""
        d = vars(self.scheduler)
        if d.get("step") is not self._wrapper:
            return  # already restored, or someone wrapped after us and restores first
        if self._had:
            d["step"] = self._prev
        else:
            del d["step"]
