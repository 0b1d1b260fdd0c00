"""The runtime's options: one frozen, validated object built once and handed down.

:func:`~offload_lab.record.runtime.profile`, :func:`~offload_lab.record.runtime.offload` and
:class:`~offload_lab.record.runtime.OffloadManager` take either these keywords or
``options=OffloadOptions(...)``; the keywords are checked here, in one place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from offload_lab import vocabulary
from offload_lab.checks import check_bool, check_choice, check_int
from offload_lab.errors import OffloadLabError

__all__ = ["OffloadError", "OffloadOptions", "MAX_STAGE_THREADS", "plan_label", "resolve_options"]

MAX_STAGE_THREADS = 64


class OffloadError(OffloadLabError, ValueError):
    """A model, plan, option or backend the manager cannot work with."""


@dataclass(frozen=True)
class OffloadOptions:
    """How the runtime runs a plan (see :func:`~offload_lab.record.runtime.offload`).

    >>> OffloadOptions(backend="cpu", stage_threads=2).stage_threads
    2
    >>> try:
    ...     OffloadOptions(issue="sometime")
    ... except OffloadError as e:
    ...     print(e)
    issue 'sometime' is not one of 'after-compute', 'before-compute'
    """

    backend: str = "auto"
    device: torch.device | str | None = None
    init: str = "grouped"
    label: str | None = None
    record_memory: bool = True
    #: ``"auto"``: the scheduler of the diffusers pipeline holding the model; None: none; or an object
    scheduler: Any = "auto"
    issue: str = "after-compute"
    stage_threads: int = 1

    def __post_init__(self) -> None:
        check_choice("backend", self.backend, vocabulary.BACKENDS, error=OffloadError)
        if self.device is not None and not isinstance(self.device, (str, torch.device)):
            raise OffloadError(f"device {self.device!r} is not a torch device; accepted: None, 'cpu', "
                               f"'cuda', 'cuda:1', or a torch.device")
        check_choice("init", self.init, vocabulary.INIT_STRATEGIES, error=OffloadError)
        if self.label is not None and not isinstance(self.label, str):
            raise OffloadError(f"label {self.label!r} is not a string; accepted: None or a str")
        check_bool("record_memory", self.record_memory, error=OffloadError)
        check_choice("issue", self.issue, vocabulary.ISSUE_ORDERS, error=OffloadError)
        check_int("stage_threads", self.stage_threads, minimum=1, maximum=MAX_STAGE_THREADS, error=OffloadError)

    def replace(self, **changes: Any) -> OffloadOptions:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)


_DEFAULTS = OffloadOptions()
FIELDS = tuple(f.name for f in dataclasses.fields(OffloadOptions))


def resolve_options(options: OffloadOptions | None, **keywords: Any) -> OffloadOptions:
    """``options``, or an :class:`OffloadOptions` of ``keywords``; both at once is refused
    unless every keyword is left at its default."""
    if options is None:
        return OffloadOptions(**keywords)
    if not isinstance(options, OffloadOptions):
        raise OffloadError(f"options must be an OffloadOptions, got {type(options).__name__}")
    given = sorted(k for k, v in keywords.items() if v is not getattr(_DEFAULTS, k) and v != getattr(_DEFAULTS, k))
    if given:
        raise OffloadError(f"pass the runtime options either as options=OffloadOptions(...) or as keywords, "
                           f"not both: {', '.join(given)} given beside options")
    return options


def plan_label(layers: pd.DataFrame, prefetch: int) -> str:
    """A run's default label: ``"20 pinned, 10 pageable, prefetch 1"``.

    >>> plan_label(pd.DataFrame({"tier": ["pinned", "pageable", "pinned"]}), 1)
    '2 pinned, 1 pageable, prefetch 1'
    """
    counts = layers["tier"].astype("string").fillna("unknown").value_counts() if "tier" in layers else {}
    order = [t for t in vocabulary.TIERS if t in counts] + sorted(t for t in counts.keys() if t not in vocabulary.TIERS)
    tiers = ", ".join(f"{int(counts[t])} {t}" for t in order) if len(order) else "no layers"
    return f"{tiers}, prefetch {prefetch}"
