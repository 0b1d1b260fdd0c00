"""The ``diffusers_bare`` evidence stage: what ``offload_lab.observe`` itself costs.

diffusers' group offloading (block level, one block per group, a side stream on cuda: as
``gpu_check.py --stage diffusers`` sets it up) on the Wan2.1-T2V-1.3B-shaped model at 480p,
timed by plain wall clock with ``torch.cuda.synchronize`` around each forward, first with
nothing of offload-lab attached, then with ``observe`` attached, and again both ways (so drift
over the stage shows as a difference between the two bare rounds). The observed rounds' Runs
are saved; the bare timings have no Run (nothing recorded them) and are in the json.
"""

from __future__ import annotations

import time
from typing import Any

MODEL = "wan2.1-t2v-1.3b"


def group_offload(model, dev) -> None:
    """diffusers' block-level group offloading, set up as the ``diffusers`` stage of gpu_check does."""
    import torch
    from diffusers.hooks import apply_group_offloading

    apply_group_offloading(model, onload_device=dev, offload_device=torch.device("cpu"),
                           offload_type="block_level", num_blocks_per_group=1, use_stream=dev.type == "cuda")
    # the synthetic DiT reads its small Sequentials' weights directly, never calling them, so
    # diffusers would never onload them: they stay on the device (a few MiB), as in gpu_check
    for name, child in model.named_children():
        if name != "blocks" and isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
            child.to(dev)


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed_forwards(model, inputs, dev, n: int, step=None) -> list[float]:
    """Wall seconds of ``n`` forwards, each bracketed by a device synchronize; ``step`` wraps each."""
    import contextlib

    import torch

    out = []
    with torch.no_grad():
        for _ in range(n):
            _sync(dev)
            t0 = time.perf_counter()
            with (step() if step else contextlib.nullcontext()):
                model(**inputs)
            _sync(dev)
            out.append(time.perf_counter() - t0)
    return out


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def stage_diffusers_bare(st, dev, scale: float = 1.0, steps: int = 5, rounds: int = 2,
                         tokens: int | None = None, layers: int | None = None) -> None:
    """Bare vs observed wall time of diffusers' group offloading: the observer's own overhead."""
    try:
        import diffusers  # noqa: F401
    except ImportError:
        st.notes["skipped"] = "diffusers is not importable here: its group offloading cannot be timed"
        print(f"  diffusers_bare: skipped: {st.notes['skipped']}", flush=True)
        return
    from gpu_stages import _model

    import offload_lab
    from offload_lab import synthetic

    tokens = tokens or (32760 if scale == 1.0 else 64)
    model, _ = _model(MODEL, dev, layers=layers, scale=scale)
    kw: dict[str, Any] = {} if scale == 1.0 else {"text_tokens": 16}
    inputs = synthetic.example_inputs(model, tokens=tokens, device=dev, **kw)
    group_offload(model, dev)
    timed_forwards(model, inputs, dev, st.warmup)  # first onloads and stream set-up, bare
    bare: list[list[float]] = []
    observed: list[list[float]] = []
    observer_step: list[float] = []
    for r in range(rounds):
        bare.append(timed_forwards(model, inputs, dev, steps))
        label = f"diffusers group offload observed round {r + 1}"
        with offload_lab.observe(model, label=label) as obs:
            observed.append(timed_forwards(model, inputs, dev, st.warmup + steps, step=obs.step)[st.warmup:])
        run = st.keep(obs.build_run(warmup=st.warmup), tokens, stage_round=r + 1)
        observer_step.append(run.step_time)
    b = _median([x for xs in bare for x in xs])
    o = _median([x for xs in observed for x in xs])
    st.notes["diffusers_bare"] = {
        "tokens": tokens, "steps_per_round": steps, "rounds": rounds,
        "bare_s": bare, "observed_s": observed, "bare_median_s": b, "observed_median_s": o,
        "observer_overhead": o / b - 1, "observer_run_step_s": observer_step,
        "bare_rounds_median_s": [_median(xs) for xs in bare],
        "how": "wall clock (perf_counter) around each forward, device synchronized before and after; "
               "observed forwards also inside obs.step(); the first observed step of each round dropped",
    }
    print(f"  diffusers_bare: bare {b:.4f} s, observed {o:.4f} s per forward ({o / b - 1:+.1%})", flush=True)
