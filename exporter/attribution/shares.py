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

Under MPS, on a GPU whose figure is SM activity, a client held to an active-thread limit `c_j` (a
fraction of the SMs) that runs kernels all the time is busy for the whole interval yet adds at
most `c_j` to SM activity: weighting by time alone would give it more than it could have used (a
30 % client beside a lighter one read as 40 %, above its own cap). Where a client's cap is known
(its `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, or what its control daemon runs its server under), the
device's clients are weighted by the SM activity they could have added, `w_j * c_j` (c = 1 without
a known cap), on SM activity's own scale:

    share_j = D * w_j * c_j / max(sum(w * c), D)

so no client is given more than `w_j * c_j` (at most its cap), and a device busier than its listed
clients could make it leaves the rest unattributed. With every cap 1 (clients known to run at
100 %) this is the time split above wherever the listed clients account for the busy time
(`U <= sum(w)`): SM activity is at most the union of busy times (`D <= U`), so both scales are
`sum(w)`. A job measured under its cap thus reads on the
same scale as when it ran whole, which is what keeps a plan's MPS caps from moving because they
were applied. Where the figure is NVML utilization (no GPM / DCGM) it is a time, like `w`, which a
thread cap does not bound: the time split above stays.
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


def capped_shares(capacity: Mapping[K, float | None], device: float) -> dict[K, float | None]:
    """Each key's share of `device` by the SM activity it could have added (module docstring):
    `capacity[k]` is the sum over its processes of time x thread cap; None without a figure."""
    known = {k: max(0.0, float(c)) for k, c in capacity.items() if c is not None}
    device = min(max(device, 0.0), 1.0)
    scale = max(sum(known.values()), device)
    shares: dict[K, float | None] = {k: None for k in capacity}
    for key, most in known.items():
        shares[key] = device * most / scale if scale > 0 else 0.0
    return shares
