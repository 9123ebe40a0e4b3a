"""GPU topology: how each pair of GPUs is connected, and each GPU's NUMA node.

Read once per driver start (and again after a GPU reset): the topology does not change while the
driver runs, so the backend keeps its first complete answer and every sample repeats it.
`gpu_topology_info` has one series per ordered GPU pair: n(n-1), 56 on an 8-GPU node and 64 x 63 =
4,032 on the simulator's 64-GPU limit of one node, bounded by the node's GPU count like every per-GPU family.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    CollectorOptions,
    CollectorSpec,
    add_optional,
    gauge,
    gpu_labels,
    non_empty,
    readable,
)
from gpulens.exporter.snapshot import Area, NodeSnapshot

TOPOLOGY_LABELS = [*GPU_LABELS, "peer", "peer_uuid", "link"]


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    info = gauge(
        "gpu_topology_info",
        "How the GPU reaches a peer GPU, fastest path first: nvlink (NVML P2P status over NVLink), else"
        " the PCIe common ancestor (NVML topology level): board, pcie_switch, pcie_switches,"
        " pcie_host_bridge, numa, system; always 1.",
        TOPOLOGY_LABELS,
    )
    numa = gauge(
        "gpu_numa_node",
        "NUMA node the GPU is attached to (NVML NUMA node id); absent where the driver does not say.",
        GPU_LABELS,
    )
    for gpu in readable(snapshot, Area.TOPOLOGY):
        labels = gpu_labels(gpu)
        add_optional(numa, labels, gpu.numa_node)
        for peer in gpu.peers:
            info.add_metric([*labels, str(peer.peer), peer.peer_uuid, peer.link.value], 1.0)
    yield from non_empty(info, numa)


SPEC = CollectorSpec(
    Area.TOPOLOGY, True, "GPU pair links (NVLink, PCIe common ancestor) and NUMA node", collect
)
