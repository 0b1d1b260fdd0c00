"""Prove a recommendation on the real backend: run the best plan and a baseline, measured and
simulated, and put predicted next to measured.

>>> import offload_lab
>>> from offload_lab import synthetic
>>> model = synthetic.build(offload_lab.catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=4)
>>> inputs = synthetic.example_inputs(model, tokens=64)
>>> dev = offload_lab.DeviceProfile("cpu", {"pinned": 5, "pageable": 5, "mapped_warm": 5},
...     compute_s={"blocks": 1e-3}, compute_mode="sync", memory_bytes=2**30)
>>> rec = offload_lab.recommend(offload_lab.spec_of(model), dev, host="8GiB", tokens=64)
>>> c = rec.confirm(model, lambda: model(**inputs), steps=2, backend="cpu")
>>> list(c.table["plan"])
['recommended', 'baseline']
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

import pandas as pd

from offload_lab.planning.planner import Plan, plan
from offload_lab.simulation.errors import SimError

__all__ = ["Confirmation", "confirm", "CONFIRM_COLUMNS"]

CONFIRM_COLUMNS = ["plan", "label", "predicted_step_s", "measured_step_s", "measured_over_predicted",
                   "predicted_device_peak_bytes", "measured_device_peak_bytes", "backend"]


@dataclass(eq=False, repr=False)
class Confirmation:
    """Predicted (simulated) vs measured for the recommended plan and the baseline.

    ``table`` has one row per plan (:data:`CONFIRM_COLUMNS`); ``runs`` holds the four Runs
    (measured and simulated, recommended then baseline) for :func:`offload_lab.report`.
    """

    table: pd.DataFrame
    runs: list[Any]
    calls_per_step: int = 1

    @property
    def speedup(self) -> dict[str, float]:
        """Baseline step / recommended step, predicted and measured."""
        t = self.table.set_index("plan")
        return {k: float(t.loc["baseline", f"{k}_step_s"] / t.loc["recommended", f"{k}_step_s"])
                for k in ("predicted", "measured")}

    def summary(self) -> str:
        from offload_lab.units import format_bytes

        lines = []
        for _, r in self.table.iterrows():
            lines.append(f"{r['plan']}: predicted {r['predicted_step_s']:.4f} s/step (simulated), measured "
                         f"{r['measured_step_s']:.4f} s/step on {r['backend']} "
                         f"(x{r['measured_over_predicted']:.2f}); device peak predicted "
                         f"{format_bytes(int(r['predicted_device_peak_bytes']))}, measured "
                         f"{format_bytes(int(r['measured_device_peak_bytes']))}")
        sp = self.speedup
        lines.append(f"speed-up over the baseline: predicted x{sp['predicted']:.2f}, measured x{sp['measured']:.2f} "
                     f"(a step is {self.calls_per_step} call{'s' if self.calls_per_step != 1 else ''} of fn)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return "Confirmation(\n" + self.summary() + "\n)"

    def _repr_html_(self) -> str:
        return "<pre>" + escape(self.summary()) + "</pre>"


def _median_step(run: Any) -> float:
    return float(run.steps["wall_s"].median())


def _same_plan(a: Plan, b: Plan) -> bool:
    return int(a.prefetch) == int(b.prefetch) and list(a.layers["tier"]) == list(b.layers["tier"])


def confirm(rec: Any, model: Any, fn: Any, steps: int = 3, warmup: int = 1, baseline: Plan | None = None,
            backend: str = "auto") -> Confirmation:
    """Run ``rec.best`` and ``baseline`` (default: every layer streamed pageable at prefetch 1,
    or at prefetch 0 where that is the best itself) on ``model``, calling ``fn()`` once per step, and simulate both on the
    recommendation's device profile. ``model`` must be the model the recommendation's spec
    describes (``spec_of(model)`` has its layers and bytes).
    """
    from offload_lab.model.load import spec_of
    from offload_lab.record.runtime import profile
    from offload_lab.simulation.engine import simulate

    if rec.best is None:
        raise SimError(f"nothing to confirm: no plan of {rec.spec.name!r} fits ({rec.explanation[:120]}...)")
    mine = spec_of(model)
    if ([(g.name, g.num_layers, g.bytes) for g in mine.groups]
            != [(g.name, g.num_layers, g.bytes) for g in rec.spec.groups]):
        raise SimError(f"model {type(model).__name__} is not the model of this recommendation: its layer groups "
                       f"{[(g.name, g.num_layers) for g in mine.groups]} differ from {rec.spec.name!r}'s "
                       f"{[(g.name, g.num_layers) for g in rec.spec.groups]}")
    if baseline is None:
        baseline = plan(rec.spec, tier="pageable", prefetch=1, host=rec.host, device_memory=rec.device_memory,
                        tokens=rec.tokens)
        if _same_plan(baseline, rec.best):
            # where compute hides every pageable copy the best is that baseline: compare with
            # no prefetch instead, so the two runs differ
            baseline = plan(rec.spec, tier="pageable", prefetch=0, host=rec.host, device_memory=rec.device_memory,
                            tokens=rec.tokens)
    if not isinstance(baseline, Plan):
        raise SimError(f"baseline {baseline!r:.80} is not a Plan; accepted: offload_lab.plan(...) or None")
    rows, runs = [], []
    for name, p in (("recommended", rec.best), ("baseline", baseline)):
        measured = profile(model, fn, p, steps=steps, warmup=warmup, backend=backend, label=f"{name} (measured)")
        sim = simulate(p, rec.profile, steps=steps, tokens=rec.tokens, passes=rec.calls_per_step,
                       label=f"{name} on {rec.profile.name}")
        runs += [measured, sim]
        pred, meas = _median_step(sim), _median_step(measured)
        rows.append({
            "plan": name, "label": p.summary(), "predicted_step_s": pred, "measured_step_s": meas,
            "measured_over_predicted": meas / pred if pred > 0 else float("nan"),
            "predicted_device_peak_bytes": int(p.device_peak),
            "measured_device_peak_bytes": int(measured.meta["device_peak"]["measured_bytes"]),
            "backend": measured.backend,
        })
    return Confirmation(pd.DataFrame(rows, columns=CONFIRM_COLUMNS), runs, int(rec.calls_per_step))
