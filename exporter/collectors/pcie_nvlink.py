"""PCIe and NVLink traffic counters, replays, link state and NVLink error counters.

NVLink byte and error counters are summed over the GPU's links by default: an HGX node has 18 links
per GPU and five error kinds, so per-link counters were 27 % of a large node's series, nearly all 0.
`--collector.pcie_nvlink.per-link` adds the `link` label back (the same family names, so queries
that sum over links work either way). Link state (`gpu_nvlink_link_up`) stays per link: a link
that goes down is what its alert names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

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


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    tx = counter(
        "gpu_pcie_tx_bytes_total", "Bytes sent over PCIe (NVML field 197, PCIE_COUNT_TX_BYTES).", GPU_LABELS
    )
    rx = counter(
        "gpu_pcie_rx_bytes_total",
        "Bytes received over PCIe (NVML field 198, PCIE_COUNT_RX_BYTES).",
        GPU_LABELS,
    )
    replays = counter("gpu_pcie_replays_total", "PCIe replays (NVML PCIe replay counter).", GPU_LABELS)
    gen = gauge("gpu_pcie_link_generation", "Current PCIe link generation (NVML).", GPU_LABELS)
    width = gauge("gpu_pcie_link_width", "Current PCIe link width in lanes (NVML).", GPU_LABELS)
    link_labels = [*GPU_LABELS, "link"]
    link_up = gauge("gpu_nvlink_link_up", "1 if the NVLink link is active (NVML NVLink state).", link_labels)
    per_link = options.nvlink_per_link
    counter_labels = link_labels if per_link else GPU_LABELS
    scope = "" if per_link else ", summed over the GPU's links"
    nv_tx = counter(
        "gpu_nvlink_tx_bytes_total",
        f"NVLink data bytes sent (NVML field 138 THROUGHPUT_DATA_TX, KiB x 1024){scope}.",
        counter_labels,
    )
    nv_rx = counter(
        "gpu_nvlink_rx_bytes_total",
        f"NVLink data bytes received (NVML field 139 THROUGHPUT_DATA_RX, KiB x 1024){scope}.",
        counter_labels,
    )
    nv_err = counter(
        "gpu_nvlink_errors_total",
        f"NVLink data-link errors by kind (NVML NVLink error counters){scope}.",
        [*counter_labels, "kind"],
    )
    for gpu in readable(snapshot, Area.PCIE_NVLINK):
        labels = gpu_labels(gpu)
        add_optional(tx, labels, gpu.pcie_tx_bytes)
        add_optional(rx, labels, gpu.pcie_rx_bytes)
        add_optional(replays, labels, gpu.pcie_replays)
        add_optional(gen, labels, gpu.pcie_link_generation)
        add_optional(width, labels, gpu.pcie_link_width)
        for link in gpu.nvlinks:
            ll = [*labels, str(link.link)]
            link_up.add_metric(ll, 1.0 if link.up else 0.0)
            if per_link:
                add_optional(nv_tx, ll, link.tx_bytes)
                add_optional(nv_rx, ll, link.rx_bytes)
                for kind, count in link.errors:
                    nv_err.add_metric([*ll, kind], float(count))
        if not per_link and gpu.nvlinks:
            add_optional(nv_tx, labels, _sum(link.tx_bytes for link in gpu.nvlinks))
            add_optional(nv_rx, labels, _sum(link.rx_bytes for link in gpu.nvlinks))
            errors: dict[str, int] = {}
            for link in gpu.nvlinks:
                for kind, count in link.errors:
                    errors[kind] = errors.get(kind, 0) + count
            for kind, count in errors.items():
                nv_err.add_metric([*labels, kind], float(count))
    yield from non_empty(tx, rx, replays, gen, width, link_up, nv_tx, nv_rx, nv_err)


def _sum(values: Iterable[int | None]) -> int | None:
    """Sum of the links that report a value; None when none does (absent beats a fake zero)."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


SPEC = CollectorSpec(
    Area.PCIE_NVLINK, True, "PCIe/NVLink byte counters, replays, link state and NVLink errors", collect
)
