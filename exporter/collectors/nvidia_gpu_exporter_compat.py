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

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.exporter.collectors.base import CollectorOptions, CollectorSpec, non_empty
from gpulens.exporter.compat import NVIDIA_GPU_EXPORTER
from gpulens.exporter.snapshot import Area, GpuSample, MigSample, NodeSnapshot

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
COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}
# the reasons nvidia-smi has a clocks_event_reasons.<reason> field for (display_clock_setting: none)
CLOCK_EVENT_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sync_boost",
)
# (family suffix, MigSample.profiling key): the peer's per-GPU-instance GPM ratios
MIG_ACTIVITY = (
    ("graphics_activity_ratio", "graphics"),
    ("sm_activity_ratio", "sm"),
    ("sm_occupancy_ratio", "sm_occupancy"),
    ("tensor_activity_ratio", "tensor"),
)
Value = float | int | bool | None


@dataclass(frozen=True)
class Field:
    """One `nvidia-smi --query-gpu` field as the peer exports it: the family suffix, its HELP (the
    field as nvidia-smi returns it), the collector area the value comes from, and its reader (the
    value already in the peer's unit; None: N/A, no series)."""

    suffix: str
    help: str
    area: Area
    read: Callable[[GpuSample], Value]


def _mib(value: int | None) -> Value:
    """Bytes as nvidia-smi shows them: whole MiB, exported times 1048576."""
    return None if value is None else (int(value) // MIB) * MIB


def _ecc(error: str, scope: str) -> Callable[[GpuSample], Value]:
    return lambda g: next((c for e, s, c in g.ecc_errors if e == error and s == scope), None)


def _pair(attribute: str, key: str) -> Callable[[GpuSample], Value]:
    return lambda g: next((v for k, v in getattr(g, attribute) if k == key), None)


def _event(reason: str) -> Callable[[GpuSample], Value]:
    return lambda g: next((active for r, active in g.clock_events if r == reason), None)


def _event_seconds(reason: str) -> Callable[[GpuSample], Value]:
    return lambda g: next((s for r, s in g.clock_event_seconds if r == reason), None)


def _profiling(key: str) -> Callable[[GpuSample], Value]:
    return lambda g: dict(g.profiling).get(key)


def _not_on_mig(read: Callable[[GpuSample], Value]) -> Callable[[GpuSample], Value]:
    """nvidia-smi prints [N/A] for whole-GPU utilization on a MIG-enabled GPU."""
    return lambda g: None if g.mig_mode == "enabled" else read(g)


FIELDS: tuple[Field, ...] = (
    Field("index", "index", Area.DEVICE, lambda g: g.identity.index),
    Field("utilization_gpu_ratio", "utilization.gpu [%]", Area.DEVICE,
          _not_on_mig(lambda g: g.utilization_ratio)),
    Field("utilization_memory_ratio", "utilization.memory [%]", Area.DEVICE,
          _not_on_mig(lambda g: g.memory_utilization_ratio)),
    Field("utilization_encoder_ratio", "utilization.encoder [%]", Area.DEVICE,
          _not_on_mig(lambda g: g.encoder_utilization_ratio)),
    Field("utilization_decoder_ratio", "utilization.decoder [%]", Area.DEVICE,
          _not_on_mig(lambda g: g.decoder_utilization_ratio)),
    Field("pstate", "pstate", Area.DEVICE, lambda g: g.performance_state),
    Field("compute_mode", "compute_mode", Area.DEVICE,
          lambda g: None if g.compute_mode is None else COMPUTE_MODES.get(g.compute_mode)),
    Field("fan_speed_ratio", "fan.speed [%]", Area.DEVICE, lambda g: g.fan_speed_ratio),
    Field("persistence_mode", "persistence_mode", Area.DEVICE, lambda g: g.persistence_mode),
    Field("mig_mode_current", "mig.mode.current", Area.DEVICE,
          lambda g: None if g.mig_mode is None else g.mig_mode == "enabled"),
    Field("memory_total_bytes", "memory.total [MiB]", Area.MEMORY, lambda g: _mib(g.memory_total_bytes)),
    Field("memory_used_bytes", "memory.used [MiB]", Area.MEMORY, lambda g: _mib(g.memory_used_bytes)),
    Field("memory_free_bytes", "memory.free [MiB]", Area.MEMORY, lambda g: _mib(g.memory_free_bytes)),
    Field("memory_reserved_bytes", "memory.reserved [MiB]", Area.MEMORY,
          lambda g: _mib(g.memory_reserved_bytes)),
    Field("power_draw_watts", "power.draw [W]", Area.POWER_THERMAL, lambda g: g.power_watts),
    Field("enforced_power_limit_watts", "enforced.power.limit [W]", Area.POWER_THERMAL,
          lambda g: g.power_limit_watts),
    Field("temperature_gpu", "temperature.gpu", Area.POWER_THERMAL, lambda g: g.temperature_celsius),
    Field("temperature_memory", "temperature.memory", Area.POWER_THERMAL,
          lambda g: g.memory_temperature_celsius),
    Field("clocks_current_graphics_clock_hz", "clocks.current.graphics [MHz]", Area.CLOCKS,
          lambda g: g.graphics_clock_hertz),
    Field("clocks_current_sm_clock_hz", "clocks.current.sm [MHz]", Area.CLOCKS, lambda g: g.sm_clock_hertz),
    Field("clocks_current_memory_clock_hz", "clocks.current.memory [MHz]", Area.CLOCKS,
          lambda g: g.memory_clock_hertz),
    Field("clocks_current_video_clock_hz", "clocks.current.video [MHz]", Area.CLOCKS,
          lambda g: g.video_clock_hertz),
    Field("clocks_max_graphics_clock_hz", "clocks.max.graphics [MHz]", Area.CLOCKS,
          lambda g: g.graphics_clock_max_hertz),
    Field("clocks_max_sm_clock_hz", "clocks.max.sm [MHz]", Area.CLOCKS, lambda g: g.sm_clock_max_hertz),
    Field("clocks_max_memory_clock_hz", "clocks.max.memory [MHz]", Area.CLOCKS,
          lambda g: g.memory_clock_max_hertz),
    *(
        Field(f"clocks_event_reasons_{r}", f"clocks_event_reasons.{r}", Area.CLOCKS, _event(r))
        for r in CLOCK_EVENT_REASONS
    ),
    *(
        Field(f"clocks_event_reasons_counters_{r}_seconds", f"clocks_event_reasons_counters.{r} [us]",
              Area.CLOCKS, _event_seconds(r))
        for r in ("sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                  "hw_power_brake_slowdown")
    ),
    Field("pcie_link_gen_current", "pcie.link.gen.current", Area.PCIE_NVLINK,
          lambda g: g.pcie_link_generation),
    Field("pcie_link_width_current", "pcie.link.width.current", Area.PCIE_NVLINK,
          lambda g: g.pcie_link_width),
    Field("ecc_mode_current", "ecc.mode.current", Area.HEALTH, lambda g: g.ecc_enabled),
    *(
        Field(f"ecc_errors_{e}_{s}_total", f"ecc.errors.{e}.{s}.total", Area.HEALTH, _ecc(e, s))
        for e in ("corrected", "uncorrected")
        for s in ("volatile", "aggregate")
    ),
    Field("retired_pages_single_bit_ecc_count", "retired_pages.single_bit_ecc.count", Area.HEALTH,
          _pair("retired_pages", "single_bit_ecc")),
    Field("retired_pages_double_bit_count", "retired_pages.double_bit.count", Area.HEALTH,
          _pair("retired_pages", "double_bit_ecc")),
    Field("retired_pages_pending", "retired_pages.pending", Area.HEALTH, lambda g: g.retired_pages_pending),
    Field("remapped_rows_correctable", "remapped_rows.correctable", Area.HEALTH,
          _pair("remapped_rows", "correctable")),
    Field("remapped_rows_uncorrectable", "remapped_rows.uncorrectable", Area.HEALTH,
          _pair("remapped_rows", "uncorrectable")),
    Field("remapped_rows_pending", "remapped_rows.pending", Area.HEALTH, lambda g: g.row_remap_pending),
    Field("remapped_rows_failure", "remapped_rows.failure", Area.HEALTH, lambda g: g.row_remap_failed),
    Field("gpu_recovery_action", "gpu_recovery_action", Area.HEALTH, lambda g: g.recovery_action),
    Field("fabric_state", "fabric.state", Area.HEALTH, lambda g: g.fabric_state),
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
    procs = [p for p in (*gpu.processes, *gpu.mps_clients) if p.kind != "graphics"]
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
        for f in FIELDS:
            if f.area not in gpu.failed_areas:
                value = f.read(gpu)
                if value is not None:
                    fields[f.suffix].add_metric([uuid], float(value))
        if Area.POWER_THERMAL not in gpu.failed_areas and gpu.energy_joules is not None:
            energy.add_metric([uuid], gpu.energy_joules)
        if Area.PROFILING not in gpu.failed_areas:
            rates = dict(gpu.profiling)
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
        if gpu.mig_mode == "enabled" and Area.MIG not in gpu.failed_areas:
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
