"""MkDocs hook: the API reference's module sections come from ``offload_lab.__all__``.

``::: offload_lab`` documents the functions and classes the root exports; the submodules it
exports (``offload_lab.catalog``, ...) are aliases that the root's block leaves out, so this hook
writes one ``::: offload_lab.<name>`` block per exported module where ``api.md`` has the
marker. A name added to ``__all__`` appears here without anyone editing the page.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

MARKER = "<!-- exported modules -->"


def exported_modules() -> list[str]:
    """Names in ``offload_lab.__all__`` that are modules, in ``__all__`` order."""
    offload_lab = importlib.import_module("offload_lab")
    return [n for n in offload_lab.__all__ if inspect.ismodule(getattr(offload_lab, n))]


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != "api.md" or MARKER not in markdown:
        return markdown
    blocks = [f"::: offload_lab.{name}\n    options:\n      show_root_heading: true\n"
              f"      show_root_full_path: true\n      heading_level: 3\n"
              for name in exported_modules()]
    return markdown.replace(MARKER, "\n".join(blocks))
