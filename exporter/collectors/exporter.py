"""The exporter's own health: build info, NVML state, GPUs seen, per-collector status, sample timing.

Always on; it has no flag. Its values come from the snapshot and from the statuses the app measured
while building the other collectors' families.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator, Mapping

from prometheus_client.core import Metric

from gpulens import __version__
from gpulens.exporter.collectors.base import gauge
from gpulens.exporter.snapshot import AreaTiming, NodeSnapshot


def collect(snapshot: NodeSnapshot, statuses: Mapping[str, AreaTiming]) -> Iterator[Metric]:
    build = gauge(
        "gpulens_build_info",
        "gpulens version, Python version and NVML library version; always 1.",
        ["version", "python_version", "nvml_library_version"],
    )
    build.add_metric([__version__, platform.python_version(), snapshot.nvml_library_version], 1.0)
    yield build
    up = gauge(
        "gpulens_nvml_up",
        "1 if NVML is initialised and answering; 0 while init fails (retried with backoff).",
        [],
    )
    up.add_metric([], 1.0 if snapshot.nvml_up else 0.0)
    yield up
    if not snapshot.nvml_up and snapshot.nvml_error:
        err = gauge(
            "gpulens_nvml_error_info", "Why NVML is down (the last init or call error); always 1.", ["error"]
        )
        err.add_metric([snapshot.nvml_error[:200]], 1.0)
        yield err
    gpus = gauge("gpulens_gpus", "GPUs seen by NVML in the last sample.", [])
    gpus.add_metric([], float(snapshot.gpu_count))
    yield gpus
    success = gauge(
        "gpulens_collector_success",
        "1 if the collector's reads and rendering succeeded in the last sample.",
        ["collector"],
    )
    duration = gauge(
        "gpulens_collector_duration_seconds",
        "Seconds the collector took in the last sample (NVML reads summed over GPUs, plus rendering).",
        ["collector"],
    )
    for name in sorted(statuses):
        status = statuses[name]
        success.add_metric([name], 1.0 if status.success else 0.0)
        duration.add_metric([name], status.seconds)
    yield success
    yield duration
    if snapshot.timestamp > 0:
        last = gauge(
            "gpulens_last_sample_timestamp_seconds",
            "When the last sample completed (seconds since epoch).",
            [],
        )
        last.add_metric([], snapshot.timestamp)
        yield last
        sample = gauge("gpulens_sample_duration_seconds", "Seconds the last sampling cycle took.", [])
        sample.add_metric([], snapshot.duration_seconds)
        yield sample
