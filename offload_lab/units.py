"""Byte sizes: parse ``"8GiB"`` / ``"512MiB"`` / ``8e9`` / ints, and print them in binary units."""

from __future__ import annotations

import math
import re

from offload_lab.errors import OffloadLabError

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
ACCEPTED = "a non-negative number of bytes or a size string such as '8GiB', '512MiB', '1.5GB', '8e9'"
#: the largest size accepted (8 EiB): byte counts are int64 in every frame, and no host is larger
MAX_SIZE = 2**63 - 1


class SizeError(OffloadLabError, ValueError):
    """A size that cannot be read as a byte count."""


def parse_size(value: int | float | str, what: str = "size") -> int:
    """Return ``value`` as a whole number of bytes.

    Integers are bytes. A string without a unit must be at least 1 MiB (or 0): ``"8"`` is
    refused as ambiguous rather than read as 8 bytes. Sizes above 8 EiB (``"1e400"``) are
    refused with a :class:`SizeError`, never an ``OverflowError``.

    >>> parse_size("8GiB"), parse_size("1.5 GB"), parse_size(8e9), parse_size(4096)
    (8589934592, 1500000000, 8000000000, 4096)
    """
    if isinstance(value, bool):
        raise SizeError(f"{what} {value!r} is a bool; expected {ACCEPTED}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise SizeError(f"{what} {value!r} is not finite; expected {ACCEPTED}")
        if abs(value) > MAX_SIZE:
            raise SizeError(f"{what} {value!r} is too large; expected at most 8 EiB ({ACCEPTED})")
        n = int(round(value))
    elif isinstance(value, str):
        m = _SIZE_RE.match(value)
        if not m:
            raise SizeError(f"{what} {value!r} is not a size; expected {ACCEPTED}")
        number, unit = m.groups()
        factor = _UNITS.get(unit.lower()) if unit else 1
        if not unit and 0 < float(number) < 2**20:
            # "--pin-budget 8" is far more likely 8 GiB than 8 bytes: refuse to guess.
            raise SizeError(
                f"{what} {value!r} has no unit and is ambiguous; write it with a unit, "
                f"e.g. '{number}GiB' or '{number}MiB' ({ACCEPTED})"
            )
        if factor is None:
            raise SizeError(
                f"{what} {value!r} has an unknown unit {unit!r}; "
                f"accepted units: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB"
            )
        value_bytes = float(number) * factor
        if not math.isfinite(value_bytes) or value_bytes > MAX_SIZE:
            raise SizeError(f"{what} {value!r} is too large; expected at most 8 EiB ({ACCEPTED})")
        n = int(round(value_bytes))
    else:
        raise SizeError(f"{what} {value!r} has type {type(value).__name__}; expected {ACCEPTED}")
    if n < 0:
        raise SizeError(f"{what} {value!r} is negative; expected {ACCEPTED}")
    if n > MAX_SIZE:
        raise SizeError(f"{what} {value!r} is too large; expected at most 8 EiB ({ACCEPTED})")
    return n


def format_bytes(n: float | int | None, digits: int = 2) -> str:
    """``1288490188 -> '1.20 GiB'`` (binary units).

    >>> format_bytes(1288490188), format_bytes(None)
    ('1.20 GiB', '-')
    """
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor:
            return f"{sign}{n / factor:.{digits}f} {unit}"
    return f"{sign}{int(n)} B"
