"""What each prediction rests on: the regime of a simulated run and the measured runs behind it.

A **regime** is what a held-out error carries over between: the device profile, the runtime's
issue order and the class of the copies the plan streams (its model and token count are not
part of it: the held-out runs of one regime span both model sizes and token counts):

* ``pinned``: every streamed layer is pinned, or nothing is streamed (all resident). Both issue
  orders issue every pinned copy from the pre-hook and the simulator predicts the same timeline
  under either, so a ``pinned`` regime holds for both orders (its issue order is ``"any"``);
* ``host-blocking``: some streamed layer is ``pageable`` or ``mapped`` (copies that block the
  host thread; pinned layers beside them do not change the class) and none is staged;
* ``staged``: some streamed layer is ``staged`` and none is pageable or mapped;
* ``host-blocking+staged``: both.

A profile's per-regime table (``DeviceProfile.regimes``, made by :func:`regime_table` and, for
the shipped ``h200`` profile, written by ``scripts/calibrate_h200.py``) lists each regime the
measured runs of its device cover, those runs, and the worst leave-one-out error of the
simulator over them (each run predicted by a profile fitted on every other run). A simulated
run's ``meta["evidence"]`` (from :func:`evidence_of`) is then a table lookup, cheap enough for
every redraw:

* ``"held-out"``: measured runs of the same regime exist; ``band`` is their worst held-out error;
* ``"unconfirmed"``: no measured run of that regime exists (e.g. after-compute pageable copies
  on any GPU today); ``band`` is ``None``;
* ``"derived"``: the profile has no measured run of its device at all (an estimated profile such
  as ``rtx4090-pcie4``, or a node of several ranks, an estimate on top of the profile);
  ``band`` is ``None``.

Adding measured runs of a new regime and rerunning the calibration makes the status follow,
with no change to this code.

>>> copy_class(["pinned", "resident"]), copy_class(["pinned", "mapped"]), copy_class(["staged"])
('pinned', 'host-blocking', 'staged')
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from offload_lab.planning.options import ISSUE_ORDERS
from offload_lab.record.run import Run
from offload_lab.simulation.errors import SimError

__all__ = ["COPY_CLASSES", "STATUSES", "copy_class", "run_regime", "issue_of", "regime_table",
           "check_regimes", "evidence_of", "both_orders", "streams_host_blocking", "UNCONFIRMED_TEXT"]

COPY_CLASSES = ("pinned", "host-blocking", "staged", "host-blocking+staged")
STATUSES = ("held-out", "unconfirmed", "derived")
#: what a prediction without a band says instead of a ± band
UNCONFIRMED_TEXT = "unconfirmed — no GPU run of this issue order yet"
_HOST_BLOCKING = ("pageable", "mapped")
_DESCRIBE = {"pinned": "pinned copies only (or none)", "host-blocking": "pageable/mapped copies",
             "staged": "staged copies", "host-blocking+staged": "pageable/mapped and staged copies"}


def copy_class(tiers: Iterable[str]) -> str:
    """The class of copies a plan streams, from the tiers of its streamed layers (see the module).

    >>> copy_class([]), copy_class(["pageable", "staged", "pinned"])
    ('pinned', 'host-blocking+staged')
    """
    ts = {str(t) for t in tiers}
    blocking, staged = bool(ts & set(_HOST_BLOCKING)), "staged" in ts
    if blocking and staged:
        return "host-blocking+staged"
    return "host-blocking" if blocking else "staged" if staged else "pinned"


def issue_of(run: Run) -> str:
    """A run's issue order; runs recorded before the option existed issued ``"before-compute"``."""
    issue = run.meta.get("issue")
    return issue if issue in ISSUE_ORDERS else "before-compute"


def _streamed_tiers(run: Run) -> list[str]:
    df = run.layers
    if not len(df):
        return []
    streamed = df["streamed"].astype(bool) if "streamed" in df else df["tier"].astype(str) != "resident"
    return [str(t) for t in df.loc[streamed, "tier"]]


def _key(issue: str, copies: str) -> tuple[str, str]:
    # a pinned-only plan runs the same way in either order (see the module text)
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
    issue, copies = _key(issue_of(run), copy_class(_streamed_tiers(run)))
    return {"device": device, "issue": issue, "copies": copies}


def streams_host_blocking(run: Run) -> bool:
    """Whether a run streams pageable, mapped or staged layers (the issue order then matters)."""
    return copy_class(_streamed_tiers(run)) != "pinned"


def regime_table(runs: Mapping[str, Run] | Sequence[Run], loo: Any = None, source: str = "") -> dict[str, Any]:
    """The per-regime held-out table of measured runs of one device (``DeviceProfile.regimes``).

    ``runs`` (``{name: Run}`` or a list, named by label) are measured runs of one device;
    simulated and observed runs are skipped, as :func:`~offload_lab.simulation.heldout.held_out`
    does. ``loo`` is that function's table for these runs when the caller has it already (its
    ``loo_err`` column), else it is computed (one profile fitted per run: seconds per run);
    ``source`` names where the runs lie, for the table's ``how``. A
    run whose leave-one-out prediction is missing (a tier no other run copied from) backs no
    regime.

    >>> import offload_lab
    >>> runs = [r for r in offload_lab.shipped_runs("wan2.1-t2v-1.3b") if r.label in ("1.3B pinned p1", "1.3B pinned p0")]
    >>> t = regime_table(runs)
    >>> t["device_name"], [(r["issue"], r["copies"], r["runs"]) for r in t["table"]]
    ('NVIDIA H200', [('any', 'pinned', ['1.3B pinned p1', '1.3B pinned p0'])])
    """
    from offload_lab.simulation.heldout import _not_measured, held_out

    if not isinstance(runs, Mapping):
        runs = {r.label: r for r in runs} if all(isinstance(r, Run) for r in runs) else runs
    if not isinstance(runs, Mapping) or not runs or not all(isinstance(r, Run) for r in runs.values()):
        raise SimError(f"regime_table needs measured runs (a dict of name -> Run or a list of Run), got {runs!r:.80}")
    measured = {n: r for n, r in runs.items() if not _not_measured(r)}
    if not measured:
        raise SimError(f"regime_table needs measured runs; every run given is simulated or observed: {sorted(runs)}")
    devices = sorted({str(r.meta.get("device_name") or r.backend) for r in measured.values()})
    if len(devices) != 1:
        raise SimError(f"regime_table needs runs of one device (one profile); got devices {devices}")
    if loo is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # skipped runs are already left out above
            loo = held_out(measured, schemes=("loo",))
    err = dict(zip(loo["run"], loo["loo_err"]))
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for name, r in measured.items():
        e = err.get(name)
        if e is None or not math.isfinite(e):
            continue
        reg = run_regime(r)
        row = rows.setdefault((reg["issue"], reg["copies"]),
                              {"issue": reg["issue"], "copies": reg["copies"], "runs": [], "band": 0.0})
        row["runs"].append(r.label)
        row["band"] = max(row["band"], round(abs(float(e)), 4))
    order = {c: i for i, c in enumerate(COPY_CLASSES)}
    table = sorted(rows.values(), key=lambda x: (order[x["copies"]], x["issue"]))
    return {"device_name": devices[0],
            "how": f"worst leave-one-out error of the simulator over the measured runs of each regime "
                   f"({len(measured)} runs{' of ' + source if source else ''}; "
                   f"offload_lab.simulation.evidence.regime_table)",
            "table": table}


def check_regimes(name: str, regimes: Any) -> dict[str, Any]:
    """A profile's ``regimes`` checked (``{}``: none); raises :class:`~offload_lab.ProfileError`."""
    from offload_lab.simulation.errors import ProfileError

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


def _regime_text(issue: str, copies: str) -> str:
    return f"{_DESCRIBE[copies]}, either issue order" if issue == "any" else f"{issue}, {_DESCRIBE[copies]}"


def _runs_text(labels: list[str], most: int = 3) -> str:
    shown = ", ".join(repr(x) for x in labels[:most])
    return shown + (f" and {len(labels) - most} more" if len(labels) > most else "")


def evidence_of(profile: Any, issue: str, copies: str) -> dict[str, Any]:
    """``meta["evidence"]`` of a prediction on ``profile`` in ``issue`` order with ``copies``.

    >>> from offload_lab.simulation import DeviceProfile
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
    key_issue, _ = _key(issue, copies)
    regime = {"device": profile.name, "issue": key_issue, "copies": copies}
    regimes = getattr(profile, "regimes", None) or {}
    rows = regimes.get("table") or []
    what = _regime_text(key_issue, copies)
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
    have = "; ".join(_regime_text(r["issue"], r["copies"]) for r in rows)
    return {**base, "status": "unconfirmed", "band": None,
            "basis": f"no measured {device} run in the {issue} order with "
                     f"{_DESCRIBE[copies]} yet (measured: {have})"}


def both_orders(plan: Any, device: Any, **kwargs: Any) -> list[Run]:
    """The plan simulated under each issue order, each labelled with its order and evidence.

    Two runs (``after-compute`` first, then ``before-compute``) when the plan streams pageable,
    mapped or staged layers; one run (in the default order) when its copies are all pinned or it
    streams nothing, since the order does not change such a plan. ``kwargs`` are
    :func:`~offload_lab.simulate`'s (``steps``, ``tokens``, ``label``, ...) except ``issue``.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> p = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="256GiB"))
    >>> [(r.meta["issue"], r.meta["evidence"]["status"]) for r in both_orders(p, "h200", steps=2)]
    [('after-compute', 'unconfirmed'), ('before-compute', 'held-out')]
    """
    from offload_lab.simulation.engine import simulate
    from offload_lab.views.text import with_part

    if "issue" in kwargs:
        raise SimError(f"both_orders simulates every issue order itself; got issue={kwargs['issue']!r} "
                       f"(call simulate(plan, device, issue=...) for one order)")
    first = simulate(plan, device, issue=ISSUE_ORDERS[0], **kwargs)
    if not streams_host_blocking(first):
        return [first]
    out = [first] + [simulate(plan, device, issue=o, **kwargs) for o in ISSUE_ORDERS[1:]]
    for r in out:  # name the order in the label (before a "(simulated)" mark where it has one)
        r.meta["label"] = with_part(r.label, r.meta["issue"])
    return out


def other_order(run: Run) -> Run | None:
    """A simulated run's plan predicted again in the other issue order, on the same profile;
    None when the order does not change the plan (pinned copies only), for a measured run, or
    when the run's plan or profile cannot be rebuilt (a run saved by an older version).

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    >>> p = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="256GiB"))
    >>> other = other_order(offload_lab.simulate(p, "h200", steps=2))
    >>> other.meta["issue"], other.meta["evidence"]["status"]
    ('before-compute', 'held-out')
    """
    from offload_lab.simulation.calibration import spec_of_run
    from offload_lab.simulation.engine import simulate
    from offload_lab.simulation.errors import ProfileError
    from offload_lab.simulation.profile import DeviceProfile
    from offload_lab.simulation.runs import plan_of_run

    if not run.simulated or not streams_host_blocking(run) or run.meta.get("ranks_per_node"):
        return None
    try:
        prof = DeviceProfile.from_dict(run.meta["profile"])
        _, plan = plan_of_run(run, spec=spec_of_run(run))
        other = next(o for o in ISSUE_ORDERS if o != issue_of(run))
        warm = int(run.meta.get("warmup_dropped", 0) or 0)
        return simulate(plan, prof, steps=len(run.steps) + warm, warmup=warm, tokens=run.meta.get("tokens"),
                        passes=int(run.meta.get("passes", 1) or 1), issue=other,
                        stage_threads=int(run.meta.get("stage_threads", 1) or 1))
    except (KeyError, TypeError, SimError, ProfileError, StopIteration):
        return None
