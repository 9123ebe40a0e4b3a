"""Memory health: ECC mode and error counters, remapped rows (Ampere+), retired pages (pre-Ampere).

The families keyed by error kind or cause are filled here rather than by an accessor: one series
per (error, scope), kind or cause the GPU reports.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    HEALTH,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    Unit,
    add_values,
    flag,
    fresh,
    non_empty,
    per_gpu_record,
    readers,
)
from gpulens.exporter.snapshot import HealthReading, NodeSnapshot

_REMAP_MIG = "parent only; NOT_SUPPORTED while MIG instances exist, then absent"

ECC = FamilySpec[HealthReading](
    "gpu_ecc_errors_total",
    Kind.COUNTER,
    "ECC errors (NVML total ECC errors); scope volatile = since driver load, aggregate = lifetime.",
    "`GetTotalEccErrors(type, counter)`; only while ECC is enabled",
    labels=(*GPU_LABELS, "error", "scope"),
    unit=Unit.ERRORS,
    label_doc="error (`corrected`/`uncorrected`), scope (`volatile`/`aggregate`)",
)
REMAPPED = FamilySpec[HealthReading](
    "gpu_remapped_rows_total",
    Kind.COUNTER,
    "Rows remapped, by the kind of error that caused it (NVML remapped rows).",
    "`GetRemappedRows()` 4-tuple (Ampere+)",
    labels=(*GPU_LABELS, "kind"),
    unit=Unit.ROWS,
    label_doc="kind (`correctable`/`uncorrectable`)",
    mig=_REMAP_MIG,
)
RETIRED = FamilySpec[HealthReading](
    "gpu_retired_pages",
    Kind.GAUGE,
    "Retired framebuffer pages by cause (NVML retired pages; pre-Ampere).",
    "`len(GetRetiredPages(cause))` (pre-Ampere only)",
    labels=(*GPU_LABELS, "cause"),
    unit=Unit.PAGES,
    label_doc="cause (`single_bit_ecc`/`double_bit_ecc`)",
)

FAMILIES: tuple[FamilySpec[HealthReading], ...] = (
    FamilySpec("gpu_ecc_enabled", Kind.GAUGE, "1 if ECC is currently enabled (NVML ECC mode, current).",
               "`GetEccMode()[0]` (current)", lambda h: flag(h.ecc_enabled), unit=Unit.BOOLEAN),
    ECC,
    REMAPPED,
    FamilySpec("gpu_row_remap_pending", Kind.GAUGE,
               "1 if a row remap is pending (needs a GPU reset) (NVML remapped rows).",
               "`GetRemappedRows()` pending", lambda h: flag(h.row_remap_pending), unit=Unit.BOOLEAN,
               mig=_REMAP_MIG),
    FamilySpec("gpu_row_remap_failed", Kind.GAUGE, "1 if a row remap failed (NVML remapped rows).",
               "`GetRemappedRows()` failure occurred", lambda h: flag(h.row_remap_failed), unit=Unit.BOOLEAN,
               mig=_REMAP_MIG),
    RETIRED,
    FamilySpec("gpu_retired_pages_pending", Kind.GAUGE,
               "1 if pages are pending retirement (NVML; pre-Ampere).",
               "`GetRetiredPagesPendingStatus` (pre-Ampere only)", lambda h: flag(h.retired_pages_pending),
               unit=Unit.BOOLEAN),
)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    reading = readers(FAMILIES, families)
    ecc, remapped, retired = families[ECC.name], families[REMAPPED.name], families[RETIRED.name]
    for labels, health in per_gpu_record(snapshot, HEALTH):
        add_values(reading, labels, health)
        for error, scope, count in health.ecc_errors:
            ecc.add_metric([*labels, error, scope], float(count))
        for kind, rows in health.remapped_rows:
            remapped.add_metric([*labels, kind], float(rows))
        for cause, pages in health.retired_pages:
            retired.add_metric([*labels, cause], float(pages))
    yield from non_empty(*families.values())


SPEC = CollectorSpec(HEALTH.area, True, "ECC, remapped rows and retired pages", collect, families=FAMILIES)
