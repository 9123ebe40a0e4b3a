"""The GPU topology of each node as the exporter publishes it (`gpu_topology_info`), typed.

One series per ordered GPU pair says the fastest path between them (`link`): NVLink, else the
PCIe common ancestor. What matters to a multi-GPU job's all-reduce is its worst pair, and the
links fall into four tiers whose bandwidths differ by steps the reference measures (NVLink
~460 GB/s, PCIe peer-to-peer ~35 GB/s, through a CPU less again). A history or Prometheus
without the family (an older exporter) gives an empty `Topology`: no finding, no constraint.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

INFO = "gpu_topology_info"
LABELS = ("instance", "gpu", "uuid", "peer", "peer_uuid", "link")
# the history columns the file path reads from the family
FAMILY_COLUMNS: dict[str, list[str]] = {INFO: list(LABELS)}
# sets of GPUs searched exhaustively up to this many candidates (C(16, 8) = 12,870), greedily beyond
EXHAUSTIVE = 20_000


class Link(StrEnum):
    """The exporter's `link` label values, fastest first (NVML topology levels)."""

    NVLINK = "nvlink"
    BOARD = "board"
    PCIE_SWITCH = "pcie_switch"
    PCIE_SWITCHES = "pcie_switches"
    PCIE_HOST_BRIDGE = "pcie_host_bridge"
    NUMA = "numa"
    SYSTEM = "system"


class Tier(IntEnum):
    """What a link costs an all-reduce: the steps the reference gives bandwidth figures for."""

    NVLINK = 0
    PCIE = 1  # peer-to-peer under PCIe switches, never through a CPU
    HOST = 2  # through a CPU's host bridge (one NUMA node)
    SYSTEM = 3  # across NUMA nodes: the CPUs' interconnect
    UNKNOWN = 4  # a pair the data does not describe


TIER_OF = {
    Link.NVLINK: Tier.NVLINK,
    Link.BOARD: Tier.PCIE,
    Link.PCIE_SWITCH: Tier.PCIE,
    Link.PCIE_SWITCHES: Tier.PCIE,
    Link.PCIE_HOST_BRIDGE: Tier.HOST,
    Link.NUMA: Tier.HOST,
    Link.SYSTEM: Tier.SYSTEM,
}

ORDER = {link: n for n, link in enumerate(Link)}

WORDS = {
    Tier.NVLINK: "NVLink",
    Tier.PCIE: "PCIe switches (no NVLink)",
    Tier.HOST: "a CPU's PCIe host bridge",
    Tier.SYSTEM: "the CPUs' interconnect (across NUMA nodes)",
    Tier.UNKNOWN: "links the data does not describe",
}

LOCAL = {
    Tier.NVLINK: "in one NVLink domain",
    Tier.PCIE: "under one PCIe switch",
    Tier.HOST: "on one NUMA node",
    Tier.SYSTEM: "on the node",
    Tier.UNKNOWN: "on the node",
}


@dataclass(frozen=True)
class NodeTopology:
    """One node's GPUs (uuid -> index) and the link of each pair (both orders)."""

    node: str
    index: Mapping[str, int]
    links: Mapping[tuple[str, str], Link] = field(repr=False)

    def tier(self, a: str, b: str) -> Tier:
        link = self.links.get((a, b)) or self.links.get((b, a))
        return Tier.UNKNOWN if link is None else TIER_OF[link]

    def worst(self, uuids: Sequence[str]) -> tuple[Tier, Link | None]:
        """The slowest pair of a set of GPUs (its all-reduce goes at that pair's pace)."""
        tier, link = Tier.NVLINK, Link.NVLINK
        for a, b in itertools.combinations(uuids, 2):
            found = self.links.get((a, b)) or self.links.get((b, a))
            if found is None:
                return Tier.UNKNOWN, None
            if (TIER_OF[found], ORDER[found]) > (tier, ORDER[link]):
                tier, link = TIER_OF[found], found
        return tier, link

    def names(self, uuids: Iterable[str]) -> str:
        """GPU indexes as people read them: "4-7", "0, 2, 5"."""
        return spans(sorted(self.index[u] for u in uuids if u in self.index))


@dataclass(frozen=True)
class Topology:
    """Every node's topology, found by any of its GPUs' uuids (uuids are unique in a fleet)."""

    nodes: tuple[NodeTopology, ...] = ()
    by_uuid: Mapping[str, NodeTopology] = field(default_factory=dict, repr=False)

    def of(self, uuids: Sequence[str]) -> NodeTopology | None:
        """The node all of `uuids` are on, or None (unknown GPUs, or several nodes)."""
        found = {id(self.by_uuid[u]) for u in uuids if u in self.by_uuid}
        if len(found) != 1 or any(u not in self.by_uuid for u in uuids):
            return None
        return self.by_uuid[uuids[0]]


def from_rows(rows: Iterable[Mapping[str, object]]) -> Topology:
    """A `Topology` from `gpu_topology_info` label sets; rows with an unknown link value or no
    uuid are skipped (a newer exporter's level is no reason to fail the run)."""
    index: dict[str, dict[str, int]] = {}
    links: dict[str, dict[tuple[str, str], Link]] = {}
    values = {link.value for link in Link}
    for row in rows:
        node, uuid = str(row.get("instance", "")), str(row.get("uuid", ""))
        peer = str(row.get("peer_uuid", ""))
        link = str(row.get("link", ""))
        if not uuid or not peer or uuid == peer or link not in values:
            continue
        gpus = index.setdefault(node, {})
        for u, i in ((uuid, row.get("gpu")), (peer, row.get("peer"))):
            if u not in gpus:
                gpus[u] = _index(i, len(gpus))
        links.setdefault(node, {})[(uuid, peer)] = Link(link)
    nodes = tuple(NodeTopology(node, index[node], links[node]) for node in sorted(index))
    return Topology(nodes, {u: n for n in nodes for u in n.index})


def _index(value: object, default: int) -> int:
    text = str(value or "")
    return int(text) if text.isdigit() else default


def spans(indexes: Sequence[int]) -> str:
    """Sorted integers as runs: [4, 5, 6, 7] -> "4-7", [0, 2, 3] -> "0, 2-3"."""
    out: list[str] = []
    for _, run in itertools.groupby(enumerate(indexes), key=lambda p: p[1] - p[0]):
        members = [v for _, v in run]
        out.append(f"{members[0]}-{members[-1]}" if len(members) > 1 else str(members[0]))
    return ", ".join(out)


def best_set(
    topo: NodeTopology,
    candidates: Sequence[str],
    n: int,
    cost: Callable[[tuple[str, ...]], tuple[object, ...]] = lambda s: (),
    feasible: Callable[[tuple[str, ...]], bool] = lambda s: True,
) -> tuple[str, ...] | None:
    """The `n` GPUs among `candidates` with the best worst link, then the lowest `cost`, then the
    lowest indexes, a `feasible` set before any other; None when there are fewer than `n`.
    Exhaustive up to `EXHAUSTIVE` sets (every node of up to 16 GPUs), beyond that greedy from
    each seed (exact when each tier's links form groups, as PCIe trees and NVSwitch domains do)."""
    pool = sorted(set(candidates), key=lambda u: (topo.index.get(u, math.inf), u))
    if n <= 0 or len(pool) < n:
        return None

    def score(chosen: tuple[str, ...]) -> tuple[bool, float, tuple[object, ...], list[int]]:
        return (
            not feasible(chosen),
            topo.worst(chosen)[0],
            cost(chosen),
            sorted(topo.index.get(u, 0) for u in chosen),
        )

    if math.comb(len(pool), n) <= EXHAUSTIVE:
        return min(itertools.combinations(pool, n), key=score)
    sets = []
    for seed in pool:
        chosen = [seed]
        for u in sorted(pool, key=lambda u: topo.tier(seed, u)):
            if u != seed and len(chosen) < n:
                chosen.append(u)
        sets.append(tuple(chosen))
    return min(sets, key=score)
