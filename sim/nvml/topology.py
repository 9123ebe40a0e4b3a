"""GPU topology: NUMA node, PCIe common ancestor and P2P status of GPU pairs (`SimNode.topology`)."""

from __future__ import annotations

import pynvml

from gpulens.sim.nvml._core import (
    DEV,
    PTR,
    UINT,
    Context,
    NvmlFail,
    SymbolTable,
    out_int,
    out_struct,
    out_uint,
)
from gpulens.sim.topology import Topology

TABLE = SymbolTable()


def _topology(ctx: Context) -> Topology:
    topology = ctx.node.topology
    if topology is None:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return topology


def _pair(ctx: Context, first: int, second: int) -> tuple[Topology, int, int]:
    """Both GPUs' indexes; MIG device handles are INVALID_ARGUMENT as on a real driver."""
    a, b = ctx.device(first), ctx.device(second)
    a.require_physical()
    b.require_physical()
    return _topology(ctx), a.identity.index, b.identity.index


@TABLE.define("nvmlDeviceGetNumaNodeId", DEV, PTR)
def numa_node_id(ctx: Context, handle: int, out: int) -> None:
    target = ctx.device(handle)
    target.require_physical()
    out_int(out, _topology(ctx).numa_node(target.identity.index))


@TABLE.define("nvmlDeviceGetTopologyCommonAncestor", DEV, DEV, PTR)
def common_ancestor(ctx: Context, first: int, second: int, out: int) -> None:
    topology, a, b = _pair(ctx, first, second)
    if a == b:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    out_uint(out, topology.common_ancestor(a, b))


@TABLE.define("nvmlDeviceGetP2PStatus", DEV, DEV, UINT, PTR)
def p2p_status(ctx: Context, first: int, second: int, index: int, out: int) -> None:
    """NVLINK: OK within an NVLink domain; READ/WRITE/ATOMICS/PCI: OK under one PCIe switch or
    host bridge (the PCIe P2P rule of the driver), NOT_SUPPORTED across NUMA nodes."""
    topology, a, b = _pair(ctx, first, second)
    if index > pynvml.NVML_P2P_CAPS_INDEX_UNKNOWN:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if index == pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
        ok = topology.nvlink(a, b)
    else:
        ok = topology.nvlink(a, b) or topology.common_ancestor(a, b) < pynvml.NVML_TOPOLOGY_NODE
    out_uint(out, pynvml.NVML_P2P_STATUS_OK if ok else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)


@TABLE.define("nvmlDeviceGetGpuFabricInfo", DEV, PTR)
def gpu_fabric_info(ctx: Context, handle: int, out: int) -> None:
    """An NVLink-fabric GPU (Hopper or newer with NVLink: the NVSwitch boards) has registered with
    the fabric manager (state COMPLETED); any other GPU answers NOT_SUPPORTED, as PCIe boards do."""
    target = ctx.device(handle)
    target.require_physical()
    model = target.identity.model
    if model.architecture not in ("hopper", "blackwell") or not model.nvlink_links:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    info = out_struct(out, pynvml.c_nvmlGpuFabricInfo_t)
    info.status = pynvml.NVML_SUCCESS
    info.cliqueId = 0
    info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
