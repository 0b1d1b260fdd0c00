"""Multi-rank profiles on real processes: gloo process groups of 2 and 4 ranks on the CPU.

Each test starts its ranks as fresh processes and joins them with a timeout, so a hang fails
the test instead of blocking the run; every process is checked to be gone at the end.
"""

from __future__ import annotations

import json
import multiprocessing
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import ranks_worker  # noqa: E402

import offload_lab  # noqa: E402
from offload_lab.planning.hostmem import RESERVE_FLOOR  # noqa: E402

JOIN_S = 180


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(target, world: int, *args) -> None:
    ctx = multiprocessing.get_context("spawn")
    port = _port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(JOIN_S)
        alive = [p.pid for p in procs if p.is_alive()]
        assert not alive, f"ranks still running after {JOIN_S} s: pids {alive}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)


def _results(tmp: Path, world: int) -> list[dict]:
    out = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]
    for r in out:
        assert "crash" not in r, r["crash"]
    return out


@pytest.fixture(scope="module")
def layer_bytes():
    from offload_lab import catalog, synthetic

    model = synthetic.build(catalog.load("wan2.1-t2v-1.3b"), scale=0.05, layers=4, seed=0)
    plan = offload_lab.plan(offload_lab.spec_of(model), host="64GiB")
    assert plan.layers["bytes"].nunique() == 1  # every block is the same size
    return int(plan.layers["bytes"].iloc[0])


def test_four_ranks_share_one_node(tmp_path, layer_bytes):
    world = 4
    # the node can spend 6 layers' worth: planned alone, each rank would pin all 4 of its layers
    node = RESERVE_FLOOR + 6 * layer_bytes + 4096
    _launch(ranks_worker.worker, world, str(tmp_path), node, -1)
    res = _results(tmp_path, world)
    spendable = offload_lab.HostMemory(available=node, shared_by=1).spendable
    assert {r["node_spendable"] for r in res} == {spendable}
    assert all(r["host_ranks"] == world for r in res)
    pinned = [r["ledger"]["pinned_bytes"] for r in res]
    assert sum(pinned) <= spendable and all(p > 0 for p in pinned)
    assert all(r["identical"] == [True] * 3 and r["restored"] and "error" not in r for r in res)
    assert [r["gathered"] for r in res] == [True, False, False, False]
    run = offload_lab.Run.load(tmp_path / "gathered")
    for name in ("events", "layers", "steps", "memory"):
        assert sorted(set(getattr(run, name)["rank"])) == list(range(world)), name
    assert run.meta["world_size"] == world
    assert [m["rank"] for m in run.meta["ranks"]] == list(range(world))
    assert sum(m["ledger"]["pinned_bytes"] for m in run.meta["ranks"]) == sum(pinned)
    per_rank = run.events[run.events["kind"] == "copy"].groupby("rank")["bytes"].sum()
    # every rank moved all four layers in each of its two measured steps
    assert per_rank.to_dict() == {r: 2 * 4 * layer_bytes for r in range(world)}


def test_one_rank_raises_the_others_say_so(tmp_path, layer_bytes):
    world = 2
    node = RESERVE_FLOOR + 6 * layer_bytes
    _launch(ranks_worker.worker, world, str(tmp_path), node, 1)
    ok, failed = _results(tmp_path, world)
    assert failed["error"] == "RuntimeError: boom on rank 1"
    assert "GatherError" in ok["error"] and "rank 1 failed (RuntimeError: boom on rank 1)" in ok["error"]
    assert ok["restored"] and failed["restored"]
    assert ok["identical"] == [True] * 3 and failed["identical"] == [True]
    assert not ok["gathered"] and not (tmp_path / "gathered.zip").exists()


def test_per_rank_traces_import_as_one_run(tmp_path):
    world = 2
    _launch(ranks_worker.trace_worker, world, str(tmp_path))
    _results(tmp_path, world)
    traces = tmp_path / "traces"
    traces.mkdir()
    for r in range(world):
        (tmp_path / f"rank{r}.trace.json").rename(traces / f"rank{r}.trace.json")
    run = offload_lab.from_torch_profiler(traces)
    assert sorted(set(run.events["rank"])) == [0, 1]
    assert [m["rank"] for m in run.meta["ranks"]] == [0, 1]
    single = offload_lab.from_torch_profiler(traces / "rank1.trace.json")
    assert len(run.events[run.events["rank"] == 1]) == len(single.events)


def test_cli_profile_under_torchrun(tmp_path):
    import os
    import subprocess

    out, rep = tmp_path / "ranks.zip", tmp_path / "ranks.html"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "offload_lab", "profile", "wan2.1-t2v-1.3b", "--scale", "0.02", "--layers", "2",
           "--tokens", "16", "-n", "2", "--warmup", "0", "--backend", "cpu", "--host", "64GiB",
           "--out", str(out), "--report", str(rep)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=JOIN_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("saved ") == 1  # rank 0 speaks and writes; rank 1 only profiles
    assert done.stderr.count("] 100%") == 1, done.stderr[-2000:]  # one progress bar: rank 0's
    run = offload_lab.Run.load(out)
    assert sorted(set(run.events["rank"])) == [0, 1] and run.meta["world_size"] == 2
    node = offload_lab.HostMemory(available="64GiB", shared_by=1).spendable
    assert sum(m["ledger"]["spendable"] for m in run.meta["ranks"]) <= node
    assert 'id="ranks-0"' in rep.read_text()
