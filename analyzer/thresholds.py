"""Thresholds that decide recommendations: one frozen dataclass per section, read once from YAML.

The defaults live in `thresholds.yaml` next to this module (the documented reference file); a
user file only needs the keys it changes. Both files are checked when they are read, against the
dataclasses below: an unknown section or key, a value of the wrong type or out of its range is one
line naming the file and the field (`thresholds.yaml: mps.max_load must be a number in [0, 1]`).
Everything downstream reads typed attributes (`th.mps.max_load`), never strings.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

from gpulens.analyzer.errors import AnalyzerError
from gpulens.safeload import InputError, read_yaml_file

DEFAULTS_PATH = Path(__file__).with_name("thresholds.yaml")

# fields whose value is a ratio of something (0..1); every other number only has to be >= 0
_RATIO = "ratio"
RATIO = {_RATIO: True}
_MIN = "min"  # a whole number's smallest meaningful value, where 0 or 1 would be degenerate


@dataclass(frozen=True)
class Data:
    min_samples: int
    min_coverage: float = dataclasses.field(metadata=RATIO)


@dataclass(frozen=True)
class Activity:
    idle_below: float = dataclasses.field(metadata=RATIO)


@dataclass(frozen=True)
class Reclaim:
    max_p95: float = dataclasses.field(metadata=RATIO)
    min_idle_fraction: float = dataclasses.field(metadata=RATIO)
    # a job whose median activity is above this ran all window (a live, low-traffic server):
    # never reclaimed, it may share
    serving_min_median: float = dataclasses.field(metadata=RATIO)
    # ... nor one active (above zero) in at least this share of the clock hours of its lifetime:
    # a server with a few requests an hour, whose metrics nobody scrapes
    serving_min_active_hour_fraction: float = dataclasses.field(metadata=RATIO)
    # ... counted only for a job that lived at least this many hours: a short job touching the GPU
    # now and then is no server (too few hours to tell)
    serving_min_hours: float


@dataclass(frozen=True)
class Exclusive:
    min_activity: float = dataclasses.field(metadata=RATIO)


@dataclass(frozen=True)
class Headroom:
    memory_ratio: float
    memory_min_bytes: int
    compute_ratio: float
    # a running MPS pinned memory limit that holds the new need and is at most this share above it
    # is kept (analyzer/hysteresis.py)
    memory_limit_deadband_ratio: float = dataclasses.field(metadata=RATIO)


@dataclass(frozen=True)
class Compute:
    max_bind_fraction: float = dataclasses.field(metadata=RATIO)
    latency_min_burstiness: float
    latency_peak_ratio: float
    # a running MPS thread cap that does not bind is kept while the newly sized one is within this
    # many percentage points of it (analyzer/hysteresis.py: measurement noise is no change)
    cap_deadband_points: int


@dataclass(frozen=True)
class TimeSlicing:
    min_idle_fraction: float = dataclasses.field(metadata=RATIO)
    max_replicas: int
    max_interference: float


@dataclass(frozen=True)
class Mig:
    min_density_ratio: float = dataclasses.field(metadata=RATIO)


@dataclass(frozen=True)
class Mps:
    max_load: float = dataclasses.field(metadata=RATIO)
    max_clients: int
    min_thread_percentage: int


@dataclass(frozen=True)
class Downsize:
    enabled: bool


@dataclass(frozen=True)
class FalseSaturation:
    min_memory_fraction: float = dataclasses.field(metadata=RATIO)
    max_mean_activity: float = dataclasses.field(metadata=RATIO)


@dataclass(frozen=True)
class Leak:
    min_growth_fraction: float = dataclasses.field(metadata=RATIO)
    min_bytes_per_hour: int
    min_hours: float
    # a step whose memory falls under (1 - this) x the step before's is a restart (a sawtooth)
    restart_drop_fraction: float = dataclasses.field(metadata=RATIO)
    # steps of the short windows whose median slope is the growth between restarts (2: a slope)
    cycle_window_steps: int = dataclasses.field(metadata={_MIN: 2})


@dataclass(frozen=True)
class MultiGpu:
    # a multi-GPU job whose compute and memory would fit this many fewer GPUs is a finding
    min_gpus_saved: int


@dataclass(frozen=True)
class TopologyLimits:
    # the all-reduce bandwidths a multi-GPU job's worst link is compared at (nccl-tests on 8xH100)
    nvlink_allreduce_gbps: float
    pcie_allreduce_gbps: float
    # the share of its GPU-hours a job placed across PCIe switches / NUMA nodes is taken to lose
    # (reported 30-50 %): the figure a topology finding is ranked by
    misaligned_loss: float = dataclasses.field(metadata=RATIO)


@dataclass(frozen=True)
class Serving:
    # an inference server's KV cache is sized to its peak KV use x (1 + this): the pool the
    # server needs when the flag that sizes it is lowered (analyzer/serving.py)
    kv_headroom_ratio: float
    # a server whose queue is non-empty in more than this share of samples, or that preempted
    # more than `max_preemptions` requests in the window, is never shrunk
    max_waiting_fraction: float = dataclasses.field(metadata=RATIO)
    max_preemptions: int
    # week over week, a moved server whose p95 e2e latency or time to first token rose by more
    # than this share is rolled back (analyzer/weekly.py)
    max_latency_increase: float


@dataclass(frozen=True)
class PlanLimits:
    max_gpu_load: float = dataclasses.field(metadata=RATIO)
    max_dram_load: float = dataclasses.field(metadata=RATIO)
    gpus_per_node: int
    # seconds a job holds its GPU after its last step: jobs closer than this never use one GPU in
    # turn (teardown and the next pod's scheduling outlast the samples)
    lifetime_margin_s: int


@dataclass(frozen=True)
class ArchetypeSettings:
    min_jobs: int
    max_clusters: int
    seed: int


@dataclass(frozen=True)
class Confidence:
    full_samples: int
    high: float = dataclasses.field(metadata=RATIO)
    medium: float = dataclasses.field(metadata=RATIO)


@dataclass(frozen=True)
class Thresholds:
    """Every section, typed; `source` is the file the values came from (defaults or the user's)."""

    data: Data
    activity: Activity
    reclaim: Reclaim
    exclusive: Exclusive
    headroom: Headroom
    compute: Compute
    time_slicing: TimeSlicing
    mig: Mig
    mps: Mps
    downsize: Downsize
    false_saturation: FalseSaturation
    leak: Leak
    multi_gpu: MultiGpu
    topology: TopologyLimits
    serving: Serving
    plan: PlanLimits
    archetypes: ArchetypeSettings
    confidence: Confidence
    source: str = str(DEFAULTS_PATH)

    def as_dict(self) -> dict[str, dict[str, float]]:
        """section -> key -> value (the YAML shape), e.g. for documentation checks."""
        out = dataclasses.asdict(self)
        out.pop("source")
        return out


def _sections() -> dict[str, type]:
    hints = get_type_hints(Thresholds)
    return {f.name: hints[f.name] for f in dataclasses.fields(Thresholds) if f.name != "source"}


def _read(path: Path) -> dict[str, Any]:
    try:
        data = read_yaml_file(path, unreadable="cannot read thresholds file")
    except InputError as exc:  # unreadable, not UTF-8, over the YAML byte bound, or not YAML
        raise AnalyzerError(str(exc)) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise AnalyzerError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def _check(path: Path, section: str, field: dataclasses.Field[object], kind: type, value: object) -> object:
    """The value converted to the field's type, or one error line naming file and field."""
    name = f"{path}: {section}.{field.name}"
    if kind is bool:
        if not isinstance(value, bool):
            raise AnalyzerError(f"{name} must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise AnalyzerError(f"{name} must be a number, got {value!r}")
    if kind is int:
        if float(value) != int(value):
            raise AnalyzerError(f"{name} must be a whole number, got {value!r}")
        value = int(value)
    if value < 0 or math.isinf(value):
        raise AnalyzerError(f"{name} must be a finite number >= 0, got {value!r}")
    if value < field.metadata.get(_MIN, 0):
        raise AnalyzerError(f"{name} must be at least {field.metadata[_MIN]}, got {value!r}")
    if field.metadata.get(_RATIO) and value > 1:
        raise AnalyzerError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value) if kind is float else value


def _merge(into: dict[str, dict[str, object]], path: Path, data: dict[str, Any], complete: bool) -> None:
    """Validate `data` (one file) and write it over `into`; `complete` = every field must be set."""
    sections = _sections()
    for section, entries in data.items():
        if section not in sections:
            raise AnalyzerError(f"{path}: unknown section {section!r}; known: {', '.join(sections)}")
        if not isinstance(entries, dict):
            raise AnalyzerError(f"{path}: section {section!r} must be a mapping of keys to values")
        cls = sections[section]
        hints = get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in entries.items():
            if key not in fields:
                raise AnalyzerError(f"{path}: unknown key {section}.{key}; known: {', '.join(fields)}")
            into.setdefault(section, {})[key] = _check(path, section, fields[key], hints[key], value)
    if complete:
        for section, cls in sections.items():
            for f in dataclasses.fields(cls):
                if f.name not in into.get(section, {}):
                    raise AnalyzerError(f"{path}: {section}.{f.name} is missing")


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """Defaults, overridden by `path` when given; both files validated as they are read."""
    values: dict[str, dict[str, object]] = {}
    _merge(values, DEFAULTS_PATH, _read(DEFAULTS_PATH), complete=True)
    source = DEFAULTS_PATH
    if path is not None:
        source = Path(path)
        _merge(values, source, _read(source), complete=False)
    sections = _sections()
    built = {name: cls(**values[name]) for name, cls in sections.items()}
    th = Thresholds(**built, source=str(source))
    if th.confidence.medium > th.confidence.high:
        raise AnalyzerError(f"{source}: confidence.medium must not exceed confidence.high")
    return th
