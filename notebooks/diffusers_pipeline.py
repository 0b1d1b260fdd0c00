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
# # Profiling the diffusers pipeline you actually run
#
# offload-lab records a per-layer timeline of weight offload on **your own pipeline**, without
# editing its denoising loop: every call of the offloaded model is recorded, and the steps are
# found from the pipeline's own `scheduler.step(...)`. This notebook uses a tiny `WanPipeline`
# built from a random config, so it runs on a CPU in seconds and downloads nothing:
#
# 1. offload only the transformer and run the pipeline as usual: steps, and the two calls per step
#    that classifier-free guidance makes;
# 2. the whole pipeline: one plan per component, ranked by how often each runs per request;
# 3. a checkpoint directory written by `save_pretrained` (sharded safetensors), its spec read from
#    the headers alone, and the loaded pipeline run with its weights served from the files' pages;
# 4. the same in one line with `%offload_profile`, a simulated full-speed run, and a report.
#
# It needs the `diffusers` extra (`pip install 'offload-lab[diffusers]'`).

# %%
import os
import tempfile
from pathlib import Path

import diffusers
import plotly.io as pio
import torch

import offload_lab
from offload_lab import figures
from offload_lab.model.synthetic.diffusers_tiny import tiny_wan_call, tiny_wan_pipeline

pio.renderers.default = "plotly_mimetype+notebook"
# diffusers logs harmless notes to stderr (e.g. "text_encoder=None ... cannot be saved" for the
# pipeline saved without a text encoder) and draws loading bars: none is about offload-lab
diffusers.utils.logging.set_verbosity_error()
diffusers.utils.logging.disable_progress_bar()

# reports go to $OFFLOAD_LAB_NOTEBOOK_OUT, else artifacts/notebooks/ of the checkout (git ignores it)
ROOT = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "data" / "models").is_dir()),
            Path.cwd())
OUT = Path(os.environ.get("OFFLOAD_LAB_NOTEBOOK_OUT", ROOT / "artifacts" / "notebooks"))
OUT.mkdir(parents=True, exist_ok=True)
HAS_CUDA = torch.cuda.is_available()
STEPS = 3
print(f"offload-lab {offload_lab.__version__} · torch {torch.__version__} · measured runs use the "
      f"cpu backend here" + ("" if HAS_CUDA else " (no CUDA device: the GPU cell will say it skips)"))

# %% [markdown]
# ## A pipeline, run as usual
#
# Six transformer blocks, a tiny VAE and no text encoder (random prompt embeddings stand in for
# it). `tiny_wan_call` gives one request's arguments with a seeded generator, so two runs
# produce the same frames bit for bit.

# %%
pipe = tiny_wan_pipeline(layers=6)
with torch.no_grad():
    reference = pipe(**tiny_wan_call(steps=STEPS)).frames
tuple(reference.shape)

# %% [markdown]
# ## Offload the transformer; no step markers
#
# `offload(pipe.transformer, plan)` applies a plan to the transformer only. Nothing in the loop
# changes: the manager records every call of the transformer, and each `scheduler.step(...)`
# closes a denoising step (the scheduler's `step` is wrapped only while the block runs, and
# restored after — also on an error or Ctrl-C). `run.meta["steps_from"]` says how the steps were
# found; `calls` counts the transformer's forwards in each step: 2, the conditional and the
# unconditional pass of classifier-free guidance. Each block is therefore copied twice per step.

# %%
plan = offload_lab.plan(offload_lab.spec_of(pipe.transformer), tier="pinned")
with offload_lab.offload(pipe.transformer, plan, backend="cpu") as m:
    frames = pipe(**tiny_wan_call(steps=STEPS)).frames
run = m.build_run()
print(run, "· steps from:", run.meta["steps_from"], "· same frames:", torch.equal(frames, reference))
run.steps[["step", "calls", "wall_s", "bytes_moved"]]

# %% [markdown]
# The timeline shades each call within a step; hovering a bar names its step and call.

# %%
figures.timeline(run)

# %% [markdown]
# ## The whole pipeline: one plan per component
#
# `spec_of(pipe)` gives a pipeline spec: each torch component with its groups (prefixed by the
# component) and how often it runs per request — the denoiser `steps × passes` times, the VAE
# once. `plan_pipeline` ranks pins across components by that: with a budget that covers only
# part of the pipeline, the transformer gets its pins first.

# %%
pspec = offload_lab.spec_of(pipe).with_uses(steps=STEPS, passes=2)
pspec.table()

# %%
budget = pspec["transformer"].spec.layer_bytes
pplan = offload_lab.plan_pipeline(pspec, pin_budget=budget)
pplan.table().groupby(["component", "tier"]).size()

# %% [markdown]
# `offload(pipe, pipeline_plan)` applies every component's plan at once and records one run:
# three denoising steps (two transformer calls each), then the VAE's decode, which comes after
# the last `scheduler.step`, in a step of its own.

# %%
with offload_lab.offload(pipe, pplan, backend="cpu") as m:
    frames = pipe(**tiny_wan_call(steps=STEPS)).frames
whole = m.build_run()
print(whole, "· same frames:", torch.equal(frames, reference))
whole.steps[["step", "calls", "bytes_moved"]]

# %%
figures.timeline(whole)

# %% [markdown]
# ## A checkpoint directory
#
# `save_pretrained` writes the diffusers format: `model_index.json` and one folder per component,
# here in small shards with their index. `spec_of(directory)` reads the headers only — no weight
# is loaded — and gives the same spec as the loaded pipeline. `from_pretrained` (with accelerate
# installed) leaves every weight on the files' pages, so the `mapped` tier serves the copies from
# there, costing no anonymous memory.

# %%
ckpt = Path(tempfile.mkdtemp()) / "tiny-wan"
pipe.save_pretrained(ckpt, max_shard_size="100KB")
shards = sorted((ckpt / "transformer").glob("*.safetensors"))
from_dir = offload_lab.spec_of(ckpt)
print(f"{len(shards)} transformer shards; spec from the headers: {from_dir!r}")

# %%
from diffusers import WanPipeline  # noqa: E402

loaded = WanPipeline.from_pretrained(ckpt, text_encoder=None, tokenizer=None)
loaded.set_progress_bar_config(disable=True)
file_backed = sum(offload_lab.is_file_backed(p) for p in loaded.transformer.parameters())
print(f"{file_backed} of {sum(1 for _ in loaded.transformer.parameters())} transformer parameters "
      f"are file-backed; same spec as the directory: {offload_lab.spec_of(loaded).signature() == from_dir.signature()}")
mplan = offload_lab.plan_pipeline(offload_lab.spec_of(loaded).with_uses(steps=STEPS), tier="mapped")
with offload_lab.offload(loaded, mplan, backend="cpu") as m:
    frames = loaded(**tiny_wan_call(steps=STEPS)).frames
mapped = m.build_run()
print(mapped, "· same frames:", torch.equal(frames, reference))
mapped.layers.groupby(["group", "tier"]).size()

# %% [markdown]
# ### Your own checkpoint
#
# Set `OFFLOAD_LAB_PIPELINE=/path/to/a/diffusers/directory` before starting Jupyter and this cell
# reads its spec and plans it (headers only, nothing loaded). To run it, use
# `offload-lab profile --pipeline DIR --steps 4 --height 64 --width 64 --frames 5 --out run.zip`.

# %%
given = os.environ.get("OFFLOAD_LAB_PIPELINE")
if given:
    yours = offload_lab.spec_of(given)
    print(f"using the checkpoint directory {given}: {yours!r}")
    display(yours.table())  # noqa: F821 - IPython's display
    print(offload_lab.plan_pipeline(yours.with_uses(steps=50)))
else:
    print("no checkpoint directory given (OFFLOAD_LAB_PIPELINE is not set): using the tiny "
          "pipeline above only")

# %% [markdown]
# ## In one line: `%offload_profile`
#
# The magic takes a pipeline and a call of it: the call is one request, the steps come from the
# pipeline's scheduler, and it shows the summary and the timeline.

# %%
# %load_ext offload_lab

# %%
# %offload_profile --tier pageable -n 1 --warmup 0 --backend cpu pipe pipe(**tiny_wan_call(steps=3))

# %% [markdown]
# ## Predicted at full speed (simulated)
#
# On a CPU, copies and compute share the same cores, so this machine cannot show what pinned
# memory buys. The simulator can: the full-size Wan2.1 1.3B transformer (the architecture the
# tiny one shrinks) with an 8 GiB pin budget on the H200 profile, with `passes=2` for the two
# guidance calls per step — numbered as calls 0 and 1, as the measured runs number them. A
# simulated run is labelled so everywhere.

# %%
full = offload_lab.plan(offload_lab.catalog.load("wan2.1-t2v-1.3b"), pin_budget="1GiB",
                        host=offload_lab.HostMemory(available="64GiB"))
sim = offload_lab.simulate(full, "h200", steps=STEPS, passes=2)
print(sim)
figures.timeline(sim)

# %% [markdown]
# ## On a GPU
#
# With a CUDA device the same pipeline runs under the `cuda` backend (a side stream for copies).

# %%
if HAS_CUDA:
    gpu_pipe = tiny_wan_pipeline(layers=6).to("cuda")
    gplan = offload_lab.plan(offload_lab.spec_of(gpu_pipe.transformer), tier="pinned")
    with offload_lab.offload(gpu_pipe.transformer, gplan, backend="cuda") as m:
        gpu_pipe(**tiny_wan_call(steps=STEPS))
    print(m.build_run())
else:
    print("skipped: no CUDA device here")

# %% [markdown]
# ## A report
#
# One offline HTML file with every run (measured and simulated, each labelled).

# %%
path = offload_lab.report([run, whole, mapped, sim]).save(OUT / "diffusers_pipeline.html")
print(f"report written to {path.name}")
