"""The plan and the steps :func:`~offload_lab.planning.planner.plan` and
:func:`~offload_lab.planning.pipeline.plan_pipeline` share: the host and budget they resolve, the
ledger, the device part, the :class:`Plan` they finish with and the warnings they issue.

Both fronts build their units and solve them with :mod:`offload_lab.planning.grants`; this
module sits between the two so that neither imports the other.
"""

from __future__ import annotations

import importlib
import json
import warnings
from dataclasses import dataclass, field
from html import escape
from typing import Any

import numpy as np
import pandas as pd

from offload_lab.keyed import PlanTable
from offload_lab.model.spec import ModelSpec
from offload_lab.planning.device import device_parts, misfit_note
from offload_lab.planning.errors import PlanError, PlanSizeError, PlanWarning, check_choice
from offload_lab.planning.grants import Outcome, Unit, jsonable, parse_bytes
from offload_lab.planning.hostmem import HostMemory, HostMemoryError, resolve_host
from offload_lab.planning.options import ISSUE_ORDERS, STRATEGIES, TIERS
from offload_lab.reading import InputFileError, parse_json
from offload_lab.units import SizeError, format_bytes

__all__ = [
    "LAYER_COLUMNS", "Plan", "plain_ledger", "add_device", "resolve_plan_host", "budget_of", "finish_plan",
    "check_forced_pinned", "ledger_of", "emit_warnings",
]

LAYER_COLUMNS = ["group", "layer", "tier", "bytes", "mapped_bytes", "streamed", "pin_rank", "reason"]
_FORMAT = "offload-lab/plan"


# -- Plan ----------------------------------------------------------------------------------------
@dataclass(eq=False, repr=False)
class Plan:
    """The decision per layer, the budget ledger and the group init order.

    >>> from offload_lab import catalog
    >>> from offload_lab.planning.planner import plan
    >>> p = plan(catalog.load("wan2.1-t2v-14b"), pin_budget="8GiB", host=HostMemory(available="64GiB"))
    >>> p.tier_of("blocks", 0), p.tier_of("blocks", 39)
    ('pinned', 'pageable')
    """

    spec: ModelSpec
    layers: pd.DataFrame
    ledger: dict[str, Any]
    init_order: list[str]
    prefetch: int  # a plan rebuilt from a run may hold one per group (``{group: depth}``)
    params: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    host: HostMemory | None = None
    grant_order: list[str] = field(default_factory=list)
    #: the runtime's issue order the plan ran under, for a plan rebuilt from a run
    #: (:meth:`from_layers`); ``None``: :func:`~offload_lab.simulate` takes its default
    issue: str | None = None

    @classmethod
    def from_layers(cls, spec: ModelSpec, layers: pd.DataFrame, prefetch: int | dict[str, int] = 1,
                    params: dict[str, Any] | None = None, issue: str | None = None) -> Plan:
        """A plan from a layers frame that was not planned here (a recorded run's ``layers``).

        ``layers`` needs ``group, layer, tier, bytes, streamed``; ``mapped_bytes``, ``pin_rank``
        and ``reason`` are filled in when missing, other columns are dropped. The ledger is
        empty: what the host could spend was not recorded, so :attr:`fits` is not known and
        reads True.

        >>> from offload_lab import catalog, plan
        >>> spec = catalog.load("wan2.1-t2v-1.3b")
        >>> p = plan(spec, tier="pinned", host=HostMemory(available="64GiB"))
        >>> again = Plan.from_layers(spec, p.layers[["group", "layer", "tier", "bytes", "streamed"]])
        >>> again.streamed_layers("blocks") == p.streamed_layers("blocks"), again.ledger
        (True, {})
        """
        need = {"group", "layer", "tier", "bytes", "streamed"}
        if not isinstance(layers, pd.DataFrame) or not need <= set(layers.columns):
            got = sorted(layers.columns) if isinstance(layers, pd.DataFrame) else type(layers).__name__
            raise PlanError(f"layers {got} is not a layers frame; accepted: a DataFrame with columns "
                            f"{sorted(need)}")
        if issue is not None:
            check_choice(issue, "issue", ISSUE_ORDERS)
        df = layers.reset_index(drop=True)
        rows = [{
            "group": str(r["group"]), "layer": int(r["layer"]), "tier": str(r["tier"]),
            "bytes": int(r["bytes"]), "mapped_bytes": int(r.get("mapped_bytes", 0) or 0),
            "streamed": bool(r["streamed"]),
            "pin_rank": None if pd.isna(r.get("pin_rank", None)) else int(r["pin_rank"]),
            "reason": str(r.get("reason", None) or f"{r['tier']}: as recorded"),
        } for r in df.to_dict("records")]
        return cls(spec, _layers_frame(rows), {}, list(dict.fromkeys(str(g) for g in df["group"])),
                   prefetch, dict(params or {}), issue=issue)

    # -- queries -------------------------------------------------------------------------
    def _row(self, group: str, layer: int) -> pd.Series:
        df = self.layers
        hit = df[(df["group"] == group) & (df["layer"] == layer)]
        if hit.empty:
            raise PlanError(
                f"layer {group}.{layer} is not in this plan; groups: "
                f"{ {g: int((df['group'] == g).sum()) for g in self.spec.group_names} }"
            )
        return hit.iloc[0]

    def tier_of(self, group: str, layer: int) -> str:
        """Tier of one layer: ``plan.tier_of("blocks", 3) -> "pinned"``."""
        return str(self._row(group, layer)["tier"])

    def reason_of(self, group: str, layer: int) -> str:
        """Why one layer got its tier."""
        return str(self._row(group, layer)["reason"])

    def _placement(self) -> list[tuple[str, int, bool, int]]:
        """(group, layer, streamed, bytes) per row; plain tuples, since widgets call the
        queries below on every slider move and pandas masks cost ~1 ms each."""
        df = self.layers
        return list(zip(df["group"].tolist(), (int(i) for i in df["layer"].tolist()),
                        (bool(s) for s in df["streamed"].tolist()), (int(b) for b in df["bytes"].tolist())))

    def streamed_layers(self, group: str) -> list[int]:
        """Indices of the group's streamed layers, in execution order."""
        self.spec.group(group)  # names the groups when this one does not exist
        return sorted(i for g, i, s, _ in self._placement() if g == group and s)

    def resident_layers(self, group: str) -> list[int]:
        """Indices of the group's resident layers, in index order."""
        self.spec.group(group)
        return sorted(i for g, i, s, _ in self._placement() if g == group and not s)

    @property
    def tier_counts(self) -> dict[str, int]:
        counts = self.layers["tier"].value_counts()
        return {t: int(counts.get(t, 0)) for t in TIERS}

    @property
    def fits(self) -> bool:
        """True when the plan fits the host and (when ``device_memory`` was given) the device."""
        return bool(self.ledger.get("fits", True)) and bool(self.ledger.get("device_fits", True))

    @property
    def device_peak(self) -> int:
        """Predicted steady-state device bytes (an estimate; see :mod:`offload_lab.planning.device`)."""
        if "device_peak_bytes" not in self.ledger:  # a plan saved before the device model
            return device_parts(self.spec, self._placement(), self.prefetch, None, None)["device_peak_bytes"]
        return int(self.ledger["device_peak_bytes"])

    def startup_peak(self, strategy: str = "grouped") -> int:
        """Predicted device bytes at the startup peak.

        ``grouped``: every group's layers are replaced by host stores first (largest group
        first), then non-layer tensors move to the device once, then prefetch is armed — the
        peak is non-layer + resident layers + the first ``prefetch`` streamed layers of each
        group in flight. ``naive``: in declared order each group is offloaded and then the whole
        model moved, so groups not yet offloaded are transiently on the device; the peak is the
        largest of non-layer + resident layers of the groups already offloaded + every layer of
        the groups not yet offloaded, and never below the grouped steady state.

        >>> from offload_lab import catalog
        >>> from offload_lab.planning.planner import plan
        >>> p = plan(catalog.load("minimax-h3"), host=HostMemory(available="64GiB"))
        >>> p.startup_peak("naive") > 60 * 2**30 > p.startup_peak("grouped")
        True
        """
        check_choice(strategy, "strategy", STRATEGIES)
        non_layer = self.spec.non_layer_bytes
        rows = sorted(self._placement(), key=lambda r: r[1])  # execution order in each group
        parts = {}
        for g in self.spec.group_names:
            mine = [r for r in rows if r[0] == g]
            resident = sum(b for _, _, s, b in mine if not s)
            in_flight = sum([b for _, _, s, b in mine if s][: self.prefetch])
            parts[g] = (resident, in_flight, sum(b for *_, b in mine))
        steady = non_layer + sum(p[0] + p[1] for p in parts.values())
        if strategy == "grouped":
            return steady
        peak = steady
        names = self.spec.group_names
        for i in range(len(names)):
            # prefetch is armed only after every group is offloaded, so not counted here
            done = sum(parts[g][0] for g in names[: i + 1])
            pending = sum(parts[g][2] for g in names[i + 1:])
            peak = max(peak, non_layer + done + pending)
        return peak

    def to_engine(self, name: str, device: Any = None, tokens: int | str | None = None,
                  calls: int = 1) -> Any:
        """The nearest settings of engine ``name`` that realise this plan, as code or flags, with
        what the engine cannot express (:func:`offload_lab.engines.to_engine`)."""
        # looked up by name when called: the engines package builds on the planner, not the reverse
        engines = importlib.import_module("offload_lab.engines")
        return engines.to_engine(self, name, device=device, tokens=tokens, calls=calls)

    # -- printing --------------------------------------------------------------------------
    def table(self) -> pd.DataFrame:
        """The layers with sizes formatted, for printing in a notebook or a terminal.

        A DataFrame (:class:`~offload_lab.keyed.PlanTable`) whose printed form keeps
        layer, tier, pin rank and reason in view on a narrow terminal; ``mapped`` is the bytes
        a ``mapped`` layer reads from its checkpoint file (empty for the other tiers).
        """
        df = self.layers
        return PlanTable({
            "group": df["group"], "layer": df["layer"], "tier": df["tier"],
            "size": [format_bytes(b) for b in df["bytes"]],
            # a pinned or pageable store is a copy: what it read from the file is not mapped any more
            "mapped": [format_bytes(b) if t == "mapped" else "" for b, t in zip(df["mapped_bytes"], df["tier"])],
            "streamed": df["streamed"],
            "pin rank": ["" if pd.isna(r) else str(int(r)) for r in df["pin_rank"]],
            "reason": df["reason"],
        })

    def summary(self) -> str:
        t = self.tier_counts
        led = self.ledger
        tiers = ", ".join(f"{n} {k}" for k, n in t.items() if n)
        if not led:  # rebuilt from a run (from_layers): no budget was recorded
            return f"{len(self.layers)} layers: {tiers}; rebuilt from a run (no ledger)"
        fit = "fits" if led["fits"] else "DOES NOT FIT"
        staging = (f" + {format_bytes(led['staging_bytes'])} staging buffers"
                   if led.get("staging_bytes") else "")
        dev = ""
        if led.get("device_memory") is not None:
            dev = (f"; device peak {format_bytes(led['device_peak_bytes'])} (estimate) of "
                   f"{format_bytes(led['device_memory'])}, "
                   f"{'fits' if led['device_fits'] else 'DOES NOT FIT the device'}")
        return (f"{len(self.layers)} layers: {tiers}; pinned {format_bytes(led['pinned_bytes'])}{staging} "
                f"of budget {format_bytes(led['budget'])}; net new anonymous "
                f"{format_bytes(led['net_anonymous_bytes'])}; {fit}{dev}")

    def __repr__(self) -> str:
        return f"Plan({self.spec.name!r}, {self.summary()})"

    def _repr_html_(self) -> str:
        # escaped: a spec name can come from a directory name or a shared plan
        return f"<p><code>{escape(repr(self))}</code></p>" + self.table().to_html(index=False, escape=True)

    # -- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-able, spec included; ``Plan.from_dict(p.to_dict())`` gives the same plan."""
        layers = []
        for r in self.layers.itertuples(index=False):
            layers.append({
                "group": str(r.group), "layer": int(r.layer), "tier": str(r.tier),
                "bytes": int(r.bytes), "mapped_bytes": int(r.mapped_bytes),
                "streamed": bool(r.streamed),
                "pin_rank": None if pd.isna(r.pin_rank) else int(r.pin_rank),
                "reason": str(r.reason),
            })
        return {
            "format": _FORMAT, "version": 1, "spec": self.spec.to_dict(),
            "params": jsonable(self.params), "ledger": plain_ledger(self.ledger),
            "init_order": list(self.init_order), "prefetch": int(self.prefetch),
            "warnings": list(self.warnings),
            "host": None if self.host is None else self.host.to_dict(),
            "grant_order": list(self.grant_order), "layers": layers,
            **({} if self.issue is None else {"issue": self.issue}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        if not isinstance(d, dict) or d.get("format") != _FORMAT:
            raise PlanError(f"not an offload-lab plan (expected format {_FORMAT!r})")
        return cls(
            spec=ModelSpec.from_dict(d["spec"]), layers=_layers_frame(d["layers"]),
            ledger=dict(d["ledger"]), init_order=list(d["init_order"]),
            prefetch=int(d["prefetch"]), params=dict(d["params"]),
            warnings=list(d.get("warnings", [])),
            host=None if d.get("host") is None else HostMemory.from_dict(d["host"]),
            grant_order=list(d.get("grant_order", [])), issue=d.get("issue"),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """A plan from the JSON text :meth:`to_json` wrote (too deep nesting is a PlanError).

        >>> Plan.from_json("[" * 100_000)
        Traceback (most recent call last):
        ...
        offload_lab.planning.errors.PlanError: plan JSON is not valid JSON: nested too deeply
        """
        try:
            data = parse_json(text, "plan JSON")
        except InputFileError as e:
            raise PlanError(str(e)) from None
        return cls.from_dict(data)


def plain_ledger(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (bool(v) if isinstance(v, bool) else int(v) if isinstance(v, int) else v)
            for k, v in d.items()}


def add_device(p: Plan, tokens: Any, device_memory: int | None) -> list[str]:
    """Put the device part in ``p``'s ledger; when it does not fit, say so in every reason and
    return the warning (the host side's misfit works the same way)."""
    p.ledger.update(device_parts(p.spec, p._placement(), p.prefetch, tokens, device_memory))
    if p.ledger["device_fits"]:
        return []
    note = misfit_note(p.ledger)
    p.layers["reason"] = [f"{r}; does not fit the device" for r in p.layers["reason"]]
    msg = f"{p.spec.name}: {note}; accepted: fewer resident layers, a smaller prefetch or more device memory"
    p.warnings.append(msg)
    return [msg]


def _layers_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=LAYER_COLUMNS)
    return df.astype({
        "group": "object", "layer": "int64", "tier": "object", "bytes": "int64",
        "mapped_bytes": "int64", "streamed": "bool", "pin_rank": "Int64", "reason": "object",
    }).reset_index(drop=True)


def resolve_plan_host(host: Any) -> HostMemory:
    try:
        return resolve_host(host)
    except SizeError as e:
        raise PlanSizeError(f"host: {e}") from None
    except HostMemoryError as e:
        raise PlanError(str(e)) from None


def budget_of(host: HostMemory, pin_budget: Any) -> tuple[int, int | None, list[str]]:
    """``(budget, the user's budget in bytes or None, a note when the host capped it)``."""
    user = None if pin_budget is None else parse_bytes(pin_budget, "pin_budget")
    spend = host.spendable
    if user is None or user <= spend:
        return (spend if user is None else user), user, []
    return spend, user, [f"pin_budget {format_bytes(user)} is more than the host can spend "
                         f"({format_bytes(spend)}); capped"]


def _rows_frame(rows: list[Any]) -> pd.DataFrame:
    """The layers frame of the planner's own rows, built column by column in its final dtypes:
    the same frame :func:`_layers_frame` gives, without inferring and re-typing every column
    (that cost most of a plan: the plan widget plans on every slider move)."""
    def texts(values: list[str]) -> pd.Series:
        # a Series keeps object dtype; pandas 3 would infer ``str`` from an object ndarray
        return pd.Series(values, dtype="object", copy=False)

    return pd.DataFrame({
        "group": texts([r.group for r in rows]),
        "layer": np.array([r.index for r in rows], dtype="int64"),
        "tier": texts([r.tier for r in rows]),
        "bytes": np.array([r.bytes for r in rows], dtype="int64"),
        "mapped_bytes": np.array([r.mapped for r in rows], dtype="int64"),
        "streamed": np.array([r.streamed for r in rows], dtype="bool"),
        "pin_rank": pd.array([r.pin_rank for r in rows], dtype="Int64"),
        "reason": texts([r.reason for r in rows]),
    }, copy=False)


def finish_plan(unit: Unit, ledger: dict[str, Any], params: dict[str, Any], msgs: list[str],
            host: HostMemory) -> Plan:
    layers = _rows_frame(unit.rows)
    return Plan(unit.spec, layers, ledger, unit.init_order, unit.prefetch, params, msgs, host,
                [r.name for r in unit.grant_order])


def check_forced_pinned(unit: Unit, budget: int) -> None:
    if unit.tier != "pinned":
        return
    smallest = min((r.bytes for r in unit.rows if r.streamed), default=None)
    if smallest is not None and smallest > budget:
        raise PlanError(
            f"tier 'pinned' is forced but no streamed layer of {unit.spec.name!r} fits the pin "
            f"budget {format_bytes(budget)} (the smallest is {format_bytes(smallest)}); accepted: "
            f"a larger pin_budget or host, or tier 'pageable', 'mapped' or None"
        )


def ledger_of(host: HostMemory, out: Outcome) -> dict[str, Any]:
    ledger = {
        "available": host.available, "reserve": host.reserve, "spendable": host.spendable,
        "budget": out.budget, "pinned_bytes": out.pinned, "net_anonymous_bytes": out.net,
        "fits": out.fits, "headroom": out.headroom, "staging_bytes": out.staging,
        "staging": {g: {"buffers": k, "buffer_bytes": b} for g, (k, b) in out.staging_groups.items()},
    }
    if host.ranks > 1:  # this rank's share of a node that several ranks plan against
        ledger.update(ranks=host.ranks, local_rank=host.local_rank, node_spendable=host.node_spendable,
                      split=host.split_note())
    return ledger


def emit_warnings(msgs: list[str]) -> None:
    for m in msgs:
        warnings.warn(m, PlanWarning, stacklevel=3)
