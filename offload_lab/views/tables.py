"""What every surface prints about runs: the comparison as text, and the note on a noisy run.

The command line prints :func:`comparison_frame`, the magic and the widgets show it; they all
say :func:`noise_note` for a run whose step times disagree. No plotly here.

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
>>> p = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
>>> comparison_frame([offload_lab.simulate(p, "h200", steps=1)])["step"][0].endswith("s")
True
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from offload_lab.analysis.comparison import compare
from offload_lab.analysis.summary import NOISY_SPREAD, is_noisy, step_spread
from offload_lab.record.run import Run, display_label
from offload_lab.views.text import fmt_percent, fmt_ratio, fmt_seconds, with_part

__all__ = ["comparison_frame", "noise_note", "order_labels"]


def order_labels(runs: Sequence[Run]) -> list[str]:
    """The runs' labels, each naming its issue order where the runs differ by it.

    >>> import offload_lab
    >>> from offload_lab.simulation.evidence import both_orders
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> p = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="64GiB"))
    >>> a = offload_lab.simulate(p, "h200", steps=1, label="a")
    >>> b = offload_lab.simulate(p, "h200", steps=1, label="b", issue="before-compute")
    >>> order_labels([a, b])
    ['a · after-compute (simulated)', 'b · before-compute (simulated)']
    """
    from offload_lab.simulation.evidence import issue_of

    orders = [issue_of(r) for r in runs]
    if len(set(orders)) < 2:
        return [display_label(r) for r in runs]
    return [display_label(r) if o in r.label else display_label(r, with_part(r.label, o))
            for r, o in zip(runs, orders)]


def noise_note(run: Run, limit: float = NOISY_SPREAD) -> str | None:
    """One sentence saying a measured run is noisy and why, or None when it is not.

    The rule is :func:`offload_lab.analysis.summary.is_noisy`: the slowest measured step took more
    than ``limit`` (1.5) times the fastest. The report, the widgets and the magic print this.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> plan = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="256GiB"))
    >>> noise_note(offload_lab.simulate(plan, "h200", steps=3)) is None
    True
    """
    if not is_noisy(run, limit):
        return None
    wall = pd.to_numeric(run.steps["wall_s"], errors="coerce")
    return (f"noisy: run {run.label!r} took {fmt_seconds(wall.min())} to {fmt_seconds(wall.max())} per step "
            f"(slowest {step_spread(run):.1f}× the fastest, above {limit:g}×); the machine was probably "
            f"busy, so rerun before trusting its median")


def _note(row: pd.Series) -> str:
    notes = [str(row["ratio_note"])] if row["ratio_note"] else []
    if row["noisy"]:
        notes.append(f"noisy: slowest step {row['spread']:.1f}× the fastest")
    return "; ".join(notes)


def comparison_frame(runs: Run | Sequence[Run]) -> pd.DataFrame:
    """:func:`~offload_lab.analysis.comparison.compare` as text: seconds, ratios, percentages.

    ``backend`` says ``(simulated)`` for simulated runs, so a prediction never reads as a
    measurement even where its label does not say so; where the runs differ by issue order, each
    ``run`` names its own (:func:`order_labels`). ``ratio`` is blank where runs cannot be
    compared, and ``note`` says why (and flags noisy runs).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> p = offload_lab.plan(spec, tier="pinned", host=offload_lab.HostMemory(available="64GiB"))
    >>> df = comparison_frame([offload_lab.simulate(p, "h200", steps=1)])
    >>> list(df.columns)
    ['run', 'backend', 'tiers', 'step', 'ratio', 'stall', 'exposed copy', 'overlap', 'vs bound', 'note']
    >>> df["backend"][0]
    'sim (simulated)'
    """
    df = compare(runs, ranks="max")
    from offload_lab.analysis.summary import as_runs

    listed = as_runs(runs)
    names = order_labels(listed) if len(listed) == len(df) else df["label"].astype(str).tolist()
    return pd.DataFrame({
        "run": names,
        "backend": [f"{b} (simulated)" if s else str(b) for b, s in zip(df["backend"], df["simulated"])],
        "tiers": df["tiers"].astype(str),
        "step": [fmt_seconds(x) for x in df["step_s"]],
        "ratio": ["" if n else fmt_ratio(x) for x, n in zip(df["ratio"], df["ratio_note"])],
        "stall": [fmt_seconds(x) for x in df["stall_s"]],
        "exposed copy": [fmt_seconds(x) for x in df["exposed_copy_s"]],
        "overlap": [fmt_percent(x) for x in df["overlap"]],
        "vs bound": [fmt_ratio(x) for x in df["vs_bound"]],
        "note": [_note(row) for _, row in df.iterrows()],
    })
