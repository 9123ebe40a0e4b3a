"""Memory health: ECC mode and error counters, remapped rows (Ampere+), retired pages (pre-Ampere).

The families keyed by error kind or cause are filled here rather than by an accessor: one series
per (error, scope), kind or cause the GPU reports.
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

_REMAP_MIG = "parent only; NOT_SUPPORTED while MIG instances exist, then absent"

ECC = FamilySpec[GpuSample](
    "gpu_ecc_errors_total",
    Kind.COUNTER,
    "ECC errors (NVML total ECC errors); scope volatile = since driver load, aggregate = lifetime.",
    "`GetTotalEccErrors(type, counter)`; only while ECC is enabled",
    labels=(*GPU_LABELS, "error", "scope"),
    unit="errors",
    label_doc="error (`corrected`/`uncorrected`), scope (`volatile`/`aggregate`)",
)
REMAPPED = FamilySpec[GpuSample](
    "gpu_remapped_rows_total",
    Kind.COUNTER,
    "Rows remapped, by the kind of error that caused it (NVML remapped rows).",
    "`GetRemappedRows()` 4-tuple (Ampere+)",
    labels=(*GPU_LABELS, "kind"),
    unit="rows",
    label_doc="kind (`correctable`/`uncorrectable`)",
    mig=_REMAP_MIG,
)
RETIRED = FamilySpec[GpuSample](
    "gpu_retired_pages",
    Kind.GAUGE,
    "Retired framebuffer pages by cause (NVML retired pages; pre-Ampere).",
    "`len(GetRetiredPages(cause))` (pre-Ampere only)",
    labels=(*GPU_LABELS, "cause"),
    unit="pages",
    label_doc="cause (`single_bit_ecc`/`double_bit_ecc`)",
)

FAMILIES: tuple[FamilySpec[GpuSample], ...] = (
    FamilySpec("gpu_ecc_enabled", Kind.GAUGE, "1 if ECC is currently enabled (NVML ECC mode, current).",
               "`GetEccMode()[0]` (current)", lambda g: flag(g.ecc_enabled), unit="0/1"),
    ECC,
    REMAPPED,
    FamilySpec("gpu_row_remap_pending", Kind.GAUGE,
               "1 if a row remap is pending (needs a GPU reset) (NVML remapped rows).",
               "`GetRemappedRows()` pending", lambda g: flag(g.row_remap_pending), unit="0/1",
               mig=_REMAP_MIG),
    FamilySpec("gpu_row_remap_failed", Kind.GAUGE, "1 if a row remap failed (NVML remapped rows).",
               "`GetRemappedRows()` failure occurred", lambda g: flag(g.row_remap_failed), unit="0/1",
               mig=_REMAP_MIG),
    RETIRED,
    FamilySpec("gpu_retired_pages_pending", Kind.GAUGE,
               "1 if pages are pending retirement (NVML; pre-Ampere).",
               "`GetRetiredPagesPendingStatus` (pre-Ampere only)", lambda g: flag(g.retired_pages_pending),
               unit="0/1"),
)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    reading = readers(FAMILIES, families)
    ecc, remapped, retired = families[ECC.name], families[REMAPPED.name], families[RETIRED.name]
    for labels, gpu in per_gpu(readable(snapshot, Area.HEALTH)):
        add_values(reading, labels, gpu)
        for error, scope, count in gpu.ecc_errors:
            ecc.add_metric([*labels, error, scope], float(count))
        for kind, rows in gpu.remapped_rows:
            remapped.add_metric([*labels, kind], float(rows))
        for cause, pages in gpu.retired_pages:
            retired.add_metric([*labels, cause], float(pages))
    yield from non_empty(*families.values())


SPEC = CollectorSpec(Area.HEALTH, True, "ECC, remapped rows and retired pages", collect, families=FAMILIES)
