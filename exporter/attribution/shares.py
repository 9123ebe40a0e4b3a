"""Per-job SM figures as shares of the device's own figure, so that jobs plus a remainder add up.

NVML's per-process utilization (`nvmlDeviceGetProcessUtilization`, smUtil) says for how much of
the interval a kernel of that process ran. Summed over processes it is not the device's figure:
under MPS kernels of several clients run at the same time and each counts the full time (dgx-h100
GPU 2: jobs summing to 1.54 on a GPU at 0.88), and the device's best figure is often SM activity
(GPM / DCGM), not the duty cycle. So each job gets the share of the device figure `D` that its
processes' time is of the device's busy time:

    share_j = D * w_j / max(sum(w), U)

with `w_j` the job's summed per-process figures and `U` the device's NVML utilization (the duty
cycle, the same scale as `w`). When the processes account for less than the device was busy
(`sum(w) < U`: processes NVML did not list, or that ended) the rest is the unattributed remainder
`D - sum(share)`; when they overlap (`sum(w) > U`) the shares are scaled down to fit. Without `U`
(MIG instances: no utilization there) the scale is `sum(w)`. The shares and the remainder are
never negative and always sum to `D`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

K = TypeVar("K")


def sm_shares(weights: Mapping[K, float | None], device: float, duty: float | None) -> dict[K, float | None]:
    """Each key's share of `device` (None where the key has no per-process figure)."""
    known = {k: max(0.0, float(w)) for k, w in weights.items() if w is not None}
    total = sum(known.values())
    scale = max(total, max(0.0, duty)) if duty is not None else total
    device = min(max(device, 0.0), 1.0)
    shares: dict[K, float | None] = {k: None for k in weights}
    for key, weight in known.items():
        shares[key] = device * (weight / scale) if scale > 0 else 0.0
    return shares


def remainder(device: float, shares: Mapping[K, float | None]) -> float:
    """The part of `device` no share accounts for (never negative: rounding is clamped)."""
    device = min(max(device, 0.0), 1.0)
    return max(0.0, device - sum(s for s in shares.values() if s is not None))
