"""The ``--stage first`` run of ``scripts/gpu_check.py``: what a first session on a GPU measures.

    PYTHONPATH=. python3 scripts/gpu_check.py --out DIR --stage first [--budget-s 420]

In this priority order, each part only when its estimated time fits what is left of the budget
(a part that does not fit is skipped and named; a later, shorter one may still run):

1. ``smoke``: the correctness checks (bit-identical outputs per tier, exact restore, startup
   peaks) into ``DIR/smoke.json``;
2. ``issue_order``: the experiment no GPU has run yet — a Wan2.1-T2V-14B-shaped model at 480p
   all pinned, all pageable under each issue order (``after-compute`` is offload-lab's default,
   ``before-compute`` what every shipped H200 run measured) and all staged; runs
   ``DIR/staged-14B_*.zip``, table ``DIR/staged.csv``;
3. the evidence stages of ``scripts/gpu_stages.py`` in their own order (``STAGES``: the ones to
   skip first when short of time come last).

The estimates (:data:`ESTIMATES_S`, seconds on one H200) come from the shipped runs in
``data/runs/h200-2026-12-01/``: ``log.txt`` puts the smoke checks and the 1.3B build well inside
the first 31.2 s; a 14B-shaped run takes 23-24 s of wall (``wall_s`` in ``comparison.csv``) and
building that model about 20 s, so four 14B runs and a build are about 120 s; the evidence
stages' estimates are ``gpu_stages.py``'s table. The default budget (420 s) leaves room under
8 minutes for starting Python and CUDA. Every run carries the machine's facts
(``gpu_stages.machine_facts``) in ``meta["machine"]``; ``DIR/first.json`` lists what ran, what
was skipped and why, and each part's wall time.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_stages import SCALED, STAGES, machine_facts, run_stages

#: seconds on one H200 for each part of ``first`` (see the module docstring for where they come from)
ESTIMATES_S: dict[str, float] = {
    "smoke": 20.0, "issue_order": 120.0,
    "tokens": 60.0, "short": 90.0, "overhead": 15.0, "cfg720": 30.0, "pin_memory": 30.0,
    "diffusers_bare": 25.0, "h3": 140.0, "budgets": 300.0, "repeats": 240.0,
}
#: the parts of ``first``, in the order they run
ORDER = ("smoke", "issue_order", *STAGES)
#: the issue-order experiment's configurations (names of ``gpu_staged.staged_stage``'s)
ISSUE_CONFIGS = ("pinned", "pageable before-compute", "pageable after-compute", "staged")


def run_first(out: Path, dev: Any, budget_s: float = 420.0, scale: float = 1.0,
              estimates: dict[str, float] | None = None, tokens: int = 32760, steps: int = 2, warmup: int = 1,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the parts of ``first`` in :data:`ORDER` while their estimates fit ``budget_s``.

    ``scale`` < 1 is a cpu rehearsal: the models are built at that width and the evidence stages
    are only those that take a scale (``gpu_stages.SCALED``); ``estimates`` replaces entries of
    :data:`ESTIMATES_S`. Returns (and writes to ``out/first.json``) what ran, what was skipped,
    the failures and the wall time of each part.
    """
    if budget_s <= 0:
        raise ValueError(f"budget_s={budget_s!r}; accepted: a positive number of seconds")
    from gpu_check import fast_build, smoke
    from gpu_staged import staged_stage

    est = {**ESTIMATES_S, **(estimates or {})}
    out.mkdir(parents=True, exist_ok=True)
    facts = machine_facts()
    backend = "cuda" if dev.type == "cuda" else "cpu"
    parts = [p for p in ORDER if scale == 1.0 or p not in STAGES or p in SCALED]
    t0 = time.perf_counter()
    res: dict[str, Any] = {"stage": "first", "budget_s": budget_s, "machine": facts, "order": parts,
                           "estimates_s": {p: est[p] for p in parts}, "ran": [], "skipped": [],
                           "failed": [], "wall_s": {}}

    def build(spec: Any, d: Any) -> Any:
        kw: dict[str, Any] = {} if scale == 1.0 else {"scale": scale, "layers": 4}
        return fast_build(spec, d, **kw)

    for part in parts:
        left = budget_s - (time.perf_counter() - t0)
        if est[part] > left:
            res["skipped"].append(part)
            log(f"[first] skip {part}: estimated {est[part]:.0f} s, {max(left, 0):.0f} s of the budget left")
            continue
        log(f"[first] {part} (estimated {est[part]:.0f} s, {left:.0f} s left)")
        t1 = time.perf_counter()
        try:
            if part == "smoke":
                (out / "smoke.json").write_text(json.dumps(smoke(dev, log=log, backend=backend), indent=1) + "\n")
            elif part == "issue_order":
                rows = staged_stage(dev, out, out, build, tokens=tokens, steps=steps, warmup=warmup,
                                    budget_s=max(left, est[part]), log=log, backend=backend,
                                    models=(("wan2.1-t2v-14b", "14B"),), configs=ISSUE_CONFIGS, facts=facts)
                if len(rows) < len(ISSUE_CONFIGS):
                    raise RuntimeError(f"issue_order measured {len(rows)} of {len(ISSUE_CONFIGS)} configurations")
            elif run_stages([part], out, dev, scale=scale):
                raise RuntimeError(f"stage {part} failed (its traceback is in {part}.json)")
            res["ran"].append(part)
        except Exception:
            res["failed"].append(part)
            res.setdefault("errors", {})[part] = traceback.format_exc()
            log(f"  FAILED {part}:\n{res['errors'][part]}")
        res["wall_s"][part] = round(time.perf_counter() - t1, 2)
    res["total_s"] = round(time.perf_counter() - t0, 2)
    if res["skipped"]:
        log(f"[first] skipped for the time budget ({budget_s:.0f} s): {', '.join(res['skipped'])}")
    (out / "first.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    return res
