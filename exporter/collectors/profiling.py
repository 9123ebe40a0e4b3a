"""Profiling-level activity (SM, tensor, DRAM, FP pipes) from NVML GPM on Hopper+.

Whole-GPU values go to `gpu_<metric>_active_ratio` (`gpu_sm_occupancy_ratio` for occupancy), instance
values to `gpu_mig_<metric>_active_ratio`.
`gpulens_profiling_source_info` says per GPU which source fed them (`gpm`; `nvml` when only the
coarse utilization is available, in which case the `*_active_ratio` families are absent).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    MIG_LABELS,
    CollectorOptions,
    CollectorSpec,
    gauge,
    gpu_labels,
    non_empty,
    readable,
)
from gpulens.exporter.snapshot import PROFILING_KEYS, Area, NodeSnapshot


def family_name(key: str, mig: bool = False) -> str:
    """`sm` -> gpu_sm_active_ratio; `sm_occupancy` -> gpu_sm_occupancy_ratio (occupancy is not activity)."""
    prefix = "gpu_mig_" if mig else "gpu_"
    return f"{prefix}{key}_ratio" if key == "sm_occupancy" else f"{prefix}{key}_active_ratio"


DESCRIPTIONS = {
    "graphics": "graphics or compute engine active (GPM GRAPHICS_UTIL)",
    "sm": "SMs with at least one warp assigned (GPM SM_UTIL)",
    "sm_occupancy": "resident warps relative to the maximum, averaged (GPM SM_OCCUPANCY)",
    "tensor": "any tensor pipe active (GPM ANY_TENSOR_UTIL)",
    "dram": "device memory interface busy, of peak bandwidth (GPM DRAM_BW_UTIL)",
    "fp64": "FP64 pipe active (GPM FP64_UTIL)",
    "fp32": "FP32 pipe active (GPM FP32_UTIL)",
    "fp16": "FP16 pipe active (GPM FP16_UTIL)",
}


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    source = gauge(
        "gpulens_profiling_source_info",
        "Which source feeds the *_active_ratio families of the GPU; always 1.",
        [*GPU_LABELS, "source"],
    )
    gpu_families = {
        key: gauge(
            family_name(key),
            f"Fraction of the sample interval with {DESCRIPTIONS[key]}.",
            GPU_LABELS,
        )
        for key in PROFILING_KEYS
    }
    mig_families = {
        key: gauge(
            family_name(key, mig=True),
            f"MIG instance: fraction of the sample interval with {DESCRIPTIONS[key]}.",
            MIG_LABELS,
        )
        for key in PROFILING_KEYS
    }
    for gpu in readable(snapshot, Area.PROFILING):
        labels = gpu_labels(gpu)
        if gpu.profiling_source:
            source.add_metric([*labels, gpu.profiling_source], 1.0)
        for key, value in gpu.profiling:
            if key in gpu_families:
                gpu_families[key].add_metric(labels, value)
        for m in gpu.mig_instances:
            for key, value in m.profiling:
                if key in mig_families:
                    mig_families[key].add_metric([*labels, str(m.gpu_instance), m.profile], value)
    yield from non_empty(source, *gpu_families.values(), *mig_families.values())


SPEC = CollectorSpec(
    Area.PROFILING, True, "SM/tensor/DRAM/FP activity ratios from NVML GPM (Hopper+)", collect
)
