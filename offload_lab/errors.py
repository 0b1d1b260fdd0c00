"""The one base of every error offload-lab raises on purpose.

Catch :class:`OffloadLabError` to handle any bad input the package refuses (a malformed saved
run, an impossible plan, an output path it will not write to) while letting bugs keep their
tracebacks. Each subclass also derives from the builtin it has always been (most are
``ValueError``), so existing ``except ValueError`` code keeps working.

>>> from offload_lab.errors import OffloadLabError
>>> class MyError(OffloadLabError, ValueError): ...
>>> issubclass(MyError, ValueError), isinstance(MyError("x"), OffloadLabError)
(True, True)
"""

from __future__ import annotations

__all__ = ["OffloadLabError", "ArgumentError"]


class OffloadLabError(Exception):
    """Base of every error the package raises on purpose; the message names the bad value and
    what is accepted, in one line."""


class ArgumentError(OffloadLabError, ValueError):
    """An argument of the wrong type or out of range, refused by :mod:`offload_lab.checks` where
    the caller names no error class of its own."""
