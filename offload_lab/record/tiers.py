"""How a run's or a plan's layers are placed, in a few words: the recorders label runs with it
and the views print it.

>>> import pandas as pd
>>> tier_summary(pd.DataFrame({"tier": ["pinned"] * 20 + ["pageable"] * 10}))
'20 pinned, 10 pageable'
"""

from __future__ import annotations

import pandas as pd

from offload_lab.vocabulary import OBSERVED_TIERS

__all__ = ["tier_counts", "tier_summary"]


def tier_counts(layers: pd.DataFrame) -> dict[str, int]:
    """Layers per tier, in the canonical tier order (resident, pinned, staged, pageable, mapped, ...).

    >>> tier_counts(pd.DataFrame({"tier": ["pinned", "pageable", "pinned"]}))
    {'pinned': 2, 'pageable': 1}
    """
    if "tier" not in layers or not len(layers):
        return {}
    counts = layers["tier"].astype("string").fillna("unknown").value_counts()
    order = [t for t in OBSERVED_TIERS if t in counts.index] + sorted(t for t in counts.index
                                                                    if t not in OBSERVED_TIERS)
    return {str(t): int(counts[t]) for t in order}


def tier_summary(layers: pd.DataFrame) -> str:
    """``"20 pinned, 10 pageable"``; ``"no layers"`` for an empty frame."""
    counts = tier_counts(layers)
    return ", ".join(f"{n} {t}" for t, n in counts.items()) if counts else "no layers"
