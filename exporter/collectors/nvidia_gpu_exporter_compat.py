"""`--compat nvidia_gpu_exporter`: the same snapshot under utkuozdemir/nvidia_gpu_exporter's names.

That exporter (Go, port 9835, Grafana dashboards 14574 and 25547) turns each `nvidia-smi
--query-gpu` field into a gauge: `nvidia_smi_` + the field name with dots as underscores, and the
unit nvidia-smi prints turned into a suffix and a base unit (`[%]` -> `_ratio` x 0.01, `[MiB]` ->
`_bytes` x 1048576, `[MHz]` -> `_clock_hz` x 1e6, `[W]` -> `_watts`, `[us]` -> `_seconds` x 1e-6);
HELP is the field as nvidia-smi returns it (`utilization.gpu [%]`). Enum fields become numbers
(Enabled/Active/Yes 1, pstate `P0` 0, compute mode and the NVML recovery-action / fabric-state
enums as integers). Every per-GPU series carries only `uuid` (lowercase, without `GPU-`), and
`nvidia_smi_gpu_info` carries the identity labels, so dashboards join on `uuid`. A field nvidia-smi
reports as N/A or [Not Supported] is left out, as the peer does (None in the snapshot: no series).

Its NVML backend's families are served too: `energy_joules_total`, PCIe throughput (here from the
profiling source's PCIe rates), per MIG instance `mig_info` / `mig_memory_*_bytes` / activity ratios
keyed by `(uuid, gpu_instance_id)`, and the Xid counters `xid_errors_total{uuid,xid}` and
`xid_last_timestamp_seconds`; and its per-process families as with `--collect.compute-apps`
(`compute_app_info{uuid,pid,process_name}`, ...). Megabyte values are whole MiB as nvidia-smi prints
them. Fields gpulens does not read (vbios, inforom, accounting, display, pcie max, ...) are absent;
docs/migrate-nvidia-gpu-exporter.md lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.exporter.collectors.base import (
    CLOCKS,
    DEVICE,
    HEALTH,
    MEMORY,
    PCIE_NVLINK,
    POWER_THERMAL,
    CollectorOptions,
    CollectorSpec,
    Reads,
    non_empty,
)
from gpulens.exporter.compat import NVIDIA_GPU_EXPORTER
from gpulens.exporter.snapshot import (
    NO_PROCESSES,
    Area,
    ClockEventReason,
    ClocksReading,
    ComputeMode,
    EccError,
    EccScope,
    GpuSample,
    HealthReading,
    MigMode,
    MigSample,
    NodeSnapshot,
    ProcessKind,
    RemappedRowKind,
    RetiredPageCause,
)

PREFIX = "nvidia_smi_"
MIB = 1024 * 1024
UUID = ["uuid"]
INFO_LABELS = [
    "uuid",
    "name",
    "driver_model_current",
    "driver_model_pending",
    "vbios_version",
    "driver_version",
    "pci_bus_id",
    "serial",
    "compute_cap",
    "pci_sub_device_id",
    "index",
    "cuda_version",
]
APP_LABELS = ["uuid", "pid", "process_name"]
MIG_LABELS = ["uuid", "gpu_instance_id"]
MIG_INFO_LABELS = ["uuid", "mig_uuid", "gpu_instance_id", "compute_instance_id", "profile"]
XID_LABELS = ["uuid", "xid"]
COMPUTE_MODES: dict[ComputeMode, int] = {
    ComputeMode.DEFAULT: 0,
    ComputeMode.EXCLUSIVE_THREAD: 1,
    ComputeMode.PROHIBITED: 2,
    ComputeMode.EXCLUSIVE_PROCESS: 3,
}
# the reasons nvidia-smi has a clocks_event_reasons.<reason> field for (display_clock_setting: none)
CLOCK_EVENT_REASONS = (
    ClockEventReason.GPU_IDLE,
    ClockEventReason.APPLICATIONS_CLOCKS_SETTING,
    ClockEventReason.SW_POWER_CAP,
    ClockEventReason.HW_SLOWDOWN,
    ClockEventReason.HW_THERMAL_SLOWDOWN,
    ClockEventReason.HW_POWER_BRAKE_SLOWDOWN,
    ClockEventReason.SW_THERMAL_SLOWDOWN,
    ClockEventReason.SYNC_BOOST,
)
# the reasons with a clocks_event_reasons_counters.<reason> field (NVML's cumulative durations)
CLOCK_EVENT_COUNTERS = (
    ClockEventReason.SW_POWER_CAP,
    ClockEventReason.SYNC_BOOST,
    ClockEventReason.SW_THERMAL_SLOWDOWN,
    ClockEventReason.HW_THERMAL_SLOWDOWN,
    ClockEventReason.HW_POWER_BRAKE_SLOWDOWN,
)
# (family suffix, MigSample.profiling key): the peer's per-GPU-instance GPM ratios
MIG_ACTIVITY = (
    ("graphics_activity_ratio", "graphics"),
    ("sm_activity_ratio", "sm"),
    ("sm_occupancy_ratio", "sm_occupancy"),
    ("tensor_activity_ratio", "tensor"),
)
Value = float | int | bool | None
R = TypeVar("R")


@dataclass(frozen=True)
class Field(Generic[R]):
    """One `nvidia-smi --query-gpu` field as the peer exports it: the family suffix, its HELP (the
    field as nvidia-smi returns it), the area whose record the value comes from, and its reader (the
    value already in the peer's unit; None: N/A, no series)."""

    suffix: str
    help: str
    reads: Reads[R]
    read: Callable[[R], Value]
    on_mig: bool = True  # False: nvidia-smi prints [N/A] for it on a MIG-enabled GPU


# fields of the GPU's identity and MIG mode, which are read whatever the areas: emitted unless the
# device reads failed
IDENTITY = Reads[GpuSample](Area.DEVICE, lambda g: g)


def _mib(value: int | None) -> Value:
    """Bytes as nvidia-smi shows them: whole MiB, exported times 1048576."""
    return None if value is None else (int(value) // MIB) * MIB


def _ecc(error: EccError, scope: EccScope) -> Callable[[HealthReading], Value]:
    return lambda h: next((c for e, s, c in h.ecc_errors if e == error and s == scope), None)


def _pair(
    pairs: Callable[[HealthReading], tuple[tuple[StrEnum, int], ...]], key: StrEnum
) -> Callable[[HealthReading], Value]:
    return lambda h: next((v for k, v in pairs(h) if k == key), None)


def _event(reason: ClockEventReason) -> Callable[[ClocksReading], Value]:
    return lambda c: next((active for r, active in c.clock_events if r == reason), None)


def _event_seconds(reason: ClockEventReason) -> Callable[[ClocksReading], Value]:
    return lambda c: next((s for r, s in c.clock_event_seconds if r == reason), None)


FIELDS: tuple[Field[Any], ...] = (
    Field("index", "index", IDENTITY, lambda g: g.identity.index),
    Field("utilization_gpu_ratio", "utilization.gpu [%]", DEVICE,
          lambda d: d.utilization_ratio, on_mig=False),
    Field("utilization_memory_ratio", "utilization.memory [%]", DEVICE,
          lambda d: d.memory_utilization_ratio, on_mig=False),
    Field("utilization_encoder_ratio", "utilization.encoder [%]", DEVICE,
          lambda d: d.encoder_utilization_ratio, on_mig=False),
    Field("utilization_decoder_ratio", "utilization.decoder [%]", DEVICE,
          lambda d: d.decoder_utilization_ratio, on_mig=False),
    Field("pstate", "pstate", DEVICE, lambda d: d.performance_state),
    Field("compute_mode", "compute_mode", DEVICE,
          lambda d: None if d.compute_mode is None else COMPUTE_MODES.get(d.compute_mode)),
    Field("fan_speed_ratio", "fan.speed [%]", DEVICE, lambda d: d.fan_speed_ratio),
    Field("persistence_mode", "persistence_mode", DEVICE, lambda d: d.persistence_mode),
    Field("mig_mode_current", "mig.mode.current", IDENTITY,
          lambda g: None if g.mig_mode is None else g.mig_mode is MigMode.ENABLED),
    Field("memory_total_bytes", "memory.total [MiB]", MEMORY, lambda m: _mib(m.memory_total_bytes)),
    Field("memory_used_bytes", "memory.used [MiB]", MEMORY, lambda m: _mib(m.memory_used_bytes)),
    Field("memory_free_bytes", "memory.free [MiB]", MEMORY, lambda m: _mib(m.memory_free_bytes)),
    Field("memory_reserved_bytes", "memory.reserved [MiB]", MEMORY,
          lambda m: _mib(m.memory_reserved_bytes)),
    Field("power_draw_watts", "power.draw [W]", POWER_THERMAL, lambda p: p.power_watts),
    Field("enforced_power_limit_watts", "enforced.power.limit [W]", POWER_THERMAL,
          lambda p: p.power_limit_watts),
    Field("temperature_gpu", "temperature.gpu", POWER_THERMAL, lambda p: p.temperature_celsius),
    Field("temperature_memory", "temperature.memory", POWER_THERMAL,
          lambda p: p.memory_temperature_celsius),
    Field("clocks_current_graphics_clock_hz", "clocks.current.graphics [MHz]", CLOCKS,
          lambda c: c.graphics_clock_hertz),
    Field("clocks_current_sm_clock_hz", "clocks.current.sm [MHz]", CLOCKS, lambda c: c.sm_clock_hertz),
    Field("clocks_current_memory_clock_hz", "clocks.current.memory [MHz]", CLOCKS,
          lambda c: c.memory_clock_hertz),
    Field("clocks_current_video_clock_hz", "clocks.current.video [MHz]", CLOCKS,
          lambda c: c.video_clock_hertz),
    Field("clocks_max_graphics_clock_hz", "clocks.max.graphics [MHz]", CLOCKS,
          lambda c: c.graphics_clock_max_hertz),
    Field("clocks_max_sm_clock_hz", "clocks.max.sm [MHz]", CLOCKS, lambda c: c.sm_clock_max_hertz),
    Field("clocks_max_memory_clock_hz", "clocks.max.memory [MHz]", CLOCKS,
          lambda c: c.memory_clock_max_hertz),
    *(
        Field(f"clocks_event_reasons_{r}", f"clocks_event_reasons.{r}", CLOCKS, _event(r))
        for r in CLOCK_EVENT_REASONS
    ),
    *(
        Field(f"clocks_event_reasons_counters_{r}_seconds", f"clocks_event_reasons_counters.{r} [us]",
              CLOCKS, _event_seconds(r))
        for r in CLOCK_EVENT_COUNTERS
    ),
    Field("pcie_link_gen_current", "pcie.link.gen.current", PCIE_NVLINK,
          lambda p: p.pcie_link_generation),
    Field("pcie_link_width_current", "pcie.link.width.current", PCIE_NVLINK,
          lambda p: p.pcie_link_width),
    Field("ecc_mode_current", "ecc.mode.current", HEALTH, lambda h: h.ecc_enabled),
    *(
        Field(f"ecc_errors_{e}_{s}_total", f"ecc.errors.{e}.{s}.total", HEALTH, _ecc(e, s))
        for e in EccError
        for s in EccScope
    ),
    Field("retired_pages_single_bit_ecc_count", "retired_pages.single_bit_ecc.count", HEALTH,
          _pair(lambda h: h.retired_pages, RetiredPageCause.SINGLE_BIT_ECC)),
    Field("retired_pages_double_bit_count", "retired_pages.double_bit.count", HEALTH,
          _pair(lambda h: h.retired_pages, RetiredPageCause.DOUBLE_BIT_ECC)),
    Field("retired_pages_pending", "retired_pages.pending", HEALTH, lambda h: h.retired_pages_pending),
    Field("remapped_rows_correctable", "remapped_rows.correctable", HEALTH,
          _pair(lambda h: h.remapped_rows, RemappedRowKind.CORRECTABLE)),
    Field("remapped_rows_uncorrectable", "remapped_rows.uncorrectable", HEALTH,
          _pair(lambda h: h.remapped_rows, RemappedRowKind.UNCORRECTABLE)),
    Field("remapped_rows_pending", "remapped_rows.pending", HEALTH, lambda h: h.row_remap_pending),
    Field("remapped_rows_failure", "remapped_rows.failure", HEALTH, lambda h: h.row_remap_failed),
    Field("gpu_recovery_action", "gpu_recovery_action", HEALTH, lambda h: h.recovery_action),
    Field("fabric_state", "fabric.state", HEALTH, lambda h: h.fabric_state),
)  # fmt: skip


def smi_uuid(uuid: str) -> str:
    """The peer's uuid label: lowercase, without the `GPU-` (or a MIG device's `MIG-`) prefix."""
    text = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def _gauge(suffix: str, help_text: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + suffix, help_text, labels=labels)


def _info(snapshot: NodeSnapshot, gpu: GpuSample) -> list[str]:
    """gpu_info's label values; "[N/A]" where nvidia-smi prints it on Linux (the WDDM driver model),
    empty where gpulens does not read the field (vbios, compute capability, PCI sub-device id)."""
    ident = gpu.identity
    return [
        smi_uuid(ident.uuid),
        ident.model,
        "[N/A]",
        "[N/A]",
        "",
        snapshot.driver_version,
        ident.pci_bus_id,
        ident.serial,
        "",
        "",
        str(ident.index),
        snapshot.cuda_version,
    ]


def _apps(gpu: GpuSample) -> list[tuple[int, str, int | None]]:
    """(pid, name, used bytes) of every process with a compute context (nvidia-smi's compute apps:
    the MPS server and its clients included, MIG instances' processes under the parent GPU)."""
    lists = gpu.processes or NO_PROCESSES
    procs = [p for p in (*lists.processes, *lists.mps_clients) if p.kind is not ProcessKind.GRAPHICS]
    return [(p.pid, p.name or "", p.used_memory_bytes) for p in sorted(procs, key=lambda p: p.pid)]


def _mig_families() -> dict[str, GaugeMetricFamily]:
    families = {
        f"memory_{kind}": _gauge(
            f"mig_memory_{kind}_bytes", f"Memory of the GPU instance ({kind}).", MIG_LABELS
        )
        for kind in ("total", "used", "free", "reserved")
    }
    for suffix, key in MIG_ACTIVITY:
        families[key] = _gauge(f"mig_{suffix}", f"GPU instance {key} activity (GPM), 0..1.", MIG_LABELS)
    return families


def _mig_memory(m: MigSample) -> dict[str, int | None]:
    free = None
    if m.memory_total_bytes is not None and m.memory_used_bytes is not None:
        free = m.memory_total_bytes - m.memory_used_bytes - (m.memory_reserved_bytes or 0)
    return {
        "memory_total": m.memory_total_bytes,
        "memory_used": m.memory_used_bytes,
        "memory_free": free,
        "memory_reserved": m.memory_reserved_bytes,
    }


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    fields = {f.suffix: _gauge(f.suffix, f.help, UUID) for f in FIELDS}
    count = _gauge("count", "count", UUID)
    info = _gauge(
        "gpu_info",
        f"A metric with a constant '1' value labeled by gpu {', '.join(INFO_LABELS[1:])}.",
        INFO_LABELS,
    )
    energy = CounterMetricFamily(
        PREFIX + "energy_joules",
        "Total energy consumed by the GPU in joules since the driver was last loaded.",
        labels=UUID,
    )
    pcie = {
        d: _gauge(f"pcie_throughput_{d}_bytes_per_second", f"PCIe traffic {verb} by the GPU.", UUID)
        for d, verb in (("tx", "transmitted"), ("rx", "received"))
    }
    app_info = _gauge(
        "compute_app_info",
        "A metric with a constant '1' value labeled by the identity of a process with a compute context"
        " on a GPU.",
        APP_LABELS,
    )
    app_memory = _gauge("compute_app_used_memory_bytes", "GPU memory used by the process.", APP_LABELS)
    apps = _gauge("compute_apps", "Number of processes with a compute context on the GPU.", UUID)
    apps_ok = GaugeMetricFamily(
        PREFIX + "compute_apps_last_collect_success",
        "Whether the most recent per-process collection succeeded (1) or not (0)",
    )
    mig_info = _gauge(
        "mig_info",
        "A metric with a constant '1' value labeled by the identity of a MIG device.",
        MIG_INFO_LABELS,
    )
    mig = _mig_families()
    up = [g for g in snapshot.gpus if g.up]
    apps_failed = False
    for gpu in up:
        uuid = smi_uuid(gpu.identity.uuid)
        info.add_metric(_info(snapshot, gpu), 1.0)
        count.add_metric([uuid], float(snapshot.gpu_count))
        mig_on = gpu.mig_mode is MigMode.ENABLED
        for f in FIELDS:
            if f.reads.area in gpu.failed_areas or (mig_on and not f.on_mig):
                continue
            record = f.reads.record(gpu)
            value = None if record is None else f.read(record)
            if value is not None:
                fields[f.suffix].add_metric([uuid], float(value))
        joules = None if gpu.power_thermal is None else gpu.power_thermal.energy_joules
        if Area.POWER_THERMAL not in gpu.failed_areas and joules is not None:
            energy.add_metric([uuid], joules)
        if Area.PROFILING not in gpu.failed_areas and gpu.profiling is not None:
            rates = dict(gpu.profiling.values)
            for direction, family in pcie.items():
                rate = rates.get(f"pcie_{direction}_bytes_per_second")
                if rate is not None:
                    family.add_metric([uuid], rate)
        if gpu.failed_areas & {Area.PROCESSES, Area.DEVICE}:
            apps_failed = True
        else:
            listed = _apps(gpu)
            apps.add_metric([uuid], float(len(listed)))
            for pid, name, used in listed:
                labels = [uuid, str(pid), name]
                app_info.add_metric(labels, 1.0)
                if used is not None:
                    app_memory.add_metric(labels, float(_mib(used) or 0))
        if mig_on and Area.MIG not in gpu.failed_areas:
            _add_mig(gpu, uuid, mig_info, mig)
    if up:
        apps_ok.add_metric([], 0.0 if apps_failed else 1.0)
    xids = CounterMetricFamily(
        PREFIX + "xid_errors",
        "Number of XID errors observed on the GPU since the exporter started.",
        labels=XID_LABELS,
    )
    xid_last = _gauge(
        "xid_last_timestamp_seconds", "Unix timestamp of the most recently observed XID error.", XID_LABELS
    )
    for x in snapshot.xids:  # outside the GPU reads: visible while a GPU is lost, as with the peer
        if x.gpu_instance is None:
            labels = [smi_uuid(x.uuid), str(x.xid)]
            xids.add_metric(labels, float(x.count))
            xid_last.add_metric(labels, x.last_timestamp)
    collected = GaugeMetricFamily(
        PREFIX + "last_collect_success", "Whether the most recent collection succeeded (1) or not (0)"
    )
    collected.add_metric([], 1.0 if snapshot.nvml_up else 0.0)
    yield from non_empty(info, count, *fields.values(), energy, *pcie.values())
    yield from non_empty(
        app_info, app_memory, apps, apps_ok, mig_info, *mig.values(), xids, xid_last, collected
    )


def _add_mig(
    gpu: GpuSample, uuid: str, mig_info: GaugeMetricFamily, mig: dict[str, GaugeMetricFamily]
) -> None:
    """mig_info per MIG device; memory and activity once per GPU instance (its compute instances
    share the instance's framebuffer and engines)."""
    seen: set[int] = set()
    for m in gpu.mig_instances:
        gi = str(m.gpu_instance)
        mig_info.add_metric([uuid, smi_uuid(m.uuid), gi, str(m.compute_instance), m.profile], 1.0)
        if m.gpu_instance in seen:
            continue
        seen.add(m.gpu_instance)
        for key, value in _mig_memory(m).items():
            if value is not None:
                mig[key].add_metric([uuid, gi], float(value))
        if Area.PROFILING not in gpu.failed_areas:
            values = dict(m.profiling)
            for _, key in MIG_ACTIVITY:
                if key in values:
                    mig[key].add_metric([uuid, gi], float(values[key]))


SPEC = CollectorSpec(
    "nvidia_gpu_exporter_compat",
    False,
    "utkuozdemir/nvidia_gpu_exporter's nvidia_smi_* names and labels",
    collect,
    reads_nvml=False,
    compat=NVIDIA_GPU_EXPORTER,
)
