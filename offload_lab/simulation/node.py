"""Several ranks on one node: what copying at once costs each of them (an estimate).

Every rank of a node streams its own weights to its own GPU. Two resources decide how they
interact:

* **pinned** copies are DMA transfers over each GPU's own host link: each rank is limited by
  its link (``pinned_link_gbps``, default the device profile's ``pinned`` rate), not by the
  other ranks;
* **pageable** and **mapped** copies are staged by the host: a CPU ``memcpy`` into a driver
  buffer before the DMA. Those memcpys of all the ranks share the node's memory bus, whose
  throughput for them is ``host_memcpy_gbps``; with ``k`` ranks copying at once each gets at
  most ``host_memcpy_gbps / k``.

:func:`simulate_node` simulates one rank on a profile derated that way and returns the node as
a multi-rank run (every rank the same: ranks of a sequence-parallel DiT run the same layer at
the same time, so they copy at once — the worst case, taken here). The derating is an
estimate, not a measurement: the ranks are assumed to overlap their copies completely, the
memory bus to split evenly, and pinned DMA never to be limited by host memory bandwidth.
:meth:`NodeProfile.estimate` is a starting point when the node's memcpy ceiling has not been
measured; its rule is written in its ``provenance``.

>>> import offload_lab
>>> spec = offload_lab.catalog.load("wan2.1-t2v-14b")
>>> plan = offload_lab.plan(spec, tier="pageable", host=offload_lab.HostMemory(available="256GiB"))
>>> run = offload_lab.simulate(plan, "h200", steps=2, ranks_per_node=8)
>>> run.meta["ranks_per_node"], sorted(set(run.steps["rank"])) == list(range(8))
(8, True)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from offload_lab.checks import check_int, check_number
from offload_lab.simulation.errors import ProfileError, SimError
from offload_lab.simulation.profile import DeviceProfile

__all__ = ["NodeProfile", "simulate_node", "node_bandwidths", "STAGED_TIERS", "ESTIMATE_FACTOR", "MAX_RANKS"]

#: the bandwidth keys a host memcpy stages (they share the node's memory bus)
STAGED_TIERS = ("pageable", "mapped_warm", "mapped_cold")
#: :meth:`NodeProfile.estimate`'s rule: the node's staging memcpys are taken to saturate at this
#: many single ranks' pageable rate (an assumption until measured)
ESTIMATE_FACTOR = 4.0
MAX_RANKS = 64


def _gbps(name: str, value: Any, none_ok: bool = False) -> float | None:
    return check_number(name, value, above=0, optional=none_ok, error=ProfileError,
                        accepted="a finite number of GB/s > 0" + (" or None" if none_ok else ""))


@dataclass
class NodeProfile:
    """What the ranks of one node share: the host memory bus that stages pageable and mapped
    copies (``host_memcpy_gbps``, GB/s for all ranks together) and each GPU's own pinned link
    (``pinned_link_gbps``; ``None``: the device profile's ``pinned`` rate).

    >>> NodeProfile("toy", host_memcpy_gbps=20.0).per_rank_staging_gbps(4)
    5.0
    """

    name: str
    host_memcpy_gbps: float
    pinned_link_gbps: float | None = None
    provenance: dict[str, Any] = field(default_factory=lambda: {"kind": "estimated", "sources": []})

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProfileError(f"node profile name {self.name!r} is not a non-empty string")
        self.host_memcpy_gbps = _gbps("host_memcpy_gbps", self.host_memcpy_gbps)
        self.pinned_link_gbps = _gbps("pinned_link_gbps", self.pinned_link_gbps, none_ok=True)

    def per_rank_staging_gbps(self, ranks: int) -> float:
        """Each rank's share of the staging memcpy throughput when ``ranks`` copy at once."""
        return self.host_memcpy_gbps / _check_ranks(ranks)

    @classmethod
    def estimate(cls, device: DeviceProfile) -> NodeProfile:
        """A node for ``device`` when nothing is measured: staging saturates at
        :data:`ESTIMATE_FACTOR` × one rank's pageable rate; pinned links as the device's.

        >>> NodeProfile.estimate(DeviceProfile("x", {"pinned": 50, "pageable": 10})).host_memcpy_gbps
        40.0
        """
        single = device.bandwidths.get("pageable") or max(device.bandwidths.values())
        return cls(f"{device.name} node (estimated)", host_memcpy_gbps=ESTIMATE_FACTOR * single,
                   provenance={"kind": "estimated", "sources": [
                       f"assumed: the node's staging memcpys saturate at {ESTIMATE_FACTOR:g} × one rank's "
                       f"pageable rate ({single:g} GB/s); pinned links as the device profile's"]})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeProfile:
        known = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, dict) or set(d) - known or "host_memcpy_gbps" not in d:
            raise ProfileError(f"node profile {str(d)[:80]} is not a dict with host_memcpy_gbps; "
                               f"accepted keys: {sorted(known)}")
        return cls(**d)


def _check_ranks(ranks: Any) -> int:
    return check_int("ranks_per_node", ranks, minimum=1, maximum=MAX_RANKS, error=SimError)


def node_bandwidths(device: DeviceProfile, node: NodeProfile, ranks: int) -> dict[str, float]:
    """Each rank's bandwidth per tier when ``ranks`` of them copy at once.

    >>> dev = DeviceProfile("x", {"pinned": 50, "pageable": 10})
    >>> node_bandwidths(dev, NodeProfile("n", 20.0), 4)
    {'pinned': 50.0, 'pageable': 5.0}
    """
    share = node.per_rank_staging_gbps(ranks)
    out = {}
    for tier, gbps in device.bandwidths.items():
        if tier in STAGED_TIERS:
            out[tier] = min(gbps, share)
        elif tier == "pinned" and node.pinned_link_gbps is not None:
            out[tier] = min(gbps, node.pinned_link_gbps)
        else:
            out[tier] = gbps
    return out


def simulate_node(plan: Any, device: DeviceProfile | str, ranks_per_node: int, node: NodeProfile | dict | None = None,
                  **kwargs: Any) -> Any:
    """``ranks_per_node`` ranks of one node running ``plan`` at once, as one multi-rank simulated run.

    ``kwargs`` are :func:`~offload_lab.simulate`'s (``steps``, ``tokens``, ``passes``, ...).
    """
    from offload_lab.record.gather import merge_ranks
    from offload_lab.simulation.engine import simulate

    ranks = _check_ranks(ranks_per_node)
    if isinstance(device, str):
        device = DeviceProfile.load(device)
    if not isinstance(device, DeviceProfile):
        raise SimError(f"device {device!r:.80} is not a DeviceProfile or a shipped profile name")
    if isinstance(node, dict):
        node = NodeProfile.from_dict(node)
    node = NodeProfile.estimate(device) if node is None else node
    if not isinstance(node, NodeProfile):
        raise SimError(f"node {node!r:.80} is not a NodeProfile; accepted: a NodeProfile, its to_dict() or None")
    derated = device.replace(bandwidths=node_bandwidths(device, node, ranks))
    label = kwargs.pop("label", None)
    one = simulate(plan, derated, **kwargs)
    one.meta.update(rank=0, local_rank=0, world_size=ranks, node=f"{node.name} (simulated)")
    runs = []
    for k in range(ranks):  # the ranks of a symmetric node: one prediction, k lanes
        r = type(one)(one.events, one.layers, one.steps, one.memory, {**one.meta, "rank": k, "local_rank": k})
        runs.append(r)
    auto = f"{device.name} · {ranks} ranks/node · {one.label.removeprefix(device.name + ' · ')}"
    out = merge_ranks(runs, label=label or auto)
    single = dict(one.meta.get("evidence") or {})
    out.meta.update(
        # no node of several ranks has been measured: the node model is an estimate on top
        evidence={**single, "status": "derived", "band": None,
                  "basis": f"{ranks} ranks on one node are an estimate on top of the profile "
                           f"(one rank: {single.get('basis', 'no evidence')})"},
        ranks_per_node=ranks, node_profile=node.to_dict(), simulated=True,
        rank_bandwidths=node_bandwidths(device, node, ranks),
        estimates=["ranks copy at the same time (complete overlap)", "the staging memcpy bandwidth splits "
                   "evenly between ranks", "pinned DMA is limited by each GPU's own link only"]
        + ([] if node.provenance.get("kind") == "measured" else ["host_memcpy_gbps: "
           + "; ".join(map(str, node.provenance.get("sources") or ["not measured"]))]),
    )
    return out
