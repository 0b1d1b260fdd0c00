"""Multi-rank runs read per rank: who sets the step (the straggler), and each rank's copy bandwidth.

A gathered run (:func:`offload_lab.gather`, a directory of per-rank traces, or
``simulate(..., ranks_per_node=k)``) holds every rank's rows, told apart by the ``rank``
column. Ranks of a data- or sequence-parallel job meet at collectives, so the slowest rank
sets the step for all of them: :func:`rank_table` names it.

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> plan = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="256GiB"))
>>> run = offload_lab.simulate(plan, "h200", steps=2, ranks_per_node=2)
>>> rank_table(run)[["rank", "straggler"]].values.tolist()
[[0, True], [1, False]]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from offload_lab.record.run import Run

__all__ = ["ranks_of", "is_multi_rank", "split_ranks", "rank_table", "node_steps", "slowest_rank_run",
           "RANK_TABLE_COLUMNS"]

RANK_TABLE_COLUMNS = ["rank", "node", "steps", "step_s", "slowest_step_s", "behind_s", "copy_gbps",
                      "pinned_gbps", "pageable_gbps", "bytes_moved", "straggler"]


def ranks_of(run: Run) -> list[int]:
    """The ranks a run holds rows of (``[0]`` for a single process)."""
    seen = set(run.steps["rank"].tolist()) | set(run.events["rank"].tolist())
    return sorted(int(r) for r in seen) or [0]


def is_multi_rank(run: Run) -> bool:
    """Whether ``run`` holds more than one rank's rows."""
    return len(ranks_of(run)) > 1


def split_ranks(run: Run) -> dict[int, Run]:
    """One :class:`Run` per rank (labelled ``"<label> · rank k"``), meta completed from that
    rank's entry in ``meta["ranks"]``.

    >>> import offload_lab
    >>> plan = offload_lab.plan(offload_lab.catalog.load("wan2.1-t2v-1.3b"), host="64GiB")
    >>> parts = split_ranks(offload_lab.simulate(plan, "h200", steps=1, ranks_per_node=2))
    >>> sorted(parts), parts[1].label
    ([0, 1], 'h200 · 2 ranks/node · 30 pinned · prefetch 1 · rank 1')
    """
    per = {int(m.get("rank", i)): m for i, m in enumerate(run.meta.get("ranks") or [])}
    out = {}
    for k in ranks_of(run):
        frames = {n: getattr(run, n)[getattr(run, n)["rank"] == k].reset_index(drop=True)
                  for n in ("events", "layers", "steps", "memory")}
        meta = {**run.meta, **{a: b for a, b in per.get(k, {}).items() if a not in ("run", "label")},
                "rank": k, "label": f"{run.label} · rank {k}"}
        meta.pop("ranks", None)
        out[k] = Run(**frames, meta=meta)
    return out


def node_steps(run: Run) -> pd.DataFrame:
    """Per step, the slowest rank's wall time (``wall_s``) and which rank it was (``rank``)."""
    st = run.steps
    if not len(st):
        return pd.DataFrame({"step": pd.Series(dtype="int64"), "wall_s": pd.Series(dtype="float64"),
                             "rank": pd.Series(dtype="int64")})
    idx = st.groupby("step")["wall_s"].idxmax()
    return st.loc[idx, ["step", "wall_s", "rank"]].reset_index(drop=True)


def _gbps(ev: pd.DataFrame, tier: str | None = None) -> float:
    cp = ev[(ev["kind"] == "copy") & ((ev["tier"] == tier) if tier else True)]
    secs = float(cp["dur_s"].sum())
    return float(cp["bytes"].sum()) / secs / 1e9 if secs > 0 else float("nan")


def rank_table(run: Run) -> pd.DataFrame:
    """One row per rank: ``step_s`` (median step), ``slowest_step_s``, ``behind_s`` (its median
    step minus the fastest rank's), copy bandwidth over all its copies and per tier (GB/s, bytes
    over time spent copying), ``bytes_moved`` per step (median), and ``straggler`` (the rank with
    the slowest median step: it sets the node's step). A single-process run gives one row.
    """
    nodes = {int(m.get("rank", i)): str(m.get("node") or "") for i, m in enumerate(run.meta.get("ranks") or [])}
    rows: list[dict[str, Any]] = []
    for k in ranks_of(run):
        st = run.steps[run.steps["rank"] == k]
        ev = run.events[run.events["rank"] == k]
        rows.append({
            "rank": k, "node": nodes.get(k, str(run.meta.get("node") or "")), "steps": len(st),
            "step_s": float(st["wall_s"].median()) if len(st) else float("nan"),
            "slowest_step_s": float(st["wall_s"].max()) if len(st) else float("nan"),
            "copy_gbps": _gbps(ev), "pinned_gbps": _gbps(ev, "pinned"), "pageable_gbps": _gbps(ev, "pageable"),
            "bytes_moved": int(st["bytes_moved"].median()) if len(st) else 0,
        })
    df = pd.DataFrame(rows, columns=[c for c in RANK_TABLE_COLUMNS if c not in ("behind_s", "straggler")])
    step = df["step_s"].to_numpy(dtype="float64")
    finite = np.isfinite(step)
    df["behind_s"] = step - (step[finite].min() if finite.any() else np.nan)
    # the first of the slowest ranks, so that a symmetric node names one straggler
    slowest = int(np.argmax(np.where(finite, step, -np.inf))) if finite.any() else -1
    df["straggler"] = np.arange(len(df)) == slowest
    return df[RANK_TABLE_COLUMNS].astype({"rank": "int64", "node": "string", "steps": "int64",
                                          "bytes_moved": "int64", "straggler": "bool"})


def slowest_rank_run(run: Run) -> Run:
    """The straggler's own run with each step's wall time set to the slowest rank's at that step
    (labelled ``"<label> · max over ranks"``): what the node as a whole takes per step."""
    table = rank_table(run)
    k = int(table.loc[table["straggler"], "rank"].iloc[0]) if table["straggler"].any() else ranks_of(run)[0]
    part = split_ranks(run)[k]
    worst = node_steps(run).set_index("step")["wall_s"]
    steps = part.steps.assign(wall_s=part.steps["step"].map(worst).fillna(part.steps["wall_s"]))
    return Run(part.events, part.layers, steps, part.memory,
               {**part.meta, "label": f"{run.label} · max over ranks", "straggler": k})
