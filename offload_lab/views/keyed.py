"""A DataFrame whose printed form keeps its key columns in view, whatever the terminal width.

pandas fits a wide frame to the terminal by cutting the middle columns (``group ... reason``),
which for a plan hides exactly what a reader looks for: the tier and the pin rank. A
:class:`KeyedFrame` prints all its columns when they fit; when they do not, it prints only its
key columns and shortens the last one (a reason) to fit, and says which columns it left out.
Everything else is the plain DataFrame: indexing, ``.to_string()`` and the notebook's HTML view
show every column.
"""

from __future__ import annotations

import shutil

import pandas as pd

__all__ = ["KeyedFrame", "PlanTable"]

_ELLIPSIS = "…"
#: a shortened last column keeps at least this many characters, even if a line then overflows
_MIN_TAIL = 16


def display_width() -> int:
    """The width pandas prints to: ``display.width``, or the terminal's when pandas fits the terminal."""
    width = int(pd.get_option("display.width") or 80)
    if pd.get_option("display.max_columns") == 0:
        # pandas' own "fit the terminal" mode (its default in a terminal): it follows the terminal
        width = shutil.get_terminal_size((width, 24)).columns
    return max(width, 20)


def _longest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


class KeyedFrame(pd.DataFrame):
    """A DataFrame that prints its ``key_columns`` (and shortens the last of them) when narrow.

    >>> import pandas as pd
    >>> class T(KeyedFrame):
    ...     key_columns = ("name", "why")
    ...     @property
    ...     def _constructor(self):
    ...         return T
    >>> t = T({"name": ["a"], "x": ["-" * 50], "why": ["because " * 8]})
    >>> with pd.option_context("display.width", 40, "display.max_columns", 20):
    ...     print(t)
      name                               why
    0    a  because because because because…
    [x left out to fit 40 columns; .to_string() shows all]
    >>> type(t.iloc[:1]).__name__, list(t.columns)
    ('T', ['name', 'x', 'why'])
    """

    key_columns: tuple[str, ...] = ()

    @property
    def _constructor(self) -> type[KeyedFrame]:
        return KeyedFrame

    def __repr__(self) -> str:
        width = display_width()
        with pd.option_context("display.width", 10**6, "display.max_columns", None):
            full = pd.DataFrame.__repr__(self)
        keys = [c for c in self.key_columns if c in self.columns]
        if _longest(full) <= width or not keys:
            return full if _longest(full) <= width else pd.DataFrame.__repr__(self)
        left_out = [str(c) for c in self.columns if c not in keys]
        compact = pd.DataFrame(self[keys])
        tail = keys[-1]
        values = compact[tail].astype(str)
        limit = max(int(values.str.len().max() or 0), _MIN_TAIL)
        text = ""
        for _ in range(3):  # the widths of the other columns do not change: one correction suffices
            compact[tail] = [v if len(v) <= limit else v[: limit - 1] + _ELLIPSIS for v in values]
            with pd.option_context("display.width", 10**6, "display.max_columns", None):
                text = pd.DataFrame.__repr__(compact)
            over = _longest(text) - width
            if over <= 0 or limit <= _MIN_TAIL:
                break
            limit = max(_MIN_TAIL, limit - over)
        note = f"[{', '.join(left_out)} left out to fit {width} columns; .to_string() shows all]"
        return f"{text}\n{note}" if left_out else text

    __str__ = __repr__


class PlanTable(KeyedFrame):
    """:meth:`offload_lab.Plan.table`: one row per layer; prints layer, tier, pin rank and reason
    on any terminal."""

    key_columns = ("component", "group", "layer", "tier", "pin rank", "reason")

    @property
    def _constructor(self) -> type[PlanTable]:
        return PlanTable
