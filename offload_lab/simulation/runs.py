"""The plan a recorded run was made under, rebuilt from its frames so it can be simulated again."""

from __future__ import annotations

import pandas as pd

from offload_lab.model.spec import ModelSpec
from offload_lab.planning.planner import Plan
from offload_lab.record.run import Run
from offload_lab.simulation.errors import SimError
from offload_lab.vocabulary import ISSUE_ORDERS


def plan_of_run(run: Run, spec: ModelSpec | None = None) -> tuple[ModelSpec, Plan]:
    """``(spec, plan)`` rebuilt from a run's ``layers`` and meta: ``plan`` is an
    :class:`~offload_lab.Plan` (:meth:`~offload_lab.Plan.from_layers`) that carries the spec and
    the run's issue order, so ``simulate(plan, device)`` replays it. Without ``spec``, the
    spec has one tensor per layer (two where part of it is a checkpoint view) with the
    layer's bytes: enough for copies, and for compute keyed ``"group.layer"`` (a calibrated
    profile), not for the FLOPs model, which needs the real tensor shapes; pass the model's
    real spec (e.g. ``catalog.load(run.meta["model"])``) for that, and :func:`simulate` checks
    it against the run's layers.

    >>> import offload_lab
    >>> spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    >>> plan = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="64GiB"))
    >>> run = offload_lab.simulate(plan, "h200", steps=2)
    >>> spec_again, plan_again = plan_of_run(run)
    >>> again = offload_lab.simulate(plan_again, offload_lab.calibrate(run), steps=2)
    >>> round(again.step_time / run.step_time, 4), type(plan_again).__name__
    (1.0, 'Plan')
    """
    if not isinstance(run, Run):
        raise SimError(f"plan_of_run needs an offload_lab.Run, got {type(run).__name__}")
    df = run.layers.reset_index(drop=True)
    if not len(df):
        raise SimError(f"run {run.label!r} has no layers frame to rebuild its plan from")
    if spec is None:
        spec = _spec_of_layers(run, df)
    elif not isinstance(spec, ModelSpec):
        raise SimError(f"spec {spec!r:.60} is not a ModelSpec; accepted: None or the run's model spec")
    prefetch = run.meta.get("prefetch", 1)
    issue = run.meta.get("issue")
    # runs recorded before the issue option existed issued "before-compute"
    plan = Plan.from_layers(spec, df, prefetch if isinstance(prefetch, (int, dict)) else 1,
                            dict(run.meta.get("plan") or {}),
                            issue if issue in ISSUE_ORDERS else "before-compute")
    return spec, plan


def _spec_of_layers(run: Run, df: pd.DataFrame) -> ModelSpec:
    """A spec with the run's layers and bytes (one tensor per layer, two with a checkpoint view)."""
    from offload_lab.model.spec import GroupSpec, LayerSpec, TensorSpec

    groups = [g for g in (run.meta.get("groups") or []) if g in set(df["group"])] or \
        list(dict.fromkeys(df["group"].astype(str)))
    gspecs = []
    for g in groups:
        rows = df[df["group"] == g].sort_values("layer")
        if rows["layer"].tolist() != list(range(len(rows))):
            raise SimError(f"run {run.label!r}: group {g!r} has layers {rows['layer'].tolist()[:8]}..., "
                           f"expected 0..{len(rows) - 1}")
        layers = []
        for r in rows.itertuples(index=False):
            n, m = int(r.bytes), min(int(r.mapped_bytes), int(r.bytes))
            ts = [TensorSpec(f"{g}.{int(r.layer)}.view", (m,), "uint8", True)] if m else []
            if n > m:
                ts.append(TensorSpec(f"{g}.{int(r.layer)}.store", (n - m,), "uint8"))
            layers.append(LayerSpec(g, int(r.layer), ts))
        gspecs.append(GroupSpec(g, layers))
    rest = int(run.meta.get("model_bytes", 0) or 0) - int(df["bytes"].sum())
    non_layer = [TensorSpec("non_layer", (rest,), "uint8")] if rest > 0 else []
    return ModelSpec(str(run.meta.get("model") or "run"), gspecs, non_layer, {})

