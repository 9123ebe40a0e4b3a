"""PCIe throughput, replays and link state; NVLink state, versions and error counters."""

from __future__ import annotations

import pynvml

from gpulens.sim.nvml._core import (
    DEV,
    PTR,
    UINT,
    Context,
    NvmlFail,
    SymbolTable,
    Target,
    out_uint,
    out_ull,
)
from gpulens.sim.state import NvLinkState

TABLE = SymbolTable()

NVLINK_VERSION = {7: 3, 9: 4, 10: 5}  # NVML_DEVICE_ARCH_* -> NVLink generation


def physical(ctx: Context, handle: int) -> Target:
    target = ctx.device(handle)
    target.require_physical()
    return target


@TABLE.define("nvmlDeviceGetPcieThroughput", DEV, UINT, PTR)
def pcie_throughput(ctx: Context, handle: int, counter: int, out: int) -> None:
    state = physical(ctx, handle).state
    if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
        out_uint(out, state.pcie_tx_kbps)
    elif counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
        out_uint(out, state.pcie_rx_kbps)
    else:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)


@TABLE.define("nvmlDeviceGetPcieReplayCounter", DEV, PTR)
def pcie_replay_counter(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, physical(ctx, handle).state.pcie_replay_count)


@TABLE.define("nvmlDeviceGetCurrPcieLinkGeneration", DEV, PTR)
def curr_link_generation(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, physical(ctx, handle).state.pcie_link_generation)


@TABLE.define("nvmlDeviceGetCurrPcieLinkWidth", DEV, PTR)
def curr_link_width(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, physical(ctx, handle).state.pcie_link_width)


@TABLE.define("nvmlDeviceGetMaxPcieLinkGeneration", DEV, PTR)
def max_link_generation(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, physical(ctx, handle).identity.model.pcie_generation)


TABLE.alias("nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration")


@TABLE.define("nvmlDeviceGetMaxPcieLinkWidth", DEV, PTR)
def max_link_width(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, physical(ctx, handle).identity.model.pcie_width)


@TABLE.define("nvmlDeviceGetPcieSpeed", DEV, PTR)
def pcie_speed(ctx: Context, handle: int, out: int) -> None:
    """Per-lane speed in Mbps of the current link generation."""
    generation = physical(ctx, handle).state.pcie_link_generation
    out_uint(out, {1: 2500, 2: 5000, 3: 8000, 4: 16000, 5: 32000, 6: 64000}.get(generation, 16000))


def nvlink(target: Target, link: int) -> NvLinkState:
    """The state of one link: NOT_SUPPORTED on boards (or MIG devices) without NVLink."""
    target.require_physical()
    links = target.state.nvlinks
    if not links or target.identity.model.nvlink_links == 0:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    found = next((s for s in links if s.link == link), None)
    if found is None:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return found


@TABLE.define("nvmlDeviceGetNvLinkState", DEV, UINT, PTR)
def nvlink_state(ctx: Context, handle: int, link: int, out: int) -> None:
    state = nvlink(ctx.device(handle), link)
    out_uint(out, pynvml.NVML_FEATURE_ENABLED if state.active else pynvml.NVML_FEATURE_DISABLED)


@TABLE.define("nvmlDeviceGetNvLinkVersion", DEV, UINT, PTR)
def nvlink_version(ctx: Context, handle: int, link: int, out: int) -> None:
    target = ctx.device(handle)
    nvlink(target, link)
    out_uint(out, NVLINK_VERSION.get(target.identity.model.nvml_architecture, 4))


@TABLE.define("nvmlDeviceGetNvLinkErrorCounter", DEV, UINT, UINT, PTR)
def nvlink_error_counter(ctx: Context, handle: int, link: int, counter: int, out: int) -> None:
    state = nvlink(ctx.device(handle), link)
    if not 0 <= counter <= pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    out_ull(out, state.errors.get(counter, 0))
