"""PCIe and NVLink traffic counters, replays, link state and NVLink error counters.

NVLink byte and error counters are summed over the GPU's links by default: an HGX node has 18 links
per GPU and five error kinds, so per-link counters were 27 % of a large node's series, nearly all 0.
`--collector.pcie_nvlink.per-link` adds the `link` label back (the same family names, so queries
that sum over links work either way). Link state (`gpu_nvlink_link_up`) stays per link: a link
that goes down is what its alert names. The NVLink families are filled here rather than by an
accessor: their rows are links (or sums over them), and their labels follow the option.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    PCIE_NVLINK,
    CollectorOptions,
    CollectorSpec,
    Family,
    FamilySpec,
    Kind,
    Unit,
    add_optional,
    add_values,
    non_empty,
    per_gpu_record,
    readers,
)
from gpulens.exporter.snapshot import NodeSnapshot, NvLinkErrorKind, PcieNvlinkReading

LINK_LABELS = (*GPU_LABELS, "link")
_PER_LINK = "link with `--collector.pcie_nvlink.per-link`"
_SCOPE = ", summed over the GPU's links"  # the counters' HELP ends so unless per link

LINK_UP = FamilySpec[PcieNvlinkReading](
    "gpu_nvlink_link_up",
    Kind.GAUGE,
    "1 if the NVLink link is active (NVML NVLink state).",
    "`GetNvLinkState` for links 0..(field 91 `NVLINK_LINK_COUNT`)",
    labels=LINK_LABELS,
    unit=Unit.BOOLEAN,
)
NV_TX = FamilySpec[PcieNvlinkReading](
    "gpu_nvlink_tx_bytes_total",
    Kind.COUNTER,
    f"NVLink data bytes sent (NVML field 138 THROUGHPUT_DATA_TX, KiB x 1024){_SCOPE}.",
    "field 138 `NVLINK_THROUGHPUT_DATA_TX` with the link as scope (KiB x 1024)",
    unit=Unit.BYTES,
    label_doc=f"({_PER_LINK}; else summed over the GPU's links)",
)
NV_RX = FamilySpec[PcieNvlinkReading](
    "gpu_nvlink_rx_bytes_total",
    Kind.COUNTER,
    f"NVLink data bytes received (NVML field 139 THROUGHPUT_DATA_RX, KiB x 1024){_SCOPE}.",
    "field 139 `NVLINK_THROUGHPUT_DATA_RX` with the link as scope (KiB x 1024)",
    unit=Unit.BYTES,
    label_doc=f"({_PER_LINK}; else summed over the GPU's links)",
)
NV_ERR = FamilySpec[PcieNvlinkReading](
    "gpu_nvlink_errors_total",
    Kind.COUNTER,
    f"NVLink data-link errors by kind (NVML NVLink error counters){_SCOPE}.",
    "per-link fields `NVLINK_<KIND>_ERROR_COUNT_L<n>` (links 0-11, one field call per GPU), else"
    " `GetNvLinkErrorCounter(link, NVML_NVLINK_ERROR_DL_*)`",
    labels=(*GPU_LABELS, "kind"),
    unit=Unit.ERRORS,
    label_doc=f"({_PER_LINK}), kind (`replay`, `recovery`, `crc_flit`, `crc_data`, `ecc_data`)",
)

FAMILIES: tuple[FamilySpec[PcieNvlinkReading], ...] = (
    FamilySpec("gpu_pcie_tx_bytes_total", Kind.COUNTER,
               "Bytes sent over PCIe (NVML field 197, PCIE_COUNT_TX_BYTES).",
               "field 197 `PCIE_COUNT_TX_BYTES` (each entry's own `nvmlReturn` checked)",
               lambda p: p.pcie_tx_bytes, unit=Unit.BYTES),
    FamilySpec("gpu_pcie_rx_bytes_total", Kind.COUNTER,
               "Bytes received over PCIe (NVML field 198, PCIE_COUNT_RX_BYTES).",
               "field 198 `PCIE_COUNT_RX_BYTES` (each entry's own `nvmlReturn` checked)",
               lambda p: p.pcie_rx_bytes, unit=Unit.BYTES),
    FamilySpec("gpu_pcie_replays_total", Kind.COUNTER, "PCIe replays (NVML PCIe replay counter).",
               "`GetPcieReplayCounter`", lambda p: p.pcie_replays, unit=Unit.REPLAYS),
    FamilySpec("gpu_pcie_link_generation", Kind.GAUGE, "Current PCIe link generation (NVML).",
               "`GetCurrPcieLinkGeneration`", lambda p: p.pcie_link_generation, unit=Unit.PCIE_GENERATION),
    FamilySpec("gpu_pcie_link_width", Kind.GAUGE, "Current PCIe link width in lanes (NVML).",
               "`GetCurrPcieLinkWidth`", lambda p: p.pcie_link_width, unit=Unit.PCIE_LANES),
    LINK_UP,
    NV_TX,
    NV_RX,
    NV_ERR,
)  # fmt: skip


_SUMMED = frozenset(spec.name for spec in (NV_TX, NV_RX, NV_ERR))


def _new(spec: FamilySpec[PcieNvlinkReading], per_link: bool) -> Family:
    """The spec's family; the NVLink counters get the `link` label back when per link."""
    if per_link and spec.name in _SUMMED:
        return spec.new(labels=(*LINK_LABELS, *spec.labels[2:]), help=spec.help.replace(_SCOPE, ""))
    return spec.new()


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    per_link = options.nvlink_per_link
    families = {spec.name: _new(spec, per_link) for spec in FAMILIES}
    reading, link_up = readers(FAMILIES, families), families[LINK_UP.name]
    nv_tx, nv_rx, nv_err = families[NV_TX.name], families[NV_RX.name], families[NV_ERR.name]
    for labels, pcie in per_gpu_record(snapshot, PCIE_NVLINK):
        add_values(reading, labels, pcie)
        for link in pcie.nvlinks:
            ll = [*labels, str(link.link)]
            link_up.add_metric(ll, 1.0 if link.up else 0.0)
            if per_link:
                add_optional(nv_tx, ll, link.tx_bytes)
                add_optional(nv_rx, ll, link.rx_bytes)
                for kind, count in link.errors:
                    nv_err.add_metric([*ll, kind], float(count))
        if not per_link and pcie.nvlinks:
            add_optional(nv_tx, labels, _sum(link.tx_bytes for link in pcie.nvlinks))
            add_optional(nv_rx, labels, _sum(link.rx_bytes for link in pcie.nvlinks))
            errors: dict[NvLinkErrorKind, int] = {}
            for link in pcie.nvlinks:
                for kind, count in link.errors:
                    errors[kind] = errors.get(kind, 0) + count
            for kind, count in errors.items():
                nv_err.add_metric([*labels, kind], float(count))
    yield from non_empty(*families.values())


def _sum(values: Iterable[int | None]) -> int | None:
    """Sum of the links that report a value; None when none does (absent beats a fake zero)."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


SPEC = CollectorSpec(
    PCIE_NVLINK.area,
    True,
    "PCIe/NVLink byte counters, replays, link state and NVLink errors",
    collect,
    families=FAMILIES,
)
