"""The scenario engine: a scenario, a seed and a clock become `GpuState` records.

`build_node` returns a `ScenarioNode`, the `SimNode` the simulated NVML library serves. Per GPU and
instant it sums the processes' workload samples per container (whole GPU, or MIG instance), derives
utilization, power, clocks, temperature and throttle reasons from that activity and the fault
timeline, and reads counters (energy, PCIe/NVLink bytes) from a per-GPU integrator.

Counters are integrated over fixed 10 s buckets of the smooth activity envelope, evaluated at each
bucket's start (a left Riemann sum from the node's start). So they are monotonic, independent of the
order and frequency of queries, and agree with the gauges on average; a simulated week costs about
60 k envelope evaluations per GPU. States are cached per GPU and 100 ms quantum (NVML itself refreshes
most readings about ten times a second), so the ~40 calls one sampler makes per GPU share one state.

Nothing here touches global random state or numpy: noise comes from `patterns.hash_unit`.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpulens.catalog import CatalogError
from gpulens.migplacement import place_mig_layout
from gpulens.sim.checks import Check
from gpulens.sim.clock import RealClock
from gpulens.sim.defaults import (
    default_gpu_instance_id,
    gpu_reserved_bytes,
    instance_reserved_bytes,
    make_uuid,
)
from gpulens.sim.faults import GpuFaults, Timeline
from gpulens.sim.parse_processes import parse_process
from gpulens.sim.patterns import Sample, Workload, WorkloadSpec, hash_unit
from gpulens.sim.procfs import NodeFiles, ProcView, job_id
from gpulens.sim.restarts import Lifecycle
from gpulens.sim.scenario import (
    FOREVER,
    THROTTLE_BITS,
    EccFault,
    GpuSpec,
    HangFault,
    InitErrorFault,
    MigCreateFault,
    MigDestroyFault,
    MigInstanceSpec,
    ProcessSpec,
    Scenario,
    ScenarioError,
    ThrottleFault,
    XidFault,
    instance_profiles,
)
from gpulens.sim.state import (
    NO_INSTANCE,
    ActivityState,
    DriverInfo,
    GpuIdentity,
    GpuState,
    MigInstanceState,
    NvLinkState,
    ProcessState,
    SimClock,
    SimEvent,
)
from gpulens.sim.topology import Topology, default_topology

MIB = 1024**2
GIB = 1024**3
QUANTUM = 0.1  # seconds: states are cached per GPU and quantum (NVML refreshes readings ~10x a second)
BUCKET = 10.0  # seconds: counter integration step
TEMP_WINDOW = 120.0  # seconds of average power the temperature follows
ACTIVITY_READINGS = 16  # most readings averaged by activity_between
# GPU utilization samples the driver keeps (nvmlDeviceGetSamples): one per one-second reading, the
# readings' own period; a real driver's buffer is longer, but each sample costs one activity
# evaluation, and 16 cover the exporter's usual intervals (older ones are simply not returned)
UTILIZATION_SAMPLES = 16

_IDLE_BUSY = 0.05
_NO_SAMPLE = Sample()  # placeholder for processes not sampled yet (never mutated)
_REASON_IDLE = THROTTLE_BITS["gpu_idle"]
_REASON_POWER_CAP = THROTTLE_BITS["sw_power_cap"]
_THERMAL = THROTTLE_BITS["sw_thermal"] | THROTTLE_BITS["hw_thermal"]
_CLOCK_FACTORS = (  # (reason bits, factor applied to the SM clock)
    (THROTTLE_BITS["hw_power_brake"], 0.25),
    (THROTTLE_BITS["hw_slowdown"], 0.5),
    (THROTTLE_BITS["hw_thermal"], 0.6),
    (THROTTLE_BITS["sw_thermal"], 0.7),
    (THROTTLE_BITS["sw_power_cap"], 0.85),
    (THROTTLE_BITS["applications_clocks"], 0.9),
)


# ---------------------------------------------------------------------------------------------
# activity sums


@dataclass
class _Acc:
    """Summed activity of the processes in one container."""

    busy: float = 0.0
    busy_idle_product: float = 1.0  # for MPS: probability no client is running a kernel
    sm: float = 0.0
    occupancy: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    fp64: float = 0.0
    fp32: float = 0.0
    fp16: float = 0.0
    integer: float = 0.0
    pcie_tx: float = 0.0
    pcie_rx: float = 0.0
    nvlink_tx: float = 0.0
    nvlink_rx: float = 0.0
    memory: int = 0

    def add(self, s: Sample) -> None:
        self.busy += s.busy
        self.busy_idle_product *= 1.0 - s.busy
        self.sm += s.sm
        self.occupancy += s.occupancy
        self.tensor += s.tensor
        self.dram += s.dram
        self.fp64 += s.fp64
        self.fp32 += s.fp32
        self.fp16 += s.fp16
        self.integer += s.integer
        self.pcie_tx += s.pcie_tx
        self.pcie_rx += s.pcie_rx
        self.nvlink_tx += s.nvlink_tx
        self.nvlink_rx += s.nvlink_rx
        self.memory += s.memory

    def finish(self, concurrent: bool) -> _Acc:
        """Clip to what one container can do; MPS clients run concurrently, others time-slice."""
        busy = 1.0 - self.busy_idle_product if concurrent else self.busy
        # SM activity (a share of SMs over time) never exceeds the time any kernel ran
        return _Acc(
            busy=min(1.0, max(busy, self.sm)),
            sm=min(1.0, self.sm),
            occupancy=min(1.0, self.occupancy),
            tensor=min(1.0, self.tensor),
            dram=min(1.0, self.dram),
            fp64=min(1.0, self.fp64),
            fp32=min(1.0, self.fp32),
            fp16=min(1.0, self.fp16),
            integer=min(1.0, self.integer),
            pcie_tx=self.pcie_tx,
            pcie_rx=self.pcie_rx,
            nvlink_tx=self.nvlink_tx,
            nvlink_rx=self.nvlink_rx,
            memory=self.memory,
        )

    def scaled_into(self, target: _Acc, weight: float) -> None:
        """Add this instance's activity to the GPU's, weighted by its share of the SMs."""
        target.busy += self.busy * weight
        target.sm += self.sm * weight
        target.occupancy += self.occupancy * weight
        target.tensor += self.tensor * weight
        target.dram += self.dram * weight
        target.fp64 += self.fp64 * weight
        target.fp32 += self.fp32 * weight
        target.fp16 += self.fp16 * weight
        target.integer += self.integer * weight
        target.pcie_tx += self.pcie_tx
        target.pcie_rx += self.pcie_rx
        target.nvlink_tx += self.nvlink_tx
        target.nvlink_rx += self.nvlink_rx
        target.memory += self.memory

    def activity(self) -> ActivityState:
        return ActivityState(
            graphics=max(self.busy, self.sm),
            sm=self.sm,
            sm_occupancy=self.occupancy,
            tensor=self.tensor,
            dram=self.dram,
            fp64=self.fp64,
            fp32=self.fp32,
            fp16=self.fp16,
            integer=self.integer,
            pcie_tx_bytes_per_second=self.pcie_tx,
            pcie_rx_bytes_per_second=self.pcie_rx,
            nvlink_tx_bytes_per_second=self.nvlink_tx,
            nvlink_rx_bytes_per_second=self.nvlink_rx,
        )


def _container_sums(
    procs: Iterable[_Proc], r: float, instances: Container[int | None] | None = None
) -> dict[int | None, _Acc]:
    """The activity of the processes running at r, summed per container (a GPU instance id, or
    None on a whole GPU), in process order; with `instances`, only processes in those instances.

    The one summation the whole-GPU, per-instance and DCGM/GPM window readings share; `_snapshot`
    sums its own samples (smoothed, MPS-aware) the same way before `_gpu_total`.
    """
    containers: dict[int | None, _Acc] = {}
    for proc in procs:
        spec = proc.spec if proc.life is None else proc.life.at(r)
        if spec is None:
            continue
        if spec.start <= r < spec.end and (instances is None or spec.instance in instances):
            containers.setdefault(spec.instance, _Acc()).add(proc.workload.sample(r - spec.start))
    return containers


def _gpu_total(
    g: GpuSpec, layout: Sequence[MigInstanceSpec], containers: dict[int | None, _Acc], *, concurrent: bool
) -> tuple[_Acc, dict[int, _Acc]]:
    """(the GPU's activity, each instance's) from container sums: a whole GPU clips its one
    container (MPS clients run concurrently); a MIG GPU adds its instances weighted by SM share."""
    if g.mig is None:
        return containers.get(None, _Acc()).finish(concurrent), {}
    total = _Acc()
    instances: dict[int, _Acc] = {}
    for inst in layout:
        acc = containers.get(inst.gpu_instance_id, _Acc()).finish(False)
        instances[inst.gpu_instance_id] = acc
        acc.scaled_into(total, inst.profile.sm_count / g.model.sm_count)
    return total, instances


@dataclass
class _Running:
    """A process present on its GPU at one instant, with its sample."""

    spec: ProcessSpec
    pid: int
    sample: Sample
    start_time: float  # relative
    workload: Workload | None = None


@dataclass
class _Snapshot:
    """One GPU at one instant: per-container sums and the processes behind them."""

    gpu: _Acc
    instances: dict[int, _Acc]
    layout: tuple[MigInstanceSpec, ...]
    running: list[_Running]
    mps_server: _Running | None
    faults: GpuFaults


@dataclass
class _Proc:
    spec: ProcessSpec
    workload: Workload
    life: Lifecycle | None = None  # a process with a memory limit: its runs (OOM, restart)

    def at(self, r: float) -> ProcessSpec | None:
        """The spec of the process's run alive at r (its own spec without restarts), else None."""
        if self.life is not None:
            return self.life.at(r)
        spec = self.spec
        return spec if spec.start <= r < spec.end else None


@dataclass
class _Counters:
    """Cumulative integrals from the node's start at the boundaries of recent buckets.

    Only a window of buckets is kept (`base` is the first one): clocks never go backwards, and the
    temperature looks back two minutes, so older boundaries are never needed again; keeping them
    all would cost ~150 MB per simulated week on an 8-GPU node.
    """

    base: int = 0
    # prefix[i]: (energy J, PCIe tx B, PCIe rx B, NVLink tx B, NVLink rx B) at bucket base + i
    prefix: list[tuple[float, float, float, float, float]] = field(
        default_factory=lambda: [(0.0, 0.0, 0.0, 0.0, 0.0)]
    )
    rates: list[tuple[float, float, float, float, float]] = field(default_factory=list)


_KEEP_BUCKETS = 64  # boundaries kept behind the latest one (10 min 40 s)


def _bar1_total(memory_bytes: int) -> int:
    if memory_bytes <= 48 * GIB:
        return 64 * GIB
    if memory_bytes <= 100 * GIB:
        return 128 * GIB
    return 256 * GIB


def _round_clock(mhz: float) -> int:
    return int(round(mhz / 15.0) * 15)


def mig_uuid(hostname: str, gpu: int, inst: MigInstanceSpec) -> str:
    """A MIG device's UUID: stable for one placement of one profile on one GPU."""
    return _mig_uuid(hostname, gpu, inst.gpu_instance_id, inst.profile.name, inst.start)


@functools.lru_cache(maxsize=4096)
def _mig_uuid(hostname: str, gpu: int, gpu_instance_id: int, profile: str, start: int) -> str:
    return "MIG-" + make_uuid("mig", hostname, gpu, gpu_instance_id, profile, start)


class ScenarioNode:
    """A simulated GPU node driven by a scenario (implements `state.SimNode`).

    Thread-safe: the NVML library may call from several threads while a test injects faults.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        seed: int,
        clock: SimClock,
        procfs_root: Path | None = None,
        pods_root: Path | None = None,
        job_mapping_dir: Path | None = None,
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        self.clock = clock
        self.driver: DriverInfo = scenario.driver
        self.start_time = clock.now()
        self.procfs_root = procfs_root
        self.pods_root = pods_root
        self.job_mapping_dir = job_mapping_dir
        self._gpus = scenario.gpus
        self.identities: tuple[GpuIdentity, ...] = tuple(
            GpuIdentity(
                index=g.index,
                model=g.model,
                uuid=g.uuid,
                serial=g.serial,
                pci_bus_id=g.pci_bus_id,
                minor_number=g.index,
                board_part_number=f"692-2G{g.model.pci_device_id >> 16:04X}-0200-000",
                vbios_version="96.00.99.00.01" if g.model.architecture != "ampere" else "92.00.45.00.03",
            )
            for g in scenario.gpus
        )
        # None only for hand-built scenarios; parsed ones always carry one (their own or the default)
        self.topology: Topology | None = scenario.topology or default_topology(scenario.gpus)
        self._timeline = Timeline(scenario)
        self._lock = threading.RLock()
        self._procs: dict[int, list[_Proc]] = {g.index: [] for g in scenario.gpus}
        self._restart_slots = 0
        for spec in scenario.processes:
            self._procs[spec.gpu].append(self._new_proc(spec))
        self._mps_servers: dict[int, _Proc] = {}
        for g in scenario.gpus:
            if g.mps is not None:
                self._mps_servers[g.index] = _Proc(
                    self._mps_server_spec(g),
                    Workload(
                        WorkloadSpec("constant", g.mps.memory_bytes, 0.0, busy=0.0), seed, g.mps.server_pid
                    ),
                )
        self._runtime_mig: dict[int, list[MigInstanceSpec]] = {}
        self._cache: dict[int, tuple[int, GpuState]] = {}
        self._snapshots: dict[tuple[int, float], _Snapshot] = {}
        # GPU -> {whole simulated second -> utilization percent}: the driver's sample buffer
        self._util_samples: dict[int, dict[int, int]] = {}
        self._counters = [_Counters() for _ in scenario.gpus]
        self._counter_lock = threading.Lock()
        self._files = NodeFiles(procfs_root, pods_root, job_mapping_dir)
        self._files_key: object = None
        self._files_quantum: int | None = None
        self._energy_base_j = [
            g.model.idle_power_watts * 86400 * (1 + 20 * hash_unit(seed, g.index, 91)) for g in scenario.gpus
        ]
        self.sync_files()

    # -- SimNode ----------------------------------------------------------------------------------
    def init_error(self) -> int | None:
        return self._timeline.init_error(self.clock.now() - self.start_time)

    def gpu_state(self, index: int) -> GpuState:
        if not 0 <= index < len(self._gpus):
            raise IndexError(f"no GPU {index} on this node ({len(self._gpus)} GPUs)")
        now = self.clock.now()
        quantum = math.floor(now / QUANTUM)
        with self._lock:
            cached = self._cache.get(index)
            if cached is not None and cached[0] == quantum:
                return cached[1]
        state = self._build_state(index, quantum * QUANTUM)
        with self._lock:
            self._cache[index] = (quantum, state)
        self._maybe_sync_files(max(quantum * QUANTUM - self.start_time, 0.0), quantum=quantum)
        return state

    def events_between(self, start: float, end: float) -> list[SimEvent]:
        t0 = self.start_time
        return [
            SimEvent(
                time=t0 + e.at,
                gpu_index=e.gpu,
                event_type=e.event_type,
                data=e.data,
                gpu_instance_id=e.gpu_instance_id,
                compute_instance_id=e.compute_instance_id,
            )
            for e in self._timeline.events(start - t0, end - t0)
        ]

    def activity_between(
        self, index: int, gpu_instance_id: int | None, start: float, end: float
    ) -> ActivityState:
        # Each reading is already a one-second average, so readings one second apart cover the
        # interval. Lengths are taken to the state quantum: a sampler's 2 s window measures a few
        # ms more in real time and would otherwise cost 3 readings instead of 2 (integer windows,
        # as on a manual clock, are unchanged).
        t0 = self.start_time
        n = max(1, min(ACTIVITY_READINGS, math.ceil(end - start - QUANTUM)))
        step = (end - start) / n if end > start else 0.0
        times = [end - t0 - k * step for k in range(n)]
        total = _Acc()
        whole = gpu_instance_id in (None, NO_INSTANCE)
        for r in times:
            if whole:
                acc: _Acc | None = self._gpu_activity(index, r)
            else:
                acc = self._instance_activity(index, gpu_instance_id, r)
            if acc is not None:
                acc.scaled_into(total, 1.0)
        k = 1.0 / len(times)
        return ActivityState(
            graphics=min(1.0, max(total.busy, total.sm) * k),
            sm=total.sm * k,
            sm_occupancy=total.occupancy * k,
            tensor=total.tensor * k,
            dram=total.dram * k,
            fp64=total.fp64 * k,
            fp32=total.fp32 * k,
            fp16=total.fp16 * k,
            integer=total.integer * k,
            pcie_tx_bytes_per_second=total.pcie_tx * k,
            pcie_rx_bytes_per_second=total.pcie_rx * k,
            nvlink_tx_bytes_per_second=total.nvlink_tx * k,
            nvlink_rx_bytes_per_second=total.nvlink_rx * k,
        )

    def utilization_samples(self, index: int, end: float) -> tuple[tuple[float, int], ...]:
        # One sample per whole simulated second, each the one-second reading ending then (what
        # GetUtilizationRates answers at that second): the period the engine's readings have. The
        # last UTILIZATION_SAMPLES seconds since the node started; each computed once.
        last = math.floor(end)
        first = max(last - UTILIZATION_SAMPLES + 1, math.ceil(self.start_time))
        with self._lock:
            kept = self._util_samples.setdefault(index, {})
            known = {t: kept[t] for t in range(first, last + 1) if t in kept}
        for t in range(first, last + 1):
            if t not in known:
                known[t] = round(self._gpu_activity(index, t - self.start_time).busy * 100)
        with self._lock:
            self._util_samples[index] = known  # older seconds are dropped from the buffer
        return tuple((float(t), known[t]) for t in range(first, last + 1))

    # -- runtime changes (tests, demos) -----------------------------------------------------------
    def _now_rel(self) -> float:
        return self.clock.now() - self.start_time

    def _changed(self) -> None:
        with self._lock:
            self._cache.clear()
            self._snapshots.clear()
            self._util_samples.clear()
        self.sync_files()

    def _check_gpu(self, gpu: int) -> GpuSpec:
        if not 0 <= gpu < len(self._gpus):
            raise ValueError(f"no GPU {gpu} on this node ({len(self._gpus)} GPUs)")
        return self._gpus[gpu]

    def inject_xid(self, gpu: int, xid: int, gpu_instance_id: int | None = None) -> None:
        """Deliver Xid `xid` on `gpu` (or one of its GPU instances) now."""
        self._check_gpu(gpu)
        self._timeline.add(XidFault(at=self._now_rel(), gpu=gpu, code=xid, instance=gpu_instance_id))
        self._changed()

    def inject_ecc(self, gpu: int, *, corrected: int = 0, uncorrected: int = 0, location: int = 2) -> None:
        """Add ECC errors now (volatile and aggregate counters, and their events)."""
        self._check_gpu(gpu)
        self._timeline.add(
            EccFault(
                at=self._now_rel(),
                gpu=gpu,
                corrected=corrected,
                uncorrected=uncorrected,
                location=location,
            )
        )
        self._changed()

    def set_lost(self, gpu: int, lost: bool | None) -> None:
        """Force the GPU lost (True) or healthy (False); None follows the timeline again."""
        self._check_gpu(gpu)
        self._timeline.set_lost_override(gpu, lost)
        self._changed()

    def set_hang(self, gpu: int, seconds: float) -> None:
        """Calls on `gpu` block until `seconds` (simulated) from now have passed."""
        self._check_gpu(gpu)
        self._timeline.add(HangFault(at=self._now_rel(), gpu=gpu, duration=float(seconds)))
        self._changed()

    def set_throttle(self, gpu: int, reasons: int, seconds: float = FOREVER) -> None:
        """Set clock-event reason bits (`THROTTLE_BITS`) on `gpu` for `seconds` from now."""
        self._check_gpu(gpu)
        self._timeline.add(ThrottleFault(at=self._now_rel(), gpu=gpu, reasons=reasons, duration=seconds))
        self._changed()

    def set_init_error(self, code: int, seconds: float = FOREVER) -> None:
        """Make nvmlInit fail with NVML error `code` for `seconds` from now."""
        self._timeline.add(InitErrorFault(at=self._now_rel(), code=code, duration=seconds))
        self._changed()

    def add_process(self, raw: dict[str, Any]) -> ProcessSpec:
        """Start a process described like a scenario `processes` entry; `start` defaults to now.

        Raises ScenarioError (one line) for a bad description or a pid already running.
        """
        raw = dict(raw)
        now = self._now_rel()
        raw.setdefault("start", now)
        c = Check("add_process")
        instances = {g.index: instance_profiles(g, self.scenario.faults) for g in self._gpus}
        with self._lock:
            for gpu, created in self._runtime_mig.items():
                for inst in created:
                    instances[gpu].setdefault(inst.gpu_instance_id, inst.profile)
        users = dict(self.scenario.users)
        spec = parse_process(
            c, "process", raw, self._gpus, users, dict(self.scenario.kubernetes_defaults), instances
        )
        with self._lock:
            for procs in self._procs.values():
                for proc in procs:
                    running = proc.at(now)
                    if (proc.spec.pid == spec.pid and proc.spec.end > now) or (
                        running is not None and running.pid == spec.pid
                    ):
                        raise c.expected("process.pid", "a pid not running now", spec.pid)
            self._procs[spec.gpu].append(self._new_proc(spec))
        self._changed()
        return spec

    def _new_proc(self, spec: ProcessSpec, slot: int | None = None) -> _Proc:
        """A process's workload (under its MPS thread cap) and, with a memory limit, its runs;
        each restarting process takes the next band of restart pids (or `slot`: its own again)."""
        workload = Workload(spec.workload, self.seed, spec.pid, sm_cap=spec.sm_cap)
        if spec.memory_limit_bytes is None:
            return _Proc(spec, workload)
        if slot is None:
            slot, self._restart_slots = self._restart_slots, self._restart_slots + 1
        return _Proc(spec, workload, Lifecycle.of(spec, workload, slot))

    def remove_process(self, pid: int) -> None:
        """End a running process now."""
        now = self._now_rel()
        with self._lock:
            for procs in self._procs.values():
                for i, proc in enumerate(procs):
                    running = proc.at(now)
                    if running is not None and running.pid == pid:
                        ended = replace(proc.spec, end=now)
                        if proc.life is None:
                            procs[i] = _Proc(ended, proc.workload)
                        else:
                            procs[i] = self._new_proc(ended, proc.life.slot)
                        break
                else:
                    continue
                break
            else:
                raise ValueError(f"no running process with pid {pid}")
        self._changed()

    def create_mig_instance(
        self, gpu: int, profile: str, start: int | None = None, gpu_instance_id: int | None = None
    ) -> int:
        """Create a GPU instance now (as `nvidia-smi mig -cgi` would); returns its id."""
        spec = self._check_gpu(gpu)
        if spec.mig is None:
            raise ValueError(f"GPU {gpu} is not in MIG mode")
        now = self._now_rel()
        alive = self._timeline.mig_instances(gpu, self._initial_layout(gpu), now)
        try:
            requests: list[tuple[str, int | None]] = [(i.profile.name, i.start) for i in alive]
            placed = place_mig_layout(spec.model, [*requests, (profile, start)])[-1]
        except CatalogError as e:
            raise ValueError(str(e)) from None
        gid = (
            gpu_instance_id
            if gpu_instance_id is not None
            else default_gpu_instance_id(spec.model, placed.profile, placed.start)
        )
        if gid in {i.gpu_instance_id for i in alive}:
            raise ValueError(f"GPU instance id {gid} is in use on GPU {gpu}")
        used = {i.slot for i in alive}
        slot = next(s for s in range(spec.model.compute_slices) if s not in used)
        inst = MigInstanceSpec(placed.profile, placed.start, gid, slot)
        with self._lock:
            self._runtime_mig.setdefault(gpu, []).append(inst)
        self._timeline.add(MigCreateFault(at=now, gpu=gpu, mig=inst))
        self._changed()
        return gid

    def destroy_mig_instance(self, gpu: int, gpu_instance_id: int) -> None:
        """Destroy a GPU instance now; its processes disappear from NVML."""
        self._check_gpu(gpu)
        now = self._now_rel()
        alive = self._timeline.mig_instances(gpu, self._initial_layout(gpu), now)
        if gpu_instance_id not in {i.gpu_instance_id for i in alive}:
            raise ValueError(f"no GPU instance {gpu_instance_id} on GPU {gpu}")
        self._timeline.add(MigDestroyFault(at=now, gpu=gpu, instance=gpu_instance_id))
        self._changed()

    # -- files ------------------------------------------------------------------------------------
    def sync_files(self) -> None:
        """Write the procfs / pod / job-mapping trees for the processes running now."""
        self._maybe_sync_files(self._now_rel(), force=True)

    def _maybe_sync_files(self, r: float, force: bool = False, quantum: int | None = None) -> None:
        """Rewrite the file trees if the running processes changed (checked once per quantum)."""
        if not self._files.enabled:
            return
        if not force:
            with self._lock:
                if quantum is not None and quantum == self._files_quantum:
                    return
                self._files_quantum = quantum
        running: list[tuple[GpuSpec, _Running, MigInstanceSpec | None]] = []
        for g in self._gpus:
            layout = {i.gpu_instance_id: i for i in self._layout(g.index, r)}
            faults = self._timeline.gpu(g.index, r) if g.mps is not None else None
            for run in self._alive(g.index, r, faults):
                inst = layout.get(run.spec.instance) if run.spec.instance is not None else None
                running.append((g, run, inst))
        key = tuple((run.pid, id(run.spec), inst) for _, run, inst in running)
        with self._lock:
            if not force and key == self._files_key:
                return
            views: list[ProcView] = []
            mapping: dict[str, list[str]] = {}
            for g, run, inst in running:
                spec = run.spec
                uuid = mig_uuid(self.scenario.hostname, g.index, inst) if inst else g.uuid
                views.append(ProcView(spec, run.pid, uuid, self.scenario.hostname, g.mps))
                job = job_id(spec)
                if job is not None and (spec.instance is None or inst is not None):
                    device = str(g.index) if spec.instance is None else f"{g.index}.{spec.instance}"
                    mapping.setdefault(device, []).append(job)
            self._files_key = key
            self._files.sync(views, mapping)

    def close(self) -> None:
        """Remove the files this node wrote."""
        with self._lock:
            self._files.clear()
            self._files_key = None

    # -- evaluation -------------------------------------------------------------------------------
    def _initial_layout(self, gpu: int) -> tuple[MigInstanceSpec, ...]:
        return self._gpus[gpu].mig or ()

    def _layout(self, gpu: int, r: float) -> tuple[MigInstanceSpec, ...]:
        if self._gpus[gpu].mig is None:
            return ()
        return self._timeline.mig_instances(gpu, self._initial_layout(gpu), r)

    def _mps_server_spec(self, g: GpuSpec) -> ProcessSpec:
        assert g.mps is not None
        return ProcessSpec(
            pid=g.mps.server_pid,
            gpu=g.index,
            instance=None,
            kind="mps_server",
            name="nvidia-cuda-mps-server",
            cmdline=("nvidia-cuda-mps-server",),
            user=g.mps.user,
            uid=g.mps.uid,
            job=None,
            start=g.mps.start,
            end=FOREVER,
            workload=WorkloadSpec("constant", g.mps.memory_bytes, 0.0, busy=0.0),
        )

    def _alive(self, gpu: int, r: float, faults: GpuFaults | None) -> list[_Running]:
        """Processes running at r (the MPS server first), without samples."""
        out: list[_Running] = []
        server = self._mps_servers.get(gpu)
        if server is not None:
            assert faults is not None
            if faults.mps_down or r < server.spec.start:
                return []  # clients need their server
            mps = self._gpus[gpu].mps
            assert mps is not None
            pid = mps.server_pid if faults.mps_restarts % 2 == 0 else mps.restart_pid
            started = max(server.spec.start, faults.mps_up_since)
            out.append(_Running(server.spec, pid, _NO_SAMPLE, started, server.workload))
        with self._lock:
            procs = list(self._procs[gpu])
        for proc in procs:
            spec = proc.at(r)
            if spec is not None:
                start = spec.start
                if spec.kind == "mps_client" and server is not None:
                    start = max(start, out[0].start_time)
                out.append(_Running(spec, spec.pid, _NO_SAMPLE, start, proc.workload))
        return out

    def _cached_snapshot(self, gpu: int, r: float) -> _Snapshot:
        key = (gpu, r)
        with self._lock:
            snap = self._snapshots.get(key)
        if snap is None:
            snap = self._snapshot(gpu, r, smooth=False)
            with self._lock:
                if len(self._snapshots) >= 128:
                    self._snapshots.pop(next(iter(self._snapshots)))
                self._snapshots[key] = snap
        return snap

    def _instance_activity(self, gpu: int, gpu_instance_id: int | None, r: float) -> _Acc | None:
        """One GPU instance's activity at r: `_snapshot(gpu, r).instances[id]`, computed from that
        instance's processes only.

        GPM and DCGM read every instance over its own window, so these instants rarely coincide
        with a cached whole-GPU snapshot; sampling only the instance's few processes instead of all
        of the GPU's makes a 7-instance GPU cost about one snapshot per reading instead of seven.
        """
        g = self._gpus[gpu]
        if g.mig is None:
            return None  # no instances on a whole GPU
        with self._lock:
            snap = self._snapshots.get((gpu, r))
            procs = [p for p in self._procs[gpu] if p.spec.instance == gpu_instance_id]
        if snap is not None:
            return snap.instances.get(gpu_instance_id)  # type: ignore[arg-type]
        if g.mps is not None:  # never with MIG (validated); keep the general path in case
            return self._cached_snapshot(gpu, r).instances.get(gpu_instance_id)  # type: ignore[arg-type]
        if not any(i.gpu_instance_id == gpu_instance_id for i in self._layout(gpu, r)):
            return None
        # the order of _alive, so the sums are bit-identical to _snapshot's
        return _container_sums(procs, r).get(gpu_instance_id, _Acc()).finish(False)

    def _gpu_activity(self, gpu: int, r: float) -> _Acc:
        """The whole GPU's activity at r: `_snapshot(gpu, r).gpu` without building the per-process
        records a state needs (the sums run in the same order, so they are bit-identical)."""
        g = self._gpus[gpu]
        with self._lock:
            snap = self._snapshots.get((gpu, r))
            procs = list(self._procs[gpu])
        if snap is not None:
            return snap.gpu
        if g.mps is not None:  # the server and client (re)starts: the general path
            return self._cached_snapshot(gpu, r).gpu
        if g.mig is None:
            return _gpu_total(g, (), _container_sums(procs, r), concurrent=False)[0]
        layout = self._layout(gpu, r)
        containers = _container_sums(procs, r, {i.gpu_instance_id for i in layout})
        return _gpu_total(g, layout, containers, concurrent=False)[0]

    def _snapshot(self, gpu: int, r: float, smooth: bool) -> _Snapshot:
        g = self._gpus[gpu]
        faults = self._timeline.gpu(gpu, r)
        layout = self._layout(gpu, r)
        instance_ids = {i.gpu_instance_id for i in layout}
        running: list[_Running] = []
        server: _Running | None = None
        containers: dict[int | None, _Acc] = {}
        for run in self._alive(gpu, r, faults):
            if run.spec.kind == "mps_server":
                server = _Running(
                    run.spec, run.pid, Sample(memory=g.mps.memory_bytes if g.mps else 0), run.start_time
                )
                continue
            if g.mig is not None and run.spec.instance not in instance_ids:
                continue  # its GPU instance does not exist (yet / any more)
            assert run.workload is not None
            age = r - run.start_time
            sample = run.workload.expected(age) if smooth else run.workload.sample(age)
            running.append(_Running(run.spec, run.pid, sample, run.start_time, run.workload))
            containers.setdefault(run.spec.instance, _Acc()).add(sample)
        gpu_acc, instances = _gpu_total(g, layout, containers, concurrent=g.mps is not None)
        if g.mig is None and server is not None:
            gpu_acc.memory += server.sample.memory
        return _Snapshot(gpu_acc, instances, layout, running, server, faults)

    @staticmethod
    def _mean_busy(run: _Running, r: float) -> float:
        """The process's busy time over the reader's interval: its smooth envelope at `r`."""
        if run.workload is None:
            return run.sample.busy
        return min(1.0, run.workload.power_terms(r - run.start_time)[0])

    def _power_w(self, g: GpuSpec, acc: _Acc, reasons: int) -> tuple[float, bool]:
        """Board power for this activity, and whether the power limit capped it."""
        model = g.model
        idle = float(model.idle_power_watts)
        dynamic = 0.12 * acc.busy + 0.48 * acc.sm + 0.25 * acc.tensor + 0.15 * acc.dram
        power = idle + (model.power_limit_watts - idle) * min(1.0, dynamic)
        if reasons & THROTTLE_BITS["hw_power_brake"]:
            power = min(power, idle + 0.1 * (g.power_limit_watts - idle))
        elif reasons & (_THERMAL | THROTTLE_BITS["hw_slowdown"]):
            power = idle + (power - idle) * 0.75
        capped = power > g.power_limit_watts * 0.98
        return min(power, float(g.power_limit_watts)), capped

    def _rates(self, gpu: int, r: float) -> tuple[float, float, float, float, float]:
        """Smooth (power W, PCIe tx, PCIe rx, NVLink tx, NVLink rx B/s) at r: the integrand of the
        counters. A lean copy of `_snapshot(smooth=True)`, as it runs once per 10 s bucket."""
        g = self._gpus[gpu]
        faults = self._timeline.gpu(gpu, r)
        if faults.lost:
            return float(g.model.idle_power_watts), 0.0, 0.0, 0.0, 0.0
        weights: dict[int | None, float] = {None: 1.0}
        if g.mig is not None:
            weights = {i.gpu_instance_id: i.profile.sm_count / g.model.sm_count for i in self._layout(gpu, r)}
        sums: dict[int | None, list[float]] = {}
        with self._lock:
            procs = list(self._procs[gpu])
        mps_since = -math.inf
        if g.mps is not None:
            if faults.mps_down or r < g.mps.start:
                procs = []
            mps_since = max(g.mps.start, faults.mps_up_since)
        for proc in procs:
            spec = proc.at(r)
            if spec is None or spec.instance not in weights:
                continue
            start = spec.start
            if spec.kind == "mps_client":
                start = max(start, mps_since)  # as in _alive: clients (re)connect to the server
            terms = proc.workload.power_terms(r - start)
            acc = sums.get(spec.instance)
            if acc is None:
                sums[spec.instance] = [*terms, 1.0 - terms[0]]
            else:
                for k in range(8):
                    acc[k] += terms[k]
                acc[8] *= 1.0 - terms[0]
        total = _Acc()
        for container, acc in sums.items():
            busy = 1.0 - acc[8] if g.mps is not None else acc[0]
            w = weights[container]
            total.busy += min(1.0, busy) * w
            total.sm += min(1.0, acc[1]) * w
            total.tensor += min(1.0, acc[2]) * w
            total.dram += min(1.0, acc[3]) * w
            total.pcie_tx += acc[4]
            total.pcie_rx += acc[5]
            total.nvlink_tx += acc[6]
            total.nvlink_rx += acc[7]
        power, _ = self._power_w(g, total, faults.throttle)
        return power, total.pcie_tx, total.pcie_rx, total.nvlink_tx, total.nvlink_rx

    def _integrals(self, gpu: int, r: float) -> tuple[float, float, float, float, float]:
        """(energy J, PCIe tx B, PCIe rx B, NVLink tx B, NVLink rx B) from the start to r."""
        if r <= 0:
            return 0.0, 0.0, 0.0, 0.0, 0.0
        k = math.floor(r / BUCKET)
        c = self._counters[gpu]
        with self._counter_lock:
            if k < c.base:  # older than the kept window: integrate again from the start
                total = (0.0, 0.0, 0.0, 0.0, 0.0)
                for j in range(k):
                    rate = self._rates(gpu, j * BUCKET)
                    total = tuple(a + b * BUCKET for a, b in zip(total, rate, strict=True))  # type: ignore[assignment]
                rate = self._rates(gpu, k * BUCKET)
                start = total
            else:
                while c.base + len(c.rates) <= k:
                    rate = self._rates(gpu, (c.base + len(c.rates)) * BUCKET)
                    last = c.prefix[-1]
                    c.rates.append(rate)
                    c.prefix.append(tuple(a + b * BUCKET for a, b in zip(last, rate, strict=True)))  # type: ignore[arg-type]
                    if len(c.rates) > 2 * _KEEP_BUCKETS:
                        del c.rates[:_KEEP_BUCKETS]
                        del c.prefix[:_KEEP_BUCKETS]
                        c.base += _KEEP_BUCKETS
                rate = c.rates[k - c.base]
                start = c.prefix[k - c.base]
        part = r - k * BUCKET
        return (
            start[0] + rate[0] * part,
            start[1] + rate[1] * part,
            start[2] + rate[2] * part,
            start[3] + rate[3] * part,
            start[4] + rate[4] * part,
        )

    def _thermal(
        self, index: int, r: float, acc: _Acc, throttle: int, energy_since_start_j: float
    ) -> tuple[float, float, int, float]:
        """(board power W, temperature C, clock event reasons, SM clock MHz) at r."""
        g = self._gpus[index]
        model = g.model
        power_w, capped = self._power_w(g, acc, throttle)
        # temperature follows recent average power
        window = min(TEMP_WINDOW, max(r, 0.0))
        if window >= 1.0:
            past = self._integrals(index, r - window)[0]
            average_w = 0.4 * power_w + 0.6 * (energy_since_start_j - past) / window
        else:
            average_w = power_w
        noise = hash_unit(self.seed, index, 77, math.floor(r))
        temperature = g.ambient_c + 47.0 * average_w / model.power_limit_watts + (noise - 0.5)
        reasons = throttle
        if reasons & _THERMAL:
            temperature = max(temperature, 87.0 + 3 * noise)
        if capped:
            reasons |= _REASON_POWER_CAP
        idle = acc.busy < _IDLE_BUSY and not (reasons & ~_REASON_IDLE)
        if idle:
            reasons |= _REASON_IDLE
        fast = model.architecture != "ampere"
        sm_clock = model.max_sm_clock_mhz * ((0.175 if fast else 0.15) if idle else 1.0)
        for bits, factor in _CLOCK_FACTORS:
            if reasons & bits:
                sm_clock = min(sm_clock, model.max_sm_clock_mhz * factor)
        return power_w, temperature, reasons, sm_clock

    def _process_states(
        self, g: GpuSpec, snap: _Snapshot, reserved: int, r: float
    ) -> tuple[list[ProcessState], list[ProcessState], dict[int | None, list[ProcessState]]]:
        """(processes with the MPS server first, MPS clients, every process by GPU instance): each
        process's memory is what it asked for, scaled down when its container is over-subscribed.

        A process's SM utilization is its smooth envelope's busy time, not the one-second reading:
        NVML keeps a sample per driver period and the exporter averages those since its last read
        (exporter/backends/nvml.py), so the figure it sees is a mean over its interval, on the same
        footing as the SM activity counters integrate (GPM, DCGM). A one-second draw of a stepping
        trainer beside that mean split the device figure by noise."""
        model = g.model
        processes: list[ProcessState] = []
        clients: list[ProcessState] = []
        if snap.mps_server is not None:
            s = snap.mps_server
            processes.append(
                ProcessState(
                    pid=s.pid,
                    kind="mps_server",
                    used_memory_bytes=s.sample.memory,
                    start_time=self.start_time + s.start_time,
                    name=s.spec.name,
                )
            )
        by_instance: dict[int | None, list[ProcessState]] = {}
        capacity: dict[int | None, int] = {None: model.memory_bytes - reserved}
        for inst in snap.layout:
            capacity[inst.gpu_instance_id] = inst.profile.memory_bytes - instance_reserved_bytes(inst.profile)
        demand: dict[int | None, int] = {}
        for run in snap.running:
            demand[run.spec.instance] = demand.get(run.spec.instance, 0) + run.sample.memory
        for run in snap.running:
            container = run.spec.instance
            memory = run.sample.memory
            if demand[container] > capacity[container]:  # over-subscribed: the allocations that fit
                memory = int(memory * capacity[container] / demand[container])
            gi = container if container is not None else NO_INSTANCE
            ps = ProcessState(
                pid=run.pid,
                kind=run.spec.kind,
                used_memory_bytes=memory // MIB * MIB,
                sm_util_percent=round(self._mean_busy(run, r) * 100),
                mem_util_percent=round(min(1.0, run.sample.dram * 1.2) * 100),
                gpu_instance_id=gi,
                compute_instance_id=0 if container is not None else NO_INSTANCE,
                start_time=self.start_time + run.start_time,
                name=run.spec.name,
            )
            by_instance.setdefault(container, []).append(ps)
            if run.spec.kind == "mps_client":
                clients.append(ps)
            else:
                processes.append(ps)
        return processes, clients, by_instance

    def _mig_states(
        self, index: int, snap: _Snapshot, by_instance: dict[int | None, list[ProcessState]]
    ) -> tuple[list[MigInstanceState], int]:
        """Each MIG instance's state, and the memory all of them use (reserved included)."""
        mig_states: list[MigInstanceState] = []
        used = 0
        for inst in snap.layout:
            inst_acc = snap.instances[inst.gpu_instance_id]
            inst_procs = by_instance.get(inst.gpu_instance_id, [])
            inst_reserved = instance_reserved_bytes(inst.profile)
            inst_used = inst_reserved + sum(p.used_memory_bytes or 0 for p in inst_procs)
            used += inst_used
            mig_states.append(
                MigInstanceState(
                    slot=inst.slot,
                    gpu_instance_id=inst.gpu_instance_id,
                    compute_instance_id=0,
                    profile=inst.profile,
                    placement_start=inst.start,
                    uuid=mig_uuid(self.scenario.hostname, index, inst),
                    memory_total_bytes=inst.profile.memory_bytes,
                    memory_used_bytes=inst_used,
                    memory_reserved_bytes=inst_reserved,
                    activity=inst_acc.activity(),
                    processes=tuple(p for p in inst_procs if p.kind != "mps_client"),
                    mps_clients=tuple(p for p in inst_procs if p.kind == "mps_client"),
                )
            )
        return mig_states, used

    def _build_state(self, index: int, t: float) -> GpuState:
        """The GPU's state at t, in named steps: activity (the cached snapshot), power, heat and
        clocks, processes and memory, MIG instances, then the fault-driven health counters."""
        g = self._gpus[index]
        model = g.model
        r = max(t - self.start_time, 0.0)  # the quantum may begin just before the node did
        snap = self._cached_snapshot(index, r)
        faults = snap.faults
        acc = snap.gpu
        busy = acc.busy
        integrals = self._integrals(index, r)
        energy_j = self._energy_base_j[index] + integrals[0]
        power_w, temperature, reasons, sm_clock = self._thermal(index, r, acc, faults.throttle, integrals[0])
        sm_clock_i = _round_clock(sm_clock)
        reserved = gpu_reserved_bytes(model)
        processes, clients, by_instance = self._process_states(g, snap, reserved, r)
        mig_states, instances_used = self._mig_states(index, snap, by_instance)
        used = reserved + instances_used
        if g.mig is None:
            used += sum(p.used_memory_bytes or 0 for p in (*processes, *clients))
        ecc_totals, memory_errors = _ecc_counters(g, faults)
        remapped: tuple[int, int, bool, bool] | None = None
        if model.row_remapping and not snap.layout:
            remapped = (
                g.remapped_rows[0],
                g.remapped_rows[1] + faults.remap_rows,
                faults.remap_pending,
                faults.remap_failed,
            )
        links = model.nvlink_links if g.nvlink else 0  # no links exposed: NvLink calls are NS
        nvlinks = tuple(
            NvLinkState(
                link=link,
                active=True,
                tx_kib_total=int(integrals[3] / links / 1024),
                rx_kib_total=int(integrals[4] / links / 1024),
                errors={c: n for c, n in faults.nvlink_errors.get(link, {}).items()},
            )
            for link in range(links)
        )
        bar1_total = _bar1_total(model.memory_bytes)
        n_procs = len(snap.running) + (1 if snap.mps_server else 0)
        return GpuState(
            index=index,
            lost=faults.lost,
            hang_seconds=faults.hang_seconds,
            utilization_gpu_percent=round(busy * 100),
            utilization_memory_percent=round(min(1.0, acc.dram * 1.2) * 100),
            memory_total_bytes=model.memory_bytes,
            memory_reserved_bytes=reserved,
            memory_used_bytes=min(used, model.memory_bytes),
            bar1_total_bytes=bar1_total,
            bar1_used_bytes=(2 + 2 * n_procs) * MIB,
            temperature_c=round(temperature),
            memory_temperature_c=round(temperature + 3 + 10 * acc.dram),
            power_mw=int(power_w * 1000),
            power_limit_mw=g.power_limit_watts * 1000,
            default_power_limit_mw=model.power_limit_watts * 1000,
            energy_mj=int(energy_j * 1000),
            graphics_clock_mhz=sm_clock_i,
            sm_clock_mhz=sm_clock_i,
            memory_clock_mhz=model.max_memory_clock_mhz,
            video_clock_mhz=_round_clock(sm_clock * 0.89),
            clock_event_reasons=reasons,
            supported_clock_event_reasons=0x1FF,
            fan_percent=round(30 + 0.8 * max(0.0, temperature - 30)) if model.has_fan else None,
            performance_state=0,
            compute_mode=g.compute_mode,
            persistence_mode=g.persistence_mode,
            pcie_tx_kbps=int(acc.pcie_tx / 1000),
            pcie_rx_kbps=int(acc.pcie_rx / 1000),
            pcie_tx_bytes_total=int(integrals[1]),
            pcie_rx_bytes_total=int(integrals[2]),
            pcie_replay_count=faults.pcie_replay,
            pcie_link_generation=model.pcie_generation,
            pcie_link_width=model.pcie_width,
            nvlinks=nvlinks,
            ecc_enabled=g.ecc,
            ecc_totals=ecc_totals,
            memory_error_counters=memory_errors,
            remapped_rows=remapped,
            retired_pages=None,
            retired_pages_pending=None,
            mig_mode_current=(1 if g.mig is not None else 0) if model.mig_capable else None,
            mig_mode_pending=(1 if g.mig is not None else 0) if model.mig_capable else None,
            mig_instances=tuple(mig_states),
            processes=tuple(processes),
            mps_clients=tuple(clients) if g.mig is None else (),
            activity=acc.activity(),
            accounting_enabled=g.accounting and g.mig is None,
        )


def _ecc_counters(
    g: GpuSpec, faults: GpuFaults
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int, int], int]]:
    """ECC totals (type, volatile/aggregate) and per-location memory error counters, when ECC is on."""
    ecc_totals: dict[tuple[int, int], int] = {}
    memory_errors: dict[tuple[int, int, int], int] = {}
    if g.ecc:
        for etype in (0, 1):
            volatile = sum(n for (t_, _loc), n in faults.ecc.items() if t_ == etype)
            total = sum(n for (t_, _loc), n in faults.ecc_total.items() if t_ == etype)
            ecc_totals[(etype, 0)] = volatile
            ecc_totals[(etype, 1)] = total + g.ecc_aggregate[etype]
            for location in sorted({0, 1, 2, 3, 7} | {loc for (_t, loc) in faults.ecc_total}):
                memory_errors[(etype, 0, location)] = faults.ecc.get((etype, location), 0)
                memory_errors[(etype, 1, location)] = faults.ecc_total.get((etype, location), 0) + (
                    g.ecc_aggregate[etype] if location == 2 else 0
                )
    return ecc_totals, memory_errors


def build_node(
    scenario: Scenario,
    *,
    seed: int | None = None,
    clock: SimClock | None = None,
    procfs_root: Path | None = None,
    pods_root: Path | None = None,
    job_mapping_dir: Path | None = None,
) -> ScenarioNode:
    """A simulated node for `scenario`, started at `clock.now()`.

    `seed` defaults to the scenario's; `clock` to real time. When given, `procfs_root` gets a fake
    `/proc` (`<root>/<pid>/{cgroup,environ,comm,cmdline,status}`), `pods_root` a fake
    `/var/log/pods`, and `job_mapping_dir` dcgm-exporter style job-mapping files; all kept in step
    with the running processes.
    """
    if not isinstance(scenario, Scenario):
        raise ScenarioError(
            f"build_node: expected a Scenario (from load_scenario), found {type(scenario).__name__}"
        )
    return ScenarioNode(
        scenario,
        seed=scenario.seed if seed is None else seed,
        clock=clock if clock is not None else RealClock(),
        procfs_root=Path(procfs_root) if procfs_root is not None else None,
        pods_root=Path(pods_root) if pods_root is not None else None,
        job_mapping_dir=Path(job_mapping_dir) if job_mapping_dir is not None else None,
    )
