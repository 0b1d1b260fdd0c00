"""Multi-rank runs without processes: the simulated node, views across ranks, merging, import errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import offload_lab
from offload_lab.analysis.ranks import rank_table, split_ranks
from offload_lab.record.gather import GatherError, gather, merge_ranks, run_from_bytes, run_to_bytes
from offload_lab.record.kineto import TraceFormatError, TraceImportError
from offload_lab.record.run import display_label
from offload_lab.simulation.errors import SimError
from offload_lab.simulation.node import NodeProfile, node_bandwidths

TRACES = Path(__file__).parent / "data" / "traces"


@pytest.fixture(scope="module")
def wan():
    return offload_lab.catalog.load("wan2.1-t2v-14b")


def _node_step(plan, k: int) -> float:
    run = offload_lab.simulate(plan, "h200", steps=2, ranks_per_node=k)
    assert run.simulated and "simulated" in display_label(run)
    assert sorted(set(run.steps["rank"])) == list(range(k))
    return float(run.steps.groupby("rank")["wall_s"].median().max())


def test_h200_node_pageable_slows_pinned_does_not(wan):
    host = offload_lab.HostMemory(available="512GiB", shared_by=1)
    pinned = offload_lab.plan(wan, tier="pinned", host=host)
    pageable = offload_lab.plan(wan, tier="pageable", host=host)
    ks = (1, 2, 4, 8)
    pin = [_node_step(pinned, k) for k in ks]
    page = [_node_step(pageable, k) for k in ks]
    assert pin == [pin[0]] * len(ks)
    assert all(a <= b for a, b in zip(page, page[1:])) and page[-1] > page[0] * 1.2
    # the single-rank path is the plain simulation
    assert pin[0] == offload_lab.simulate(pinned, "h200", steps=2).step_time


def test_node_bandwidth_rule():
    dev = offload_lab.DeviceProfile("x", {"pinned": 50.0, "pageable": 10.0, "mapped_warm": 9.0})
    node = NodeProfile("n", host_memcpy_gbps=30.0, pinned_link_gbps=40.0)
    assert node_bandwidths(dev, node, 1) == {"pinned": 40.0, "pageable": 10.0, "mapped_warm": 9.0}
    assert node_bandwidths(dev, node, 6) == {"pinned": 40.0, "pageable": 5.0, "mapped_warm": 5.0}
    assert NodeProfile.from_dict(node.to_dict()) == node


@pytest.mark.parametrize("bad", [0, 65, 2.5, True])
def test_bad_ranks_per_node(wan, bad):
    plan = offload_lab.plan(wan, host="256GiB")
    with pytest.raises(SimError, match="ranks_per_node"):
        offload_lab.simulate(plan, "h200", steps=1, ranks_per_node=bad)


def test_report_shows_rank_lanes_and_straggler(wan, tmp_path):
    plan = offload_lab.plan(wan, tier="pageable", host=offload_lab.HostMemory(available="256GiB", shared_by=1))
    run = offload_lab.simulate(plan, "h200", steps=2, ranks_per_node=8)
    lanes = set(offload_lab.figures.timeline(run).data[0].y)
    assert {f"rank {k} · compute" for k in range(8)} <= lanes
    html = offload_lab.report([run]).save(tmp_path / "r.html").read_text()
    assert "SIMULATED" in html and 'id="ranks-0"' in html and "rank 0 · straggler" in html
    table = rank_table(run)
    assert table["straggler"].sum() == 1 and list(table["rank"]) == list(range(8))


def test_compare_gives_rank_rows_and_the_max(wan):
    plan = offload_lab.plan(wan, tier="pinned", host="256GiB")
    one = offload_lab.simulate(plan, "h200", steps=2)
    slow = offload_lab.simulate(plan.__class__.from_dict(plan.to_dict()), "h200", steps=2, passes=2)
    run = merge_ranks([one, slow], ranks=[0, 1])
    df = offload_lab.compare(run)
    assert [lbl.rsplit(" · ", 1)[-1] for lbl in df["label"]] == [
        f"{x} (simulated)" for x in ("rank 0", "rank 1", "max over ranks")]
    assert df["step_s"].iloc[2] == pytest.approx(max(one.step_time, slow.step_time))
    assert len(offload_lab.compare(run, ranks="max")) == 1
    assert rank_table(run).set_index("rank")["straggler"].to_dict() == {0: False, 1: True}


def test_merge_split_and_bytes_round_trip(wan, tmp_path):
    plan = offload_lab.plan(wan, host="256GiB")
    a = offload_lab.simulate(plan, "h200", steps=1)
    merged = merge_ranks([a, a], ranks=[1, 0], offsets_s=[0.5, 0.0])
    parts = split_ranks(merged)
    assert parts[0].events["start_s"].tolist() == a.events["start_s"].tolist()
    assert parts[1].events["start_s"].tolist() == pytest.approx((a.events["start_s"] + 0.5).tolist())
    assert run_from_bytes(run_to_bytes(merged)).equals(merged)
    assert offload_lab.Run.load(merged.save(tmp_path / "m")).equals(merged)
    with pytest.raises(GatherError, match="distinct"):
        merge_ranks([a, a], ranks=[0, 0])


def test_gather_outside_a_process_group(wan):
    run = offload_lab.simulate(offload_lab.plan(wan, host="256GiB"), "h200", steps=1)
    assert gather(run) is run
    with pytest.raises(GatherError, match="this process failed"):
        gather(None, failed=RuntimeError("x"))


def test_trace_directory_errors(tmp_path):
    with pytest.raises(TraceImportError, match="holds no trace files"):
        offload_lab.from_torch_profiler(tmp_path)
    src = next(TRACES.glob("*.json"))
    shutil.copy(src, tmp_path / "a.json")
    with pytest.raises(TraceFormatError, match="distributedInfo"):
        offload_lab.from_torch_profiler(tmp_path)


def test_a_ranks_own_run_carries_its_rank():
    import pandas as pd

    events = [{"step": 0, "group": "blocks", "layer": 0, "kind": "compute", "stream": "compute",
               "tier": "pinned", "bytes": 0, "start_s": 0.0, "end_s": 1.0}]
    layers = pd.DataFrame({"group": ["blocks"], "layer": [0], "tier": ["pinned"], "bytes": [8],
                           "mapped_bytes": [0], "streamed": [True], "pin_rank": [1]})
    run = offload_lab.Run.build(events, [{"step": 0, "start_s": 0.0, "end_s": 1.0}], layers,
                                [{"t_s": 0.5, "device_bytes": 1, "pinned_bytes": 8, "anon_bytes": 0,
                                  "mapped_bytes": 0}], {"rank": 3, "backend": "cpu"})
    assert {n: set(getattr(run, n)["rank"]) for n in ("events", "layers", "steps", "memory")} == \
        {n: {3} for n in ("events", "layers", "steps", "memory")}


def test_cli_simulate_a_node(tmp_path, capsys):
    from offload_lab.cli.app import main

    out = tmp_path / "node.zip"
    assert main(["simulate", "wan2.1-t2v-14b", "--device", "h200", "--tier", "pinned", "--host", "1TiB",
                 "--ranks-per-node", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "4 ranks copying at once" in text and "SIMULATED" in text
    run = offload_lab.Run.load(out)
    assert run.meta["ranks_per_node"] == 4 and sorted(set(run.steps["rank"])) == [0, 1, 2, 3]
    node = offload_lab.HostMemory(available="1TiB", shared_by=1)
    assert run.meta["plan"]["ledger"]["spendable"] == node.spendable // 4
