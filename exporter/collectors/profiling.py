"""Profiling-level activity (SM, tensor, DRAM, FP pipes) from NVML GPM on Hopper+.

Whole-GPU values go to `gpu_<metric>_active_ratio` (`gpu_sm_occupancy_ratio` for occupancy), instance
values to `gpu_mig_<metric>_active_ratio`.
`gpulens_profiling_source_info` says per GPU which source fed them (`gpm`; `nvml` when only the
coarse utilization is available, in which case the `*_active_ratio` families are absent).
The activity families are filled here rather than by accessors: the snapshot holds each device's
values as (key, ratio) pairs, read in one pass.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    MIG_LABELS,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    Unit,
    fresh,
    non_empty,
    per_gpu,
    readable,
)
from gpulens.exporter.snapshot import PROFILING_KEYS, Area, GpuSample, NodeSnapshot


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
# key -> (GPM metric, its id, the DCGM profiling field read instead where DCGM serves the GPU)
SOURCES = {
    "graphics": ("GRAPHICS_UTIL", 1, "1001 `DCGM_FI_PROF_GR_ENGINE_ACTIVE`"),
    "sm": ("SM_UTIL", 2, "1002 `DCGM_FI_PROF_SM_ACTIVE`"),
    "sm_occupancy": ("SM_OCCUPANCY", 3, "1003 `DCGM_FI_PROF_SM_OCCUPANCY`"),
    "tensor": ("ANY_TENSOR_UTIL", 5, "1004 `DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`"),
    "dram": ("DRAM_BW_UTIL", 10, "1005 `DCGM_FI_PROF_DRAM_ACTIVE`"),
    "fp64": ("FP64_UTIL", 11, "1006 `DCGM_FI_PROF_PIPE_FP64_ACTIVE`"),
    "fp32": ("FP32_UTIL", 12, "1007 `DCGM_FI_PROF_PIPE_FP32_ACTIVE`"),
    "fp16": ("FP16_UTIL", 13, "1008 `DCGM_FI_PROF_PIPE_FP16_ACTIVE`"),
}


def _source(key: str, mig: bool) -> str:
    metric, number, dcgm = SOURCES[key]
    if mig:
        return (
            f"GPM {metric} ({number}) from `nvmlGpmMigSampleGet(parent, gpu_instance)`, or DCGM field"
            f" {dcgm} of the GPU-instance entity (entity group 4, mapped through"
            " `dcgmGetGpuInstanceHierarchy`)"
        )
    return (
        f"GPM {metric} ({number}) between this sample and the previous one (`nvmlGpmSampleGet` +"
        f" `nvmlGpmMetricsGet`), percent / 100; or DCGM field {dcgm} (a ratio), latest value of a"
        " watch updated every interval"
    )


SOURCE_INFO = FamilySpec[GpuSample](
    "gpulens_profiling_source_info", Kind.GAUGE,
    "Which source feeds the *_active_ratio families of the GPU; always 1.",
    "`--profiling` and what answers: DCGM reachable and profiling this GPU, else"
    " `nvmlGpmQueryDeviceSupport` (docs/dcgm.md)",
    labels=(*GPU_LABELS, "source"), unit=Unit.ALWAYS_ONE,
    label_doc="source (`dcgm`, `gpm`; `nvml` when only `gpu_utilization_ratio` exists)", mig="per GPU",
)  # fmt: skip
GPU_FAMILIES = tuple(
    FamilySpec[GpuSample](
        family_name(key),
        Kind.GAUGE,
        f"Fraction of the sample interval with {DESCRIPTIONS[key]}.",
        _source(key, mig=False),
        unit=Unit.RATIO,
        mig="whole-GPU value on the parent",
    )
    for key in PROFILING_KEYS
)
MIG_FAMILIES = tuple(
    FamilySpec[GpuSample](
        family_name(key, mig=True),
        Kind.GAUGE,
        f"MIG instance: fraction of the sample interval with {DESCRIPTIONS[key]}.",
        _source(key, mig=True),
        labels=tuple(MIG_LABELS),
        unit=Unit.RATIO,
        mig="per instance",
    )
    for key in PROFILING_KEYS
)
FAMILIES = (SOURCE_INFO, *GPU_FAMILIES, *MIG_FAMILIES)


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    source = families[SOURCE_INFO.name]
    gpu_families = {key: families[family_name(key)] for key in PROFILING_KEYS}
    mig_families = {key: families[family_name(key, mig=True)] for key in PROFILING_KEYS}
    for labels, gpu in per_gpu(readable(snapshot, Area.PROFILING)):
        profiling = gpu.profiling
        if profiling is not None:
            source.add_metric([*labels, profiling.source], 1.0)
            for key, value in profiling.values:
                if key in gpu_families:
                    gpu_families[key].add_metric(labels, value)
        for m in gpu.mig_instances:
            for key, value in m.profiling:
                if key in mig_families:
                    mig_families[key].add_metric([*labels, str(m.gpu_instance), m.profile], value)
    yield from non_empty(*families.values())


SPEC = CollectorSpec(
    Area.PROFILING,
    True,
    "SM/tensor/DRAM/FP activity ratios from NVML GPM (Hopper+)",
    collect,
    families=FAMILIES,
)
