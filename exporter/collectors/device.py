"""Identity, liveness and whole-GPU state: gpu_info, gpu_up, utilization, P-state, compute mode, fan.

`gpu_up` and `gpu_info` are exported for every GPU seen, also when it is down, so that alerts and
joins keep working while the GPU is lost or hung. `gpu_info` (identity labels from the GPU and the
node) and `gpu_compute_mode` (the mode as a label) are filled here rather than by an accessor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    Unit,
    add_values,
    flag,
    fresh,
    non_empty,
    per_gpu,
    readable,
    readers,
)
from gpulens.exporter.snapshot import NO_PROCESSES, Area, DeviceReading, GpuSample, NodeSnapshot

INFO = FamilySpec[GpuSample](
    "gpu_info",
    Kind.GAUGE,
    "GPU identity (NVML name, PCI bus id, serial, MIG mode; system driver and CUDA versions); always 1.",
    "`nvmlDeviceGetName`, `GetPciInfo().busId`, `nvmlSystemGetDriverVersion`,"
    " `nvmlSystemGetCudaDriverVersion` (as `12.4`), `GetSerial`, `GetMigMode` (current)",
    labels=(*GPU_LABELS, "model", "pci_bus_id", "driver_version", "cuda_version", "serial", "mig_mode"),
    unit=Unit.ALWAYS_ONE,
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
    unit=Unit.BOOLEAN,
)
MODE = FamilySpec[DeviceReading](
    "gpu_compute_mode",
    Kind.GAUGE,
    "Compute mode (NVML compute mode); 1 for the current mode.",
    "`GetComputeMode`",
    labels=(*GPU_LABELS, "mode"),
    unit=Unit.ALWAYS_ONE,
    label_doc="mode (`default`/`exclusive_thread`/`exclusive_process`/`prohibited`)",
)
_NOT_ON_MIG = "absent (NOT_SUPPORTED on MIG)"

# families read only from GPUs whose device reads succeeded, in render order around MODE
READ: tuple[FamilySpec[DeviceReading], ...] = (
    FamilySpec("gpu_utilization_ratio", Kind.GAUGE,
               "Fraction of the exporter's interval a kernel ran (NVML's utilization samples since the"
               " last read; the last sample period where there are none); absent on MIG.",
               "`GetSamples(GPU_UTILIZATION_SAMPLES)` since the last read, time-weighted mean, else"
               " `GetUtilizationRates().gpu`; / 100", lambda d: d.utilization_ratio, unit=Unit.RATIO,
               mig=_NOT_ON_MIG),
    FamilySpec("gpu_memory_utilization_ratio", Kind.GAUGE,
               "Fraction of the last sample period device memory was read or written"
               " (NVML utilization.memory); absent on MIG.",
               "`GetUtilizationRates().memory` / 100 (memory controller busy)",
               lambda d: d.memory_utilization_ratio, unit=Unit.RATIO, mig=_NOT_ON_MIG),
    FamilySpec("gpu_performance_state", Kind.GAUGE,
               "Current performance state, 0 (max) .. 15 (min) (NVML performance state).",
               "`GetPerformanceState`", lambda d: d.performance_state, unit=Unit.PSTATE),
    MODE,
    FamilySpec("gpu_fan_speed_ratio", Kind.GAUGE,
               "Fan speed as a fraction of maximum (NVML fan speed; absent on fanless boards).",
               "`GetFanSpeed` / 100 (absent on fanless SXM boards)", lambda d: d.fan_speed_ratio,
               unit=Unit.RATIO),
    FamilySpec("gpu_encoder_utilization_ratio", Kind.GAUGE,
               "Video encoder utilization (NVML encoder utilization); absent on MIG.",
               "`GetEncoderUtilization()[0]` / 100", lambda d: d.encoder_utilization_ratio, unit=Unit.RATIO,
               mig=_NOT_ON_MIG),
    FamilySpec("gpu_decoder_utilization_ratio", Kind.GAUGE,
               "Video decoder utilization (NVML decoder utilization); absent on MIG.",
               "`GetDecoderUtilization()[0]` / 100", lambda d: d.decoder_utilization_ratio, unit=Unit.RATIO,
               mig=_NOT_ON_MIG),
    FamilySpec("gpu_persistence_mode", Kind.GAUGE,
               "1 if persistence mode is enabled (NVML persistence mode).",
               "`GetPersistenceMode`", lambda d: flag(d.persistence_mode), unit=Unit.BOOLEAN),
)  # fmt: skip
# read from the process lists, on the GPUs whose device reads succeeded (0 where the lists were not
# read: their failure is reported under the processes collector when it is on)
PROCESSES = FamilySpec[GpuSample](
    "gpu_processes", Kind.GAUGE,
    "Compute and graphics processes with a context on the GPU (all MIG instances).",
    "compute + graphics process lists (deduplicated by pid; MPS clients not included, the MPS"
    " server is)", lambda g: len((g.processes or NO_PROCESSES).processes), unit=Unit.PROCESSES,
    mig="parent, all instances together",
)  # fmt: skip
FAMILIES: tuple[FamilySpec[Any], ...] = (INFO, UP, *READ, PROCESSES)


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
    reading, processes = readers(READ, families), readers((PROCESSES,), families)
    for labels, gpu in per_gpu(readable(snapshot, Area.DEVICE)):
        add_values(processes, labels, gpu)
        device = gpu.device
        if device is None:
            continue
        add_values(reading, labels, device)
        if device.compute_mode is not None:
            mode.add_metric([*labels, device.compute_mode], 1.0)
    yield from non_empty(*families.values())


SPEC = CollectorSpec(
    Area.DEVICE,
    True,
    "identity, gpu_up, utilization, P-state, compute mode, fan, process count",
    collect,
    families=FAMILIES,
)
