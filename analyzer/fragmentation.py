"""Room for new GPU requests, and how fragmented the free GPUs are (FGD, Weng et al., ATC '23).

A count of free GPUs hides where they are: eight free GPUs on eight nodes take no 8-GPU job.
`placeable` says how many whole-GPU, 2-, 4- and 8-GPU requests the free GPUs hold (each request
on one node; where the node's topology is known, on GPUs as local as that node offers such a
request when it is empty: one NVLink domain, else one PCIe switch, else one NUMA node).

`fragmentation` is FGD's measure: for a request of k GPUs, a node's free GPUs are fragmented
when fewer than k are free (the request cannot use them); weighted by the typical task mix (the
share of jobs of each size), the sum is the GPU capacity that mix cannot use. GPUs the plan
uses count as full: the packer already put beside their jobs what fits there. The layout uses
its increase as the tie-breaker between equally good GPUs (`cost_of_taking`): taking a GPU from
an already fragmented node costs nothing, breaking into an empty 8-GPU node costs an 8-GPU slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpulens.analyzer.topology import Topology, best_set

REQUEST_SIZES = (1, 2, 4, 8)


def size_of(gpus: int) -> int:
    """The request size a job of `gpus` GPUs counts as (fractional and 1-GPU jobs: 1; beyond 8: 8)."""
    return next((k for k in REQUEST_SIZES if gpus <= k), REQUEST_SIZES[-1])


def task_mix(gpu_counts: Iterable[int]) -> dict[int, float]:
    """The share of jobs per request size (FGD's typical task mix); all 1-GPU when there are none."""
    counts = dict.fromkeys(REQUEST_SIZES, 0)
    for gpus in gpu_counts:
        counts[size_of(max(1, int(gpus)))] += 1
    total = sum(counts.values())
    return {k: n / total for k, n in counts.items()} if total else {1: 1.0}


def fragmentation(free: int, mix: Mapping[int, float]) -> float:
    """Free GPUs of one node that the task mix cannot use, expected over the mix (FGD's F_n(M))."""
    return sum(share * free for k, share in mix.items() if free < k)


def cost_of_taking(free: int, mix: Mapping[int, float]) -> float:
    """How much taking one of a node's `free` GPUs raises its fragmentation (FGD's gradient)."""
    return fragmentation(free - 1, mix) - fragmentation(free, mix)


def placeable(free: Mapping[str, Sequence[str]], topology: Topology | None = None) -> dict[int, int]:
    """k -> how many k-GPU requests the free GPUs (node -> uuids) hold at once, k of one node each;
    on a node whose topology is known, only sets as local as the node's best k-set."""
    out = {}
    for k in REQUEST_SIZES:
        out[k] = sum(_sets_of(node, uuids, k, topology) for node, uuids in free.items())
    return out


def _sets_of(node: str, uuids: Sequence[str], k: int, topology: Topology | None) -> int:
    topo = topology.of(list(uuids)) if topology is not None and uuids else None
    if topo is None or k == 1:
        return len(uuids) // k
    best = best_set(topo, list(topo.index), k)
    if best is None:
        return 0
    wanted = topo.worst(best)[0]  # the locality a k-GPU job gets on this node when it is empty
    left, n = list(uuids), 0
    while (chosen := best_set(topo, left, k)) is not None and topo.worst(chosen)[0] <= wanted:
        n += 1
        left = [u for u in left if u not in chosen]
    return n


def free_per_node(gpus: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(node, uuid) pairs grouped by node, uuids sorted (a stable input for `placeable`)."""
    out: dict[str, list[str]] = {}
    for node, uuid in gpus:
        out.setdefault(node, []).append(uuid)
    return {node: sorted(uuids) for node, uuids in sorted(out.items())}
