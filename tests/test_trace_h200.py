"""A real CUDA torch.profiler trace of offload-lab's own manager on an H200, read back.

``scripts/gpu_check.py --stage extras`` recorded it: 6 full-width Wan2.1-1.3B blocks, each
bracketed by ``record_function("blocks.<i>")``, 3 layers pinned and 3 pageable, 2 profiled
steps after one unprofiled warm-up; the manager's own Run saw 6 pinned and 6 pageable copies.
The manager labels each copy ``offload_lab.copy blocks.<j>``, so a copy issued one layer ahead
(prefetch) is credited to the layer it carries, not to the one whose hook issued it.
"""

from __future__ import annotations

from pathlib import Path

import offload_lab

TRACE = Path(__file__).parent / "data/traces/h200_offload_trace.json.gz"
BLOCK = 92_881_408  # one Wan2.1-1.3B block, bf16 (reference table)


def test_real_h200_trace_matches_the_managers_own_copies():
    run = offload_lab.from_torch_profiler(TRACE, label="h200 trace")
    assert run.backend == "trace" and not run.simulated
    assert "H200" in str(run.meta.get("device_name"))
    copies = run.events[run.events["kind"] == "copy"]
    by_tier = copies.groupby("tier")["bytes"].agg(["count", "sum"])
    # layer 0's first pinned copy was issued in the unprofiled warm-up step (prefetch wraps)
    assert by_tier.loc["pinned", "count"] == 5 and by_tier.loc["pageable", "count"] == 6
    assert by_tier.loc["pinned", "sum"] == 5 * BLOCK and by_tier.loc["pageable", "sum"] == 6 * BLOCK
    assert len(run.steps) == 2
    assert run.steps["bytes_moved"].tolist() == [5 * BLOCK, 6 * BLOCK]
    tiers = run.layers.set_index("layer")["tier"]
    assert sorted(tiers[tiers == "pinned"].index) == [0, 1, 2]
    assert sorted(tiers[tiers == "pageable"].index) == [3, 4, 5]
    assert run.meta["skipped"]["copies_without_a_later_use"]["copy"] == 1  # the last wrap-around
    # pinned copies overlap compute on the copy stream; pageable ones block the host
    assert (run.events["kind"] == "host_block").any()
    compute = run.events[(run.events["kind"] == "compute") & (run.events["layer"] >= 0)]
    assert set(compute["layer"]) == set(range(6))
