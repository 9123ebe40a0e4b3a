"""Per-GPU health verdicts, one per system, in the spirit of DCGM's health watches.

`gpu_health_status{gpu, uuid, system}` is 0 (pass), 1 (warn) or 2 (fail) for the systems DCGM
watches and gpulens can judge: `pcie`, `memory`, `thermal`, `power`, `nvlink`, `driver` (six values,
so the label stays bounded). It is derived only from what the snapshot already holds (no NVML call of
its own): Xid events of the last `XID_WINDOW_SECONDS` by their NVIDIA catalogue bucket, ECC and
row-remap / page-retirement state, clock-event reasons, temperature against the GPU's own thresholds,
NVLink link state, and whether the GPU answers NVML at all.

What one snapshot cannot tell is left to the rate alerts: PCIe replay rate (GPUPcieReplayRateHigh),
NVLink error rate (GPUNvlinkErrors) and corrected-ECC rate need two samples apart in time, and a
collector is a pure function of one sample. A system whose inputs were not read this cycle
(`failed_areas`) is left out rather than reported as passing; a GPU that stopped answering reports
only `driver` = fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum, StrEnum

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    Unit,
    gpu_labels,
    non_empty,
)
from gpulens.exporter.snapshot import (
    Area,
    ClockEventReason,
    ClocksReading,
    EccError,
    EccScope,
    GpuSample,
    HealthReading,
    NodeSnapshot,
    PcieNvlinkReading,
    PowerThermalReading,
    RetiredPageCause,
    TemperatureThreshold,
    XidCount,
)

# The Xid alerts' window (alerts/gpu_alerts.yml uses increase(...[10m])): an Xid counts against its
# system for this long after it was received, then the state checks (or the GPU's absence) take over.
XID_WINDOW_SECONDS = 600.0

# DCGM's MEM health watch limits (also GPURetiredPagesLimitReached): 63 retired pages in total, or
# more than 15 from double-bit errors.
RETIRED_PAGES_LIMIT = 63
RETIRED_DBE_PAGES_LIMIT = 15


class System(StrEnum):
    """The health-watch systems judged (DCGM_HEALTH_WATCH_PCIE, _MEM, _THERMAL, _POWER, _NVLINK,
    _DRIVER)."""

    PCIE = "pcie"
    MEMORY = "memory"
    THERMAL = "thermal"
    POWER = "power"
    NVLINK = "nvlink"
    DRIVER = "driver"


class Status(IntEnum):
    """The value of `gpu_health_status`; DCGM's own scale is the same order times 10 (0 / 10 / 20)."""

    PASS = 0
    WARN = 1
    FAIL = 2


@dataclass(frozen=True)
class Finding:
    """Why a system is not passing: its status and DCGM's failure-reason code for the same
    condition (what dcgm-exporter puts in `health_error_code`)."""

    status: Status
    code: str


# Xid -> the system it indicts and how badly, from NVIDIA's Xid catalogue buckets (the same buckets
# as the Xid alerts in mixin/rules/gpu_alerts.yml). Application-class Xids (13, 31, 43, ...) are
# faults of a program, not of the GPU, and indict nothing.
XID_FINDINGS: dict[int, tuple[System, Finding]] = {
    79: (System.PCIE, Finding(Status.FAIL, "DCGM_FR_FALLEN_OFF_BUS")),
    48: (System.MEMORY, Finding(Status.FAIL, "DCGM_FR_XID_ERROR")),
    63: (System.MEMORY, Finding(Status.WARN, "DCGM_FR_XID_ERROR")),
    64: (System.MEMORY, Finding(Status.FAIL, "DCGM_FR_XID_ERROR")),
    92: (System.MEMORY, Finding(Status.WARN, "DCGM_FR_XID_ERROR")),
    94: (System.MEMORY, Finding(Status.WARN, "DCGM_FR_XID_ERROR")),
    95: (System.MEMORY, Finding(Status.FAIL, "DCGM_FR_UNCONTAINED_ERROR")),
    140: (System.MEMORY, Finding(Status.FAIL, "DCGM_FR_XID_ERROR")),
    54: (System.POWER, Finding(Status.FAIL, "DCGM_FR_XID_ERROR")),
    74: (System.NVLINK, Finding(Status.FAIL, "DCGM_FR_NVLINK_ERROR_CRITICAL")),
    **{x: (System.NVLINK, Finding(Status.FAIL, "DCGM_FR_NVLINK_ERROR_CRITICAL")) for x in range(144, 151)},
    155: (System.NVLINK, Finding(Status.FAIL, "DCGM_FR_NVLINK_ERROR_CRITICAL")),
    # the rest of NVIDIA's RESET_GPU bucket: firmware (GSP, PMU halt), init and engine timeouts
    **{
        x: (System.DRIVER, Finding(Status.FAIL, "DCGM_FR_XID_ERROR"))
        for x in (46, 62, 109, 119, 120, 136, 143, 156, 158)
    },
}  # fmt: skip

# The snapshot areas each system's state checks read; a failed read leaves the system out.
SYSTEM_AREAS: dict[System, tuple[Area, ...]] = {
    System.PCIE: (Area.XID,),
    System.MEMORY: (Area.HEALTH, Area.XID),
    System.THERMAL: (Area.POWER_THERMAL, Area.CLOCKS),
    System.POWER: (Area.CLOCKS, Area.XID),
    System.NVLINK: (Area.PCIE_NVLINK, Area.XID),
    System.DRIVER: (),  # judged on whether the GPU answers at all, Xids besides
}


def _worst(findings: list[Finding]) -> Finding | None:
    return max(findings, key=lambda f: f.status, default=None)


# A reading that is None (its area not read) holds nothing to find: the empty one stands in for it.
_NO_HEALTH = HealthReading()
_NO_POWER_THERMAL = PowerThermalReading()
_NO_CLOCKS = ClocksReading()
_NO_PCIE_NVLINK = PcieNvlinkReading()
_THERMAL_SLOWDOWNS = frozenset({ClockEventReason.HW_THERMAL_SLOWDOWN, ClockEventReason.SW_THERMAL_SLOWDOWN})


def _memory(gpu: GpuSample) -> list[Finding]:
    health = gpu.health or _NO_HEALTH
    found: list[Finding] = []
    if health.row_remap_failed:
        found.append(Finding(Status.FAIL, "DCGM_FR_ROW_REMAP_FAILURE"))
    if any(e == EccError.UNCORRECTED and s == EccScope.VOLATILE and c > 0 for e, s, c in health.ecc_errors):
        found.append(Finding(Status.FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED"))
    pages = dict(health.retired_pages)
    if pages.get(RetiredPageCause.DOUBLE_BIT_ECC, 0) > RETIRED_DBE_PAGES_LIMIT:
        found.append(Finding(Status.FAIL, "DCGM_FR_RETIRED_PAGES_DBE_LIMIT"))
    elif sum(pages.values()) >= RETIRED_PAGES_LIMIT:
        found.append(Finding(Status.FAIL, "DCGM_FR_RETIRED_PAGES_LIMIT"))
    if health.row_remap_pending:
        found.append(Finding(Status.WARN, "DCGM_FR_PENDING_ROW_REMAP"))
    if health.retired_pages_pending:
        found.append(Finding(Status.WARN, "DCGM_FR_PENDING_PAGE_RETIREMENTS"))
    return found


def _thermal(gpu: GpuSample) -> list[Finding]:
    power = gpu.power_thermal or _NO_POWER_THERMAL
    found: list[Finding] = []
    limits = dict(power.temperature_thresholds)
    temperature = power.temperature_celsius
    shutdown = limits.get(TemperatureThreshold.SHUTDOWN)
    if temperature is not None and shutdown is not None and temperature >= shutdown:
        found.append(Finding(Status.FAIL, "DCGM_FR_THERMAL_VIOLATIONS"))
    active = {reason for reason, on in (gpu.clocks or _NO_CLOCKS).clock_events if on}
    if active & _THERMAL_SLOWDOWNS:
        found.append(Finding(Status.WARN, "DCGM_FR_CLOCK_THROTTLE_THERMAL"))
    return found


def _power(gpu: GpuSample) -> list[Finding]:
    active = {reason for reason, on in (gpu.clocks or _NO_CLOCKS).clock_events if on}
    # an external brake signal: the node's or rack's power
    if ClockEventReason.HW_POWER_BRAKE_SLOWDOWN in active:
        return [Finding(Status.WARN, "DCGM_FR_CLOCK_THROTTLE_POWER")]
    return []


def _nvlink(gpu: GpuSample) -> list[Finding]:
    # NVML lists only links present on the board, so a listed link that is down lost its training.
    # DCGM fails it; gpulens warns, because one sample cannot tell a link that went down from one
    # that was never cabled (GPUNvlinkLinkDown looks a day back for that).
    if any(not link.up for link in (gpu.pcie_nvlink or _NO_PCIE_NVLINK).nvlinks):
        return [Finding(Status.WARN, "DCGM_FR_NVLINK_DOWN")]
    return []


STATE_CHECKS = {
    System.MEMORY: _memory,
    System.THERMAL: _thermal,
    System.POWER: _power,
    System.NVLINK: _nvlink,
}


def recent_xids(snapshot: NodeSnapshot) -> dict[int, list[XidCount]]:
    """Per GPU index, its per-GPU Xid counts whose last event is inside the window."""
    out: dict[int, list[XidCount]] = {}
    for x in snapshot.xids:
        if x.gpu_instance is None and snapshot.timestamp - x.last_timestamp < XID_WINDOW_SECONDS:
            out.setdefault(x.gpu, []).append(x)
    return out


def assess(gpu: GpuSample, xids: list[XidCount]) -> dict[System, Finding]:
    """The verdict per system for one GPU (PASS as `Finding(PASS, "DCGM_FR_OK")`); systems whose
    inputs were not read this cycle are absent."""
    if not gpu.up:
        return {System.DRIVER: Finding(Status.FAIL, "DCGM_FR_NVML_API")}
    by_system: dict[System, list[Finding]] = {s: [] for s in System}
    for x in xids:
        hit = XID_FINDINGS.get(x.xid)
        if hit is not None:
            by_system[hit[0]].append(hit[1])
    for system, check in STATE_CHECKS.items():
        by_system[system].extend(check(gpu))
    verdict: dict[System, Finding] = {}
    for system in System:
        if any(area in gpu.failed_areas for area in SYSTEM_AREAS[system]):
            continue
        verdict[system] = _worst(by_system[system]) or Finding(Status.PASS, "DCGM_FR_OK")
    return verdict


# Filled in code rather than by an accessor: one series per system judged, from several readings.
STATUS = FamilySpec[GpuSample](
    "gpu_health_status", Kind.GAUGE,
    "GPU health per system, as DCGM's health watches judge it: 0 pass, 1 warn, 2 fail"
    " (from Xids of the last 10 minutes, ECC / remap / retirement state, slowdowns, temperature,"
    " NVLink state and NVML reachability).",
    "none of its own: judged from this sample's readings (see below)",
    labels=(*GPU_LABELS, "system"), unit=Unit.HEALTH,
    label_doc="system (`pcie`, `memory`, `thermal`, `power`, `nvlink`, `driver`)",
)  # fmt: skip
FAMILIES = (STATUS,)


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    status = STATUS.new()
    xids = recent_xids(snapshot)
    for gpu in snapshot.gpus:
        labels = gpu_labels(gpu)
        for system, finding in assess(gpu, xids.get(gpu.identity.index, [])).items():
            status.add_metric([*labels, system.value], float(finding.status))
    yield from non_empty(status)


SPEC = CollectorSpec(
    "health_status",
    True,
    "Per-GPU health verdict per system (pcie, memory, thermal, power, nvlink, driver)",
    collect,
    reads_nvml=False,
    families=FAMILIES,
)
