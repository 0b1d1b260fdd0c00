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
from collections.abc import Mapping, Sequence
from typing import Any

from offload_lab.labels import with_part
from offload_lab.record.regime import (  # noqa: F401  (part of this module's API)
    COPY_CLASSES,
    copy_class,
    issue_of,
    run_regime,
    streams_host_blocking,
)
from offload_lab.record.run import Run
from offload_lab.simulation.calibration import spec_of_run
from offload_lab.simulation.engine import simulate
from offload_lab.simulation.errors import ProfileError, SimError
from offload_lab.simulation.heldout import held_out, not_measured
from offload_lab.simulation.profile import DeviceProfile
from offload_lab.simulation.regimes import (  # noqa: F401  (part of this module's API)
    STATUSES,
    UNCONFIRMED_TEXT,
    check_regimes,
    evidence_of,
)
from offload_lab.simulation.runs import plan_of_run
from offload_lab.vocabulary import ISSUE_ORDERS

__all__ = ["COPY_CLASSES", "STATUSES", "copy_class", "run_regime", "issue_of", "regime_table",
           "check_regimes", "evidence_of", "both_orders", "other_order", "streams_host_blocking",
           "UNCONFIRMED_TEXT"]


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
    if not isinstance(runs, Mapping):
        runs = {r.label: r for r in runs} if all(isinstance(r, Run) for r in runs) else runs
    if not isinstance(runs, Mapping) or not runs or not all(isinstance(r, Run) for r in runs.values()):
        raise SimError(f"regime_table needs measured runs (a dict of name -> Run or a list of Run), got {runs!r:.80}")
    measured = {n: r for n, r in runs.items() if not not_measured(r)}
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
