"""When a process with a memory limit runs: it fails (OOM) when its memory grows past the limit, and
its container restarts, as the kubelet restarts a failed container (restartPolicy Always).

Every run of a process is the same workload from age 0, so each one lasts the same time: the first
age at which `Workload.memory` passes the limit. Between runs the kubelet's CrashLoopBackOff waits
10 s, doubling after each failure up to 5 min, and starting again from 10 s once a run lasted
10 min. A run is a new process: a new pid (from `RESTART_PID_BASE` up, one band of pids per
restarting process), its own start time, and on Kubernetes a new container id; the job (pod,
Slurm job) stays the same, so the exporter sees the job's process come back with a new pid and
start time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from gpulens.sim.defaults import make_container_id
from gpulens.sim.patterns import Workload
from gpulens.sim.scenario import RESTART_PID_BASE, RESTART_PID_SLOT, KubernetesJob, ProcessSpec

BACKOFF_FIRST = 10.0  # seconds (kubelet: initial CrashLoopBackOff)
BACKOFF_MAX = 300.0  # seconds (kubelet: the cap)
BACKOFF_RESET = 600.0  # a run this long resets the back-off
_DOUBLINGS = 5  # 10, 20, 40, 80, 160, then 300


def oom_age(workload: Workload, limit: int) -> float:
    """The age at which the workload's memory first exceeds `limit` (inf: never).

    Memory only grows until it reaches its steady `memory` (training warm-up, a `growing` leak's
    first climb), so the crossing is found by bisection on that climb.
    """
    spec = workload.spec
    if spec.memory_bytes <= limit:
        return math.inf
    if workload.memory(0.0) > limit:
        return 0.0
    lo = 0.0
    hi = spec.warmup_seconds if spec.pattern == "training" else spec.over_seconds
    for _ in range(60):  # memory(lo) <= limit < memory(hi)
        mid = (lo + hi) / 2
        if workload.memory(mid) > limit:
            hi = mid
        else:
            lo = mid
    return math.ceil(hi * 1000) / 1000  # whole milliseconds: run starts stay readable


def backoff(failures: int, run_length: float) -> float:
    """Seconds the kubelet waits before restart number `failures` (1 = after the first failure)."""
    if run_length >= BACKOFF_RESET:
        return BACKOFF_FIRST
    return min(BACKOFF_FIRST * 2.0 ** min(failures - 1, _DOUBLINGS), BACKOFF_MAX)


@dataclass
class Lifecycle:
    """The runs of one process with a memory limit; `slot` picks its band of restart pids."""

    spec: ProcessSpec
    run_length: float  # seconds each run lasts (inf: never fails; 0: fails at once, never seen)
    slot: int
    _runs: dict[int, ProcessSpec] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: ProcessSpec, workload: Workload, slot: int) -> Lifecycle:
        assert spec.memory_limit_bytes is not None
        return cls(spec, oom_age(workload, spec.memory_limit_bytes), slot)

    def run_start(self, n: int) -> float:
        """When run n (0: the first) starts, relative to the node's start."""
        length, start = self.run_length, self.spec.start
        if length >= BACKOFF_RESET:
            return start + n * (length + BACKOFF_FIRST)
        head = min(n, _DOUBLINGS + 1)
        start += sum(length + backoff(k, length) for k in range(1, head + 1))
        return start + (n - head) * (length + BACKOFF_MAX)

    def run_index(self, r: float) -> int:
        """The last run that started at or before r (r at or after the first start)."""
        length = self.run_length
        if length >= BACKOFF_RESET:
            return int((r - self.spec.start) // (length + BACKOFF_FIRST))
        n = 0
        while n <= _DOUBLINGS and self.run_start(n + 1) <= r:
            n += 1
        if n <= _DOUBLINGS:
            return n
        return n + int((r - self.run_start(n)) // (length + BACKOFF_MAX))

    def at(self, r: float) -> ProcessSpec | None:
        """The run alive at r, as a spec with its own pid, start and end; None between runs."""
        spec = self.spec
        if not spec.start <= r < spec.end or self.run_length <= 0:
            return None
        if math.isinf(self.run_length):
            return spec
        n = self.run_index(r)
        start = self.run_start(n)
        if r - start >= self.run_length:
            return None  # failed, waiting for the back-off
        return self._run(n, start)

    def _run(self, n: int, start: float) -> ProcessSpec:
        run = self._runs.get(n)
        if run is None:
            if len(self._runs) > 64:
                self._runs.clear()  # clocks only move forward: old runs are not asked for again
            spec = self.spec
            job = spec.job
            if n and isinstance(job, KubernetesJob):
                job = replace(job, container_id=make_container_id(job.namespace, job.pod, job.container, n))
            pid = spec.pid
            if n:
                pid = RESTART_PID_BASE + self.slot * RESTART_PID_SLOT + (n - 1) % RESTART_PID_SLOT
            run = replace(spec, pid=pid, start=start, end=min(spec.end, start + self.run_length), job=job)
            self._runs[n] = run
        return run
