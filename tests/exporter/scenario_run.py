"""Run the exporter on a built-in scenario deterministically (manual clock, fixed seed)."""

from __future__ import annotations

import re
from pathlib import Path

from gpulens.exporter.app import Exporter
from gpulens.exporter.collectors import REGISTRY
from gpulens.exporter.config import ExporterConfig
from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.install import install, uninstall
from gpulens.sim.scenariofile import load_scenario

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
STEP = 5.0


def scenario_exposition(
    name: str,
    workdir: Path,
    samples: int = 2,
    openmetrics: bool = False,
    compat: str = "",
    nvlink_per_link: bool = False,
) -> str:
    """Exposition after `samples` samples STEP seconds apart (the second gives GPM windows)."""
    dirs = {key: workdir / key for key in ("proc", "pods", "mapping")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    clock = ManualClock(START)
    node = build_node(
        load_scenario(name),
        seed=0,
        clock=clock,
        procfs_root=dirs["proc"],
        pods_root=dirs["pods"],
        job_mapping_dir=dirs["mapping"],
    )
    install(node)
    config = ExporterConfig(
        interval=STEP,
        collectors=frozenset(REGISTRY),
        procfs=dirs["proc"],
        pod_logs_dir=dirs["pods"],
        job_mapping_dir=dirs["mapping"],
        pod_resources_socket=None,
        compat=compat,
        nvlink_per_link=nvlink_per_link,
    )
    exporter = Exporter(config, node=node)
    try:
        snapshot = exporter.sample_once()
        for _ in range(samples - 1):
            clock.advance(STEP)
            snapshot = exporter.sample_once()
        rendered = exporter.render(snapshot)
    finally:
        exporter.close()
        uninstall()
    return (rendered.openmetrics if openmetrics else rendered.text).decode()


_VOLATILE = re.compile(
    r"^(gpulens_collector_duration_seconds\{[^}]*\}|gpulens_sample_duration_seconds"
    r"|gpulens_job_mapping_refresh_duration_seconds|gpulens_job_mapping_reads_total) \S+$",
    re.MULTILINE,
)


def normalise(text: str) -> str:
    """Replace what differs between runs and machines (durations, Python and gpulens versions, and
    the mapping files read: a file read within a timestamp tick of its writing is read twice)."""
    text = _VOLATILE.sub(r"\1 <duration>", text)
    text = re.sub(r'python_version="[^"]*"', 'python_version="<python>"', text)
    return re.sub(r'(gpulens_build_info\{[^}]*)version="[^"]*"', r'\1version="<version>"', text)
