"""The measured GPU runs shipped with offload-lab (:func:`shipped_runs`).

Where they lie is :mod:`offload_lab.shipped`'s business; reading them needs the
:class:`~offload_lab.Run` and the model catalog, so the listing sits here, above both.
"""

from __future__ import annotations

from offload_lab.model import catalog
from offload_lab.record.run import Run
from offload_lab.shipped import KINDS, require_dir

__all__ = ["shipped_runs"]


def shipped_runs(model: str | None = None) -> list[Run]:
    """The measured GPU runs shipped with offload-lab, optionally only those of one model.

    They are the ``*.zip`` runs in the folders of ``offload_lab/_data/runs`` (installed) or of
    the checkout's ``data/runs``, in folder and file order, each loaded with
    :meth:`offload_lab.Run.load`; a simulated run there is left out (simulated stand-ins ship
    apart, in ``data/simulated``, and are never listed as measured). ``model`` is a catalog name (matched case-insensitively
    against each run's ``meta["model"]``); a catalog model that has no shipped runs gives an
    empty list. Raises :class:`~offload_lab.shipped.ShippedDataError` naming the paths searched when there are no
    shipped runs at all, and ``ValueError`` for a name that is neither a catalog model nor
    the model of a shipped run.

    >>> import offload_lab
    >>> runs = offload_lab.shipped_runs("wan2.1-t2v-14b")
    >>> [r.label for r in runs]
    ['14B pinned p1', '14B pageable p1']
    >>> {r.backend for r in runs}, any(r.simulated for r in runs)
    ({'cuda'}, False)
    """
    if model is not None and not isinstance(model, str):
        raise ValueError(f"model={model!r}; accepted: None or a catalog model name (a string)")
    d = require_dir("runs", "shipped measured runs")
    runs = [r for r in (Run.load(p) for p in sorted(d.glob(KINDS["runs"]))) if not r.simulated]
    if model is None:
        return runs
    key = model.strip().lower()
    out = [r for r in runs if str(r.meta.get("model", "")).lower() == key]
    if not out:
        known = sorted({str(r.meta.get("model")) for r in runs})
        if key not in catalog.names():
            raise ValueError(f"model={model!r} is neither a catalog model ({catalog.names()}) nor "
                             f"the model of a shipped run ({known})")
    return out
