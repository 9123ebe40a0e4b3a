"""What every collector shares: the spec record, label helpers and family constructors.

A collector is a pure function from a `NodeSnapshot` to fresh metric families: it never calls NVML,
so rendering is cheap and a scrape can never block on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.exporter.families import RowCounter, RowGauge, sample_count
from gpulens.exporter.snapshot import Area, GpuSample, NodeSnapshot

GPU_LABELS = ["gpu", "uuid"]
MIG_LABELS = ["gpu", "uuid", "gpu_instance", "mig_profile"]


@dataclass(frozen=True)
class CollectorOptions:
    """Per-collector knobs from the command line."""

    processes_max: int = 100
    nvlink_per_link: bool = False  # NVLink byte/error counters per link instead of summed per GPU


CollectFn = Callable[[NodeSnapshot, CollectorOptions], Iterable[Metric]]


@dataclass(frozen=True)
class CollectorSpec:
    name: str
    default_enabled: bool
    help: str
    collect: CollectFn
    reads_nvml: bool = True  # whether the sampler reads an NVML area of this name (an `Area` value)


def gpu_labels(gpu: GpuSample) -> list[str]:
    return [str(gpu.identity.index), gpu.identity.uuid]


def readable(snapshot: NodeSnapshot, area: Area) -> Iterator[GpuSample]:
    """GPUs that are up and whose `area` reads succeeded this sample."""
    for gpu in snapshot.gpus:
        if gpu.up and area not in gpu.failed_areas:
            yield gpu


def gauge(name: str, documentation: str, labels: list[str], unit: str = "") -> GaugeMetricFamily:
    """A gauge family that keeps its samples as rows for the renderer (`families.py`)."""
    return RowGauge(name, documentation, labels, unit)


def counter(name: str, documentation: str, labels: list[str]) -> CounterMetricFamily:
    return RowCounter(name, documentation, labels)


def add_optional(
    family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None
) -> None:
    """Add a sample unless the device could not report the value (absent beats a fake zero)."""
    if value is not None:
        family.add_metric(labels, float(value))


def non_empty(*families: Metric) -> Iterator[Metric]:
    """Families with at least one sample (an empty family only adds HELP/TYPE noise)."""
    for family in families:
        if sample_count(family):  # not `family.samples`: that would turn a row family's rows into Samples
            yield family
