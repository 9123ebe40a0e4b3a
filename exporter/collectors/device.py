"""Identity, liveness and whole-GPU state: gpu_info, gpu_up, utilization, P-state, compute mode, fan.

`gpu_up` and `gpu_info` are exported for every GPU seen, also when it is down, so that alerts and
joins keep working while the GPU is lost or hung. `gpu_info` (identity labels from the GPU and the
node) and `gpu_compute_mode` (the mode as a label) are filled here rather than by an accessor.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    add_values,
    flag,
    fresh,
    non_empty,
    per_gpu,
    readable,
    readers,
)
from gpulens.exporter.snapshot import Area, GpuSample, NodeSnapshot

INFO = FamilySpec[GpuSample](
    "gpu_info",
    Kind.GAUGE,
    "GPU identity (NVML name, PCI bus id, serial, MIG mode; system driver and CUDA versions); always 1.",
    "`nvmlDeviceGetName`, `GetPciInfo().busId`, `nvmlSystemGetDriverVersion`,"
    " `nvmlSystemGetCudaDriverVersion` (as `12.4`), `GetSerial`, `GetMigMode` (current)",
    labels=(*GPU_LABELS, "model", "pci_bus_id", "driver_version", "cuda_version", "serial", "mig_mode"),
    unit="always 1",
    label_doc="model, pci_bus_id, driver_version, cuda_version, serial, mig_mode"
    " (`enabled`/`disabled`/`unsupported`)",
)
UP = FamilySpec[GpuSample](
    "gpu_up",
    Kind.GAUGE,
    "1 if the GPU answered NVML this sample; 0 when lost, failing or its calls timed out.",
    "0 when the GPU is lost (`GPU_IS_LOST`, `GPU_NOT_FOUND`, `RESET_REQUIRED`), a read raised, or its"
    " calls did not return within `--nvml.timeout`",
    lambda g: 1.0 if g.up else 0.0,
    unit="0/1",
)
MODE = FamilySpec[GpuSample](
    "gpu_compute_mode",
    Kind.GAUGE,
    "Compute mode (NVML compute mode); 1 for the current mode.",
    "`GetComputeMode`",
    labels=(*GPU_LABELS, "mode"),
    unit="always 1",
    label_doc="mode (`default`/`exclusive_thread`/`exclusive_process`/`prohibited`)",
)
_NOT_ON_MIG = "absent (NOT_SUPPORTED on MIG)"

# families read only from GPUs whose device reads succeeded, in render order around MODE
READ: tuple[FamilySpec[GpuSample], ...] = (
    FamilySpec("gpu_utilization_ratio", Kind.GAUGE,
               "Fraction of the last sample period a kernel ran (NVML utilization.gpu); absent on MIG.",
               "`GetUtilizationRates().gpu` / 100", lambda g: g.utilization_ratio, unit="ratio",
               mig=_NOT_ON_MIG),
    FamilySpec("gpu_memory_utilization_ratio", Kind.GAUGE,
               "Fraction of the last sample period device memory was read or written"
               " (NVML utilization.memory); absent on MIG.",
               "`GetUtilizationRates().memory` / 100 (memory controller busy)",
               lambda g: g.memory_utilization_ratio, unit="ratio", mig=_NOT_ON_MIG),
    FamilySpec("gpu_performance_state", Kind.GAUGE,
               "Current performance state, 0 (max) .. 15 (min) (NVML performance state).",
               "`GetPerformanceState`", lambda g: g.performance_state, unit="P-state 0..15"),
    MODE,
    FamilySpec("gpu_fan_speed_ratio", Kind.GAUGE,
               "Fan speed as a fraction of maximum (NVML fan speed; absent on fanless boards).",
               "`GetFanSpeed` / 100 (absent on fanless SXM boards)", lambda g: g.fan_speed_ratio,
               unit="ratio"),
    FamilySpec("gpu_encoder_utilization_ratio", Kind.GAUGE,
               "Video encoder utilization (NVML encoder utilization); absent on MIG.",
               "`GetEncoderUtilization()[0]` / 100", lambda g: g.encoder_utilization_ratio, unit="ratio",
               mig=_NOT_ON_MIG),
    FamilySpec("gpu_decoder_utilization_ratio", Kind.GAUGE,
               "Video decoder utilization (NVML decoder utilization); absent on MIG.",
               "`GetDecoderUtilization()[0]` / 100", lambda g: g.decoder_utilization_ratio, unit="ratio",
               mig=_NOT_ON_MIG),
    FamilySpec("gpu_persistence_mode", Kind.GAUGE,
               "1 if persistence mode is enabled (NVML persistence mode).",
               "`GetPersistenceMode`", lambda g: flag(g.persistence_mode), unit="0/1"),
    FamilySpec("gpu_processes", Kind.GAUGE,
               "Compute and graphics processes with a context on the GPU (all MIG instances).",
               "compute + graphics process lists (deduplicated by pid; MPS clients not included, the MPS"
               " server is)", lambda g: len(g.processes), unit="processes",
               mig="parent, all instances together"),
)  # fmt: skip
FAMILIES = (INFO, UP, *READ)


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    info, mode, every = families[INFO.name], families[MODE.name], readers((UP,), families)
    for labels, gpu in per_gpu(snapshot.gpus):
        ident = gpu.identity
        info.add_metric(
            [
                *labels,
                ident.model,
                ident.pci_bus_id,
                snapshot.driver_version,
                snapshot.cuda_version,
                ident.serial,
                gpu.mig_mode or "unsupported",
            ],
            1.0,
        )
        add_values(every, labels, gpu)
    reading = readers(READ, families)
    for labels, gpu in per_gpu(readable(snapshot, Area.DEVICE)):
        add_values(reading, labels, gpu)
        if gpu.compute_mode is not None:
            mode.add_metric([*labels, gpu.compute_mode], 1.0)
    yield from non_empty(*families.values())


SPEC = CollectorSpec(
    Area.DEVICE,
    True,
    "identity, gpu_up, utilization, P-state, compute mode, fan, process count",
    collect,
    families=FAMILIES,
)
