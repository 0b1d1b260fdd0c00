"""The planner's errors and warnings, shared by every planning module."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from offload_lab import checks
from offload_lab.errors import OffloadLabError
from offload_lab.units import SizeError

__all__ = ["PlanError", "PlanSizeError", "PlanWarning", "check_choice"]


class PlanError(OffloadLabError, ValueError):
    """An argument the planner cannot use; the message names it and what is accepted."""


class PlanSizeError(PlanError, SizeError):
    """A size argument of the planner that is not a byte count (both a PlanError and a SizeError)."""


class PlanWarning(UserWarning):
    """A plan that does not fit the host, or a forced tier that could not be honoured."""


def check_choice(value: Any, what: str, accepted: Sequence[str], hint: str = "") -> str:
    """``value`` when it is one of ``accepted``, else a :class:`PlanError` naming both.

    >>> check_choice("leading", "residency", ("leading", "strided"))
    'leading'
    """
    return checks.check_choice(what, value, accepted, error=PlanError, hint=hint)
