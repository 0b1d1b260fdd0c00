"""The ``--stage staged`` measurements of ``scripts/gpu_check.py`` (about 3 minutes on an H200).

Wan2.1-1.3B- and 14B-shaped synthetic DiTs in bf16 at full width on the cuda backend: all
pinned, all pageable with each issue order, all staged, and a small-pin-budget plan (a quarter
of the layer bytes pinned, the rest staged through pinned staging buffers). Every output is
compared bit for bit with the all-pinned one; every Run is saved with the machine's facts in
its meta (``meta["gpu_check"]``) and a table is printed and written to ``staged.csv``.
"""

from __future__ import annotations

import platform
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _machine(torch: Any) -> dict[str, Any]:
    import os

    import psutil

    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "gpu_memory": int(props.total_memory),
            "torch": torch.__version__, "cuda": torch.version.cuda, "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "host_memory": int(psutil.virtual_memory().total)}


def staged_stage(dev: Any, out: Path, runs_dir: Path, build: Callable, tokens: int, steps: int, warmup: int,
                 budget_s: float = 170.0, log: Callable[[str], None] = print, backend: str = "cuda",
                 models: tuple = (("wan2.1-t2v-1.3b", "1.3B"), ("wan2.1-t2v-14b", "14B")),
                 configs: tuple[str, ...] | None = None, facts: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run the staged comparison; returns one row per configuration (also ``out/staged.csv``).

    ``backend="cpu"`` with a small ``build`` rehearses the stage without a GPU. ``configs`` keeps
    only the configurations of those names (``"pinned"``, ``"pageable before-compute"``,
    ``"pageable after-compute"``, ``"staged"``, ``"quarter pinned + staged"``); ``facts`` (e.g.
    ``gpu_stages.machine_facts()``) replaces the short machine summary each run carries, and also
    goes in ``meta["machine"]``."""
    import pandas as pd
    import torch

    import offload_lab
    from offload_lab import HostMemory, catalog, synthetic
    from offload_lab.analysis.summary import tier_summary

    t0 = time.perf_counter()
    wanted = None if configs is None else set(configs)
    host = HostMemory.probe()
    if facts is None:
        facts = _machine(torch) if backend == "cuda" else {"cpu": platform.processor() or platform.machine()}
    else:
        facts = dict(facts)
    rows: list[dict[str, Any]] = []
    for model_name, short in models:
        if time.perf_counter() - t0 > budget_s * 0.5 and short == "14B":
            log(f"  skip {short}: time budget")
            break
        cat = catalog.load(model_name)
        if backend == "cuda" and host.available < 3 * cat.total_bytes:
            log(f"  skip {short}: host memory")
            continue
        model = build(cat, dev)
        inputs = synthetic.example_inputs(model, tokens=tokens, device=dev)
        spec = offload_lab.spec_of(model, name=cat.name)
        big = HostMemory(available=host.available)
        layer = max(g.layers[0].bytes for g in spec.groups)
        quarter = spec.layer_bytes // 4 + 2 * layer
        configs = [
            ("pinned", offload_lab.plan(spec, tier="pinned", host=big), "after-compute"),
            ("pageable before-compute", offload_lab.plan(spec, tier="pageable", host=big), "before-compute"),
            ("pageable after-compute", offload_lab.plan(spec, tier="pageable", host=big), "after-compute"),
            ("staged", offload_lab.plan(spec, tier="staged", host=big), "after-compute"),
            ("quarter pinned + staged", offload_lab.plan(spec, pin_budget=quarter, staging=True, host=big),
             "after-compute"),
        ]
        if wanted is not None:
            configs = [c for c in configs if c[0] in wanted]
        ref = None
        for name, plan, issue in configs:
            if time.perf_counter() - t0 > budget_s:
                log(f"  skip {short} {name}: time budget")
                continue
            label = f"{short} {name}"
            outs: list = []
            try:
                run = offload_lab.profile(model, lambda o=outs, m=model, x=inputs: o.append(m(**x)), plan, steps=steps,
                                          warmup=warmup, backend=backend, label=label, issue=issue)
            except Exception:
                log(f"  FAILED {label}:\n{traceback.format_exc()}")
                continue
            out_t = outs[-1].detach().cpu()
            ref = out_t if ref is None else ref
            same = bool(torch.equal(out_t, ref))
            run.meta["gpu_check"] = {"tokens": tokens, "stage": "staged", "machine": facts, "model": model_name,
                                     "bit_identical_to_pinned": same}
            run.meta["machine"] = facts
            run.save(runs_dir / f"staged-{label.replace(' ', '_').replace('+', 'and')}.zip")
            st = run.steps
            rows.append({"label": label, "issue": issue, "tiers": tier_summary(plan.layers),
                         "step_s": run.step_time, "stall_s": float(st["stall_s"].median()),
                         "overlap": float(st["overlap"].median()), "pinned_gib": run.meta["pinned_bytes"] / 2**30,
                         "bit_identical": same})
            r = rows[-1]
            log(f"  {label:<34} {r['step_s']:8.4f} s/step  stall {r['stall_s']:.4f}  overlap {r['overlap']:.2f}"
                f"  pinned {r['pinned_gib']:.2f} GiB  identical {same}")
            pd.DataFrame(rows).to_csv(out / "staged.csv", index=False)
        del model
        if backend == "cuda":
            torch.cuda.empty_cache()
    return rows
