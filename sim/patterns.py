"""Workload patterns: what one simulated process does to its GPU (or MIG instance) over time.

A pattern turns "seconds since the process started" into a `Sample`: the fraction of time a kernel
ran (`busy`, what NVML's utilization.gpu counts), SM activity, occupancy, tensor / DRAM / FP-pipe
activity, PCIe and NVLink byte rates and the memory the process holds. Fractions are of the process's
container (the whole GPU, or its MIG instance); the engine sums processes and scales instances.

Two views of the same pattern:
- `sample(age)`: what a sampler sees now, i.e. the average over the last `WINDOW` second (NVML's
  utilization and power readings are short averages, not instants), with deterministic jitter;
- `expected(age)`: the smooth envelope (jitter and the seconds-long steps averaged out; a
  notebook's minutes-long slots kept, as a reader's interval sees them), which the engine
  integrates into energy and PCIe/NVLink byte counters so counters agree with gauges on average.

Noise is hash-based (splitmix64 of seed, pid, tag and time bucket) so a seed fully determines every
value and no global random state is touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WINDOW = 1.0  # seconds over which a "current" reading is averaged
PATTERNS = ("constant", "training", "inference", "notebook", "growing")
_MASK = (1 << 64) - 1
GB = 1e9


def splitmix64(x: int) -> int:
    """One round of splitmix64: a fast, well-mixed 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def hash_unit(*keys: int) -> float:
    """A deterministic number in [0, 1) from integer keys."""
    h = 0x243F6A8885A308D3
    for key in keys:
        h = splitmix64(h ^ (key & _MASK))
    return (h >> 11) / float(1 << 53)


def square_fraction(a: float, b: float, period: float, duty: float) -> float:
    """Fraction of [a, b] where (x mod period) < duty * period: how much of a window a periodic
    compute phase covers. Closed form, so any window costs the same."""
    if b <= a:
        return 1.0 if (a - math.floor(a / period) * period) < duty * period else 0.0
    on = duty * period

    def covered(x: float) -> float:
        cycles = math.floor(x / period)
        rest = min(max(x - cycles * period, 0.0), period)  # consistent with `cycles` despite rounding
        return cycles * on + min(rest, on)

    return (covered(b) - covered(a)) / (b - a)


@dataclass(slots=True)
class Sample:
    """One process's activity, as fractions of its container, and its memory."""

    busy: float = 0.0
    sm: float = 0.0
    occupancy: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    fp64: float = 0.0
    fp32: float = 0.0
    fp16: float = 0.0
    integer: float = 0.0
    pcie_tx: float = 0.0  # bytes per second
    pcie_rx: float = 0.0
    nvlink_tx: float = 0.0
    nvlink_rx: float = 0.0
    memory: int = 0


@dataclass(frozen=True)
class Mix:
    """How SM activity drives the other pipes for one kind of work (ratios to SM activity)."""

    tensor: float
    dram: float
    occupancy: float
    fp64: float
    fp32: float
    fp16: float
    integer: float
    pcie_gbps: float  # default mean host<->device traffic
    rx_share: float  # part of PCIe traffic the GPU receives (host to device)


MIXES: dict[str, Mix] = {
    "training": Mix(0.62, 0.55, 0.45, 0.0, 0.15, 0.35, 0.10, 1.5, 0.85),
    "inference": Mix(0.40, 0.80, 0.35, 0.0, 0.10, 0.30, 0.15, 0.3, 0.6),
    "notebook": Mix(0.10, 0.35, 0.30, 0.02, 0.30, 0.05, 0.10, 0.05, 0.7),
    "constant": Mix(0.30, 0.45, 0.40, 0.0, 0.25, 0.15, 0.10, 0.1, 0.5),
    "growing": Mix(0.30, 0.50, 0.40, 0.0, 0.25, 0.15, 0.10, 0.2, 0.5),
}

# default SM activity per pattern (for inference and notebook: while working)
DEFAULT_SM = {"constant": 0.5, "training": 0.5, "inference": 0.6, "notebook": 0.3, "growing": 0.4}

# keys each pattern accepts in a scenario file (besides the common ones)
COMMON_KEYS = ("pattern", "memory", "sm", "tensor", "dram", "occupancy", "pcie_gbps", "nvlink_gbps")
PATTERN_KEYS: dict[str, tuple[str, ...]] = {
    "constant": ("busy",),
    "training": ("duty", "step", "warmup"),
    "inference": ("rate", "period"),
    "notebook": ("active", "slot"),
    "growing": ("busy", "memory_start", "over", "repeat"),
}


@dataclass(frozen=True)
class WorkloadSpec:
    """A validated `workload:` block of a scenario process (see docs/simulator.md)."""

    pattern: str
    memory_bytes: int
    sm: float
    busy: float | None = None  # constant / growing: fraction of time a kernel runs (>= sm)
    duty: float | None = None  # training: compute part of each step (= GPU utilization)
    step_seconds: float = 1.0
    warmup_seconds: float = 60.0
    rate: float = 0.3  # inference: mean fraction of time serving
    period_seconds: float = 86400.0  # inference: load cycle (diurnal)
    active: float = 0.15  # notebook: probability a slot has cells running
    slot_seconds: float = 300.0
    memory_start_bytes: int | None = None  # growing: memory at start
    over_seconds: float = 3600.0  # growing: time to reach `memory`
    repeat: bool = False  # growing: restart the growth (leak / OOM / restart cycle)
    tensor: float | None = None  # absolute mean activity overrides
    dram: float | None = None
    occupancy: float | None = None
    pcie_gbps: float | None = None
    nvlink_gbps: float = 0.0


_PHASE_BUCKET = 7.3  # seconds; deliberately not a divisor of common sampling intervals
_MAX_STEP_DRIFT = 3.0  # seconds a long training step may drift by
# noise tags
_JITTER, _PHASE, _LOAD, _SLOT_ON, _SLOT_LEN, _STEP = 1, 2, 3, 4, 5, 6


class Workload:
    """A compiled pattern bound to one process's noise stream."""

    def __init__(self, spec: WorkloadSpec, seed: int, pid: int, sm_cap: float | None = None) -> None:
        self.spec = spec
        self._cap = sm_cap  # an MPS client's active-thread share (`_capped`)
        self._seed = seed
        self._pid = pid
        mix = MIXES[spec.pattern]
        sm = spec.sm if spec.sm > 0 else 1.0
        self._tensor = mix.tensor if spec.tensor is None else spec.tensor / sm
        self._dram = mix.dram if spec.dram is None else spec.dram / sm
        self._occupancy = mix.occupancy if spec.occupancy is None else spec.occupancy / sm
        self._mix = mix
        self._pcie = (mix.pcie_gbps if spec.pcie_gbps is None else spec.pcie_gbps) * GB
        self._nvlink = spec.nvlink_gbps * GB
        if spec.pattern == "training":
            self._duty = spec.duty if spec.duty is not None else min(1.0, max(spec.sm, spec.sm / 0.6))
        else:
            self._duty = 1.0
        if spec.pattern in ("constant", "growing"):
            self._busy = spec.busy if spec.busy is not None else min(1.0, spec.sm * 1.2 + 0.03)
        self._key = splitmix64(splitmix64(seed & _MASK) ^ (pid & _MASK))
        self._phase = 2 * math.pi * self._u(_PHASE, 0)
        self._stationary: tuple[float, float, float, float, float, float, float, float] | None = None

    def _u(self, tag: int, bucket: int) -> float:
        # two splitmix rounds over a per-process key: the hot path of every sample
        h = splitmix64(self._key ^ ((tag * 0x9E3779B97F4A7C15 + bucket) & _MASK))
        return (splitmix64(h) >> 11) / float(1 << 53)

    def _is_stationary(self, age: float) -> bool:
        """Whether the smooth envelope no longer changes with age (all but inference, notebooks'
        slots and warm-up)."""
        p = self.spec.pattern
        if p in ("inference", "notebook"):
            return False
        return p != "training" or age >= self.spec.warmup_seconds

    def _jitter(self, age: float, amount: float = 0.08) -> float:
        return 1.0 + amount * (self._u(_JITTER, math.floor(age)) - 0.5)

    # -- what each pattern does ---------------------------------------------------------------
    def memory(self, age: float) -> int:
        spec = self.spec
        full = spec.memory_bytes
        if spec.pattern == "training" and spec.warmup_seconds > 0 and age < spec.warmup_seconds:
            return int(full * (0.25 + 0.75 * max(0.0, age) / spec.warmup_seconds))
        if spec.pattern == "growing":
            start = spec.memory_start_bytes if spec.memory_start_bytes is not None else full // 10
            progress = max(0.0, age) / spec.over_seconds
            progress = progress % 1.0 if spec.repeat else min(1.0, progress)
            return int(start + (full - start) * progress)
        return full

    def _levels(self, age: float, smooth: bool) -> tuple[float, float, float, float]:
        """(busy, sm, pcie factor, nvlink factor) at `age`; factors scale the mean rates."""
        spec = self.spec
        p = spec.pattern
        if p == "training":
            ramp = 1.0
            if spec.warmup_seconds > 0:
                ramp = min(1.0, max(0.0, age) / spec.warmup_seconds)
            duty = self._duty
            if smooth:
                f, jitter = duty, 1.0
            else:
                # steps drift against any sampler: a random phase per ~7 s keeps a sampler whose
                # interval is a multiple of the step from always landing in the same phase
                amplitude = min(spec.step_seconds, _MAX_STEP_DRIFT)
                shift = amplitude * self._u(_STEP, math.floor(age / _PHASE_BUCKET))
                f = square_fraction(age - WINDOW + shift, age + shift, spec.step_seconds, duty)
                jitter = self._jitter(age)
            peak = min(1.0, spec.sm / duty) if duty > 0 else 0.0
            busy = ramp * (f + (1 - f) * 0.03)
            sm = ramp * (f * min(1.0, peak * jitter) + (1 - f) * 0.01)
            pcie = (1 - f) / (1 - duty) if duty < 1 else 1.0
            nvlink = f / duty if duty > 0 else 0.0
            return busy, sm, pcie * ramp, nvlink * ramp
        if p == "inference":
            cycle = 1 + 0.5 * math.sin(2 * math.pi * age / spec.period_seconds + self._phase)
            if smooth:
                load = spec.rate * cycle
            else:
                u = self._u(_LOAD, math.floor(age))
                load = spec.rate * cycle * -math.log(1.0 - u * 0.999)
            busy = min(1.0, load)
            return busy, busy * spec.sm, busy / max(spec.rate, 1e-9), 0.0
        if p == "notebook":
            # Cells run for minutes, not seconds: a reader averaging over its interval sees them
            # running or not, so the smooth envelope keeps the slots and drops only the jitter.
            # (Averaged over slots, a notebook's per-process busy time, the duty cycle its
            # time-sliced neighbours are planned by, read flat at its long-run mean while its SM
            # activity and the latency of a server beside it followed the bursts.)
            slot = math.floor(age / spec.slot_seconds)
            running = self._u(_SLOT_ON, slot) < spec.active
            length = 0.3 + 0.7 * self._u(_SLOT_LEN, slot)
            on = 1.0 if running and (age % spec.slot_seconds) < length * spec.slot_seconds else 0.0
            jitter = 1.0 if smooth else self._jitter(age, 0.2)
            sm = on * min(1.0, spec.sm * jitter)
            busy = min(1.0, on * min(1.0, spec.sm * 1.3 + 0.05))
            return busy, sm, on, 0.0
        # constant, growing
        jitter = 1.0 if smooth else self._jitter(age, 0.06)
        sm = min(1.0, spec.sm * jitter)
        return max(sm, self._busy), sm, 1.0, 1.0

    def _capped(self, age: float, smooth: bool) -> tuple[float, float, float, float]:
        """`_levels` under the MPS thread cap: while a kernel runs it occupies at most the cap's
        share of the SMs, so work that ran wider (SM activity over cap x busy) keeps kernels
        running longer: busy stretches to activity / cap (at most all the time) and SM activity
        is what that time at the cap delivers (at most the cap). A client's SM activity is thus
        never above its busy time x cap, which the exporter's capped shares rely on
        (exporter/attribution/shares.py). The clip is per one-second reading, like the demand it
        is compared with; no backlog is carried into the next second."""
        busy, sm, pcie, nvlink = self._levels(age, smooth)
        cap = self._cap
        if cap is not None and sm > cap * busy:
            busy = min(1.0, sm / cap)
            sm = busy * cap
        return busy, sm, pcie, nvlink

    def _sample(self, age: float, smooth: bool) -> Sample:
        busy, sm, pcie, nvlink = self._capped(age, smooth)
        mix = self._mix
        pcie_rate = self._pcie * pcie
        nvlink_rate = self._nvlink * nvlink
        active = 1.0 if sm > 0 else 0.0
        return Sample(
            busy=busy,
            sm=sm,
            occupancy=min(1.0, sm * self._occupancy),
            tensor=min(sm, sm * self._tensor),
            dram=min(1.0, sm * self._dram + 0.01 * active),
            fp64=sm * mix.fp64,
            fp32=sm * mix.fp32,
            fp16=sm * mix.fp16,
            integer=sm * mix.integer,
            pcie_tx=pcie_rate * (1 - mix.rx_share),
            pcie_rx=pcie_rate * mix.rx_share,
            nvlink_tx=nvlink_rate / 2,
            nvlink_rx=nvlink_rate / 2,
            memory=self.memory(age),
        )

    def power_terms(self, age: float) -> tuple[float, float, float, float, float, float, float, float]:
        """The smooth envelope's (busy, sm, tensor, dram, pcie tx, pcie rx, nvlink tx, nvlink rx):
        the part of `expected` that counters integrate, without building a Sample."""
        stationary = self._is_stationary(age)
        if stationary and self._stationary is not None:
            return self._stationary
        busy, sm, pcie, nvlink = self._capped(age, True)
        mix = self._mix
        pcie_rate = self._pcie * pcie
        nvlink_rate = self._nvlink * nvlink * 0.5
        terms = (
            busy,
            sm,
            min(sm, sm * self._tensor),
            min(1.0, sm * self._dram + (0.01 if sm > 0 else 0.0)),
            pcie_rate * (1 - mix.rx_share),
            pcie_rate * mix.rx_share,
            nvlink_rate,
            nvlink_rate,
        )
        if stationary:
            self._stationary = terms
        return terms

    def sample(self, age: float) -> Sample:
        """What a sampler sees `age` seconds after the process started (last-second average)."""
        return self._sample(age, smooth=False)

    def expected(self, age: float) -> Sample:
        """The smooth envelope at `age` (no jitter, steps averaged): what counters integrate."""
        return self._sample(age, smooth=True)
