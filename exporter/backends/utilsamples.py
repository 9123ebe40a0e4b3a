"""The GPU's utilization over an interval from the driver's per-period samples (GetSamples).

`nvmlDeviceGetUtilizationRates` is the driver's last sample period only (1/6 s to 1 s by product),
while the processes' figures the exporter splits it by are means over its whole interval
(`nvmlDeviceGetProcessUtilization` since the last read). `nvmlDeviceGetSamples(
NVML_GPU_UTILIZATION_SAMPLES, lastSeen)` returns the samples behind the former since lastSeen:
their mean is the device's figure over the same interval.

The mean is time-weighted: each sample is the busy percentage of the period ending at its
timestamp, and periods are not guaranteed equal (they differ by product, and a sample the driver
skipped leaves a longer gap), so each counts for the time since the one before it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

# nvmlValueType_t -> the nvmlValue_t union member holding it
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def sample_value(value_type: int, value: Any) -> float | None:
    """A sample's value as a number, by the type the driver said it has (None: unknown type)."""
    name = _VALUE_FIELDS.get(int(value_type))
    return None if name is None else float(getattr(value, name))


def interval_mean(points: Sequence[tuple[int, float]], previous_us: int | None) -> float | None:
    """Time-weighted mean, as a ratio, of `points` ((timestamp µs, percent), ascending).

    A sample's weight is the time since the sample before it; the first one's is the time since
    `previous_us` (the newest sample of the last read), but never more than the longest later
    period (a gap the driver's buffer no longer covers is not its period), and without
    `previous_us` (the first read) the mean of the later periods, or 1 when it stands alone.
    None without points."""
    if not points:
        return None
    gaps = [float(b[0] - a[0]) for a, b in itertools.pairwise(points)]
    first: float
    if previous_us is not None and previous_us < points[0][0]:
        first = float(points[0][0] - previous_us)
        if gaps:
            first = min(first, max(gaps))
    else:
        first = sum(gaps) / len(gaps) if gaps else 1.0
    weights = [first, *gaps]
    total = sum(weights)
    if total <= 0:  # repeated timestamps: equal weights
        weights, total = [1.0] * len(points), float(len(points))
    busy = sum(w * min(100.0, max(0.0, v)) for w, (_, v) in zip(weights, points, strict=True))
    return busy / total / 100.0
