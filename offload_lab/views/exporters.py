"""The file formats a run is written in, in one registry.

Each :class:`Exporter` has a name, the suffix its files get, a one-line description and a
:meth:`~Exporter.write` that writes runs to a path. ``offload-lab export --format NAME`` offers
exactly these names with these descriptions; a new format is one entry here and one writer in
:mod:`offload_lab.views.export_writers`.

========================  ===============  ====================================================
name                      suffix           what
========================  ===============  ====================================================
``chrome-trace``          ``.trace.json``  trace-event JSON for Perfetto and chrome://tracing
``html``                  ``.html``        the offline HTML report (:func:`offload_lab.report`)
``text``                  ``.txt``         the comparison table the commands print
``zip``                   ``.zip``         parquet frames and meta.json (:meth:`Run.save`)
========================  ===============  ====================================================

The registry imports nothing but the standard library and :mod:`offload_lab.errors`: the
command-line parser reads it for ``--format``'s choices and help, and ``offload-lab --help``
must not pay for pandas. The writer of a format is named by ``"module:function"`` and imported
when a file is written, as the parser dispatches its subcommands.

>>> names()
['chrome-trace', 'html', 'text', 'zip']
>>> get("chrome-trace").suffix
'.trace.json'
>>> get("svg")
Traceback (most recent call last):
...
offload_lab.views.exporters.ExportFormatError: format 'svg' is not one of chrome-trace, html, text, zip
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offload_lab.errors import OffloadLabError

__all__ = ["Exporter", "ExportFormatError", "EXPORTERS", "names", "get"]

_WRITERS = "offload_lab.views.export_writers"


class ExportFormatError(OffloadLabError, ValueError):
    """A format name the registry does not hold, or runs a format cannot write."""


@dataclass(frozen=True)
class Exporter:
    """One file format: its name, suffix, one-line description, and its writer.

    ``many``: the format holds several runs (``html``, ``text``), else exactly one.
    ``appends_suffix``: the writer adds :attr:`suffix` to a name that lacks it (:meth:`Run.save`
    does, so ``--out run`` writes ``run.zip``); the others write the path as given.
    ``opens``: where a reader opens the file, for the line a command prints.
    """

    name: str
    suffix: str
    description: str
    writer: str
    many: bool = False
    appends_suffix: bool = False
    opens: str = ""

    def write(self, runs_or_run: Any, path: str | os.PathLike, **options: Any) -> Path:
        """Write ``runs_or_run`` (one :class:`~offload_lab.record.run.Run`, or a sequence of
        them for a format that holds several) to ``path``; returns the path written.

        ``options`` go to the writer (``html`` takes ``plan=`` and ``title=``); one it does not
        take is a ``TypeError``.
        """
        module, _, function = self.writer.partition(":")
        written = getattr(importlib.import_module(module), function)(self._runs(runs_or_run), path, **options)
        return Path(written)

    def _runs(self, runs_or_run: Any) -> Any:
        # a format of several runs takes what the report takes (a Run, a list, a {label: Run});
        # a format of one run takes a Run or a list of exactly one
        if self.many or hasattr(runs_or_run, "events"):
            return runs_or_run
        if isinstance(runs_or_run, Mapping):
            runs_or_run = list(runs_or_run.values())
        if isinstance(runs_or_run, (list, tuple)) and len(runs_or_run) == 1:
            return runs_or_run[0]
        if isinstance(runs_or_run, (list, tuple)):
            raise ExportFormatError(f"format {self.name!r} holds one run, got {len(runs_or_run)}; "
                                    f"accepted: one Run (formats of several: {', '.join(_many())})")
        return runs_or_run  # the writer names what it got instead of a Run

EXPORTERS: dict[str, Exporter] = {e.name: e for e in (
    Exporter("chrome-trace", ".trace.json", "trace-event JSON for Perfetto and chrome://tracing",
             f"{_WRITERS}:write_chrome_trace", opens="open it at https://ui.perfetto.dev or chrome://tracing"),
    Exporter("html", ".html", "the offline HTML report, figures and tables in one file",
             f"{_WRITERS}:write_html", many=True, opens="open it in a browser; it needs no network"),
    Exporter("text", ".txt", "the comparison table the commands print, as plain text",
             f"{_WRITERS}:write_text", many=True),
    Exporter("zip", ".zip", "the run's parquet frames and meta.json, as Run.save writes them",
             f"{_WRITERS}:write_zip", appends_suffix=True,
             opens="read it with offload_lab.Run.load or any offload-lab command"),
)}


def names() -> list[str]:
    """The registered format names, sorted."""
    return sorted(EXPORTERS)


def _many() -> list[str]:
    return [n for n in names() if EXPORTERS[n].many]


def get(name: str) -> Exporter:
    """The exporter of format ``name``; an unknown name is one :class:`ExportFormatError` line."""
    try:
        return EXPORTERS[name]
    except (KeyError, TypeError):
        raise ExportFormatError(f"format {name!r} is not one of {', '.join(names())}") from None
