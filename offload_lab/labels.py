"""The labels of runs: the ``(simulated)`` mark, and parts joined by `` · ``.

Labels are built from parts such as ``"rtx4090-pcie4 · 480p tokens · pinned (simulated)"``. The
simulator names an issue order in a label and the views strip the mark where they draw it
themselves, so the rule lives here, below both.

>>> with_part("h200 · 40 pageable (simulated)", "before-compute")
'h200 · 40 pageable · before-compute (simulated)'
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["SIM_MARK", "SIM_SUFFIX", "display_label", "strip_simulated", "with_part"]

#: a label's ``(simulated)`` / ``(sim)`` mark, with the spaces around it
SIM_MARK = re.compile(r"\s*\((?:simulated|sim)\)\s*", re.I)
#: what a view adds to a simulated run's label
SIM_SUFFIX = " (simulated)"


def display_label(run: Any, label: str | None = None) -> str:
    """A run's label as every view shows it: a simulated run's says ``(simulated)``, once.

    ``run`` is anything with ``label`` and ``simulated`` (an :class:`offload_lab.Run`). The
    stored label never carries the mark (``run.meta["simulated"]`` says it); a label that names
    the simulation itself (``"simulated · predicted"``) gets no second mark. ``label`` replaces
    the stored one (a view that adds a part to it, such as the issue order).

    >>> from types import SimpleNamespace as Run
    >>> display_label(Run(label="pinned", simulated=True)), display_label(Run(label="p1", simulated=False))
    ('pinned (simulated)', 'p1')
    """
    label = run.label if label is None else str(label)
    if run.simulated and "simulated" not in label.lower():
        return label + SIM_SUFFIX
    return label


def strip_simulated(label: Any) -> str:
    """A label without its ``(simulated)`` / ``(sim)`` mark, for places that mark it themselves.

    >>> strip_simulated("h200 · 40 pinned · prefetch 1 (simulated)")
    'h200 · 40 pinned · prefetch 1'
    """
    return " ".join(SIM_MARK.sub(" ", str(label)).split()) or str(label)


def with_part(label: Any, part: str) -> str:
    """``label`` with `` · part`` added, before its ``(simulated)`` mark when it has one.

    >>> with_part("h200 · 40 pageable (simulated)", "before-compute"), with_part("14B pageable p1", "before-compute")
    ('h200 · 40 pageable · before-compute (simulated)', '14B pageable p1 · before-compute')
    """
    bare = strip_simulated(label)
    mark = " (simulated)" if bare != str(label) else ""
    return f"{bare} · {part}{mark}"
