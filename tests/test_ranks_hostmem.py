"""A node's host budget shared by its ranks: each rank plans against its share."""

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
    big = HostMemory(available="64GiB", shared_by=[3, 1], local_rank=0)
    small = HostMemory(available="64GiB", shared_by=[3, 1], local_rank=1)
    assert big.spendable == 3 * small.spendable + (big.spendable - 3 * small.spendable)
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
