"""Identity, liveness and whole-GPU state: gpu_info, gpu_up, utilization, P-state, compute mode, fan.

`gpu_up` and `gpu_info` are exported for every GPU seen, also when it is down, so that alerts and
joins keep working while the GPU is lost or hung.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    CollectorOptions,
    CollectorSpec,
    add_optional,
    gauge,
    gpu_labels,
    non_empty,
    readable,
)
from gpulens.exporter.snapshot import Area, NodeSnapshot


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    info = gauge(
        "gpu_info",
        "GPU identity (NVML name, PCI bus id, serial, MIG mode; system driver and CUDA versions); always 1.",
        [*GPU_LABELS, "model", "pci_bus_id", "driver_version", "cuda_version", "serial", "mig_mode"],
    )
    up = gauge(
        "gpu_up",
        "1 if the GPU answered NVML this sample; 0 when lost, failing or its calls timed out.",
        GPU_LABELS,
    )
    util = gauge(
        "gpu_utilization_ratio",
        "Fraction of the last sample period a kernel ran (NVML utilization.gpu); absent on MIG.",
        GPU_LABELS,
    )
    mem_util = gauge(
        "gpu_memory_utilization_ratio",
        "Fraction of the last sample period device memory was read or written"
        " (NVML utilization.memory); absent on MIG.",
        GPU_LABELS,
    )
    pstate = gauge(
        "gpu_performance_state",
        "Current performance state, 0 (max) .. 15 (min) (NVML performance state).",
        GPU_LABELS,
    )
    mode = gauge(
        "gpu_compute_mode", "Compute mode (NVML compute mode); 1 for the current mode.", [*GPU_LABELS, "mode"]
    )
    fan = gauge(
        "gpu_fan_speed_ratio",
        "Fan speed as a fraction of maximum (NVML fan speed; absent on fanless boards).",
        GPU_LABELS,
    )
    encoder = gauge(
        "gpu_encoder_utilization_ratio",
        "Video encoder utilization (NVML encoder utilization); absent on MIG.",
        GPU_LABELS,
    )
    decoder = gauge(
        "gpu_decoder_utilization_ratio",
        "Video decoder utilization (NVML decoder utilization); absent on MIG.",
        GPU_LABELS,
    )
    persistence = gauge(
        "gpu_persistence_mode", "1 if persistence mode is enabled (NVML persistence mode).", GPU_LABELS
    )
    procs = gauge(
        "gpu_processes",
        "Compute and graphics processes with a context on the GPU (all MIG instances).",
        GPU_LABELS,
    )
    for gpu in snapshot.gpus:
        labels = gpu_labels(gpu)
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
        up.add_metric(labels, 1.0 if gpu.up else 0.0)
    for gpu in readable(snapshot, Area.DEVICE):
        labels = gpu_labels(gpu)
        add_optional(util, labels, gpu.utilization_ratio)
        add_optional(mem_util, labels, gpu.memory_utilization_ratio)
        add_optional(pstate, labels, gpu.performance_state)
        if gpu.compute_mode is not None:
            mode.add_metric([*labels, gpu.compute_mode], 1.0)
        add_optional(fan, labels, gpu.fan_speed_ratio)
        add_optional(encoder, labels, gpu.encoder_utilization_ratio)
        add_optional(decoder, labels, gpu.decoder_utilization_ratio)
        if gpu.persistence_mode is not None:
            persistence.add_metric(labels, 1.0 if gpu.persistence_mode else 0.0)
        procs.add_metric(labels, float(len(gpu.processes)))
    yield from non_empty(info, up, util, mem_util, pstate, mode, fan, encoder, decoder, persistence, procs)


SPEC = CollectorSpec(
    Area.DEVICE, True, "identity, gpu_up, utilization, P-state, compute mode, fan, process count", collect
)
