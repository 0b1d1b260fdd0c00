"""A profile's per-regime table: checking it, and looking a prediction up in it.

The statuses and the table are described in :mod:`offload_lab.simulation.evidence`, which
builds the table; this module holds what the profile and the engine need to read it, so
neither imports the simulator to do so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from offload_lab.record.regime import COPY_CLASSES, regime_key
from offload_lab.simulation.errors import ProfileError, SimError
from offload_lab.vocabulary import ISSUE_ORDERS

__all__ = ["STATUSES", "UNCONFIRMED_TEXT", "check_regimes", "evidence_of", "regime_text"]

STATUSES = ("held-out", "unconfirmed", "derived")
#: what a prediction without a band says instead of a ± band
UNCONFIRMED_TEXT = "unconfirmed — no GPU run of this issue order yet"
_DESCRIBE = {"pinned": "pinned copies only (or none)", "host-blocking": "pageable/mapped copies",
             "staged": "staged copies", "host-blocking+staged": "pageable/mapped and staged copies"}


def check_regimes(name: str, regimes: Any) -> dict[str, Any]:
    """A profile's ``regimes`` checked (``{}``: none); raises :class:`~offload_lab.ProfileError`."""
    if regimes is None or regimes == {}:
        return {}
    ok = isinstance(regimes, Mapping) and isinstance(regimes.get("device_name"), str) \
        and isinstance(regimes.get("table"), list)
    if not ok:
        raise ProfileError(f"profile {name!r}: regimes {regimes!r:.80}; accepted: {{}} or "
                           f"{{'device_name': str, 'how': str, 'table': [rows]}} (evidence.regime_table)")
    for row in regimes["table"]:
        good = (isinstance(row, Mapping) and row.get("issue") in (*ISSUE_ORDERS, "any")
                and row.get("copies") in COPY_CLASSES and isinstance(row.get("runs"), list) and row["runs"]
                and isinstance(row.get("band"), (int, float)) and not isinstance(row.get("band"), bool)
                and math.isfinite(row["band"]) and row["band"] >= 0
                and (row["issue"] == "any") == (row["copies"] == "pinned"))
        if not good:
            raise ProfileError(f"profile {name!r}: regimes row {row!r:.120}; accepted: issue in "
                               f"{[*ISSUE_ORDERS, 'any']} ('any' exactly for copies 'pinned'), copies in "
                               f"{list(COPY_CLASSES)}, a non-empty list of runs, band a number >= 0")
    return {**regimes, "table": [dict(r) for r in regimes["table"]]}


def regime_text(issue: str, copies: str) -> str:
    """A regime in words.

    >>> regime_text("any", "pinned")
    'pinned copies only (or none), either issue order'
    """
    return f"{_DESCRIBE[copies]}, either issue order" if issue == "any" else f"{issue}, {_DESCRIBE[copies]}"


def _runs_text(labels: list[str], most: int = 3) -> str:
    shown = ", ".join(repr(x) for x in labels[:most])
    return shown + (f" and {len(labels) - most} more" if len(labels) > most else "")


def evidence_of(profile: Any, issue: str, copies: str) -> dict[str, Any]:
    """``meta["evidence"]`` of a prediction on ``profile`` in ``issue`` order with ``copies``.

    >>> from offload_lab.simulation.profile import DeviceProfile
    >>> e = evidence_of(DeviceProfile.load("h200"), "after-compute", "host-blocking")
    >>> e["status"], e["band"]
    ('unconfirmed', None)
    >>> evidence_of(DeviceProfile.load("h200"), "before-compute", "host-blocking")["status"]
    'held-out'
    """
    if issue not in ISSUE_ORDERS:
        raise SimError(f"issue = {issue!r}; accepted: {', '.join(ISSUE_ORDERS)}")
    if copies not in COPY_CLASSES:
        raise SimError(f"copies = {copies!r}; accepted: {', '.join(COPY_CLASSES)}")
    key_issue, _ = regime_key(issue, copies)
    regime = {"device": profile.name, "issue": key_issue, "copies": copies}
    regimes = getattr(profile, "regimes", None) or {}
    rows = regimes.get("table") or []
    what = regime_text(key_issue, copies)
    base = {"regime": regime, "runs": []}
    if not rows and profile.provenance.get("kind") != "measured":
        return {**base, "status": "derived", "band": None,
                "basis": f"profile {profile.name!r} is estimated (datasheets and ratios measured on "
                         f"another GPU); no measured run of this device backs it"}
    if not rows:
        return {**base, "status": "unconfirmed", "band": None,
                "basis": f"profile {profile.name!r} was fitted on measured runs but carries no per-regime "
                         f"held-out table (offload_lab.simulation.evidence.regime_table), so no run is held "
                         f"out for {what}"}
    device = regimes.get("device_name", profile.name)
    for row in rows:
        if row["issue"] == key_issue and row["copies"] == copies:
            n = len(row["runs"])
            return {**base, "runs": list(row["runs"]), "status": "held-out", "band": float(row["band"]),
                    "basis": f"worst leave-one-out error {row['band'] * 100:.1f} % over {n} measured "
                             f"{device} run{'s' if n != 1 else ''} of this regime ({what}): {_runs_text(row['runs'])}"}
    have = "; ".join(regime_text(r["issue"], r["copies"]) for r in rows)
    return {**base, "status": "unconfirmed", "band": None,
            "basis": f"no measured {device} run in the {issue} order with "
                     f"{_DESCRIBE[copies]} yet (measured: {have})"}
