"""Profiles from a history directory (the file path), optionally limited to a window.

A usage history is read family by family with only the columns the profile needs, streamed
from Parquet row group by row group, so tens of millions of samples fit in bounded memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

import pandas as pd

from gpulens.analyzer import serving
from gpulens.analyzer import topology as gpu_topology
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import History, InputLimits, read_history, read_meta
from gpulens.analyzer.profile import (
    FleetGpu,
    family_columns,
    fleet_from_families,
    fleet_from_samples,
    profiles_from_families,
    profiles_from_samples,
)
from gpulens.analyzer.thresholds import Thresholds
from gpulens.catalog import GpuModel


def load(
    path: str,
    window_s: float | None = None,
    end: float | None = None,
    progress: TextIO | None = None,
    limits: InputLimits | None = None,
) -> History:
    """Read a history; with a window, keep samples in (end - window, end] (end defaults to its end)."""
    families = {**family_columns(), **gpu_topology.FAMILY_COLUMNS, **serving.FAMILY_COLUMNS}
    if window_s is None:
        return read_history(path, families=families, progress=progress, limits=limits)
    stop = float(read_meta(Path(path)).get("end", 0)) if end is None else end
    return read_history(path, stop - window_s, stop, families=families, progress=progress, limits=limits)


def profiles(history: History, thresholds: Thresholds, gpu_model: GpuModel | None = None) -> pd.DataFrame:
    """Profile table of a usage history."""
    if history.kind != "usage":
        raise AnalyzerError(f"{history.path}: a {history.kind!r} history has no usage to profile")
    if history.families is not None:
        if not any(len(frame) for frame in history.families.values()):
            raise AnalyzerError(f"{history.path}: no samples in the window")
        return profiles_from_families(history.families, history.step_s, thresholds, gpu_model)
    if history.samples.empty:
        raise AnalyzerError(f"{history.path}: no samples in the window")
    return profiles_from_samples(history.samples, history.step_s, thresholds, gpu_model)


def fleet(history: History, gpu_model: GpuModel | None = None) -> list[FleetGpu]:
    """Every GPU of a usage history's window (`gpu_info`), idle ones included."""
    if history.families is not None:
        return fleet_from_families(history.families, gpu_model)
    return fleet_from_samples(history.samples, gpu_model)


def topology(history: History) -> gpu_topology.Topology:
    """The GPU topology the history recorded (`gpu_topology_info`): empty when it has none."""
    if history.families is not None:
        frame = history.families.get(gpu_topology.INFO)
    else:
        frame = history.samples[history.samples["metric"] == gpu_topology.INFO]
    if frame is None or frame.empty:
        return gpu_topology.Topology()
    columns = [c for c in gpu_topology.LABELS if c in frame]
    last = frame[columns].drop_duplicates(["uuid", "peer_uuid"], keep="last")
    return gpu_topology.from_rows(last.astype(str).to_dict("records"))
