"""A griffe extension for the API reference: docstrings written for ``help()`` and doctest, shown
as Markdown.

- a doctest session (``>>>`` lines, ``...`` continuations and their output, up to a blank line)
  becomes a fenced ``pycon`` block, so ``run.meta["simulated"]`` is code, not a Markdown link;
  ``# doctest:`` flags are dropped;
- reST roles (``:class:`~offload_lab.record.run.Run```) become inline code (``Run``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
import textwrap
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


def source_attribute_docstrings(obj: object) -> dict[str, str]:
    """The attribute docstrings written in ``obj``'s source (a class or a module): the string
    literal right under an assignment, as in ``uses: int = 1`` then ``\"\"\"Forward passes ...\"\"\"``.

    Inspection (``force_inspection``) never reads them: it only sees values.
    """
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body
    if inspect.isclass(obj) and body and isinstance(body[0], ast.ClassDef):
        body = body[0].body
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:]):
        if not (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            continue
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for t in targets:
            if isinstance(t, ast.Name):
                docs[t.id] = inspect.cleandoc(after.value.value)
    return docs


class AttributeDocstrings(griffe.Extension):
    """An attribute's docstring is the one written under it in the source, or none.

    Inspecting ``uses: int = 1`` finds the value ``1``, whose ``__doc__`` is ``int``'s own
    ("int([x]) -> integer ..."): that text describes the builtin, never the attribute, so it is
    dropped. A dataclass field without a default is no class attribute at all; when its source
    has a docstring it is added, so every documented field is listed.
    """

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[int, dict[str, str]] = {}

    def _docs(self, owner: object) -> dict[str, str]:
        key = id(owner)
        if key not in self._cache:
            docs: dict[str, str] = {}
            if inspect.ismodule(owner):
                # a module re-exports constants defined (and documented) where it imports them from
                for name, source in _imported_names(owner).items():
                    written = source_attribute_docstrings(sys.modules[source]) if source in sys.modules else {}
                    if name in written:
                        docs[name] = written[name]
            docs.update(source_attribute_docstrings(owner))
            self._cache[key] = docs
        return self._cache[key]

    def on_attribute_instance(self, *, node: griffe.ObjectNode, attr: griffe.Attribute, **kwargs: Any) -> None:
        owner = node.parent.obj if node.parent is not None else None
        written = self._docs(owner).get(attr.name) if owner is not None else None
        if written is not None:
            attr.docstring = griffe.Docstring(fence_doctests(written), parent=attr)
        elif attr.docstring is not None and _inherited_doc(node.obj):
            attr.docstring = None

    def on_class_members(self, *, node: griffe.ObjectNode, cls: griffe.Class, **kwargs: Any) -> None:
        if not dataclasses.is_dataclass(node.obj):
            return
        written = self._docs(node.obj)
        for f in dataclasses.fields(node.obj):
            if f.name in cls.members or f.name not in written or f.name.startswith("_"):
                continue
            annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))
            member = griffe.Attribute(f.name, annotation=annotation,
                                      docstring=griffe.Docstring(fence_doctests(written[f.name])))
            member.labels.add("instance-attribute")
            cls.set_member(f.name, member)


def _imported_names(module: object) -> dict[str, str]:
    """``{name: module it comes from}`` for the ``from X import name`` lines of ``module``."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return {}
    return {a.asname or a.name: node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 for a in node.names}


def _inherited_doc(value: object) -> bool:
    """Whether ``value.__doc__`` is only its type's (or a base's) docstring, not its own."""
    doc = getattr(value, "__doc__", None)
    # compared by value: a builtin's ``__doc__`` may be a new string object on each access
    return doc is not None and any(doc == getattr(t, "__doc__", None) for t in type(value).__mro__)
