# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # offload-lab: quick start
#
# A diffusion transformer (DiT) such as Wan2.1-14B or MiniMax-H3 does not fit on one GPU next to
# its activations, so its blocks' weights live in host memory and each block is copied to the
# GPU just before it runs — on a side stream, while the previous block computes. Whether those
# copies hide behind compute depends on **where each block's weights live in host memory**:
#
# | tier | where the weights live between uses | what a copy costs |
# | --- | --- | --- |
# | `resident` | on the device | nothing after the first copy |
# | `pinned` | page-locked host memory | an asynchronous DMA that overlaps compute |
# | `pageable` | ordinary host memory | the driver stages it, and the host thread waits |
# | `mapped` | the checkpoint file's pages | no extra host memory; pages may fault from disk |
#
# This notebook takes a small model through the whole loop — plan, profile, read the timeline,
# compare, report — then does the same with one line (`%offload_profile`) and with a dashboard
# (`PlanExplorer`). It runs on a CPU: executed headless it took about 20 s on two idle cores;
# on a busy machine, or the first time torch is imported after installing, allow a few minutes.
# Runs that were *measured* say on which backend; runs the *simulator* predicted always say
# "simulated".

# %%
import os
from pathlib import Path

import plotly.io as pio
import torch
from IPython.display import display

import offload_lab
from offload_lab import catalog, figures, synthetic
from offload_lab.units import format_bytes

# plotly >= 6.1 shows a figure in a kernel only as the plotly mimetype, which
# `jupyter nbconvert --to html` drops. Adding the "notebook" renderer also emits text/html
# (and inlines plotly.js once, here), so every figure below survives export, offline.
pio.renderers.default = "plotly_mimetype+notebook"

# reports go to $OFFLOAD_LAB_NOTEBOOK_OUT, else artifacts/notebooks/ of the checkout (git ignores it)
ROOT = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "data" / "models").is_dir()),
            Path.cwd())
OUT = Path(os.environ.get("OFFLOAD_LAB_NOTEBOOK_OUT", ROOT / "artifacts" / "notebooks"))
OUT.mkdir(parents=True, exist_ok=True)
HAS_CUDA = torch.cuda.is_available()
BACKEND = "cuda" if HAS_CUDA else "cpu"  # measured runs; inputs must live on its device
print(f"offload-lab {offload_lab.__version__} · torch {torch.__version__} · "
      f"measured runs use the {BACKEND} backend"
      + ("" if HAS_CUDA else " (no CUDA device here: GPU-only cells will say they skip)"))


def shipped_runs(model=None):
    """The measured GPU runs shipped with offload-lab (of one catalog model, if named), found
    through the installed package rather than the working directory, so a copied notebook still
    finds them."""
    try:
        found = offload_lab.shipped_runs(model)
    except LookupError as e:  # nothing shipped where the package looks: the message says where
        print(e)
        return []
    if not found:
        print(f"no measured GPU runs of {model} are shipped with offload-lab")
    return found

# %% [markdown]
# ## 1. A model small enough for a laptop
#
# The catalog holds the exact tensors of the real models (names, shapes, dtypes — weights cannot
# be downloaded here). `synthetic.build` makes a runnable stand-in with those tensor names and
# random weights; `scale` shrinks the widths and `layers` the depth, so every code path runs in
# seconds. `synthetic.spec_of` describes it, keeping the catalog's name and token counts.

# %%
full = catalog.load("wan2.1-t2v-1.3b")
model = synthetic.build(full, scale=0.1, layers=6)
inputs = synthetic.example_inputs(model, tokens=256, device=BACKEND)
spec = synthetic.spec_of(model)

print("catalog:", full)
print("scaled: ", spec)
spec.layers[["group", "layer", "bytes", "tensors"]]

# %% [markdown]
# ## 2. A plan: a tier, a pin rank and a reason for every layer
#
# `offload_lab.plan` decides where each layer lives. With no `host=` it measures this machine:
# it keeps a reserve (5 % of available memory, at least 2 GiB) and never pins more than the
# rest, so pinning cannot invite the OOM killer. Here the pin budget is half the layer bytes:
# layers are granted pins first-fit in execution order, and those that do not fit stay pageable.

# %%
plan = offload_lab.plan(spec, pin_budget=spec.layer_bytes // 2)
print(plan.summary())
print({k: (format_bytes(v) if isinstance(v, int) and not isinstance(v, bool) else v)
       for k, v in plan.ledger.items()})
plan.table()

# %% [markdown]
# ## 3. Profile it and read the timeline
#
# `offload_lab.profile` calls the function once per step under the plan (after a warm-up step,
# which is dropped) and records every copy and compute interval. The model is restored exactly
# afterwards — also on an error or Ctrl-C. The result is a `Run`: tidy pandas frames.

# %%
run = offload_lab.profile(model, lambda: model(**inputs), plan, steps=3, warmup=1,
                          backend=BACKEND, label=f"half pinned · measured on {BACKEND}")
display(run.steps)
run.events.head(8)

# %% [markdown]
# The timeline has one lane per stream: **copy** (host → device), **compute**, and **host**
# (time the host thread was blocked staging a pageable or mapped copy). Bars are coloured by
# tier; red `wait` bars are stalls — the compute stream was ready but the layer's weights were
# not there yet. Hover a bar for its layer, bytes, duration and GB/s.

# %%
figures.timeline(run)

# %%
figures.tier_map(plan)

# %% [markdown]
# ## 4. Compare plans — measured here, measured on an H200, simulated both ways
#
# On a CPU there is no DMA engine and no page-locking: the copy thread competes with compute for
# the same cores, so pinned and pageable take about the same time here (the measured rows below;
# their ratio is this machine's, and is never set against a GPU's).

# %%
runs = []
for tier in ("pinned", "pageable"):
    p = offload_lab.plan(spec, tier=tier)
    runs.append(offload_lab.profile(model, lambda: model(**inputs), p, steps=3,
                                    backend=BACKEND, label=f"{tier} · measured on {BACKEND}"))
offload_lab.compare(runs)[["label", "backend", "simulated", "tiers", "step_s", "ratio", "stall_s"]]

# %%
figures.step_times(runs)

# %% [markdown]
# On a GPU the gap depends on the runtime's **issue order** for copies that block the host.
# Every shipped H200 run (`data/runs/`) issued them *before* each layer's compute
# (`before-compute`, as other runtimes do): there, pageable copies block the host and nothing
# overlaps. The simulator reads the same plans two ways on the `h200` profile: `before-compute`,
# within the held-out band of the measured runs of that order, and `after-compute`
# (offload-lab's default), where it predicts pageable copies hide almost like pinned ones. That
# second reading is a **prediction**: no GPU has run pageable copies in that order yet, so its
# `status` says *unconfirmed*. Below, one table (a `simulated` column, ratios `vs_pinned` only
# within one source, model and token count) and one figure, with the pair another
# layerwise-offload runtime reported for Wan2.1 (1.03 s pinned vs 1.90 s pageable, on its own GPU)
# as a group of its own.

# %%
from offload_lab.views.story import pinned_vs_pageable, story_frame, story_runs

measured_h200, simulated_h200 = story_runs()   # the shipped H200 runs at 480p + both orders simulated
story = story_frame(measured_h200, simulated_h200)
story[["source", "simulated", "model", "tier", "issue", "step_s", "vs_pinned", "status", "band"]]

# %%
pinned_vs_pageable(measured_h200, simulated_h200)

# %%
# the full-size 1.3B simulated on the H200 profile joins the report below (each run labelled simulated)
runs += [r for r in simulated_h200 if r.meta["model"] == "wan2.1-t2v-1.3b"]

# %% [markdown]
# ## 5. A report you can send
#
# `offload_lab.report(...).save(path)` writes one offline HTML file: the comparison, every
# run's timeline, memory and tier map, the plan's ledger and per-layer reasons, and the
# environment. Simulated runs are flagged on every page.

# %%
rep = offload_lab.report(runs, plan=plan, title="offload-lab quick start")
path = rep.save(OUT / "quickstart-report.html")
print(rep)
print("written to", path)

# %% [markdown]
# ## 6. The same from one line: `%offload_profile`
#
# `%load_ext offload_lab` registers one magic. The line form profiles a statement under offload
# of a model; the cell form profiles the cell body. Options mirror `plan()`; `%offload_profile?`
# lists them. `-o` returns the `Run` (a list with `--tiers`), `-q` displays nothing.

# %%
# %load_ext offload_lab

# %%
# %offload_profile -n 2 -b 1MiB model model(**inputs)

# %%
# %%offload_profile -n 2 --tiers pinned,pageable model
out = model(**inputs)

# %%
# r = %offload_profile -q -o -n 2 --resident 2 --residency strided -p 2 model model(**inputs)
# (`r` is assigned by the magic on the line above, which a linter reads as a comment)
r.layers[["group", "layer", "tier", "streamed", "copy_s", "compute_s", "stall_s"]]  # noqa: F821

# %% [markdown]
# ## 7. Interactively: `PlanExplorer`
#
# The dashboard below rewires the same functions: move the pin budget, the resident count and
# policy, the pin order, the prefetch depth or the forced tier, and the plan, its tier map and a
# simulated timeline update at once; **Run** profiles the real model with `fn`; **Add to
# comparison** keeps a run; **pinned vs pageable** simulates the headline comparison;
# **Export report** writes the HTML report. (An exported notebook shows the dashboard only where
# the widget scripts can load; the figures after it are ordinary outputs.)

# %%
from offload_lab import PlanExplorer

ex = PlanExplorer(model, fn=lambda: model(**inputs), profile="h200")
ex

# %% [markdown]
# Every control and button is a plain Python object, so a notebook (or a test) can drive the
# dashboard without a browser: set a control's `.value`, `.click()` a button, then read
# `ex.plan`, `ex.last_run`, `ex.runs` and `ex.figures`.
#
# Each button shows its own run in the dashboard's timeline, so the order matters: **pinned vs
# pageable** first (it adds one simulated run per tier to the comparison), then **Simulate** the
# plan the controls make, so the timeline and the plan printed below are the same plan.

# %%
ex.live.value = False                  # simulate on button presses only
ex.budget.value = ex.budget.max / 3    # a third of the layer bytes (or of what the host can spend)
ex.order.value = "strided"             # spread the pins over the model
ex.tiers_button.click()                # pinned vs pageable, simulated, kept in the comparison
ex.simulate_button.click()             # the plan above, simulated: this is the timeline shown
ex.add_button.click()                  # ... and kept beside the two tiers
print(ex.plan.summary())
shown = ex.last_run.layers.merge(ex.plan.layers, on=["group", "layer"], suffixes=("_run", "_plan"))
print("timeline shows the plan above:", bool((shown["tier_run"] == shown["tier_plan"]).all()))
print(ex.error or "no errors")
ex.figures["step_times"]

# %%
ex.figures["timeline"]

# %% [markdown]
# ## 8. Rerun on a real GPU
#
# Everything above ran on the `cpu` backend, whose copies are memcpys on the same cores as the
# compute: it shows the mechanics, not the pinned-vs-pageable difference. To see that, run the
# same notebook on a machine with an NVIDIA GPU.
#
# **1. torch must be a CUDA build.** A CPU build of torch (`2.13.0+cpu`, what `scripts/setup.sh`
# installs when no torch is present) never sees a GPU. Check it in the environment the kernel
# runs in:
#
# ```bash
# python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())"
# ```
#
# `torch.version.cuda` is `None` for a CPU build; `torch.cuda.is_available()` must print `True`.
# Otherwise install a CUDA build first (pick the command for your driver on pytorch.org, e.g.
# `pip install torch --index-url https://download.pytorch.org/whl/cu128`), then set up offload-lab
# beside it: `bash scripts/setup.sh` keeps an importable torch as it is. The cell below prints
# the same check.
#
# **2. The dashboard's Run on the GPU.** Nothing in this notebook changes: with CUDA visible,
# the setup cell picks the `cuda` backend, `example_inputs(..., device=BACKEND)` puts the inputs
# on the GPU, and `PlanExplorer(model, fn=lambda: model(**inputs))` measures with the `cuda`
# backend when you press **Run** (`backend="auto"`; pass `backend="cuda"` to insist). Each
# measured run also adds a device profile calibrated on it to the profile list, so **Simulate**
# can then predict other plans for that GPU. Start JupyterLab on the GPU machine (or forward its
# port: `ssh -L 8888:localhost:8888 gpu-host`, then `jupyter lab --no-browser` there).
#
# **3. Without a notebook: `scripts/gpu_check.py`.** From a checkout on the GPU machine:
#
# ```bash
# PYTHONPATH=. python3 scripts/gpu_check.py --out DIR --stage smoke   # correctness checks only
# PYTHONPATH=. python3 scripts/gpu_check.py --out DIR                 # every measurement, under 8 minutes
# ```
#
# `--stage smoke` checks the `cuda` backend against the model run wholly on the GPU (outputs
# bit-identical for each tier and prefetch depth, the model restored, the startup peak measured
# against the planner's prediction) and writes `DIR/smoke.json`; it saves no runs. The default
# (`--stage all`, or `main` without the trace and diffusers extras) also profiles full-width
# Wan2.1-shaped models under a dozen plans and saves every run as one zip in `DIR/gpu_runs.tar`,
# with `comparison.csv` and the log beside it. Without CUDA it exits with a one-line message.
#
# **4. Bring the runs back into a notebook.** Copy `DIR/gpu_runs.tar` to where the notebook runs,
# unpack it (`tar -xf gpu_runs.tar -C gpu_runs`) and load each run with `offload_lab.Run.load(path)`:
# measured runs keep the machine's name, the plan and the host they ran under, and every figure,
# `compare()` and the report read them like the runs above. The last cell loads the H200 runs
# shipped with offload-lab the same way.

# %%
print(f"torch {torch.__version__}: CUDA build {torch.version.cuda or 'no (a CPU build)'}; "
      f"GPU visible: {torch.cuda.is_available()}")

# %%
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

# %%
# runs unpacked from gpu_runs.tar load the same way:
#     [offload_lab.Run.load(f) for f in sorted(Path("gpu_runs").glob("*.zip"))]
h200 = shipped_runs("wan2.1-t2v-14b")
if h200:
    display(offload_lab.compare(h200)[["label", "backend", "simulated", "tiers", "step_s", "ratio", "stall_s"]])
    display(figures.step_times(h200))
