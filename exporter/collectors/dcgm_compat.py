"""`--compat dcgm`: the same snapshot under dcgm-exporter 4.8's names, units, types and labels.

A user switching from dcgm-exporter keeps dashboards and alerts unchanged: `DCGM_FI_DEV_*` and
`DCGM_FI_PROF_*` families with labels `gpu`, `UUID`, `pci_bus_id`, `device` (`nvidia<N>`),
`modelName`, `Hostname` and `DCGM_FI_DRIVER_VERSION`; utilization in percent, framebuffer in MiB,
energy in mJ, clocks in MHz, PROF ratios 0..1, throttle durations in ns; the last Xid as a gauge with
`err_code` / `err_msg`. Types and HELP follow dcgm-exporter's `etc/default-counters.csv`.

MIG behaves like dcgm-exporter's default `-d f` mode: a GPU with MIG instances has no GPU-level
series; every series is per GPU instance (`GPU_I_PROFILE`, `GPU_I_ID`; `gpu`/`UUID` name the
parent). Memory and PROF ratios are the instance's own; device-wide values (power, temperature,
clocks, energy, health counters) are repeated on each instance, and utilization and PCIe/NVLink PROF
rates are absent, exactly as there. (So `sum(DCGM_FI_DEV_POWER_USAGE)` over-counts on MIG nodes with
dcgm-exporter and here alike; the native `gpu_power_watts` does not.) A MIG-enabled GPU without any
instance keeps GPU-level series.

`Hostname` is `$NODE_NAME` if set, else the host name, as dcgm-exporter does (a simulated node's
scenario host name under `--simulate`), read once at start (`CollectorOptions.hostname`, app.py);
`--compat dcgm=4.8.3` and later spell it `hostname`, as dcgm-exporter does since 4.8.3 (#655). On
Kubernetes a series of a device one pod holds carries
`pod`, `namespace` and `container`, from the kubelet's pod-resources allocations like
dcgm-exporter's default mapping (holders.py). `DCGM_FI_DEV_XID_ERRORS` is 0 (`err_code="0"`,
"No Error") until the GPU's first Xid, as the field reads in dcgm-exporter before one. Only values gpulens
has are emitted; docs/metrics.md maps every field to its native family.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    CLOCKS,
    DEVICE,
    HEALTH,
    MEMORY,
    PCIE_NVLINK,
    POWER_THERMAL,
    PROFILING,
    CollectorOptions,
    CollectorSpec,
    Reads,
    non_empty,
)
from gpulens.exporter.collectors.health_status import System, assess, recent_xids
from gpulens.exporter.collectors.holders import PodLabels, pods
from gpulens.exporter.compat import DCGM, DCGM_DEFAULT_VERSION
from gpulens.exporter.snapshot import (
    Area,
    ClockEventReason,
    ClocksReading,
    EccError,
    EccScope,
    HealthReading,
    MigMode,
    MigSample,
    NodeSnapshot,
    NvLinkErrorKind,
    PcieNvlinkReading,
    ProfilingReading,
    RemappedRowKind,
    RetiredPageCause,
    XidCount,
)

MIB = 1024 * 1024
GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
MIG_LABELS = [*GPU_LABELS[:5], "GPU_I_PROFILE", "GPU_I_ID", *GPU_LABELS[5:]]

# Xid code -> message, from NVIDIA's Xid catalogue (the text dcgm-exporter puts in err_msg)
XID_MESSAGES: dict[int, str] = {
    0: "No Error",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    69: "Graphics Engine class error",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    136: "ALI Training Fail",
    140: "Unrecovered ECC Error",
    143: "GPU Initialization Failure",
    145: "NVLINK: RLW Error",
    154: "GPU Recovery Action Changed",
    155: "NVLINK: SW Defined Error",
}

# snapshot clock-event reason -> nvmlClocksEventReason* bit (DCGM_FI_DEV_CLOCKS_EVENT_REASONS)
CLOCK_EVENT_BITS: dict[ClockEventReason, int] = {
    ClockEventReason.GPU_IDLE: 0x1,
    ClockEventReason.APPLICATIONS_CLOCKS_SETTING: 0x2,
    ClockEventReason.SW_POWER_CAP: 0x4,
    ClockEventReason.HW_SLOWDOWN: 0x8,
    ClockEventReason.SYNC_BOOST: 0x10,
    ClockEventReason.SW_THERMAL_SLOWDOWN: 0x20,
    ClockEventReason.HW_THERMAL_SLOWDOWN: 0x40,
    ClockEventReason.HW_POWER_BRAKE_SLOWDOWN: 0x80,
    ClockEventReason.DISPLAY_CLOCK_SETTING: 0x100,
}

Value = float | None
R = TypeVar("R")


@dataclass(frozen=True)
class Field(Generic[R]):
    """One dcgm-exporter family: its DCGM field, type, HELP, the area whose record it comes from, and
    how to read it from that record (`device`) and, where the value is per instance, from a MIG
    instance."""

    name: str
    field_id: int
    type: str  # "gauge" | "counter"
    help: str
    reads: Reads[R]
    device: Callable[[R], Value]
    instance: Callable[[MigSample], Value] | None = None  # None: device-wide, repeated per instance
    on_mig: bool = True  # False: absent on MIG GPUs (DCGM cannot read it per instance)


def _scaled(value: float | int | None, factor: float) -> Value:
    return None if value is None else float(value) * factor


def _mib(value: int | None) -> Value:
    return None if value is None else float(int(value) // MIB)


def _flag(value: bool | None) -> Value:
    return None if value is None else (1.0 if value else 0.0)


def _ecc(health: HealthReading, error: EccError, scope: EccScope) -> Value:
    return next((float(c) for e, s, c in health.ecc_errors if e == error and s == scope), None)


def _pair(pairs: tuple[tuple[StrEnum, int], ...], key: StrEnum) -> Value:
    return next((float(v) for k, v in pairs if k == key), None)


def _nvlink_errors(pcie: PcieNvlinkReading, kind: NvLinkErrorKind) -> Value:
    counts = [c for link in pcie.nvlinks for k, c in link.errors if k == kind]
    return float(sum(counts)) if counts else None


def _event_ns(clocks: ClocksReading, *reasons: ClockEventReason) -> Value:
    seconds = [s for r, s in clocks.clock_event_seconds if r in reasons]
    return sum(seconds) * 1e9 if seconds else None


def _event_mask(clocks: ClocksReading) -> Value:
    if not clocks.clock_events:
        return None
    return float(sum(CLOCK_EVENT_BITS.get(reason, 0) for reason, active in clocks.clock_events if active))


def _prof(key: str) -> Callable[[ProfilingReading], Value]:
    return lambda profiling: dict(profiling.values).get(key)


def _mig_prof(key: str) -> Callable[[MigSample], Value]:
    return lambda instance: dict(instance.profiling).get(key)


def _nvlink_mbps(profiling: ProfilingReading) -> Value:
    """Field 449: NVLink throughput of all links, both directions, in MB/s. DCGM serves a rate
    although dcgm-exporter's counters file types it `counter`; gpulens reads the same rate from the
    profiling source (DCGM 1011/1012 or GPM's NVLink totals)."""
    values = dict(profiling.values)
    tx, rx = values.get("nvlink_tx_bytes_per_second"), values.get("nvlink_rx_bytes_per_second")
    if tx is None and rx is None:
        return None
    return ((tx or 0.0) + (rx or 0.0)) / 1e6


def _mig_free(m: MigSample) -> Value:
    if m.memory_total_bytes is None or m.memory_used_bytes is None:
        return None
    return _mib(m.memory_total_bytes - m.memory_used_bytes - (m.memory_reserved_bytes or 0))


FIELDS: tuple[Field[Any], ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", 100, "gauge", "SM clock frequency (in MHz).", CLOCKS,
          lambda c: _scaled(c.sm_clock_hertz, 1e-6)),
    Field("DCGM_FI_DEV_MEM_CLOCK", 101, "gauge", "Memory clock frequency (in MHz).", CLOCKS,
          lambda c: _scaled(c.memory_clock_hertz, 1e-6)),
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 112, "gauge",
          "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).", CLOCKS, _event_mask),
    Field("DCGM_FI_DEV_MEMORY_TEMP", 140, "gauge", "Memory temperature (in C).", POWER_THERMAL,
          lambda p: p.memory_temperature_celsius),
    Field("DCGM_FI_DEV_GPU_TEMP", 150, "gauge", "GPU temperature (in C).", POWER_THERMAL,
          lambda p: p.temperature_celsius),
    Field("DCGM_FI_DEV_POWER_USAGE", 155, "gauge", "Power draw (in W).", POWER_THERMAL,
          lambda p: p.power_watts),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 156, "counter",
          "Total energy consumption since boot (in mJ).", POWER_THERMAL,
          lambda p: _scaled(p.energy_joules, 1e3)),
    Field("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 164, "gauge", "Enforced power limit (in W).",
          POWER_THERMAL,
          lambda p: p.power_limit_watts),
    Field("DCGM_FI_DEV_PSTATE", 190, "gauge", "Performance state (P-State) 0-15. 0=highest.", DEVICE,
          lambda d: d.performance_state),
    Field("DCGM_FI_DEV_FAN_SPEED", 191, "gauge", "Fan speed for the device in percent 0-100.", DEVICE,
          lambda d: _scaled(d.fan_speed_ratio, 100.0)),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 202, "counter", "Total number of PCIe retries.",
          PCIE_NVLINK,
          lambda p: p.pcie_replays),
    Field("DCGM_FI_DEV_GPU_UTIL", 203, "gauge", "GPU utilization (in %).", DEVICE,
          lambda d: _scaled(d.utilization_ratio, 100.0), on_mig=False),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", 204, "gauge", "Memory utilization (in %).", DEVICE,
          lambda d: _scaled(d.memory_utilization_ratio, 100.0), on_mig=False),
    Field("DCGM_FI_DEV_ENC_UTIL", 206, "gauge", "Encoder utilization (in %).", DEVICE,
          lambda d: _scaled(d.encoder_utilization_ratio, 100.0), on_mig=False),
    Field("DCGM_FI_DEV_DEC_UTIL", 207, "gauge", "Decoder utilization (in %).", DEVICE,
          lambda d: _scaled(d.decoder_utilization_ratio, 100.0), on_mig=False),
    Field("DCGM_FI_DEV_PCIE_LINK_GEN", 237, "gauge", "PCIe current link generation.", PCIE_NVLINK,
          lambda p: p.pcie_link_generation),
    Field("DCGM_FI_DEV_PCIE_LINK_WIDTH", 238, "gauge", "PCIe current link width.", PCIE_NVLINK,
          lambda p: p.pcie_link_width),
    Field("DCGM_FI_DEV_POWER_VIOLATION", 240, "counter",
          "Throttling duration due to power constraints (in ns).", CLOCKS,
          lambda c: _event_ns(c, ClockEventReason.SW_POWER_CAP)),
    Field("DCGM_FI_DEV_THERMAL_VIOLATION", 241, "counter",
          "Throttling duration due to thermal constraints (in ns).", CLOCKS,
          lambda c: _event_ns(c, ClockEventReason.SW_THERMAL_SLOWDOWN, ClockEventReason.HW_THERMAL_SLOWDOWN)),
    Field("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", 242, "counter",
          "Throttling duration due to sync-boost constraints (in ns).", CLOCKS,
          lambda c: _event_ns(c, ClockEventReason.SYNC_BOOST)),
    Field("DCGM_FI_DEV_FB_TOTAL", 250, "gauge", "Framebuffer memory total (in MiB).", MEMORY,
          lambda m: _mib(m.memory_total_bytes), lambda m: _mib(m.memory_total_bytes)),
    Field("DCGM_FI_DEV_FB_FREE", 251, "gauge", "Framebuffer memory free (in MiB).", MEMORY,
          lambda m: _mib(m.memory_free_bytes), _mig_free),
    Field("DCGM_FI_DEV_FB_USED", 252, "gauge", "Framebuffer memory used (in MiB).", MEMORY,
          lambda m: _mib(m.memory_used_bytes), lambda m: _mib(m.memory_used_bytes)),
    Field("DCGM_FI_DEV_FB_RESERVED", 253, "gauge", "Framebuffer memory reserved (in MiB).", MEMORY,
          lambda m: _mib(m.memory_reserved_bytes), lambda m: _mib(m.memory_reserved_bytes)),
    Field("DCGM_FI_DEV_BAR1_TOTAL", 90, "gauge", "Total BAR1 memory (in MB).", MEMORY,
          lambda m: _mib(m.bar1_total_bytes)),
    Field("DCGM_FI_DEV_BAR1_USED", 92, "gauge", "BAR1 memory used (in MB).", MEMORY,
          lambda m: _mib(m.bar1_used_bytes)),
    Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 310, "counter", "Total number of single-bit volatile ECC errors.",
          HEALTH, lambda h: _ecc(h, EccError.CORRECTED, EccScope.VOLATILE)),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 311, "counter", "Total number of double-bit volatile ECC errors.",
          HEALTH, lambda h: _ecc(h, EccError.UNCORRECTED, EccScope.VOLATILE)),
    Field("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 312, "counter",
          "Total number of single-bit persistent ECC errors.", HEALTH,
          lambda h: _ecc(h, EccError.CORRECTED, EccScope.AGGREGATE)),
    Field("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 313, "counter",
          "Total number of double-bit persistent ECC errors.", HEALTH,
          lambda h: _ecc(h, EccError.UNCORRECTED, EccScope.AGGREGATE)),
    Field("DCGM_FI_DEV_RETIRED_SBE", 390, "counter",
          "Total number of retired pages due to single-bit errors.", HEALTH,
          lambda h: _pair(h.retired_pages, RetiredPageCause.SINGLE_BIT_ECC)),
    Field("DCGM_FI_DEV_RETIRED_DBE", 391, "counter",
          "Total number of retired pages due to double-bit errors.", HEALTH,
          lambda h: _pair(h.retired_pages, RetiredPageCause.DOUBLE_BIT_ECC)),
    Field("DCGM_FI_DEV_RETIRED_PENDING", 392, "counter", "Total number of pages pending retirement.",
          HEALTH, lambda h: _flag(h.retired_pages_pending)),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 393, "counter",
          "Number of remapped rows for uncorrectable errors", HEALTH,
          lambda h: _pair(h.remapped_rows, RemappedRowKind.UNCORRECTABLE)),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 394, "counter",
          "Number of remapped rows for correctable errors", HEALTH,
          lambda h: _pair(h.remapped_rows, RemappedRowKind.CORRECTABLE)),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", 395, "gauge", "Whether remapping of rows has failed", HEALTH,
          lambda h: _flag(h.row_remap_failed)),
    Field("DCGM_FI_DEV_ROW_REMAP_PENDING", 396, "gauge", "Whether remapping of rows is pending", HEALTH,
          lambda h: _flag(h.row_remap_pending)),
    Field("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 409, "counter",
          "Total number of NVLink flow-control CRC errors.", PCIE_NVLINK,
          lambda p: _nvlink_errors(p, NvLinkErrorKind.CRC_FLIT)),
    Field("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 419, "counter",
          "Total number of NVLink data CRC errors.",
          PCIE_NVLINK, lambda p: _nvlink_errors(p, NvLinkErrorKind.CRC_DATA)),
    Field("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 429, "counter", "Total number of NVLink retries.",
          PCIE_NVLINK, lambda p: _nvlink_errors(p, NvLinkErrorKind.REPLAY)),
    Field("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 439, "counter",
          "Total number of NVLink recovery errors.",
          PCIE_NVLINK, lambda p: _nvlink_errors(p, NvLinkErrorKind.RECOVERY)),
    Field("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 449, "counter",
          "Total number of NVLink bandwidth counters for all lanes.", PROFILING, _nvlink_mbps,
          on_mig=False),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1001, "gauge", "Ratio of time the graphics engine is active.",
          PROFILING, _prof("graphics"), _mig_prof("graphics")),
    Field("DCGM_FI_PROF_SM_ACTIVE", 1002, "gauge", "The ratio of cycles an SM has at least 1 warp assigned.",
          PROFILING, _prof("sm"), _mig_prof("sm")),
    Field("DCGM_FI_PROF_SM_OCCUPANCY", 1003, "gauge", "The ratio of number of warps resident on an SM.",
          PROFILING, _prof("sm_occupancy"), _mig_prof("sm_occupancy")),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1004, "gauge",
          "Ratio of cycles the tensor (HMMA) pipe is active.",
          PROFILING, _prof("tensor"), _mig_prof("tensor")),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", 1005, "gauge",
          "Ratio of cycles the device memory interface is active sending or receiving data.",
          PROFILING, _prof("dram"), _mig_prof("dram")),
    Field("DCGM_FI_PROF_PIPE_FP64_ACTIVE", 1006, "gauge", "Ratio of cycles the fp64 pipes are active.",
          PROFILING, _prof("fp64"), _mig_prof("fp64")),
    Field("DCGM_FI_PROF_PIPE_FP32_ACTIVE", 1007, "gauge", "Ratio of cycles the fp32 pipes are active.",
          PROFILING, _prof("fp32"), _mig_prof("fp32")),
    Field("DCGM_FI_PROF_PIPE_FP16_ACTIVE", 1008, "gauge", "Ratio of cycles the fp16 pipes are active.",
          PROFILING, _prof("fp16"), _mig_prof("fp16")),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", 1009, "gauge",
          "The rate of data transmitted over the PCIe bus - including both protocol headers and data"
          " payloads - in bytes per second.",
          PROFILING, _prof("pcie_tx_bytes_per_second"), on_mig=False),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", 1010, "gauge",
          "The rate of data received over the PCIe bus - including both protocol headers and data"
          " payloads - in bytes per second.",
          PROFILING, _prof("pcie_rx_bytes_per_second"), on_mig=False),
    Field("DCGM_FI_PROF_NVLINK_TX_BYTES", 1011, "gauge",
          "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
          PROFILING, _prof("nvlink_tx_bytes_per_second"), on_mig=False),
    Field("DCGM_FI_PROF_NVLINK_RX_BYTES", 1012, "gauge",
          "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
          PROFILING, _prof("nvlink_rx_bytes_per_second"), on_mig=False),
)  # fmt: skip

# filled from the Xid counts (its `reads` and `device` are never used)
XID_FIELD = Field[None](
    "DCGM_FI_DEV_XID_ERRORS",
    230,
    "gauge",
    "Value of the last XID error encountered.",
    Reads(Area.XID, lambda g: None),
    lambda _: None,
)


HEALTH_FAMILY = "DCGM_EXP_GPU_HEALTH_STATUS"
HEALTH_HELP = "DCGM reported health status"
HEALTH_SINCE = (4, 0, 1)  # first release with the family (tag 4.0.0-4.0.1, counters/const.go)
HEALTH_GAUGE_SINCE = (4, 8, 3)  # its counters-file row says counter before, gauge from 4.8.3
# gpulens system -> dcgm-exporter's health_watch value (DCGM_HEALTH_WATCH_*); watches gpulens cannot
# judge (PMU, MCU, SM, INFOROM) are left out rather than reported as passing
HEALTH_WATCHES: dict[System, str] = {
    System.PCIE: "PCIE",
    System.NVLINK: "NVLINK",
    System.MEMORY: "MEM",
    System.THERMAL: "THERMAL",
    System.POWER: "POWER",
    System.DRIVER: "DRIVER",
}
DCGM_HEALTH_SCALE = 10.0  # DCGM_HEALTH_RESULT_PASS 0, WARN 10, FAIL 20 (dcgm_structs.h)


def _health_family(
    snapshot: NodeSnapshot, version: tuple[int, int, int], gpu_labels: dict[int, dict[str, str]]
) -> Metric | None:
    """DCGM_EXP_GPU_HEALTH_STATUS: one series per GPU and watch, labels `health_watch` and
    `health_error_code`, value DCGM's health result (0 / 10 / 20), from the same verdicts as
    gpu_health_status. Per GPU entity only (dcgm-exporter's health group holds GPUs)."""
    if version < HEALTH_SINCE:
        return None
    kind = "gauge" if version >= HEALTH_GAUGE_SINCE else "counter"
    family = Metric(HEALTH_FAMILY, HEALTH_HELP, kind)
    xids = recent_xids(snapshot)
    for gpu in snapshot.gpus:
        labels = gpu_labels.get(gpu.identity.index)
        if labels is None:
            continue
        for system, finding in assess(gpu, xids.get(gpu.identity.index, [])).items():
            family.add_sample(
                HEALTH_FAMILY,
                {**labels, "health_error_code": finding.code, "health_watch": HEALTH_WATCHES[system]},
                float(finding.status) * DCGM_HEALTH_SCALE,
            )
    return family


def _xid_watched(snapshot: NodeSnapshot) -> bool:
    """Whether Xid events are being received (then no Xid so far means 0, not unknown)."""
    area = snapshot.areas.get(Area.XID)
    return area is not None and area.success


def _pod_labels(holders: dict[tuple[int, int | None], PodLabels], gpu: int, gi: int | None) -> dict[str, str]:
    found = holders.get((gpu, gi))
    if found is None:
        return {}
    labels = {"pod": found.pod, "namespace": found.namespace, "container": found.container}
    return {k: v for k, v in labels.items() if v}


def _last_xids(snapshot: NodeSnapshot) -> dict[int, XidCount]:
    """Per GPU, the Xid received last (what DCGM_FI_DEV_XID_ERRORS holds)."""
    last: dict[int, XidCount] = {}
    for x in snapshot.xids:
        if x.gpu_instance is None and (x.gpu not in last or x.last_timestamp >= last[x.gpu].last_timestamp):
            last[x.gpu] = x
    return last


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    host, host_label = options.hostname, options.compat.dcgm_hostname_label
    driver = snapshot.driver_version
    families = {f.name: Metric(f.name, f.help, f.type) for f in FIELDS}
    xid = Metric(XID_FIELD.name, XID_FIELD.help, XID_FIELD.type)
    last_xids = _last_xids(snapshot)
    xid_watched = _xid_watched(snapshot)
    holders = pods(snapshot)
    health_labels: dict[int, dict[str, str]] = {}
    for gpu in snapshot.gpus:
        ident = gpu.identity
        base = {
            "gpu": str(ident.index),
            "UUID": ident.uuid,
            "pci_bus_id": ident.pci_bus_id,
            "device": f"nvidia{ident.index}",
            "modelName": ident.model,
        }
        tail = {host_label: host, "DCGM_FI_DRIVER_VERSION": driver}
        health_labels[ident.index] = {**base, **tail, **_pod_labels(holders, ident.index, None)}
        if not gpu.up:
            continue
        mig = gpu.mig_mode is MigMode.ENABLED and bool(gpu.mig_instances)
        entities: list[tuple[dict[str, str], MigSample | None]]
        if mig:
            entities = [
                (
                    {
                        **base,
                        "GPU_I_PROFILE": m.profile,
                        "GPU_I_ID": str(m.gpu_instance),
                        **tail,
                        **_pod_labels(holders, ident.index, m.gpu_instance),
                    },
                    m,
                )
                for m in gpu.mig_instances
            ]
        else:
            entities = [({**base, **tail, **_pod_labels(holders, ident.index, None)}, None)]
        for f in FIELDS:
            if f.reads.area in gpu.failed_areas or (mig and not f.on_mig):
                continue
            family = families[f.name]
            record = f.reads.record(gpu)
            for labels, instance in entities:
                if instance is not None and f.instance is not None:
                    value = f.instance(instance)
                elif record is not None:
                    value = f.device(record)
                else:
                    continue  # the area was not read
                if value is not None:
                    family.add_sample(f.name, labels, float(value))
        last = last_xids.get(ident.index)
        code = last.xid if last is not None else (0 if xid_watched else None)
        if code is not None and Area.XID not in gpu.failed_areas:
            message = XID_MESSAGES.get(code, "Unknown Error")
            for labels, _ in entities:
                xid.add_sample(
                    XID_FIELD.name, {**labels, "err_code": str(code), "err_msg": message}, float(code)
                )
    health = _health_family(snapshot, options.compat.dcgm or DCGM_DEFAULT_VERSION, health_labels)
    yield from non_empty(*families.values(), xid, *([health] if health is not None else []))


SPEC = CollectorSpec(
    "dcgm_compat",
    False,
    "dcgm-exporter 4.8 names, units and labels",
    collect,
    reads_nvml=False,
    compat=DCGM,
)
