"""The regime of a run: its issue order and the class of the copies it streams.

The regime is what a held-out error of the simulator carries over between (see
:mod:`offload_lab.simulation.evidence`); it is read from a run's frames alone, so analysis
(pairing a prediction with a measurement) and the simulator (labelling a prediction) share it.

>>> copy_class(["pinned", "resident"]), copy_class(["pinned", "mapped"]), copy_class(["staged"])
('pinned', 'host-blocking', 'staged')
"""

from __future__ import annotations

from collections.abc import Iterable

from offload_lab.record.run import Run
from offload_lab.vocabulary import ISSUE_ORDERS

__all__ = ["COPY_CLASSES", "HOST_BLOCKING_TIERS", "copy_class", "issue_of", "regime_key", "run_regime",
           "streamed_tiers", "streams_host_blocking"]

COPY_CLASSES = ("pinned", "host-blocking", "staged", "host-blocking+staged")
#: the tiers whose copies block the host thread
HOST_BLOCKING_TIERS = ("pageable", "mapped")


def copy_class(tiers: Iterable[str]) -> str:
    """The class of copies a plan streams, from the tiers of its streamed layers.

    >>> copy_class([]), copy_class(["pageable", "staged", "pinned"])
    ('pinned', 'host-blocking+staged')
    """
    ts = {str(t) for t in tiers}
    blocking, staged = bool(ts & set(HOST_BLOCKING_TIERS)), "staged" in ts
    if blocking and staged:
        return "host-blocking+staged"
    return "host-blocking" if blocking else "staged" if staged else "pinned"


def issue_of(run: Run) -> str:
    """A run's issue order; runs recorded before the option existed issued ``"before-compute"``."""
    issue = run.meta.get("issue")
    return issue if issue in ISSUE_ORDERS else "before-compute"


def streamed_tiers(run: Run) -> list[str]:
    """The tier of each layer a run streams (every layer not resident)."""
    df = run.layers
    if not len(df):
        return []
    streamed = df["streamed"].astype(bool) if "streamed" in df else df["tier"].astype(str) != "resident"
    return [str(t) for t in df.loc[streamed, "tier"]]


def regime_key(issue: str, copies: str) -> tuple[str, str]:
    """``(issue, copies)`` as a regime names them: a pinned-only plan runs the same way in either
    order, so its issue is ``"any"``.

    >>> regime_key("after-compute", "pinned"), regime_key("after-compute", "staged")
    (('any', 'pinned'), ('after-compute', 'staged'))
    """
    return ("any" if copies == "pinned" else issue), copies


def run_regime(run: Run) -> dict[str, str]:
    """``{"device", "issue", "copies"}`` of a run: the profile's name for a simulated run, the
    recorded device for a measured one; ``issue`` is ``"any"`` for the ``pinned`` class.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> p = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="64GiB"))
    >>> run_regime(offload_lab.simulate(p, "h200", steps=1))
    {'device': 'h200', 'issue': 'after-compute', 'copies': 'host-blocking'}
    """
    if run.simulated:
        prof = run.meta.get("profile")
        device = str(prof.get("name")) if isinstance(prof, dict) else str(run.meta.get("device_name"))
    else:
        device = str(run.meta.get("device_name") or run.backend)
    issue, copies = regime_key(issue_of(run), copy_class(streamed_tiers(run)))
    return {"device": device, "issue": issue, "copies": copies}


def streams_host_blocking(run: Run) -> bool:
    """Whether a run streams pageable, mapped or staged layers (the issue order then matters)."""
    return copy_class(streamed_tiers(run)) != "pinned"
