"""What every collector shares: the spec records, label helpers and the one generic collect.

A collector is a pure function from a `NodeSnapshot` to fresh metric families: it never calls NVML
and reads nothing else (the host name and other start-up facts come in `CollectorOptions`), so
rendering is cheap and a scrape can never block on a GPU.

Each family is declared once, as a `FamilySpec`: name, type, HELP, labels, and how its value is read
from a sample (`value`), with the unit and NVML source that docs/metrics.md's tables are generated
from (tests/exporter/test_metric_docs.py). `fill` is the generic collect: one sample per spec and
row, absent where the accessor says None. A family whose rows do not map one-to-one onto samples
(per link, per reason, identity series with many labels) leaves `value` None and is filled by its
collector's own code, still built from its spec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

from prometheus_client.core import Metric

from gpulens.exporter.compat import CompatSpec
from gpulens.exporter.families import RowCounter, RowGauge, sample_count
from gpulens.exporter.snapshot import (
    Area,
    ClocksReading,
    DeviceReading,
    GpuSample,
    HealthReading,
    MemoryReading,
    NodeSnapshot,
    PcieNvlinkReading,
    PowerThermalReading,
    ProcessesReading,
    ProfilingReading,
    TopologyReading,
)

GPU_LABELS = ["gpu", "uuid"]
MIG_LABELS = ["gpu", "uuid", "gpu_instance", "mig_profile"]

S = TypeVar("S")  # what a family's accessor reads: a GpuSample, an area's record, a MigSample, ...
R = TypeVar("R")  # an area's record (`DeviceReading`, ...)
Family = RowGauge | RowCounter


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"


class Unit(StrEnum):
    """The unit column of docs/metrics.md (what a family's value counts or measures)."""

    RATIO = "ratio"
    BYTES = "bytes"
    WATTS = "watts"
    JOULES = "joules"
    HERTZ = "Hz"
    CELSIUS = "°C"
    SECONDS = "seconds"
    SECONDS_SINCE_EPOCH = "seconds since epoch"
    BOOLEAN = "0/1"
    ALWAYS_ONE = "always 1"
    HEALTH = "0 pass / 1 warn / 2 fail"
    PSTATE = "P-state 0..15"
    PROCESSES = "processes"
    MULTIPROCESSORS = "SMs"
    NUMA_NODE = "NUMA node id"
    PCIE_GENERATION = "generation"
    PCIE_LANES = "lanes"
    ERRORS = "errors"
    EVENTS = "events"
    REPLAYS = "replays"
    ROWS = "rows"
    PAGES = "pages"


@dataclass(frozen=True)
class FamilySpec(Generic[S]):
    """One metric family: what it is called and says, and where its value comes from.

    `value` maps a sample to the value or None (the device cannot say: no series, never an invented
    0); None as the accessor itself means the collector fills the family in code of its own. `unit`,
    `source`, `label_doc` and `mig` are for docs/metrics.md only: the unit is not passed to
    prometheus_client, which would add `# UNIT` lines to the OpenMetrics exposition.
    """

    name: str
    kind: Kind
    help: str
    source: str  # where the value comes from (NVML call or field), as the docs table says it
    value: Callable[[S], float | None] | None = None
    labels: tuple[str, ...] = tuple(GPU_LABELS)
    unit: Unit | None = None
    label_doc: str = ""  # the docs' label column where the names alone do not say enough
    mig: str = "parent only"  # what happens on a GPU with MIG enabled (docs)

    def new(self, labels: Sequence[str] | None = None, help: str | None = None) -> Family:
        """A fresh, empty family of this spec (labels or HELP overridden where an option changes them)."""
        names = list(self.labels if labels is None else labels)
        text = self.help if help is None else help
        if self.kind is Kind.COUNTER:
            return RowCounter(self.name, text, names)
        return RowGauge(self.name, text, names)


@dataclass(frozen=True)
class CollectorOptions:
    """Per-collector knobs from the command line, and what the exporter learnt once at start."""

    processes_max: int = 100
    nvlink_per_link: bool = False  # NVLink byte/error counters per link instead of summed per GPU
    hostname: str = ""  # the node's name for compat host labels ($NODE_NAME, else the host's; app.py)
    compat: CompatSpec = field(default_factory=CompatSpec)  # --compat: other exporters' names, versions


CollectFn = Callable[[NodeSnapshot, CollectorOptions], Iterable[Metric]]


@dataclass(frozen=True)
class CollectorSpec:
    name: str
    default_enabled: bool
    help: str
    collect: CollectFn
    reads_nvml: bool = True  # whether the sampler reads an NVML area of this name (an `Area` value)
    families: tuple[FamilySpec[Any], ...] = ()  # what it emits, in render order (docs/metrics.md)
    compat: str | None = None  # the --compat mode that enables it (it then has no --collector flag)


@dataclass(frozen=True)
class Reads(Generic[R]):
    """An area and how to take its record from a sample: what a collector (or a compatibility
    field) reads."""

    area: Area
    record: Callable[[GpuSample], R | None]


DEVICE = Reads[DeviceReading](Area.DEVICE, lambda g: g.device)
MEMORY = Reads[MemoryReading](Area.MEMORY, lambda g: g.memory)
POWER_THERMAL = Reads[PowerThermalReading](Area.POWER_THERMAL, lambda g: g.power_thermal)
CLOCKS = Reads[ClocksReading](Area.CLOCKS, lambda g: g.clocks)
PCIE_NVLINK = Reads[PcieNvlinkReading](Area.PCIE_NVLINK, lambda g: g.pcie_nvlink)
HEALTH = Reads[HealthReading](Area.HEALTH, lambda g: g.health)
PROFILING = Reads[ProfilingReading](Area.PROFILING, lambda g: g.profiling)
TOPOLOGY = Reads[TopologyReading](Area.TOPOLOGY, lambda g: g.topology)
# the process lists fail as PROCESSES when that collector is on, else as DEVICE (backends/nvml.py)
PROCESSES = Reads[ProcessesReading](Area.PROCESSES, lambda g: g.processes)


def gpu_labels(gpu: GpuSample) -> list[str]:
    return [str(gpu.identity.index), gpu.identity.uuid]


def readable(snapshot: NodeSnapshot, area: Area) -> Iterator[GpuSample]:
    """GPUs that are up and whose `area` reads succeeded this sample."""
    for gpu in snapshot.gpus:
        if gpu.up and area not in gpu.failed_areas:
            yield gpu


def fresh(specs: Iterable[FamilySpec[Any]]) -> dict[str, Family]:
    """A new family per spec, by name, in spec order (the order they render in)."""
    return {spec.name: spec.new() for spec in specs}


Reader = tuple[Family, Callable[[S], float | None]]


def readers(specs: Iterable[FamilySpec[S]], families: Mapping[str, Family]) -> list[Reader[S]]:
    """(family, accessor) of the specs that have an accessor; made once per cycle, used per row."""
    return [(families[spec.name], spec.value) for spec in specs if spec.value is not None]


def add_values(reading: Sequence[Reader[S]], labels: list[str], sample: S) -> None:
    """One row: each accessor's value of `sample` under `labels`; a None value adds nothing."""
    for family, read in reading:
        value = read(sample)
        if value is not None:
            family.add_metric(labels, float(value))


def fill(
    specs: Iterable[FamilySpec[S]], families: Mapping[str, Family], rows: Iterable[tuple[list[str], S]]
) -> None:
    """The generic collect: each spec's value of each row's sample. Specs without an accessor are
    left to their collector's own code."""
    reading = readers(specs, families)
    for labels, sample in rows:
        add_values(reading, labels, sample)


def collect_specs(specs: Sequence[FamilySpec[S]], rows: Iterable[tuple[list[str], S]]) -> Iterator[Metric]:
    """A collector made of specs alone: fresh families, filled from `rows`, the non-empty ones."""
    families = fresh(specs)
    fill(specs, families, rows)
    yield from non_empty(*families.values())


def per_gpu(gpus: Iterable[GpuSample]) -> Iterator[tuple[list[str], GpuSample]]:
    """(gpu, uuid labels, sample) rows, the shape of most per-GPU families."""
    for gpu in gpus:
        yield gpu_labels(gpu), gpu


def per_gpu_record(snapshot: NodeSnapshot, reads: Reads[R]) -> Iterator[tuple[list[str], R]]:
    """(gpu, uuid labels, the area's record) of the GPUs whose `reads.area` was read this sample."""
    record = reads.record
    for gpu in readable(snapshot, reads.area):
        value = record(gpu)
        if value is not None:
            yield gpu_labels(gpu), value


def flag(value: bool | None) -> float | None:
    """A yes/no reading as 1/0, absent when unknown."""
    return None if value is None else (1.0 if value else 0.0)


def gauge(name: str, documentation: str, labels: list[str], unit: str = "") -> RowGauge:
    """A gauge family that keeps its samples as rows for the renderer (`families.py`)."""
    return RowGauge(name, documentation, labels, unit)


def counter(name: str, documentation: str, labels: list[str]) -> RowCounter:
    return RowCounter(name, documentation, labels)


def add_optional(family: Family, labels: list[str], value: float | None) -> None:
    """Add a sample unless the device could not report the value (absent beats a fake zero)."""
    if value is not None:
        family.add_metric(labels, float(value))


def non_empty(*families: Metric) -> Iterator[Metric]:
    """Families with at least one sample (an empty family only adds HELP/TYPE noise)."""
    for family in families:
        if sample_count(family):  # not `family.samples`: that would turn a row family's rows into Samples
            yield family
