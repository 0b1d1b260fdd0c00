"""A node's host budget shared by its ranks: each rank plans against its share."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import offload_lab
from offload_lab import HostMemory
from offload_lab.planning.hostmem import HostMemoryError


def test_even_split_sums_to_node(monkeypatch):
    node = HostMemory(available="64GiB", shared_by=1)
    shares = [HostMemory(available="64GiB", shared_by=3, local_rank=r) for r in range(3)]
    assert sum(h.spendable for h in shares) <= node.spendable
    assert node.spendable - sum(h.spendable for h in shares) < 3
    assert {h.node_spendable for h in shares} == {node.spendable}


def test_weighted_split_and_round_trip():
    node = HostMemory(available="64GiB", shared_by=1)
    big = HostMemory(available="64GiB", shared_by=[3, 1], local_rank=0)
    small = HostMemory(available="64GiB", shared_by=[3, 1], local_rank=1)
    # the two shares fill the node, and no more: 3/4 and 1/4 of it, to the byte
    assert big.spendable + small.spendable <= node.spendable
    assert node.spendable - (big.spendable + small.spendable) < 2
    assert big.spendable == node.spendable * 3 // 4 and small.spendable == node.spendable // 4
    assert abs(big.spendable / small.spendable - 3) < 1e-6
    assert HostMemory.from_dict(small.to_dict()) == small


def test_torchrun_environment_is_the_default(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    host = HostMemory(available="64GiB")
    assert (host.ranks, host.local_rank) == (4, 2)
    spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    p = offload_lab.plan(spec, host="64GiB")
    assert p.ledger["ranks"] == 4 and p.ledger["spendable"] == host.spendable
    assert p.ledger["pinned_bytes"] <= host.spendable
    # a saved snapshot does not re-read the environment of the process loading it
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert HostMemory.from_dict(host.to_dict()).ranks == 4


def test_plan_pipeline_plans_against_the_share():
    spec = offload_lab.catalog.load("wan2.1-t2v-14b")
    comps = [offload_lab.Component("dit", spec, uses=50)]
    whole = offload_lab.plan_pipeline(comps, host=HostMemory(available="64GiB", shared_by=1))
    half = offload_lab.plan_pipeline(comps, host=HostMemory(available="64GiB", shared_by=2, local_rank=1))
    assert half.ledger["spendable"] == whole.ledger["spendable"] // 2
    assert half.ledger["pinned_bytes"] <= half.ledger["spendable"]


@pytest.mark.parametrize("bad", [0, -1, [], [1, 0], "two", True, [1, float("nan")]])
def test_bad_shared_by(bad):
    with pytest.raises(HostMemoryError, match="shared_by"):
        HostMemory(available="64GiB", shared_by=bad)


def test_bad_local_rank():
    with pytest.raises(HostMemoryError, match="local_rank = 4"):
        HostMemory(available="64GiB", shared_by=4, local_rank=4)


def test_a_launcher_naming_only_the_job_shares_the_node(monkeypatch):
    for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    host = HostMemory(available="64GiB")  # an explicit size is shared all the same
    node = HostMemory(available="64GiB", shared_by=1)  # the opt-out: this process alone
    assert (host.ranks, host.local_rank, host.split_from) == (2, 1, "WORLD_SIZE")
    assert node.ranks == 1 and host.spendable == node.spendable // 2
    p = offload_lab.plan(offload_lab.catalog.load("wan2.1-t2v-1.3b"), host=host)
    assert p.ledger["split"] == host.split_note()
    assert "split evenly between 2 ranks (WORLD_SIZE): rank 1 gets" in p.ledger["split"]


RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import offload_lab
    spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    host = offload_lab.HostMemory(available=int(sys.argv[2]))
    p = offload_lab.plan(spec, host=host, tier="pinned")
    with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump({"pinned": p.ledger["pinned_bytes"], "split": p.ledger.get("split"),
                   "ranks": host.ranks}, f)
""")


def test_torchrun_ranks_pins_together_fit_the_node(tmp_path):
    spec = offload_lab.catalog.load("wan2.1-t2v-1.3b")
    alone = HostMemory(available="1TiB", shared_by=1)
    whole = offload_lab.plan(spec, host=alone, tier="pinned").ledger["pinned_bytes"]
    # the node can spend 1.5 plans' pins: each rank alone would pin its whole plan
    node_available = next(a for a in range(int(1.5 * whole), 4 * whole, 2**20)
                          if HostMemory(available=a, shared_by=1).spendable >= 1.5 * whole)
    node = HostMemory(available=node_available, shared_by=1).spendable
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(script), str(tmp_path), str(node_available)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["ranks"] == 2 and "between 2 ranks (LOCAL_WORLD_SIZE)" in r["split"] for r in res)
    assert sum(r["pinned"] for r in res) <= node < 2 * whole
    assert all(0 < r["pinned"] < whole for r in res)
