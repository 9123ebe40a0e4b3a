"""`--compat jobstats`: the series Princeton jobstats reads, named as its NVIDIA exporter names them.

jobstats (github.com/PrincetonUniversity/jobstats) finds a Slurm job's GPUs with
`nvidia_gpu_jobId == <jobid>` (the job id is the series' value) or, with `GPU_EXPORTER_JOBID`, a
`jobid` label, and reads per GPU `nvidia_gpu_duty_cycle` (0..100; on MIG
`nvidia_gpu_graphics_util_percent` x 100), `nvidia_gpu_memory_used_bytes` and
`nvidia_gpu_memory_total_bytes`, keyed by `minor_number`. These are the families and labels of the
exporter it ships with (plazonic/nvidia_gpu_prometheus_exporter): every series carries `ordinal`,
`minor_number`, `uuid`, `name`, `GPU_I_ID`, `jobid` and `userid` (empty, hence absent, when no job
holds the device), so `and` matches a usage series with the job series of the same device.

As there, a MIG GPU has a series set for the parent (`GPU_I_ID=""`) and one per MIG device (`uuid` the
MIG UUID, `name` "<model> MIG <profile>", `GPU_I_ID` its GPU instance); utilization
(`nvidia_gpu_duty_cycle`) exists only on GPUs with MIG disabled; power, temperature and fan speed are
repeated on MIG devices; the GPM-style `*_util_percent` families hold ratios 0..1 despite their
names (jobstats multiplies them by 100).

A device's job is the job its mapping file names (the prolog's `/run/gpustat/<gpu>` file, read by the
attribution engine), else the Slurm job whose processes run on it. When several jobs hold one
device (sharing) its series are repeated once per job, so each job's query finds the device.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpulens.exporter.collectors.base import CollectorOptions, CollectorSpec, non_empty
from gpulens.exporter.collectors.holders import slurm_jobs
from gpulens.exporter.compat import JOBSTATS
from gpulens.exporter.snapshot import (
    Area,
    DeviceReading,
    GpuSample,
    MemoryReading,
    MigMode,
    MigSample,
    NodeSnapshot,
    PowerThermalReading,
)

LABELS = ["ordinal", "minor_number", "uuid", "name", "GPU_I_ID", "jobid", "userid"]
ECC_LABELS = ["ordinal", "minor_number", "uuid", "name", "error", "counter"]
PREFIX = "nvidia_gpu_"
# the readings of an area that was not read: every value absent, as when the device cannot say
_NO_MEMORY = MemoryReading()
_NO_DEVICE = DeviceReading()
_NO_POWER_THERMAL = PowerThermalReading()

# (family suffix, HELP, PROFILING_KEYS item): GPM ratios, per device and per MIG device
GPM_FAMILIES: tuple[tuple[str, str, str], ...] = (
    (
        "graphics_util_percent",
        "Percentage of time any compute/graphics app was active on the GPU",
        "graphics",
    ),
    ("sm_util_percent", "Percentage of SMs that were busy", "sm"),
    ("sm_occupancy_percent", "Percentage of warps that were active vs theoretical maximum", "sm_occupancy"),
    (
        "any_tensor_util_percent",
        "Percentage of time the GPU's SMs were doing ANY tensor operations",
        "tensor",
    ),
    ("dram_bw_util_percent", "Percentage of DRAM bw used vs theoretical maximum", "dram"),
    ("fp64_util_percent", "Percentage of time the GPU's SMs were doing non-tensor FP64 math", "fp64"),
    ("fp32_util_percent", "Percentage of time the GPU's SMs were doing non-tensor FP32 math", "fp32"),
    ("fp16_util_percent", "Percentage of time the GPU's SMs were doing non-tensor FP16 math", "fp16"),
)
# whole-GPU rates in bytes per second
RATE_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("pcie_tx_per_sec", "PCIe traffic from this GPU in bytes/sec", "pcie_tx_bytes_per_second"),
    ("pcie_rx_per_sec", "PCIe traffic to this GPU in bytes/sec", "pcie_rx_bytes_per_second"),
    ("nvlink_total_tx_per_sec", "NvLink write bandwidth for all links in bytes/sec",
     "nvlink_tx_bytes_per_second"),
    ("nvlink_total_rx_per_sec", "NvLink read bandwidth for all links in bytes/sec",
     "nvlink_rx_bytes_per_second"),
)  # fmt: skip


def _gauge(suffix: str, help_text: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + suffix, help_text, labels=LABELS if labels is None else labels)


def _v1_used(total: int | None, used: int | None, reserved: int | None) -> float | None:
    """NVML v1 memory info's `used` (total - free: includes the driver's reserve), which the
    jobstats exporter reads; gpulens' native `used` excludes the reserve."""
    if total is None or used is None:
        return None
    return float(used + (reserved or 0))


def minor_number(gpu: GpuSample) -> str:
    """NVML's minor number (/dev/nvidia<N>); the index where NVML cannot say (documented)."""
    minor = gpu.identity.minor_number
    return str(gpu.identity.index if minor is None else minor)


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    num = GaugeMetricFamily(PREFIX + "num_devices", "Number of GPU devices")
    used = _gauge("memory_used_bytes", "Memory used by the GPU device in bytes")
    total = _gauge("memory_total_bytes", "Total memory of the GPU device in bytes")
    duty = _gauge(
        "duty_cycle",
        "Percent of time over the past sample period during which one or more kernels were executing"
        " on the GPU device",
    )
    power = _gauge("power_usage_milliwatts", "Power usage of the GPU device in milliwatts")
    temperature = _gauge("temperature_celsius", "Temperature of the GPU device in celsius")
    fan = _gauge("fanspeed_percent", "Fanspeed of the GPU device as a percent of its maximum")
    job_id = _gauge("jobId", "JobId number of a job currently using this GPU as reported by Slurm")
    job_uid = _gauge("jobUid", "Uid number of user running jobs on this GPU")
    ecc = _gauge("ecc_errors", "ECC Errors, with labels describing what they are", ECC_LABELS)
    gpm = {key: _gauge(suffix, text) for suffix, text, key in GPM_FAMILIES}
    rates = {key: _gauge(suffix, text) for suffix, text, key in RATE_FAMILIES}
    if snapshot.nvml_up:
        num.add_metric([], float(snapshot.gpu_count))
    jobs = slurm_jobs(snapshot)
    for gpu in snapshot.gpus:
        if not gpu.up:
            continue
        ident = gpu.identity
        ordinal, minor = str(ident.index), minor_number(gpu)
        mig_on = gpu.mig_mode is MigMode.ENABLED
        gpu_memory = gpu.memory or _NO_MEMORY
        device = gpu.device or _NO_DEVICE
        power_thermal = gpu.power_thermal or _NO_POWER_THERMAL
        gpu_profiling = () if gpu.profiling is None else gpu.profiling.values
        devices: list[tuple[list[str], MigSample | None]] = [
            ([ordinal, minor, ident.uuid, ident.model, ""], None)
        ]
        if mig_on:
            devices += [
                ([ordinal, minor, m.uuid, f"{ident.model} MIG {m.profile}", str(m.gpu_instance)], m)
                for m in gpu.mig_instances
            ]
        for base, instance in devices:
            gi = None if instance is None else instance.gpu_instance
            holders = jobs.get((ident.index, gi)) or [("", None)]
            for job, uid in holders:
                labels = [*base, job, "" if uid is None else str(uid)]
                if job.isdigit():
                    job_id.add_metric(labels, float(job))
                if uid is not None:
                    job_uid.add_metric(labels, float(uid))
                if instance is None:
                    memory = (
                        gpu_memory.memory_total_bytes,
                        gpu_memory.memory_used_bytes,
                        gpu_memory.memory_reserved_bytes,
                    )
                else:
                    memory = (
                        instance.memory_total_bytes,
                        instance.memory_used_bytes,
                        instance.memory_reserved_bytes,
                    )
                if Area.MEMORY not in gpu.failed_areas:
                    v1_used = _v1_used(*memory)
                    if v1_used is not None:
                        used.add_metric(labels, v1_used)
                    if memory[0] is not None:
                        total.add_metric(labels, float(memory[0]))
                utilization = device.utilization_ratio
                if not mig_on and utilization is not None and Area.DEVICE not in gpu.failed_areas:
                    duty.add_metric(labels, utilization * 100.0)
                if Area.POWER_THERMAL not in gpu.failed_areas:
                    if power_thermal.power_watts is not None:
                        power.add_metric(labels, power_thermal.power_watts * 1000.0)
                    if power_thermal.temperature_celsius is not None:
                        temperature.add_metric(labels, float(power_thermal.temperature_celsius))
                if device.fan_speed_ratio is not None and Area.DEVICE not in gpu.failed_areas:
                    fan.add_metric(labels, device.fan_speed_ratio * 100.0)
                if Area.PROFILING not in gpu.failed_areas:
                    values = dict(gpu_profiling if instance is None else instance.profiling)
                    for key, family in gpm.items():
                        if key in values:
                            family.add_metric(labels, float(values[key]))
                    if instance is None:
                        for key, family in rates.items():
                            if key in values:
                                family.add_metric(labels, float(values[key]))
        if Area.HEALTH not in gpu.failed_areas and gpu.health is not None:
            for error, scope, count in gpu.health.ecc_errors:
                ecc.add_metric([ordinal, minor, ident.uuid, ident.model, error, scope], float(count))
    yield from non_empty(num, used, total, duty, power, temperature, fan, job_id, job_uid, ecc)
    yield from non_empty(*gpm.values(), *rates.values())


SPEC = CollectorSpec(
    "jobstats_compat",
    False,
    "Princeton jobstats' nvidia_gpu_* names and labels",
    collect,
    reads_nvml=False,
    compat=JOBSTATS,
)
