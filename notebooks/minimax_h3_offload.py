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
# # MiniMax-H3 under layer-wise offload
#
# MiniMax-H3 is a dense single-stream audio+video DiT: 33.12 B parameters, **61.73 GiB** in
# bf16/fp32. It has **two layer groups** — `token_refiner.blocks` (2 blocks that refine the text
# condition) and `blocks` (50 main blocks of 1.20 GiB) — and most of its tensors are views of the
# checkpoint file (all but each block's fused QKV, re-ordered at load time). Each of those facts
# shapes how it can be offloaded. This notebook walks through them: the startup peak of two
# groups, per-layer pin grants on a tight host, the mapped tier and the host memory it saves,
# hosts of 32 and 60 GB, a pinned-allocation hazard that once got a run OOM-killed, and the
# operating point with 35 resident layers spread evenly.

# %%
import os
import warnings
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
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

# %%
h3 = catalog.load("minimax-h3")
print(h3)
pd.DataFrame([{
    "group": g.name, "layers": g.num_layers, "bytes per layer": format_bytes(g.layers[0].bytes),
    "checkpoint views per layer": format_bytes(g.layers[0].mapped_bytes),
    "group bytes": format_bytes(g.bytes),
} for g in h3.groups] + [{"group": "(non-layer)", "layers": "–", "bytes per layer": "–",
                          "checkpoint views per layer": "–",
                          "group bytes": format_bytes(h3.non_layer_bytes)}])

# %%
print(f"total {format_bytes(h3.total_bytes)}, of which checkpoint views {format_bytes(h3.mapped_bytes)}")

# %% [markdown]
# ## 1. Two groups: the startup peak, grouped vs naive
#
# To offload a model, each group's layer weights are replaced by host stores and everything else
# is moved to the device once. Done **naively** — offload one group, move the whole model to the
# device, then the next group — the second group is transiently *on the device* in between:
# with H3's declared order (refiner first) that is all 50 main blocks, 60 GiB, which no 32 GB
# card survives. Done **grouped** — every group to host stores first, largest first, then the
# remainder to the device once — the peak is the non-layer weights plus the first prefetched
# blocks.

# %%
host64 = offload_lab.HostMemory(available="64GiB")
p64 = offload_lab.plan(h3, host=host64)
print("init order:", p64.init_order)
for strategy in ("grouped", "naive"):
    print(f"{strategy:>8}: startup peak {format_bytes(p64.startup_peak(strategy))} on the device")
figures.startup_peaks(p64)

# %% [markdown]
# The runtime measures the same thing. A scaled H3 (two refiner blocks, eight main blocks)
# initialised both ways — the measured peaks next to the planner's predictions:

# %%
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

# %% [markdown]
# ## 2. Per-layer grants vs a whole-component grant, at 5.32 GiB spendable
#
# On a host with 7.32 GiB available, the reserve (max of 5 % and 2 GiB) leaves **5.32 GiB** to
# pin. A whole-component rule — pin the DiT if it fits, else nothing — pins **zero** layers,
# since 61 GiB never fits. Granting per layer pins what fits: four main blocks.

# %%
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

# %% [markdown]
# ## 3. The mapped tier and the net anonymous cost
#
# Only bytes copied **out of** the checkpoint mapping into anonymous memory are new: a pinned or
# pageable store of a checkpoint view costs its mapped bytes; replacing an anonymous original
# (H3's re-ordered QKV) is a wash; the `mapped` tier costs nothing — the weights stay in the
# file's pages, which the kernel can evict and fault back in. When the plan's new bytes do not
# fit available − reserve, the planner first demotes pageable checkpoint views to `mapped`, then
# gives back pins from the tail of the pin order, and says so in every reason. On the tight
# host, 47 layers end up `mapped`:

# %%
led = p_tight.ledger
print(f"net new anonymous memory {format_bytes(led['net_anonymous_bytes'])} of "
      f"{format_bytes(led['spendable'])} spendable · fits: {led['fits']}")
print(p_tight.tier_counts)
print(p_tight.reason_of("blocks", 30))
figures.tier_map(p_tight)

# %% [markdown]
# Forcing every layer to `pageable` on the same host cannot be honoured — the copies would need
# tens of GiB of new anonymous memory — and the planner says so instead of silently falling back:

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    forced = offload_lab.plan(h3, tier="pageable", host=tight)
print(forced.tier_counts)
for w in caught:
    print("warning:", w.message)

# %% [markdown]
# ## 4. A 32 GB and a 60 GB host
#
# The same planner on two hosts. The 60 GB host is one from a reported H3 offload run outside
# this project (an RTX 5090 32 GB with a 60 GB host); we use what was available when its plan
# was made: 43.39 GiB, leaving 41.22 GiB spendable. The reported plan pinned 34 of 50 main
# blocks (40.88 GiB), and the per-layer grant reproduces it; the net-anonymous check then decides
# which unpinned layers can afford a pageable copy and which stay mapped.

# %%
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

# %%
p60 = host_plans["60 GB host (43.39 GiB available)"]
figures.tier_map(p60)

# %% [markdown]
# ## 5. The power-of-two pinned-allocation hazard
#
# That 60 GB-host plan was right, and the run was still OOM-killed: each 1.20 GiB block store was
# pinned through a caching host allocator that rounds every block up to a power of two, so each
# locked **2 GiB**. 34 × 2 GiB = 68 GiB of page-locked memory on a host with 43 GiB available.
# The fix is to allocate pinned memory at its exact size — which offload-lab's runtime does —
# and to count what is really locked, which `pinned_footprint` does for either allocator:

# %%
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

# %% [markdown]
# ## 6. Strided residency: 35 resident layers, the streamed ones spread evenly
#
# H3's operating point keeps 35 of the 50 main blocks resident and streams 15. *Which* 15 matters.
# With the first 35 resident (`leading`), the 15 streamed blocks run back to back, and each copy
# has only one block's compute to hide behind. With `strided` residency the streamed blocks are
# spread evenly, so each copy is issued while resident blocks compute. (35 resident blocks need
# about 42 GiB on the device: an H200, not a 32 GB RTX 5090.)

# %%
host256 = offload_lab.HostMemory(available="256GiB")
strided = offload_lab.plan(h3, resident={"blocks": 35}, residency="strided", tier="pinned", host=host256)
leading = offload_lab.plan(h3, resident={"blocks": 35}, residency="leading", tier="pinned", host=host256)
print("streamed, strided:", strided.streamed_layers("blocks"))
print("streamed, leading:", leading.streamed_layers("blocks"))
print("device at startup:", format_bytes(strided.startup_peak("grouped")))
figures.tier_map(strided)

# %% [markdown]
# When compute per block is long (480p) both hide every copy; with fewer tokens per block, the
# copies of back-to-back streamed blocks surface as stalls, and spreading them removes most of it
# (simulated on the H200 profile):

# %%
res_runs = []
for tokens in (4096, "480p"):
    for name, p in (("leading", leading), ("strided", strided)):
        res_runs.append(offload_lab.simulate(p, "h200", steps=2, tokens=tokens,
                                             label=f"35 resident, {name} · {tokens} tokens · H200"))
display(offload_lab.compare(res_runs)[["label", "step_s", "ratio", "stall_s", "exposed_copy_s"]])
figures.step_times(res_runs)

# %%
figures.timeline(res_runs[0], step=1)

# %%
figures.timeline(res_runs[1], step=1)

# %% [markdown]
# ## 7. A real run of the scaled H3 with strided residency
#
# The scaled model again, now with five of its eight main blocks resident, spread evenly, and the
# rest streamed: the measured timeline shows copies only for the streamed blocks.

# %%
p_res = offload_lab.plan(h3_small_spec, resident={"blocks": 5}, residency="strided")
run_res = offload_lab.profile(h3_small, lambda: h3_small(**h3_inputs), p_res, steps=2,
                              backend=BACKEND, label=f"5 of 8 resident, strided · measured on {BACKEND}")
print(p_res.summary())
figures.timeline(run_res)

# %%
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

# %% [markdown]
# ## 8. What fits a 24 GiB card with 64 GiB of host RAM
#
# `offload_lab.recommend` searches the plan space — resident count and pattern, prefetch depth,
# pin order, pin budget, forced tiers — with the simulator, keeps the plans whose host memory and
# estimated device peak fit, and says why the fastest one wins. Here: MiniMax-H3 on the RTX 4090
# profile (an estimated profile, so every step time below is simulated), 24 GiB of device
# memory, 64 GiB of host memory available, two forwards per step (classifier-free guidance).

# %%
rec = offload_lab.recommend(h3, "rtx4090-pcie4", host="64GiB", device_memory="24GiB",
                            calls_per_step=2)
print(rec.summary())
display(rec.front[["id", "residency", "resident_layers", "prefetch", "order", "tier", "step_s",
                   "pinned_bytes", "device_peak_bytes"]])

# %% [markdown]
# The fastest plan sets the pace; among the plans within 1 % of it (`tolerance=0.01`) the best pins
# the fewest host bytes, then holds the smallest device peak (non-layer weights + resident blocks +
# the blocks in flight + an activation estimate), then keeps the fewest blocks resident. This card
# is compute-bound — compute hides the copies — so the answer pins nothing and leaves most of the
# device free; the explanation says so. Step times read per call × calls per step (two with
# guidance). The report below carries the recommendation, its front and the explanation.

# %% [markdown]
# ## 9. What staging buys on a small pin budget
#
# On the 5.32 GiB host of section 2 per-layer grants pin four of 52 blocks; the other 48 pay
# the pageable price. With `staging=True` the planner first sets aside K = prefetch + 1 pinned
# staging buffers per group (each the size of its largest block), pins what is left, and sends
# every other block through those buffers: `staged`. Simulated on the H200 profile at 480p (no
# GPU run of the staged tier ships yet; the host memcpy rate is the profile's measured pageable
# rate, a lower bound):

# %%
p_staged = offload_lab.plan(h3, staging=True, host=tight)
print(p_staged.summary())
print(p_staged.ledger["staging"])
print(p_staged.reason_of("blocks", 49))
stage_runs = [
    offload_lab.simulate(p_tight, "h200", steps=2, issue="before-compute", label="4 pins, before-compute"),
    offload_lab.simulate(p_tight, "h200", steps=2, label="4 pins, after-compute"),
    offload_lab.simulate(p_staged, "h200", steps=2, label="1 pin, the rest staged"),
]
display(offload_lab.compare(stage_runs)[["label", "step_s", "ratio", "stall_s", "exposed_copy_s"]])
figures.step_times(stage_runs)

# %% [markdown]
# The new issue order (after the running block's kernels) is most of the win; staging adds to
# it here although its buffers take three of the four pins, since its copies never block the
# host. How much it buys on a real machine depends on the host's memcpy rate, which
# `scripts/gpu_check.py --stage staged` measures.

# %% [markdown]
# ## 10. Report

# %%
rep = offload_lab.report(res_runs + init_runs + [run_res] + gpu_runs, plan=p60,
                         title="MiniMax-H3 under layer-wise offload", recommendation=rec)
print(rep, "->", rep.save(OUT / "minimax-h3-report.html"))
