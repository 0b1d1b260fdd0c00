"""What changes a GPU block's time besides its FLOPs: a copy beside it, an idle gap before it.

:func:`fit` finds a profile's ``copy_slowdown`` and ``idle_speedup`` from measured cuda runs;
:func:`derate` takes both out of measured block times, so the compute fitted from them is a
block's time back to back with nothing beside it, which the simulator then puts the effects
back on (``engine._gpu_block``).

Both act on the rate-bound part of a block (its time above the compute curve's floor): a
launch-bound block costs its floor whatever the clocks or the memory traffic. The fit is a
least-squares regression of ``log(block - floor)`` on the fraction of the block a copy
overlapped and on ``1 - exp(-idle before / idle_tau_s)`` (the time constant found by a search
over a grid when the runs show three or more idle levels, else :data:`IDLE_TAU_PRIOR`), within
each layer (same model, token count,
group and index), so that only differences between the runs of one layer count: a layer seen
only one way says nothing, and an effect no layer shows both ways stays 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from offload_lab.record.intervals import overlap_with_union

__all__ = ["Effects", "fit", "derate", "observe"]

#: a layer counts when its rate-bound part is at least this share of its time
RATE_BOUND = 0.5
#: least spread (within layers) of a regressor for its effect to be fitted at all
MIN_SPREAD = 0.02
#: the idle time constant (s) used when the runs show too few idle levels to fit one: the fit
#: over the H200 runs this project ships (idle gaps of 0, 1.7, 10-12 and 82 ms before blocks; the
#: h200 profile's idle_tau_s)
IDLE_TAU_PRIOR = 0.0063
_TAU_GRID = tuple(float(x) for x in np.geomspace(5e-4, 0.5, 61))


@dataclass(frozen=True)
class Effects:
    """Fitted ``copy_slowdown`` and ``idle_speedup``, the floors they were fitted above, and how."""

    copy_slowdown: float = 0.0
    idle_speedup: float = 0.0
    idle_tau_s: float = IDLE_TAU_PRIOR
    floors: tuple[tuple[tuple[str, str], float], ...] = ()  # ((model, group), floor s)
    how: str = "none"

    def floor(self, model: Any, group: str) -> float:
        d = dict(self.floors)
        return d.get((str(model), group), d.get((str(model), "*"), 0.0))


def observe(run: Any) -> dict[str, np.ndarray]:
    """Per compute row of ``run.events``: the seconds a copy overlapped it and the idle time of
    the compute stream before it in its step (NaN for a step's first block)."""
    ev = run.events
    kinds = ev["kind"].astype(str).to_numpy()
    comp = ev[kinds == "compute"]
    copies = ev[(kinds == "copy") & (ev["dur_s"].to_numpy() > 0)]
    over = overlap_with_union(comp["start_s"].to_numpy(dtype="float64"), comp["end_s"].to_numpy(dtype="float64"),
                              copies["start_s"].to_numpy(dtype="float64"),
                              copies["end_s"].to_numpy(dtype="float64"))
    order = comp.reset_index(drop=True).sort_values(["step", "call", "start_s"] if "call" in comp else
                                                    ["step", "start_s"])
    prev_end = order.groupby(["step"])["end_s"].shift(1)
    idle = (order["start_s"] - prev_end).clip(lower=0.0)
    idle_by_row = np.full(len(comp), np.nan)
    idle_by_row[order.index.to_numpy()] = idle.to_numpy(dtype="float64")
    return {"ov": np.asarray(over, dtype="float64"), "idle": idle_by_row}


def fit(parts: list[dict[str, Any]]) -> Effects:
    """The two effects from the observations of several runs (each: ``comp_d``, ``comp_key``,
    ``comp_ov``, ``comp_idle``, ``family``, a key naming the run's model and token count, and
    ``floors``, its model's curve floor per group)."""
    rows = []
    for p in parts:
        floors = p["floors"]
        for d, (g, i), ov, idle in zip(p["comp_d"], p["comp_key"], p["comp_ov"], p["comp_idle"]):
            fl = floors.get(g, floors.get("*", 0.0))
            if d > 0 and d - fl >= RATE_BOUND * d and np.isfinite(idle):
                rows.append((f"{p['family']}|{g}|{i}", np.log(d - fl), ov / d, idle))
    if len(rows) < 8:
        return Effects(how="not fitted (too few rate-bound blocks)")
    df = pd.DataFrame(rows, columns=["k", "y", "ov", "idle_s"])
    # idle levels, a factor of two apart (0 is one): three or more fit the time constant
    levels = set(np.where(df["idle_s"] > 1e-4, np.round(np.log2(np.maximum(df["idle_s"], 1e-4))), -99))
    taus = _TAU_GRID if len(levels) >= 3 else (IDLE_TAU_PRIOR,)
    best, why = None, ""
    for tau in taus:
        got = _regress(df.assign(idle=1.0 - np.exp(-df["idle_s"] / tau)))
        if isinstance(got, str):  # this time constant makes the two regressors one: try the next
            why = got
            continue
        if best is None or got[0] < best[0] - 1e-12:
            best = (*got, tau)
    if best is None:
        return Effects(how=why)
    _, coef, dropped, tau = best
    slow = float(np.clip(coef.get("ov", 0.0), 0.0, 1.0))
    fast = float(np.clip(-coef.get("idle", 0.0), 0.0, 0.5))
    def said(c: str, what: str, text: str) -> str:
        if c in coef:
            return text
        return f"{what}: none ({'fitted with the wrong sign' if c in dropped else 'not seen'})"

    said_ov = said("ov", "copy beside", f"copy beside {coef.get('ov', 0.0):+.4f}")
    said_idle = said("idle", "idle before", f"idle before {-coef.get('idle', 0.0):+.4f} at {tau * 1e3:.1f} ms "
                                            f"({'fitted' if len(taus) > 1 else 'prior'})")
    return Effects(slow, fast, tau,
                   how=f"fitted over {len(df)} blocks: {said_ov}, {said_idle}")


def _regress(df: pd.DataFrame) -> tuple[float, dict[str, float], list[str]] | str:
    """Within-layer least squares of ``y`` on ``ov`` and ``idle``: (residual, coefficients,
    regressors dropped for the wrong sign), or why it cannot be fitted."""
    dm = df[["y", "ov", "idle"]] - df.groupby("k")[["y", "ov", "idle"]].transform("mean")
    use = [c for c in ("ov", "idle") if float(dm[c].std()) > MIN_SPREAD]
    if not use:
        return ("not fitted (no layer seen both with and without a copy beside it or an idle gap "
                "before it)")
    X = dm[use].to_numpy()
    if len(use) == 2 and abs(float(np.corrcoef(X.T)[0, 1])) > 0.95:
        # every layer that had a copy beside it had no gap before it and the other way round:
        # the runs cannot tell the two apart, and a split between them would be arbitrary
        return "not fitted (in these runs a copy beside a block and an idle gap before it never vary apart)"
    coef, *_ = np.linalg.lstsq(X, dm["y"].to_numpy(), rcond=None)
    # an effect of the wrong sign (a copy that speeds a block up, a gap that slows it) is none:
    # refit the other alone, so that it is not left bent around the one dropped
    wrong = [c for c, b in zip(use, coef) if (b < 0 if c == "ov" else b > 0)]
    dropped = wrong if len(use) == 2 else []
    if dropped:
        use = [c for c in use if c not in wrong]
        X = dm[use].to_numpy()
        coef, *_ = np.linalg.lstsq(X, dm["y"].to_numpy(), rcond=None)
    resid = float(((dm["y"].to_numpy() - X @ coef) ** 2).sum())
    return resid, dict(zip(use, (float(c) for c in coef))), dropped


def derate(comp_d: np.ndarray, groups: list[str], ov: np.ndarray, idle: np.ndarray, fx: Effects,
           model: Any) -> np.ndarray:
    """Block times of ``model`` with the effects taken out (a step's first block keeps its idle part)."""
    if not (fx.copy_slowdown or fx.idle_speedup):
        return comp_d
    per_group = {g: fx.floor(model, g) for g in set(groups)}
    fl = np.array([per_group[g] for g in groups], dtype="float64")
    fl = np.minimum(fl, comp_d)
    d = np.maximum(comp_d, 1e-15)
    factor = (1.0 + fx.copy_slowdown * ov / d) * (1.0 - fx.idle_speedup * (1.0 - np.exp(-np.nan_to_num(idle) / fx.idle_tau_s)))
    return fl + (comp_d - fl) / factor
