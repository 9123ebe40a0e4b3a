"""GPU topology: how each pair of GPUs is connected, and each GPU's NUMA node.

Read once per driver start (and again after a GPU reset): the topology does not change while the
driver runs, so the backend keeps its first complete answer and every sample repeats it.
`gpu_topology_info` has one series per ordered GPU pair: n(n-1), 56 on an 8-GPU node and 64 x 63 =
4,032 on the simulator's 64-GPU limit of one node, bounded by the node's GPU count like every per-GPU
family. Its rows are peers, so it is filled here rather than by an accessor.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    TOPOLOGY,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    Unit,
    add_values,
    fresh,
    non_empty,
    per_gpu_record,
    readers,
)
from gpulens.exporter.snapshot import NodeSnapshot, TopologyReading

TOPOLOGY_LABELS = [*GPU_LABELS, "peer", "peer_uuid", "link"]

INFO = FamilySpec[TopologyReading](
    "gpu_topology_info",
    Kind.GAUGE,
    "How the GPU reaches a peer GPU, fastest path first: nvlink (NVML P2P status over NVLink), else"
    " the PCIe common ancestor (NVML topology level): board, pcie_switch, pcie_switches,"
    " pcie_host_bridge, numa, system; always 1.",
    "`GetP2PStatus(NVML_P2P_CAPS_INDEX_NVLINK)` = OK, else `GetTopologyCommonAncestor`",
    labels=tuple(TOPOLOGY_LABELS),
    unit=Unit.ALWAYS_ONE,
    label_doc="peer (index), peer_uuid, link: `nvlink`, else the PCIe common ancestor `board` (INTERNAL),"
    " `pcie_switch` (SINGLE, nvidia-smi PIX), `pcie_switches` (MULTIPLE, PXB), `pcie_host_bridge`"
    " (HOSTBRIDGE, PHB), `numa` (NODE), `system` (SYSTEM, SYS)",
)

FAMILIES: tuple[FamilySpec[TopologyReading], ...] = (
    INFO,
    FamilySpec("gpu_numa_node", Kind.GAUGE,
               "NUMA node the GPU is attached to (NVML NUMA node id); absent where the driver does not say.",
               "`GetNumaNodeId` (absent when -1 or not supported)", lambda t: t.numa_node,
               unit=Unit.NUMA_NODE),
)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    reading, info = readers(FAMILIES, families), families[INFO.name]
    for labels, topology in per_gpu_record(snapshot, TOPOLOGY):
        add_values(reading, labels, topology)
        for peer in topology.peers:
            info.add_metric([*labels, str(peer.peer), peer.peer_uuid, peer.link.value], 1.0)
    yield from non_empty(*families.values())


SPEC = CollectorSpec(
    TOPOLOGY.area,
    True,
    "GPU pair links (NVLink, PCIe common ancestor) and NUMA node",
    collect,
    families=FAMILIES,
)
