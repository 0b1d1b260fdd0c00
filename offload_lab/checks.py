"""The one argument checker: ints, numbers, flags and choices, each refused in one line.

Every public function checks its arguments with these, so every surface refuses the same
values the same way: a bool is never an int or a number (``steps=True`` is refused, not read as
1), NaN and infinities are never numbers, and the error names the parameter, the value and what
is accepted. ``error=`` picks the caller's own error class (a :class:`~offload_lab.errors.OffloadLabError`),
so a planner argument still raises :class:`~offload_lab.PlanError`; without it the error is an
:class:`~offload_lab.errors.ArgumentError`. This module is the bottom of the package: it imports
only :mod:`offload_lab.errors`.

>>> check_int("steps", 3, minimum=1)
3
>>> check_int("steps", True, minimum=1)
Traceback (most recent call last):
    ...
offload_lab.errors.ArgumentError: steps = True; accepted: an int ≥ 1
>>> check_number("contention", 2, minimum=0, maximum=1)
Traceback (most recent call last):
    ...
offload_lab.errors.ArgumentError: contention = 2; accepted: a number in [0, 1]
>>> check_choice("backend", "gpu", ("auto", "cuda", "cpu"))
Traceback (most recent call last):
    ...
offload_lab.errors.ArgumentError: backend 'gpu' is not one of 'auto', 'cuda', 'cpu'
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import Any

from offload_lab.errors import ArgumentError

__all__ = ["ArgumentError", "check_int", "check_number", "check_bool", "check_choice", "is_int", "is_number"]

# a repr this long is a wrong object, not a typo; the message stays one readable line
_REPR_CHARS = 80


def _repr(value: Any) -> str:
    r = " ".join(repr(value).split())
    return r if len(r) <= _REPR_CHARS else r[:_REPR_CHARS - 1] + "…"


def _refuse(error: type[Exception], name: str, value: Any, accepted: str, note: str) -> Exception:
    return error(f"{name} = {_repr(value)}; accepted: {accepted}{f' ({note})' if note else ''}")


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (a Python or numpy int), never a bool.

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is a finite real number, never a bool.

    >>> is_number(2.5), is_number(False), is_number(float("nan"))
    (True, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _g(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _range(kind: str, lo: Any, lo_open: bool, hi: Any, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f"{kind} in {'(' if lo_open else '['}{_g(lo)}, {_g(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{kind} {'>' if lo_open else '≥'} {_g(lo)}"
    if hi is not None:
        return f"{kind} {'<' if hi_open else '≤'} {_g(hi)}"
    return kind


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
              optional: bool = False, error: type[Exception] = ArgumentError, accepted: str | None = None,
              note: str = "") -> Any:
    """``value`` as an int when it is an integer within ``[minimum, maximum]`` (``None`` too when
    ``optional``), else ``error`` naming ``name``, the value and what is accepted.

    >>> check_int("rank", None, minimum=0, optional=True) is None
    True
    >>> check_int("passes", 99, minimum=1, maximum=64)
    Traceback (most recent call last):
        ...
    offload_lab.errors.ArgumentError: passes = 99; accepted: an int in [1, 64]
    """
    if value is None and optional:
        return None
    if (is_int(value) and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)):
        return int(value)
    what = accepted or _range("an int", minimum, False, maximum, False) + (" or None" if optional else "")
    raise _refuse(error, name, value, what, note)


def check_number(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
                 above: float | None = None, below: float | None = None, optional: bool = False,
                 error: type[Exception] = ArgumentError, accepted: str | None = None, note: str = "") -> Any:
    """``value`` as a float when it is a finite number within the bounds (``minimum``/``maximum``
    inclusive, ``above``/``below`` exclusive; ``None`` too when ``optional``), else ``error``.

    >>> check_number("step_error", 0.05, minimum=0, below=1)
    0.05
    >>> check_number("bandwidth", 0, above=0, error=ValueError)
    Traceback (most recent call last):
        ...
    ValueError: bandwidth = 0; accepted: a number > 0
    """
    if value is None and optional:
        return None
    lo, lo_open = (above, True) if above is not None else (minimum, False)
    hi, hi_open = (below, True) if below is not None else (maximum, False)
    if (is_number(value) and (lo is None or (value > lo if lo_open else value >= lo))
            and (hi is None or (value < hi if hi_open else value <= hi))):
        return float(value)
    what = accepted or _range("a number", lo, lo_open, hi, hi_open) + (" or None" if optional else "")
    raise _refuse(error, name, value, what, note)


def check_bool(name: str, value: Any, *, error: type[Exception] = ArgumentError) -> bool:
    """``value`` when it is ``True`` or ``False`` (not 0, 1 or ``"yes"``), else ``error``.

    >>> check_bool("gather", 1)
    Traceback (most recent call last):
        ...
    offload_lab.errors.ArgumentError: gather = 1; accepted: True or False
    """
    if isinstance(value, bool):
        return value
    raise _refuse(error, name, value, "True or False", "")


def check_choice(name: str, value: Any, choices: Collection[str], *, error: type[Exception] = ArgumentError,
                 hint: str = "") -> str:
    """``value`` when it is one of ``choices`` (exactly: no case folding; a parser of typed text
    folds case before it asks), else ``error`` listing them; ``hint`` is appended to the message.

    >>> check_choice("issue", "after-compute", ("after-compute", "before-compute"))
    'after-compute'
    """
    if isinstance(value, str) and value in choices:
        return value
    raise error(f"{name} {_repr(value)} is not one of {', '.join(map(repr, choices))}{hint}")

