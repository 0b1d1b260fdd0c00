"""Where the shipped JSON data (model catalog, device profiles) lies, installed or in a checkout."""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

_REPO_DATA = Path(__file__).resolve().parent.parent / "data"


@functools.cache
def data_dir(kind: str) -> Path | None:
    """The directory of shipped ``*.json`` of ``kind`` (``"models"`` or ``"devices"``), or None.

    A wheel carries them as ``offload_lab/_data/<kind>`` (pyproject's force-include); a source
    checkout or editable install has them in the repository's ``data/<kind>``.
    """
    candidates = []
    try:
        # wheels install unzipped, so the resource is a real directory we can hand out paths in
        candidates.append(Path(str(importlib.resources.files(__package__) / "_data" / kind)))
    except (ModuleNotFoundError, TypeError):
        pass
    candidates.append(_REPO_DATA / kind)
    for d in candidates:
        if d.is_dir() and any(d.glob("*.json")):
            return d
    return None


def searched(kind: str) -> str:
    """The places :func:`data_dir` looks, for error messages."""
    return f"offload_lab/_data/{kind} (installed) and {str(_REPO_DATA / kind)!r}"
