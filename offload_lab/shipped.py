"""Where the shipped data lies, installed or in a checkout: the model catalog, device profiles,
measured GPU runs and the simulated stand-ins for runs not measured yet.

A wheel carries them as ``offload_lab/_data/<kind>`` (pyproject's force-include); a source
checkout or an editable install has them in the repository's ``data/<kind>``. Both are found
from the package's own location, never from the working directory, so a notebook copied
anywhere still finds them.

>>> sorted(KINDS)
['devices', 'models', 'runs', 'simulated']
>>> data_dir("models").name
'models'
"""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

from offload_lab.errors import OffloadLabError

__all__ = ["KINDS", "ShippedDataError", "data_dir", "require_dir", "json_names", "searched"]

_REPO_DATA = Path(__file__).resolve().parent.parent / "data"
#: kind of shipped data -> the files that make a directory of it
#: (``simulated``: predictions saved as runs, kept apart so no listing of measured runs meets them)
KINDS = {"models": "*.json", "devices": "*.json", "runs": "*/*.zip", "simulated": "*/*.zip"}


class ShippedDataError(OffloadLabError, LookupError):
    """Shipped data that is not where an installed package or a checkout keeps it."""


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown kind of shipped data {kind!r}; accepted: {sorted(KINDS)}")


def _candidates(kind: str) -> list[Path]:
    out = []
    try:
        # wheels install unzipped, so the resource is a real directory we can hand out paths in
        out.append(Path(str(importlib.resources.files(__package__) / "_data" / kind)))
    except (ModuleNotFoundError, TypeError):
        pass
    out.append(_REPO_DATA / kind)
    return out


@functools.cache
def data_dir(kind: str) -> Path | None:
    """The directory of shipped data of ``kind`` (one of :data:`KINDS`), or None when absent.

    >>> data_dir("runs") is None or any(data_dir("runs").glob("*/*.zip"))
    True
    """
    _check_kind(kind)
    for d in _candidates(kind):
        if d.is_dir() and any(d.glob(KINDS[kind])):
            return d
    return None


def require_dir(kind: str, what: str, error: type[Exception] = ShippedDataError) -> Path:
    """:func:`data_dir`, or ``error`` saying ``no <what> found`` and where it looked.

    >>> require_dir("devices", "device profiles").name
    'devices'
    """
    d = data_dir(kind)
    if d is None:
        raise error(f"no {what} found; looked for {KINDS[kind]} in {searched(kind)}")
    return d


def json_names(kind: str, what: str, error: type[Exception] = ShippedDataError) -> list[str]:
    """The names (file stems) of the shipped ``*.json`` of ``kind``, sorted.

    >>> json_names("models", "model catalog")[:2]
    ['minimax-h3', 'wan2.1-i2v-14b']
    """
    return sorted(p.stem for p in require_dir(kind, what, error).glob("*.json"))


def searched(kind: str) -> str:
    """The places :func:`data_dir` looks, for error messages.

    >>> searched("runs").startswith(repr(str(_candidates("runs")[0])))
    True
    """
    _check_kind(kind)
    paths = _candidates(kind)
    where = [f"{str(paths[0])!r} (installed)"] if len(paths) > 1 else []
    return " and ".join(where + [f"{str(_REPO_DATA / kind)!r} (source checkout)"])
