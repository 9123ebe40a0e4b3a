"""Memory health: ECC mode and error counters, remapped rows (Ampere+), retired pages (pre-Ampere)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    CollectorOptions,
    CollectorSpec,
    add_optional,
    counter,
    gauge,
    gpu_labels,
    non_empty,
    readable,
)
from gpulens.exporter.snapshot import Area, NodeSnapshot


def _flag(value: bool | None) -> float | None:
    return None if value is None else (1.0 if value else 0.0)


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    ecc_on = gauge("gpu_ecc_enabled", "1 if ECC is currently enabled (NVML ECC mode, current).", GPU_LABELS)
    ecc = counter(
        "gpu_ecc_errors_total",
        "ECC errors (NVML total ECC errors); scope volatile = since driver load, aggregate = lifetime.",
        [*GPU_LABELS, "error", "scope"],
    )
    remapped = counter(
        "gpu_remapped_rows_total",
        "Rows remapped, by the kind of error that caused it (NVML remapped rows).",
        [*GPU_LABELS, "kind"],
    )
    pending = gauge(
        "gpu_row_remap_pending",
        "1 if a row remap is pending (needs a GPU reset) (NVML remapped rows).",
        GPU_LABELS,
    )
    failed = gauge("gpu_row_remap_failed", "1 if a row remap failed (NVML remapped rows).", GPU_LABELS)
    retired = gauge(
        "gpu_retired_pages",
        "Retired framebuffer pages by cause (NVML retired pages; pre-Ampere).",
        [*GPU_LABELS, "cause"],
    )
    retired_pending = gauge(
        "gpu_retired_pages_pending", "1 if pages are pending retirement (NVML; pre-Ampere).", GPU_LABELS
    )
    for gpu in readable(snapshot, Area.HEALTH):
        labels = gpu_labels(gpu)
        add_optional(ecc_on, labels, _flag(gpu.ecc_enabled))
        for error, scope, count in gpu.ecc_errors:
            ecc.add_metric([*labels, error, scope], float(count))
        for kind, rows in gpu.remapped_rows:
            remapped.add_metric([*labels, kind], float(rows))
        add_optional(pending, labels, _flag(gpu.row_remap_pending))
        add_optional(failed, labels, _flag(gpu.row_remap_failed))
        for cause, pages in gpu.retired_pages:
            retired.add_metric([*labels, cause], float(pages))
        add_optional(retired_pending, labels, _flag(gpu.retired_pages_pending))
    yield from non_empty(ecc_on, ecc, remapped, pending, failed, retired, retired_pending)


SPEC = CollectorSpec(Area.HEALTH, True, "ECC, remapped rows and retired pages", collect)
