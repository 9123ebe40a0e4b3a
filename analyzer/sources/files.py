"""Profiles from a history directory (the file path), optionally limited to a window."""

from __future__ import annotations

import pandas as pd
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import History, read_history
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.thresholds import Thresholds
from gpulens.exporter.catalog import GpuModel


def load(path: str, window_s: float | None = None, end: float | None = None) -> History:
    """Read a history; with a window, keep samples in (end - window, end] (end defaults to its end)."""
    if window_s is None:
        return read_history(path)
    history = read_history(path)
    stop = float(history.meta.get("end", 0)) if end is None else end
    keep = (history.samples["timestamp"] > stop - window_s) & (history.samples["timestamp"] <= stop)
    history.samples = history.samples[keep].reset_index(drop=True)
    return history


def profiles(history: History, thresholds: Thresholds, gpu_model: GpuModel | None = None) -> pd.DataFrame:
    """Profile table of a usage history."""
    if history.kind != "usage":
        raise AnalyzerError(f"{history.path}: a {history.kind!r} history has no usage to profile")
    if history.samples.empty:
        raise AnalyzerError(f"{history.path}: no samples in the window")
    return profiles_from_samples(history.samples, history.step_s, thresholds, gpu_model)
