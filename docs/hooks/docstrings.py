"""A griffe extension for the API reference: docstrings written for ``help()`` and doctest, shown
as Markdown.

- a doctest session (``>>>`` lines, ``...`` continuations and their output, up to a blank line)
  becomes a fenced ``pycon`` block, so ``run.meta["simulated"]`` is code, not a Markdown link;
  ``# doctest:`` flags are dropped;
- reST roles (``:class:`~offload_lab.record.run.Run```) become inline code (``Run``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj):`~?([^`]+)`")
_FLAGS = re.compile(r"\s*# doctest:.*$")


def _role(m: re.Match) -> str:
    target = m.group(1)
    tilde = m.group(0).split("`", 1)[1].startswith("~")
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def fence_doctests(text: str) -> str:
    """``text`` with each doctest session fenced and reST roles turned into inline code."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.lstrip().startswith(">>>"):
            out.append(_ROLE.sub(_role, line))
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip():
            out.append(_FLAGS.sub("", lines[i]))
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Rewrite every docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)


class NoDunderAttributes(griffe.Extension):
    """Leave out what inspecting a class finds on every class (``__doc__``, ``__module__``, ...).

    ``filters: public`` follows each module's ``__all__`` but keeps a class's dunder attributes;
    its methods ``__init__`` (merged into the class) and ``__call__`` stay.
    """

    keep = frozenset({"__init__", "__call__"})

    def on_members(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.is_class:
            for name in [n for n in obj.members if n.startswith("__") and n not in self.keep]:
                del obj.members[name]
