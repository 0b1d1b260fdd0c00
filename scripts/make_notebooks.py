#!/usr/bin/env python3
"""Write ``notebooks/*.ipynb`` from the Python source in this file, outputs stripped.

Review and edit the notebooks here, not in their JSON::

    .venv/bin/python scripts/make_notebooks.py            # (re)write notebooks/
    .venv/bin/python scripts/make_notebooks.py --check    # exit 1 when a notebook differs

Cell ids are derived from the notebook name and position, so the output is byte-for-byte
reproducible and ``--check`` can run in CI. Each notebook runs headless on a CPU (the tests
execute them with nbclient); cells that need a GPU check ``HAS_CUDA`` and say when they skip.
Run outputs go to ``$OFFLOAD_LAB_NOTEBOOK_OUT`` (default ``artifacts/notebooks/``, ignored by git).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"

# -- shared cells ---------------------------------------------------------------------------------
SETUP = '''
import os
import warnings
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import torch

import offload_lab
from offload_lab import catalog, figures, synthetic
from offload_lab.units import format_bytes

# plotly >= 6.1 shows a figure in a kernel only as the plotly mimetype, which
# `jupyter nbconvert --to html` drops. Adding the "notebook" renderer also emits text/html
# (and inlines plotly.js once, here), so every figure below survives export, offline.
pio.renderers.default = "plotly_mimetype+notebook"

ROOT = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "data" / "models").is_dir()),
            Path.cwd())
OUT = Path(os.environ.get("OFFLOAD_LAB_NOTEBOOK_OUT", ROOT / "artifacts" / "notebooks"))
OUT.mkdir(parents=True, exist_ok=True)
HAS_CUDA = torch.cuda.is_available()
BACKEND = "cuda" if HAS_CUDA else "cpu"  # measured runs; inputs must live on its device
print(f"offload-lab {offload_lab.__version__} · torch {torch.__version__} · "
      f"measured runs use the {BACKEND} backend"
      + ("" if HAS_CUDA else " (no CUDA device here: GPU-only cells will say they skip)"))
'''


def md(text: str) -> tuple[str, str]:
    return "markdown", textwrap.dedent(text).strip("\n")


def code(text: str) -> tuple[str, str]:
    return "code", textwrap.dedent(text).strip("\n")


# -- 01 quick start -------------------------------------------------------------------------------
QUICKSTART = [
    md("""
    # offload-lab: quick start

    A diffusion transformer (DiT) such as Wan2.1-14B or MiniMax-H3 does not fit on one GPU next to
    its activations, so its blocks' weights live in host memory and each block is copied to the
    GPU just before it runs — on a side stream, while the previous block computes. Whether those
    copies hide behind compute depends on **where each block's weights live in host memory**:

    | tier | where the weights live between uses | what a copy costs |
    | --- | --- | --- |
    | `resident` | on the device | nothing after the first copy |
    | `pinned` | page-locked host memory | an asynchronous DMA that overlaps compute |
    | `pageable` | ordinary host memory | the driver stages it, and the host thread waits |
    | `mapped` | the checkpoint file's pages | no extra host memory; pages may fault from disk |

    This notebook takes a small model through the whole loop — plan, profile, read the timeline,
    compare, report — then does the same with one line (`%offload_profile`) and with a dashboard
    (`PlanExplorer`). It runs on a laptop CPU in about a minute. Runs that were *measured* say on
    which backend; runs the *simulator* predicted always say "simulated".
    """),
    code(SETUP),
    md("""
    ## 1. A model small enough for a laptop

    The catalog holds the exact tensors of the real models (names, shapes, dtypes — weights cannot
    be downloaded here). `synthetic.build` makes a runnable stand-in with those tensor names and
    random weights; `scale` shrinks the widths and `layers` the depth, so every code path runs in
    seconds. `synthetic.spec_of` describes it, keeping the catalog's name and token counts.
    """),
    code('''
    full = catalog.load("wan2.1-t2v-1.3b")
    model = synthetic.build(full, scale=0.1, layers=6)
    inputs = synthetic.example_inputs(model, tokens=256, device=BACKEND)
    spec = synthetic.spec_of(model)

    print("catalog:", full)
    print("scaled: ", spec)
    spec.layers[["group", "layer", "bytes", "tensors"]]
    '''),
    md("""
    ## 2. A plan: a tier, a pin rank and a reason for every layer

    `offload_lab.plan` decides where each layer lives. With no `host=` it measures this machine:
    it keeps a reserve (5 % of available memory, at least 2 GiB) and never pins more than the
    rest, so pinning cannot invite the OOM killer. Here the pin budget is half the layer bytes:
    layers are granted pins first-fit in execution order, and those that do not fit stay pageable.
    """),
    code('''
    plan = offload_lab.plan(spec, pin_budget=spec.layer_bytes // 2)
    print(plan.summary())
    print({k: (format_bytes(v) if isinstance(v, int) and not isinstance(v, bool) else v)
           for k, v in plan.ledger.items()})
    plan.table()
    '''),
    md("""
    ## 3. Profile it and read the timeline

    `offload_lab.profile` calls the function once per step under the plan (after a warm-up step,
    which is dropped) and records every copy and compute interval. The model is restored exactly
    afterwards — also on an error or Ctrl-C. The result is a `Run`: tidy pandas frames.
    """),
    code('''
    run = offload_lab.profile(model, lambda: model(**inputs), plan, steps=3, warmup=1,
                              backend=BACKEND, label=f"half pinned · measured on {BACKEND}")
    display(run.steps)
    run.events.head(8)
    '''),
    md("""
    The timeline has one lane per stream: **copy** (host → device), **compute**, and **host**
    (time the host thread was blocked staging a pageable or mapped copy). Bars are coloured by
    tier; red `wait` bars are stalls — the compute stream was ready but the layer's weights were
    not there yet. Hover a bar for its layer, bytes, duration and GB/s.
    """),
    code('''
    figures.timeline(run)
    '''),
    code('''
    figures.tier_map(plan)
    '''),
    md("""
    ## 4. Compare plans — measured here, simulated for the real model

    On a CPU there is no DMA engine and no page-locking: the copy thread competes with compute for
    the same cores, so pinned and pageable take about the same time here (the measured rows below).
    The difference shows on a GPU, and the simulator predicts it from a device profile: below,
    the full-size Wan2.1-T2V-1.3B on the H200 profile, each run labelled *simulated*. The host
    for a simulated plan is hypothetical (64 GiB), since the simulated machine is not this one.
    """),
    code('''
    runs = []
    for tier in ("pinned", "pageable"):
        p = offload_lab.plan(spec, tier=tier)
        runs.append(offload_lab.profile(model, lambda: model(**inputs), p, steps=3,
                                        backend=BACKEND, label=f"{tier} · measured on {BACKEND}"))
    host64 = offload_lab.HostMemory(available="64GiB")
    for tier in ("pinned", "pageable"):
        p = offload_lab.plan(full, tier=tier, host=host64)
        runs.append(offload_lab.simulate(p, "h200", steps=3,
                                         label=f"Wan2.1-T2V-1.3B full size · {tier} · H200"))
    offload_lab.compare(runs)
    '''),
    code('''
    figures.step_times(runs)
    '''),
    md("""
    ## 5. A report you can send

    `offload_lab.report(...).save(path)` writes one offline HTML file: the comparison, every
    run's timeline, memory and tier map, the plan's ledger and per-layer reasons, and the
    environment. Simulated runs are flagged on every page.
    """),
    code('''
    rep = offload_lab.report(runs, plan=plan, title="offload-lab quick start")
    path = rep.save(OUT / "quickstart-report.html")
    print(rep)
    print("written to", path)
    '''),
    md("""
    ## 6. The same from one line: `%offload_profile`

    `%load_ext offload_lab` registers one magic. The line form profiles a statement under offload
    of a model; the cell form profiles the cell body. Options mirror `plan()`; `%offload_profile?`
    lists them. `-o` returns the `Run` (a list with `--compare`), `-q` displays nothing.
    """),
    code('''
    %load_ext offload_lab
    '''),
    code('''
    %offload_profile -n 2 -b 1MiB model model(**inputs)
    '''),
    code('''
    %%offload_profile -n 2 --compare pinned,pageable model
    out = model(**inputs)
    '''),
    code('''
    r = %offload_profile -q -o -n 2 --resident 2 --residency strided -p 2 model model(**inputs)
    r.layers[["group", "layer", "tier", "streamed", "copy_s", "compute_s", "stall_s"]]
    '''),
    md("""
    ## 7. Interactively: `PlanExplorer`

    The dashboard below rewires the same functions: move the pin budget, the resident count and
    policy, the pin order, the prefetch depth or the forced tier, and the plan, its tier map and a
    simulated timeline update at once; **Run** profiles the real model with `fn`; **Add to
    comparison** keeps a run; **pinned vs pageable** simulates the headline comparison;
    **Export report** writes the HTML report. (An exported notebook shows the dashboard only where
    the widget scripts can load; the figures after it are ordinary outputs.)
    """),
    code('''
    from offload_lab import PlanExplorer

    ex = PlanExplorer(model, fn=lambda: model(**inputs), profile="h200")
    ex
    '''),
    md("""
    Every control and button is a plain Python object, so a notebook (or a test) can drive the
    dashboard without a browser: set a control's `.value`, `.click()` a button, then read
    `ex.plan`, `ex.last_run`, `ex.runs` and `ex.figures`.
    """),
    code('''
    ex.live.value = False                  # simulate on button presses only
    ex.budget.value = ex.budget.max / 3    # a third of the layer bytes (or of what the host can spend)
    ex.order.value = "strided"             # spread the pins over the model
    ex.simulate_button.click()
    ex.add_button.click()
    ex.tiers_button.click()                # pinned vs pageable, simulated
    print(ex.plan.summary())
    print(ex.error or "no errors")
    ex.figures["step_times"]
    '''),
    md("""
    ## 8. On a GPU

    With CUDA the same profile runs on the `cuda` backend: copies on a side stream timed with CUDA
    events, pinned copies asynchronous, pageable copies blocking the host thread — the difference
    the CPU cannot show.
    """),
    code('''
    if HAS_CUDA:
        gpu_model = synthetic.build(full, scale=0.5, layers=12, dtype=torch.bfloat16)
        gpu_inputs = synthetic.example_inputs(gpu_model, tokens=1024, device="cuda")
        gpu_spec = synthetic.spec_of(gpu_model)
        gpu_runs = [offload_lab.profile(gpu_model, lambda: gpu_model(**gpu_inputs),
                                        offload_lab.plan(gpu_spec, tier=t), steps=3, backend="cuda",
                                        label=f"{t} · measured on {torch.cuda.get_device_name()}")
                    for t in ("pinned", "pageable")]
        display(offload_lab.compare(gpu_runs))
        display(figures.step_times(gpu_runs))
    else:
        print("skipped: no CUDA device here. On a GPU this cell profiles a larger scaled model "
              "pinned vs pageable on the cuda backend.")
    '''),
]

# -- Wan2.1 -----------------------------------------------------------------------------------------
WAN = [
    md("""
    # Wan2.1 under layer-wise offload: T2V-1.3B and T2V-14B

    Wan2.1 is a video DiT: a stack of identical transformer blocks (30 in T2V-1.3B, 40 in
    T2V-14B) between a patch embedding and an output head. Each block runs once per forward pass;
    a denoising step is two forward passes (classifier-free guidance), and a video takes 50 steps.
    Offloading the blocks to host memory therefore moves the whole block stack **100 times per
    video**. This notebook measures how much that is, how the planner places the blocks for a given
    pin budget, what the simulator predicts on reference GPUs, what a real (scaled) run shows, and
    what explains the reported **1.03 s vs 1.90 s per step**, all-pinned vs all-pageable.

    Shapes come from the public model code (catalog specs); weights cannot be downloaded here, so
    measured runs use synthetic models with the same tensors, scaled down. Simulated runs are
    always labelled *simulated*.
    """),
    code(SETUP),
    md("""
    ## 1. Bytes per block

    Every tensor of a Wan2.1 block is bf16 and is read from the checkpoint by name with no
    re-layout, so every block is a *checkpoint view* (it could stay `mapped`).
    """),
    code('''
    specs = {name: catalog.load(name) for name in ("wan2.1-t2v-1.3b", "wan2.1-t2v-14b")}
    rows = []
    for name, s in specs.items():
        blocks = s.group("blocks")
        one = blocks.layers[0]
        rows.append({
            "model": s.meta["display_name"], "blocks": blocks.num_layers,
            "bytes per block": one.bytes, "per block": format_bytes(one.bytes),
            "tensors per block": len(one.tensors), "all blocks": format_bytes(blocks.bytes),
            "non-block": format_bytes(s.non_layer_bytes), "total": format_bytes(s.total_bytes),
            "checkpoint views": format_bytes(s.mapped_bytes),
        })
    pd.DataFrame(rows)
    '''),
    md("""
    Where a 14B block's 670 MiB go: self-attention and cross-attention each hold four d × d
    projections (d = 5120), and the FFN two d × f matrices (f = 13824) — the FFN alone is 40 %.
    """),
    code('''
    block = specs["wan2.1-t2v-14b"].group("blocks").layers[0]

    def part(name):
        head = name.split(".")[0]
        return {"self_attn": "self-attention", "cross_attn": "cross-attention", "ffn": "FFN"}.get(
            head, "norms + modulation")

    parts = (pd.DataFrame([{"part": part(t.name), "bytes": t.nbytes} for t in block.tensors])
             .groupby("part", as_index=False)["bytes"].sum().sort_values("bytes"))
    fig = go.Figure(go.Bar(x=parts["bytes"] / 2**20, y=parts["part"], orientation="h",
                           text=[format_bytes(b) for b in parts["bytes"]], textposition="outside"))
    fig.update_layout(title="One Wan2.1-T2V-14B block, by part", xaxis_title="MiB", height=300,
                      margin=dict(l=140, r=60))
    fig
    '''),
    code('''
    profiles = {n: offload_lab.DeviceProfile.load(n) for n in offload_lab.DeviceProfile.names()}
    s14 = specs["wan2.1-t2v-14b"]
    per_forward = s14.layer_bytes
    per_video = per_forward * s14.meta["guidance_passes"] * s14.meta["default_steps"]
    print(f"one forward moves {format_bytes(per_forward)} of blocks; a {s14.meta['default_steps']}-step "
          f"video with guidance moves {format_bytes(per_video)}")
    pd.DataFrame([{
        "profile": n, "pinned GB/s": p.bandwidths["pinned"], "pageable GB/s": p.bandwidths["pageable"],
        "one forward, pinned": f"{per_forward / (p.bandwidths['pinned'] * 1e9):.2f} s",
        "one forward, pageable": f"{per_forward / (p.bandwidths['pageable'] * 1e9):.2f} s",
        "provenance": p.provenance["kind"],
    } for n, p in profiles.items()])
    '''),
    md("""
    ## 2. Plans across pin budgets

    The planner grants pins layer by layer, first fit, in the chosen order; layers that do not fit
    what is left of the budget stay pageable. The budget is never more than the host can spend
    (available − reserve). Below, a hypothetical host with 64 GiB available.
    """),
    code('''
    host64 = offload_lab.HostMemory(available="64GiB")
    budgets = [0, 4, 8, 16, 24, 32]
    plans = {b: offload_lab.plan(s14, pin_budget=f"{b}GiB", host=host64) for b in budgets}
    pd.DataFrame([{
        "pin budget": f"{b} GiB", "pinned layers": p.tier_counts["pinned"],
        "pageable layers": p.tier_counts["pageable"],
        "pinned bytes": format_bytes(p.ledger["pinned_bytes"]), "fits": p.ledger["fits"],
    } for b, p in plans.items()])
    '''),
    code('''
    plan8 = plans[8]
    print(plan8.summary())
    display(plan8.table().iloc[[0, 11, 12, 39]])
    figures.tier_map(plan8)
    '''),
    md("""
    The order policy decides *which* layers get the pins when only some fit. `strided` spreads
    them evenly, so pinned and pageable copies alternate instead of all pageable copies coming
    last:
    """),
    code('''
    for order in ("execution", "reverse", "strided"):
        p = offload_lab.plan(s14, pin_budget="8GiB", order=order, host=host64)
        pinned = p.layers.loc[p.layers["tier"] == "pinned", "layer"].tolist()
        print(f"{order:>9}: pinned layers {pinned}")
    '''),
    md("""
    ## 3. Simulated timelines on the reference profiles

    The simulator replays the runtime's rules (prefetch depth, a serial copy engine, a compute
    stream, a host thread that pageable copies block) with a device profile's bandwidths and
    compute rate. The shipped profiles are *estimates* with their sources inside; calibrate one
    from a measured run to predict a particular machine. Here: the 8 GiB plan at 480p
    (32,760 tokens), one forward per step.
    """),
    code('''
    sim8 = [offload_lab.simulate(plan8, prof, steps=2) for prof in profiles.values()]
    display(offload_lab.compare(sim8)[["label", "step_s", "stall_s", "exposed_copy_s", "overlap"]])
    figures.timeline(sim8[-1], step=1)
    '''),
    md("""
    ## 4. Pinned vs pageable vs mapped — and the 1.03 s vs 1.90 s figure

    Two regimes decide what a tier costs:

    * **compute-bound** (many tokens): a pinned copy of the next block hides behind the current
      block's compute. A pageable copy also takes longer, but worse, it blocks the host thread,
      which then cannot launch the next block's kernels ahead of time — copy and compute serialise.
    * **copy-bound** (few tokens, or a fast GPU on a slow link): the step lasts as long as moving the
      bytes, so the ratio of step times is the ratio of the links' rates for each tier.
    """),
    code('''
    host256 = offload_lab.HostMemory(available="256GiB")
    tier_runs = []
    for name in ("rtx4090-pcie4", "h200"):
        for tokens in ("480p", 1024):
            for tier in ("pinned", "pageable", "mapped"):
                p = offload_lab.plan(s14, tier=tier, host=host256)
                tier_runs.append(offload_lab.simulate(p, profiles[name], steps=2, tokens=tokens,
                    label=f"{name} · {tokens} tokens · {tier}"))
    table = offload_lab.compare(tier_runs)[["label", "step_s", "stall_s", "exposed_copy_s"]]
    table
    '''),
    code('''
    figures.step_times(tier_runs)
    '''),
    md("""
    **The reported figure.** Wan2.1 with every DiT block pinned ran at 1.03 s per step, all
    pageable at 1.90 s (×1.84). The two numbers alone do not say which regime they came from, but
    each reading implies link rates that can be checked against what links deliver (the profiles
    above: 25–55 GB/s pinned, 9–18 GB/s pageable on PCIe 4.0/5.0 x16):

    * *copy-bound*: the step is the time to move the blocks, so rate = bytes / step time;
    * *compute-bound*: pinned copies hide (1.03 s is compute), pageable copies block the host and
      serialise with compute, so the extra 0.87 s is the pageable copies: rate = bytes / 0.87 s.
    """),
    code('''
    reported = {"pinned": 1.03, "pageable": 1.90}
    extra = reported["pageable"] - reported["pinned"]
    s13 = specs["wan2.1-t2v-1.3b"]
    readings = []
    for s, passes in ((s14, 1), (s14, 2), (s13, 2)):
        moved = s.layer_bytes * passes
        what = f"{s.meta['display_name']}, {passes} forward(s) per step ({format_bytes(moved)})"
        readings.append({"moving": what, "reading": "copy-bound",
                         "pinned GB/s": round(moved / reported["pinned"] / 1e9, 1),
                         "pageable GB/s": round(moved / reported["pageable"] / 1e9, 1)})
        readings.append({"moving": what, "reading": "compute-bound, pageable serialised",
                         "pinned GB/s": "hidden", "pageable GB/s": round(moved / extra / 1e9, 1)})
    pd.DataFrame(readings)
    '''),
    md("""
    Two readings land on rates real links deliver: the 14B's blocks copy-bound on a PCIe 4.0-class
    link (≈ 27 GB/s pinned, ≈ 15 GB/s pageable), or the 1.3B with guidance, compute-bound, its
    pageable copies at a few GB/s added to every step. The other readings need rates no x16 link
    shows (pageable faster than the fastest pinned copies, or pinned at a few GB/s). The simulator
    plays the two plausible readings — each labelled simulated:
    """),
    code('''
    base = profiles["rtx4090-pcie4"]
    copy_link = base.replace(name="PCIe 4.0 link at the implied rates", bandwidths={
        **base.bandwidths, "pinned": per_forward / reported["pinned"] / 1e9,
        "pageable": per_forward / reported["pageable"] / 1e9})
    readings_runs = [offload_lab.simulate(offload_lab.plan(s14, tier=t, host=host256), copy_link,
                                          steps=2, tokens=1024,
                                          label=f"14B, 1k tokens (copy-bound) · {t}")
                     for t in ("pinned", "pageable")]
    readings_runs += [offload_lab.simulate(offload_lab.plan(s13, tier=t, host=host256),
                                           profiles["h200"], steps=2, passes=2,
                                           label=f"1.3B, 480p, guidance (compute-bound) · H200 · {t}")
                      for t in ("pinned", "pageable")]
    display(offload_lab.compare(readings_runs)[["label", "step_s", "stall_s", "exposed_copy_s"]])
    figures.step_times(readings_runs)
    '''),
    md("""
    In the copy-bound reading the pinned step *is* the copy, and the pageable step comes out a bit
    longer than the bytes alone say: its copies also block the host, so the little compute there is
    cannot overlap them. In the compute-bound reading the pinned copies vanish behind compute and
    each pageable step pays compute plus copies. Measurements settle which regime a machine is in:
    section 6 checks it on the GPU runs shipped with the repository.

    ## 5. A real run of the scaled model

    A Wan2.1-T2V-1.3B-shaped model, scaled down, saved as safetensors and loaded back with
    `mmap`, so that its weights are views of the file's pages and the `mapped` tier is real.
    Three plans: all pinned, all pageable, all mapped.
    """),
    code('''
    import tempfile

    small = synthetic.build(specs["wan2.1-t2v-1.3b"], scale=0.1 if not HAS_CUDA else 0.5,
                            layers=6 if not HAS_CUDA else 12)
    ckpt = synthetic.save(small, Path(tempfile.mkdtemp()) / "wan-small.safetensors")
    small = synthetic.load(ckpt)            # every parameter is now a view of the file
    small_spec = synthetic.spec_of(small)
    small_inputs = synthetic.example_inputs(small, tokens=256, device=BACKEND)
    print(small_spec, "· checkpoint views:", format_bytes(small_spec.mapped_bytes))

    measured = []
    for tier in ("pinned", "pageable", "mapped"):
        p = offload_lab.plan(small_spec, tier=tier)
        measured.append(offload_lab.profile(small, lambda: small(**small_inputs), p, steps=3,
                                            backend=BACKEND, label=f"{tier} · measured on {BACKEND}"))
    offload_lab.compare(measured)
    '''),
    md("""
    On the `cpu` backend the three tiers take about the same time: there is no DMA engine, so a
    "copy" is a memcpy on the same cores either way. The timeline still shows the mechanics — the
    pageable and mapped copies appear on the **host** lane too, because they block the thread
    that launches compute:
    """),
    code('''
    figures.timeline(measured[1])
    '''),
    md("""
    `calibrate` fits a device profile to measured runs (bandwidth per tier, per-layer compute, host
    overheads); simulating the same plans with it shows how far the simulator's model of this
    machine is from the measurements.
    """),
    code('''
    fitted = offload_lab.calibrate(measured)
    print(fitted)
    predicted = [offload_lab.simulate(offload_lab.plan(small_spec, tier=t), fitted,
                                      steps=3, label=f"{t} · calibrated on this machine")
                 for t in ("pinned", "pageable", "mapped")]
    figures.step_times(measured + predicted)
    '''),
    md("""
    ## 6. Measured GPU runs shipped with the repository

    GPU measurements (`scripts/gpu_check.py`) are saved under `data/runs/` as `Run` zip files,
    each with the machine it ran on.
    """),
    code('''
    gpu_files = sorted((ROOT / "data" / "runs").rglob("*.zip"))
    gpu_runs = []
    for f in gpu_files:
        try:
            gpu_runs.append(offload_lab.Run.load(f))
        except ValueError as e:
            print(f"skipped {f.name}: {e}")

    def machine(r):
        where = (r.meta.get("gpu_check") or {}).get("machine")
        return r.meta.get("device_name", "unknown machine") + (f" · {where}" if where else "")

    if gpu_runs:
        table = offload_lab.compare(gpu_runs)
        table.insert(1, "machine", [machine(r) for r in gpu_runs])
        display(table[["label", "machine", "backend", "tiers", "step_s", "ratio", "stall_s"]])
        display(figures.step_times(gpu_runs))
    else:
        print("no measured GPU runs in data/runs/ yet: run `PYTHONPATH=. python3 scripts/gpu_check.py "
              "--out data/runs/<machine>` on a GPU machine to add them.")
    '''),
    md("""
    **Which regime?** For each measured pinned/pageable pair of the same model, tokens and prefetch:
    if the pageable step equals the pinned step plus the time its bytes take at the pageable rate
    measured in that run, the pageable copies were serialised with compute (the compute-bound
    reading above); if instead the steps scale with the rates, the run was copy-bound.
    """),
    code('''
    from offload_lab.analysis import summary as analysis

    def key(r):
        tokens = (r.meta.get("gpu_check") or {}).get("tokens") or r.meta.get("tokens")
        return r.meta.get("model"), tokens, r.meta.get("prefetch"), machine(r)

    def only(r, tier):
        return set(r.layers["tier"]) == {tier}

    rows = []
    for slow in (r for r in gpu_runs if only(r, "pageable")):
        fast = next((r for r in gpu_runs if only(r, "pinned") and key(r) == key(slow)), None)
        rates = analysis.bandwidth_by_tier(slow).set_index("tier")["gbps"]
        if fast is None or "pageable" not in rates:
            continue
        copy_alone = slow.steps["bytes_moved"].median() / (rates["pageable"] * 1e9)
        rows.append({"model": key(slow)[0], "tokens": key(slow)[1], "machine": key(slow)[3],
                     "pinned s": round(fast.step_time, 3), "pageable s": round(slow.step_time, 3),
                     "ratio": round(slow.step_time / fast.step_time, 2),
                     "pageable − pinned s": round(slow.step_time - fast.step_time, 3),
                     "its copies alone s": round(copy_alone, 3),
                     "pageable GB/s": round(rates["pageable"], 1)})
    if rows:
        display(pd.DataFrame(rows))
        for r in rows:
            share = r["pageable − pinned s"] / r["its copies alone s"]
            print(f"{r['model']} at {r['tokens']} tokens on {r['machine']}: ×{r['ratio']} "
                  f"(reported ×{reported['pageable'] / reported['pinned']:.2f}); the extra time is "
                  f"{share:.0%} of the pageable copies' own time")
    else:
        print("no measured pinned/pageable pair to compare")
    '''),
    md("""
    Where the extra time is close to all of the pageable copies' own time — as on the shipped H200
    runs — the pageable copies ran serialised with compute: the compute-bound reading, with the
    host thread blocked behind every pageable copy. Pinned copies, asynchronous, hid behind compute.
    """),
    md("""
    ## 7. On a GPU here

    With CUDA, the scaled model is profiled on the `cuda` backend, where pinned copies are real DMA
    and pageable ones really block the host.
    """),
    code('''
    if HAS_CUDA:
        gpu_model = synthetic.build(specs["wan2.1-t2v-1.3b"], dtype=torch.bfloat16, layers=12)
        gpu_inputs = synthetic.example_inputs(gpu_model, tokens=4096, device="cuda")
        gpu_spec = synthetic.spec_of(gpu_model)
        here = [offload_lab.profile(gpu_model, lambda: gpu_model(**gpu_inputs),
                                    offload_lab.plan(gpu_spec, tier=t), steps=3, backend="cuda",
                                    label=f"{t} · measured on {torch.cuda.get_device_name()}")
                for t in ("pinned", "pageable")]
        measured += here
        display(offload_lab.compare(here))
        display(figures.step_times(here))
    else:
        print("skipped: no CUDA device here. On a GPU this cell profiles a full-width "
              "Wan2.1-T2V-1.3B-shaped model (12 blocks) pinned vs pageable on the cuda backend.")
    '''),
    md("""
    ## 8. Report

    One offline HTML file with the simulated 14B runs, the measured scaled runs and the 8 GiB
    plan's ledger and reasons.
    """),
    code('''
    rep = offload_lab.report(sim8 + tier_runs[:3] + measured + gpu_runs, plan=plan8,
                             title="Wan2.1 under layer-wise offload")
    print(rep, "->", rep.save(OUT / "wan21-report.html"))
    '''),
]

# -- MiniMax-H3 -------------------------------------------------------------------------------------
H3 = [
    md("""
    # MiniMax-H3 under layer-wise offload

    MiniMax-H3 is a dense single-stream audio+video DiT: 33.12 B parameters, **61.73 GiB** in
    bf16/fp32. It has **two layer groups** — `token_refiner.blocks` (2 blocks that refine the text
    condition) and `blocks` (50 main blocks of 1.20 GiB) — and most of its tensors are views of the
    checkpoint file (all but each block's fused QKV, re-ordered at load time). Each of those facts
    shapes how it can be offloaded. This notebook walks through them: the startup peak of two
    groups, per-layer pin grants on a tight host, the mapped tier and the host memory it saves,
    hosts of 32 and 60 GB, a pinned-allocation hazard that once got a run OOM-killed, and the
    operating point with 35 resident layers spread evenly.
    """),
    code(SETUP),
    code('''
    h3 = catalog.load("minimax-h3")
    print(h3)
    pd.DataFrame([{
        "group": g.name, "layers": g.num_layers, "bytes per layer": format_bytes(g.layers[0].bytes),
        "checkpoint views per layer": format_bytes(g.layers[0].mapped_bytes),
        "group bytes": format_bytes(g.bytes),
    } for g in h3.groups] + [{"group": "(non-layer)", "layers": "–", "bytes per layer": "–",
                              "checkpoint views per layer": "–",
                              "group bytes": format_bytes(h3.non_layer_bytes)}])
    '''),
    code('''
    print(f"total {format_bytes(h3.total_bytes)}, of which checkpoint views {format_bytes(h3.mapped_bytes)}")
    '''),
    md("""
    ## 1. Two groups: the startup peak, grouped vs naive

    To offload a model, each group's layer weights are replaced by host stores and everything else
    is moved to the device once. Done **naively** — offload one group, move the whole model to the
    device, then the next group — the second group is transiently *on the device* in between:
    with H3's declared order (refiner first) that is all 50 main blocks, 60 GiB, which no 32 GB
    card survives. Done **grouped** — every group to host stores first, largest first, then the
    remainder to the device once — the peak is the non-layer weights plus the first prefetched
    blocks.
    """),
    code('''
    host64 = offload_lab.HostMemory(available="64GiB")
    p64 = offload_lab.plan(h3, host=host64)
    print("init order:", p64.init_order)
    for strategy in ("grouped", "naive"):
        print(f"{strategy:>8}: startup peak {format_bytes(p64.startup_peak(strategy))} on the device")
    figures.startup_peaks(p64)
    '''),
    md("""
    The runtime measures the same thing. A scaled H3 (two refiner blocks, eight main blocks)
    initialised both ways — the measured peaks next to the planner's predictions:
    """),
    code('''
    h3_small = synthetic.build(h3, scale=0.05, layers={"token_refiner.blocks": 2, "blocks": 8})
    h3_inputs = synthetic.example_inputs(h3_small, tokens=128, device=BACKEND)
    h3_small_spec = synthetic.spec_of(h3_small)
    small_plan = offload_lab.plan(h3_small_spec, tier="pinned")
    init_runs = [offload_lab.profile(h3_small, lambda: h3_small(**h3_inputs), small_plan, steps=2,
                                     backend=BACKEND, init=init,
                                     label=f"init {init} · measured on {BACKEND}")
                 for init in ("grouped", "naive")]
    for r in init_runs:
        print(f"{r.label}: measured {format_bytes(r.meta['startup_peak_bytes'])}, predicted "
              f"{format_bytes(r.meta['predicted_startup_peak_bytes'])}")
    figures.startup_peaks([small_plan, *init_runs])
    '''),
    md("""
    ## 2. Per-layer grants vs a whole-component grant, at 5.32 GiB spendable

    On a host with 7.32 GiB available, the reserve (max of 5 % and 2 GiB) leaves **5.32 GiB** to
    pin. A whole-component rule — pin the DiT if it fits, else nothing — pins **zero** layers,
    since 61 GiB never fits. Granting per layer pins what fits: four main blocks.
    """),
    code('''
    from offload_lab.planning.planner import store_bytes

    tight = offload_lab.HostMemory(available=int(7.32 * 2**30))

    def whole_component_grant(spec, budget):
        """The all-or-nothing rule: pin every layer if all of them fit the budget, else none."""
        need = sum(store_bytes(layer)[0] for layer in spec.iter_layers())
        return (sum(g.num_layers for g in spec.groups) if need <= budget else 0), need

    p_tight = offload_lab.plan(h3, host=tight)
    whole, need = whole_component_grant(h3, tight.spendable)
    print(tight)
    print(f"whole-component grant: {whole} layers pinned ({format_bytes(need)} needed)")
    print(f"per-layer grant:       {p_tight.tier_counts['pinned']} layers pinned "
          f"({format_bytes(p_tight.ledger['pinned_bytes'])})")
    p_tight.table().iloc[:8]
    '''),
    md("""
    ## 3. The mapped tier and the net anonymous cost

    Only bytes copied **out of** the checkpoint mapping into anonymous memory are new: a pinned or
    pageable store of a checkpoint view costs its mapped bytes; replacing an anonymous original
    (H3's re-ordered QKV) is a wash; the `mapped` tier costs nothing — the weights stay in the
    file's pages, which the kernel can evict and fault back in. When the plan's new bytes do not
    fit available − reserve, the planner first demotes pageable checkpoint views to `mapped`, then
    gives back pins from the tail of the pin order, and says so in every reason. On the tight
    host, 47 layers end up `mapped`:
    """),
    code('''
    led = p_tight.ledger
    print(f"net new anonymous memory {format_bytes(led['net_anonymous_bytes'])} of "
          f"{format_bytes(led['spendable'])} spendable · fits: {led['fits']}")
    print(p_tight.tier_counts)
    print(p_tight.reason_of("blocks", 30))
    figures.tier_map(p_tight)
    '''),
    md("""
    Forcing every layer to `pageable` on the same host cannot be honoured — the copies would need
    tens of GiB of new anonymous memory — and the planner says so instead of silently falling back:
    """),
    code('''
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forced = offload_lab.plan(h3, tier="pageable", host=tight)
    print(forced.tier_counts)
    for w in caught:
        print("warning:", w.message)
    '''),
    md("""
    ## 4. A 32 GB and a 60 GB host

    The same planner on two hosts. For the 60 GB host we use what was available when the reported
    plan was made: 43.39 GiB, leaving 41.22 GiB spendable. The reported plan pinned 34 of 50 main
    blocks (40.88 GiB), and the per-layer grant reproduces it; the net-anonymous check then decides
    which unpinned layers can afford a pageable copy and which stay mapped.
    """),
    code('''
    hosts = {
        "32 GB host (32 GiB available)": offload_lab.HostMemory(available="32GiB"),
        "60 GB host (43.39 GiB available)": offload_lab.HostMemory(available="43.39GiB", total="60GiB"),
    }
    host_plans = {name: offload_lab.plan(h3, host=h) for name, h in hosts.items()}
    pd.DataFrame([{
        "host": name, "spendable": format_bytes(p.ledger["spendable"]),
        "pinned main blocks": int(((p.layers["group"] == "blocks") & (p.layers["tier"] == "pinned")).sum()),
        **{t: n for t, n in p.tier_counts.items() if t != "resident"},
        "pinned bytes": format_bytes(p.ledger["pinned_bytes"]),
        "net new anonymous": format_bytes(p.ledger["net_anonymous_bytes"]), "fits": p.ledger["fits"],
    } for name, p in host_plans.items()])
    '''),
    code('''
    p60 = host_plans["60 GB host (43.39 GiB available)"]
    figures.tier_map(p60)
    '''),
    md("""
    ## 5. The power-of-two pinned-allocation hazard

    That 60 GB-host plan was right, and the run was still OOM-killed: each 1.20 GiB block store was
    pinned through a caching host allocator that rounds every block up to a power of two, so each
    locked **2 GiB**. 34 × 2 GiB = 68 GiB of page-locked memory on a host with 43 GiB available.
    The fix is to allocate pinned memory at its exact size — which offload-lab's runtime does —
    and to count what is really locked, which `pinned_footprint` does for either allocator:
    """),
    code('''
    from offload_lab.planning.hostmem import rounded_size
    from offload_lab.planning.planner import pinned_footprint

    exact, pow2 = pinned_footprint(p60, "exact"), pinned_footprint(p60, "pow2")
    block_bytes = h3.group("blocks").layers[0].bytes
    print(f"one block store: {format_bytes(block_bytes)} exact, "
          f"{format_bytes(rounded_size(block_bytes, 'pow2'))} rounded up to a power of two")
    bars = {"pinned, exact size": exact, "pinned, power-of-two blocks": pow2,
            "available": p60.ledger["available"], "spendable (available − reserve)": p60.ledger["spendable"]}
    fig = go.Figure(go.Bar(x=list(bars), y=[v / 2**30 for v in bars.values()],
                           marker_color=["#1f77b4", "#d62728", "#7f7f7f", "#bdbdbd"],
                           text=[format_bytes(v) for v in bars.values()], textposition="outside"))
    fig.update_layout(title="60 GB host: what 34 pinned blocks really lock", yaxis_title="GiB",
                      height=360)
    fig
    '''),
    md("""
    ## 6. Strided residency: 35 resident layers, the streamed ones spread evenly

    H3's operating point keeps 35 of the 50 main blocks resident and streams 15. *Which* 15 matters.
    With the first 35 resident (`leading`), the 15 streamed blocks run back to back, and each copy
    has only one block's compute to hide behind. With `strided` residency the streamed blocks are
    spread evenly, so each copy is issued while resident blocks compute. (35 resident blocks need
    about 42 GiB on the device: an H200, not a 32 GB RTX 5090.)
    """),
    code('''
    host256 = offload_lab.HostMemory(available="256GiB")
    strided = offload_lab.plan(h3, resident={"blocks": 35}, residency="strided", tier="pinned", host=host256)
    leading = offload_lab.plan(h3, resident={"blocks": 35}, residency="leading", tier="pinned", host=host256)
    print("streamed, strided:", strided.streamed_layers("blocks"))
    print("streamed, leading:", leading.streamed_layers("blocks"))
    print("device at startup:", format_bytes(strided.startup_peak("grouped")))
    figures.tier_map(strided)
    '''),
    md("""
    When compute per block is long (480p) both hide every copy; with fewer tokens per block, the
    copies of back-to-back streamed blocks surface as stalls, and spreading them removes most of it
    (simulated on the H200 profile):
    """),
    code('''
    res_runs = []
    for tokens in (4096, "480p"):
        for name, p in (("leading", leading), ("strided", strided)):
            res_runs.append(offload_lab.simulate(p, "h200", steps=2, tokens=tokens,
                                                 label=f"35 resident, {name} · {tokens} tokens · H200"))
    display(offload_lab.compare(res_runs)[["label", "step_s", "ratio", "stall_s", "exposed_copy_s"]])
    figures.step_times(res_runs)
    '''),
    code('''
    figures.timeline(res_runs[0], step=1)
    '''),
    code('''
    figures.timeline(res_runs[1], step=1)
    '''),
    md("""
    ## 7. A real run of the scaled H3 with strided residency

    The scaled model again, now with five of its eight main blocks resident, spread evenly, and the
    rest streamed: the measured timeline shows copies only for the streamed blocks.
    """),
    code('''
    p_res = offload_lab.plan(h3_small_spec, resident={"blocks": 5}, residency="strided")
    run_res = offload_lab.profile(h3_small, lambda: h3_small(**h3_inputs), p_res, steps=2,
                                  backend=BACKEND, label=f"5 of 8 resident, strided · measured on {BACKEND}")
    print(p_res.summary())
    figures.timeline(run_res)
    '''),
    code('''
    if HAS_CUDA:
        gpu_h3 = synthetic.build(h3, scale=0.25, dtype=torch.bfloat16,
                                 layers={"token_refiner.blocks": 2, "blocks": 12})
        gpu_in = synthetic.example_inputs(gpu_h3, tokens=2048, device="cuda")
        gpu_spec = synthetic.spec_of(gpu_h3)
        gpu_runs = [offload_lab.profile(gpu_h3, lambda: gpu_h3(**gpu_in),
                                        offload_lab.plan(gpu_spec, resident={"blocks": 8}, residency=r),
                                        steps=3, backend="cuda",
                                        label=f"8 of 12 resident, {r} · {torch.cuda.get_device_name()}")
                    for r in ("leading", "strided")]
        display(offload_lab.compare(gpu_runs))
    else:
        gpu_runs = []
        print("skipped: no CUDA device here. On a GPU this cell measures leading vs strided "
              "residency on a larger scaled H3 with the cuda backend.")
    '''),
    md("""
    ## 8. Report
    """),
    code('''
    rep = offload_lab.report(res_runs + init_runs + [run_res] + gpu_runs, plan=p60,
                             title="MiniMax-H3 under layer-wise offload")
    print(rep, "->", rep.save(OUT / "minimax-h3-report.html"))
    '''),
]

NOTEBOOKS = {
    "01_quickstart.ipynb": QUICKSTART,
    "wan21_offload.ipynb": WAN,
    "minimax_h3_offload.ipynb": H3,
}


def build(name: str, cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """One notebook from (kind, source) pairs; ids are stable so rebuilding changes nothing."""
    stem = name.removesuffix(".ipynb").replace("_", "-")
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    }
    for i, (kind, source) in enumerate(cells):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = make(source)
        cell.id = f"{stem}-{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 when a notebook differs from this source")
    ap.add_argument("--out", type=Path, default=NOTEBOOK_DIR, help="directory (default notebooks/)")
    args = ap.parse_args(argv)
    stale = []
    for name, cells in NOTEBOOKS.items():
        text = render(build(name, cells))
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python scripts/make_notebooks.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
