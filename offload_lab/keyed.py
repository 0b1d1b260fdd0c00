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
#: every column is printed only while the last key column keeps this many characters
_MIN_FULL = 40


def display_width() -> int:
    """The width pandas prints to: ``display.width``, or the terminal's when pandas fits the terminal."""
    width = int(pd.get_option("display.width") or 80)
    if pd.get_option("display.max_columns") == 0:
        # pandas' own "fit the terminal" mode (its default in a terminal): it follows the terminal
        width = shutil.get_terminal_size((width, 24)).columns
    return max(width, 20)


def _longest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def _render(frame: pd.DataFrame, tail: str, values: list[str]) -> str:
    """``frame`` as pandas prints it, with ``values`` in its ``tail`` column, left-aligned (pandas
    right-aligns text, which makes reasons of different lengths hard to read)."""
    n = max([len(str(tail)), *map(len, values)])
    out = frame.copy()
    out[tail] = [v.ljust(n) for v in values]
    out = out.rename(columns={tail: str(tail).ljust(n)})
    # pandas' row limits stay the user's; its column and width limits are what this module decides
    with pd.option_context("display.width", 10**6, "display.max_columns", None, "display.max_colwidth", None):
        text = pd.DataFrame.__repr__(out)
    return "\n".join(line.rstrip() for line in text.splitlines())


def _fit(frame: pd.DataFrame, tail: str, width: int) -> tuple[str, int | None]:
    """``frame`` as text with its ``tail`` column shortened (``…``) so lines fit ``width``; the
    length the column was cut to (None: not cut)."""
    values = [str(v) for v in frame[tail]]
    text = _render(frame, tail, values)
    over = _longest(text) - width
    if over <= 0:
        return text, None
    limit = max(map(len, values), default=0)
    for _ in range(3):  # the other columns keep their widths: one correction usually suffices
        limit = max(_MIN_TAIL, limit - over)
        text = _render(frame, tail, [v if len(v) <= limit else v[: limit - 1] + _ELLIPSIS for v in values])
        over = _longest(text) - width
        if over <= 0 or limit <= _MIN_TAIL:
            break
    return text, limit


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
      name  why
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
        keys = [c for c in self.key_columns if c in self.columns]
        if not keys:
            return pd.DataFrame.__repr__(self)
        # every column, the last key column shortened to fit: while it keeps a readable length
        text, limit = _fit(pd.DataFrame(self), keys[-1], width)
        if _longest(text) <= width and (limit is None or limit >= _MIN_FULL):
            return text
        left_out = [str(c) for c in self.columns if c not in keys]
        text, _ = _fit(pd.DataFrame(self[keys]), keys[-1], width)
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
