"""The names offload-lab speaks in: tiers, event kinds, streams, orders, backends, ...

Each set of names lives here once, in its canonical order (the order tables, figures and
messages list them in); every module that accepts or writes one of these names imports it from
here, so a new tier or a new stream is added in one place. This module is the bottom of the
package: it imports nothing from offload_lab.

>>> TIERS
('resident', 'pinned', 'staged', 'pageable', 'mapped')
>>> OBSERVED_TIERS[-1], set(FORCED_TIERS) < set(TIERS)
('unknown', True)
"""

from __future__ import annotations

__all__ = [
    "TIERS", "FORCED_TIERS", "UNKNOWN_TIER", "OBSERVED_TIERS", "CALIBRATION_TIERS", "BANDWIDTH_TIERS",
    "EVENT_KINDS", "STREAMS", "ISSUE_ORDERS", "BACKENDS", "INIT_STRATEGIES", "ORDERS", "RESIDENCIES",
    "COMPUTE_MODES", "PROVENANCE_KINDS", "ENGINES",
]

#: where a layer's weights live between its uses, fastest first: on the device for good, in
#: page-locked host memory, copied through a pinned staging buffer, in pageable host memory, or
#: memory-mapped from the checkpoint file
TIERS = ("resident", "pinned", "staged", "pageable", "mapped")
#: the tiers a plan may force on every streamed layer (``resident`` is what a plan keeps, not forces)
FORCED_TIERS = TIERS[1:]
#: the tier of a layer whose placement a recording could not tell (observed runs, imported traces)
UNKNOWN_TIER = "unknown"
#: every tier a run's frames may hold
OBSERVED_TIERS = (*TIERS, UNKNOWN_TIER)
#: the plans a calibration measures: pinned gives the DMA rate and compute beside copies,
#: pageable the staged rate and whether those copies block the host
CALIBRATION_TIERS = ("pinned", "pageable")
#: the bandwidth keys of a device profile (GB/s): a mapped layer's first copy in a run faults
#: its pages from disk (cold), later ones find them in the page cache (warm)
BANDWIDTH_TIERS = ("pinned", "pageable", "mapped_warm", "mapped_cold")

#: what an event row records; ``stage`` is a host memcpy of a layer into a pinned staging buffer
EVENT_KINDS = ("copy", "compute", "wait", "host_block", "stage")
#: where an event runs: the copy engine, the compute stream, the host thread, the staging thread
STREAMS = ("copy", "compute", "host", "host_copy")
#: when the runtime issues copies that block the host: behind the running block's kernels, or
#: from the pre-hook after the copy stream waits for all queued compute (other runtimes' way)
ISSUE_ORDERS = ("after-compute", "before-compute")
#: where a run executes; ``auto`` is cuda when a GPU is present, else cpu
BACKENDS = ("auto", "cuda", "cpu")
#: how the manager moves a model onto its plan: a group at a time, or everything at once
INIT_STRATEGIES = ("grouped", "naive")
#: the order in which streamed layers get the pin budget
ORDERS = ("execution", "reverse", "largest", "strided")
#: which layers of a group stay resident: the first ones, or spread evenly
RESIDENCIES = ("leading", "strided")
#: how a device profile's host drives compute: launches and runs ahead (a GPU), or runs each block
COMPUTE_MODES = ("async", "sync")
#: where a device profile's numbers come from
PROVENANCE_KINDS = ("measured", "estimated")

#: the offload engines whose settings offload-lab models as plans (:mod:`offload_lab.engines`)
ENGINES = ("diffusers-group", "diffusers-model", "sglang-layerwise", "offload-lab")
