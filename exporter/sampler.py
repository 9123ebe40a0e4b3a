"""One sampling cycle: NVML -> immutable `NodeSnapshot`, with deadlines so nothing can hang it.

The GPUs are read one after the other on one reader thread (`reader.py` says why), which the
cycle watches: a GPU whose reads pass the deadline is reported down (`gpu_up 0`, its collectors
failed), the GPUs after it are read by a fresh thread, and it is not given new work until the stuck
call returns, so one hung GPU costs one thread, never the scrape and never the other GPUs.
Attribution runs on its own worker with a deadline as well.

NVML missing or failing is not fatal: the snapshot says `nvml_up = False` and init is retried with
exponential backoff (1 s doubling to 60 s), logging the error once per distinct message.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpulens.exporter.backends.events import XidWatcher
from gpulens.exporter.backends.nvml import (
    BackendUnavailable,
    GpuLostError,
    NvmlBackend,
    SystemInfo,
    error_text,
)
from gpulens.exporter.reader import Failed, GpuReader, Hung
from gpulens.exporter.snapshot import (
    Area,
    AreaTiming,
    AttributionHealth,
    GpuIdentity,
    GpuSample,
    NodeSnapshot,
    XidCount,
)

if TYPE_CHECKING:
    from gpulens.exporter.attribution.mapping_dir import MappingStats

BACKOFF_START = 1.0
BACKOFF_MAX = 60.0
HUNG = "(hung)"


class Worker:
    """A daemon thread running one job at a time; `busy` while a job (maybe a hung one) runs
    (attribution's; the GPUs have `GpuReader`)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]] | None] = (
            queue.Queue()
        )
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._busy.set()
        self._jobs.put((fn, args, future))
        return future

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            fn, args, future = item
            try:
                result = fn(*args)
            except BaseException as exc:
                self._busy.clear()  # before waking the caller, so its next sample never sees us busy
                future.set_exception(exc)
            else:
                self._busy.clear()
                future.set_result(result)


class AttributionProbe(Protocol):
    """What the sampler asks the attribution engine from its own thread (Attributor has these)."""

    def mapping_stats(self) -> MappingStats | None: ...

    def mapping_listed(self) -> int: ...


@dataclass(frozen=True)
class SamplerSettings:
    areas: frozenset[Area]  # enabled collectors that need NVML reads
    interval: float
    deadline: float  # seconds a GPU's (and attribution's) work may take per sample
    jobs_enabled: bool
    slow_every: int = 1  # samples between reads of the backend's slow tier (1: every sample)


class Sampler:
    """Owns the backend's lifecycle and the GPU reader; `sample()` runs one bounded cycle."""

    def __init__(
        self,
        backend: NvmlBackend,
        settings: SamplerSettings,
        clock: Callable[[], float] = time.time,
        xid: XidWatcher | None = None,
        poll_events_inline: bool = False,
        attribute: Callable[[NodeSnapshot], tuple[Any, ...]] | None = None,
        logger: logging.Logger | None = None,
        probe: AttributionProbe | None = None,
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.clock = clock
        self.xid = xid
        self.poll_events_inline = poll_events_inline
        self.attribute = attribute
        self.probe = probe
        self.log = logger or logging.getLogger("gpulens.exporter.sampler")
        self._attr_late = False  # attribution is past its deadline: logged once until it recovers
        self._attr_misses = 0
        self._cycles = 0  # samples with NVML up: the slow tier is read on every `slow_every`th
        self._reader: GpuReader[tuple[GpuSample, dict[Area, float]]] | None = None
        self._attr_worker: Worker | None = None
        self._identities: dict[int, GpuIdentity] = {}
        self._was_up: dict[int, bool] = {}
        self._system = SystemInfo("", "", "")
        self._backoff = BACKOFF_START
        self._next_init = 0.0
        self._last_error = ""
        self._last_gpu_errors: dict[int, str] = {}
        self._outage_logged = False  # "NVML stopped answering" was logged for the current outage

    # ---- NVML lifecycle ------------------------------------------------------------------
    def _ensure_init(self) -> str:
        """Initialise NVML if needed; returns "" when up, else the error text."""
        if self.backend.initialised:
            return ""
        now = self.clock()  # simulated time when simulating, so history runs retry on schedule
        if now < self._next_init:
            return self._last_error
        try:
            self._system = self.backend.init()
        except BackendUnavailable as exc:
            message = str(exc)
            if message != self._last_error and not self._outage_logged:
                self.log.error("NVML unavailable, serving gpulens_nvml_up 0 and retrying: %s", message)
            else:
                self.log.debug("NVML still unavailable: %s", message)
            self._last_error = message
            self._next_init = now + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX)
            return message
        self._outage_logged = False
        if self._last_error:
            self.log.info("NVML initialised after failures (driver %s)", self._system.driver_version)
        else:
            self.log.info("NVML initialised (driver %s)", self._system.driver_version)
        self._last_error = ""
        self._backoff = BACKOFF_START
        self._next_init = 0.0
        return ""

    def _nvml_down(self, message: str) -> None:
        if message != self._last_error:
            self.log.error("NVML stopped answering, re-initialising: %s", message)
        # one outage, one line: the failing re-initialisations that follow are logged at debug
        self._outage_logged = True
        self._last_error = message
        if self.xid is not None:
            self.xid.reset()
        self.backend.shutdown()
        self._next_init = self.clock() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)

    # ---- one cycle -----------------------------------------------------------------------
    def sample(self) -> NodeSnapshot:
        started = time.perf_counter()
        error = self._ensure_init()
        if error:
            return self._down_snapshot(error, started)
        try:
            count = self.backend.device_count()
        except BackendUnavailable as exc:
            self._nvml_down(str(exc))
            return self._down_snapshot(str(exc), started)

        gpus, timings = self._read_gpus(count)
        self._watch_events(gpus)
        xids: tuple[XidCount, ...] = ()
        if self.xid is not None:
            if self.poll_events_inline:
                self.xid.poll(0)
            xids = self.xid.counts()
        snapshot = NodeSnapshot(
            timestamp=0.0,
            duration_seconds=0.0,
            nvml_up=True,
            driver_version=self._system.driver_version,
            cuda_version=self._system.cuda_version,
            nvml_library_version=self._system.nvml_version,
            gpus=tuple(gpus),
            xids=xids,
        )
        jobs, jobs_error, jobs_seconds, holders = self._attribute(snapshot)
        areas = self._area_status(gpus, timings)
        if self.settings.jobs_enabled:
            areas[Area.JOBS] = AreaTiming(seconds=jobs_seconds, success=not jobs_error)
        if self.xid is not None and Area.XID in self.settings.areas:
            areas[Area.XID] = AreaTiming(seconds=0.0, success=self.xid.active)
        return NodeSnapshot(
            timestamp=self.clock(),
            duration_seconds=time.perf_counter() - started,
            nvml_up=True,
            driver_version=snapshot.driver_version,
            cuda_version=snapshot.cuda_version,
            nvml_library_version=snapshot.nvml_library_version,
            gpus=snapshot.gpus,
            xids=xids,
            jobs=tuple(jobs),
            jobs_error=jobs_error,
            holders=tuple(holders),
            areas=areas,
            attribution=self._attribution_health(),
        )

    def _read_gpus(self, count: int) -> tuple[list[GpuSample], dict[Area, float]]:
        settings = self.settings
        if self._reader is None:
            self._reader = GpuReader()
        reader = self._reader
        results: dict[int, GpuSample] = {}
        wanted: list[int] = []
        for index in range(count):
            if reader.stuck(index):
                results[index] = self._down(index, f"previous NVML call on this GPU has not returned {HUNG}")
            else:
                wanted.append(index)
        areas, interval = settings.areas, settings.interval
        slow = self._cycles % settings.slow_every == 0
        self._cycles += 1
        outcomes = reader.read_all(
            wanted, lambda index: self.backend.read_gpu(index, areas, interval, slow), settings.deadline
        )
        timings: dict[Area, float] = {}
        for index in wanted:
            outcome = outcomes[index]
            if isinstance(outcome, Hung):
                results[index] = self._down(
                    index, f"NVML calls did not return within {settings.deadline:g}s {HUNG}"
                )
                continue
            if isinstance(outcome, Failed):
                exc = outcome.error
                if isinstance(exc, GpuLostError):
                    results[index] = self._down(index, f"GPU lost: {exc}")
                elif isinstance(exc, Exception):
                    results[index] = self._down(index, error_text(exc))
                else:
                    raise exc
                self.backend.forget(index)
                continue
            sample, gpu_timings = outcome
            self._identities[index] = sample.identity
            results[index] = sample
            for area, seconds in gpu_timings.items():
                timings[area] = timings.get(area, 0.0) + seconds
        gpus = [results[i] for i in range(count)]
        for gpu in gpus:
            self._log_gpu_state(gpu)
        return gpus, timings

    def _log_gpu_state(self, gpu: GpuSample) -> None:
        """One line when a GPU's state changes (a hang stays one state while its call is stuck)."""
        key = "hung" if gpu.error.endswith(HUNG) else gpu.error
        index = gpu.identity.index
        previous = self._last_gpu_errors.get(index, "")
        if key == previous:
            return
        if gpu.error:
            self.log.warning("GPU %d: %s", index, gpu.error)
        else:
            self.log.info("GPU %d: reads succeed again", index)
        self._last_gpu_errors[index] = key

    def _down(self, index: int, error: str) -> GpuSample:
        identity = (
            self._identities.get(index) or self.backend.identity(index) or GpuIdentity(index=index, uuid="")
        )
        return GpuSample(identity=identity, up=False, error=error, failed_areas=self.settings.areas)

    def _watch_events(self, gpus: list[GpuSample]) -> None:
        if self.xid is None or Area.XID not in self.settings.areas:
            return
        handles = dict(self.backend.handles())
        came_back = [
            handles[g.identity.index]
            for g in gpus
            if g.up and not self._was_up.get(g.identity.index, True) and g.identity.index in handles
        ]
        if came_back:
            self.xid.forget(came_back)
        self._was_up = {g.identity.index: g.up for g in gpus}
        self.xid.attach(
            [
                (g.identity.index, g.identity.uuid, handles[g.identity.index])
                for g in gpus
                if g.up and g.identity.index in handles
            ]
        )

    def _attribute(self, snapshot: NodeSnapshot) -> tuple[list[Any], str, float, tuple[Any, ...]]:
        """(jobs, error, seconds, device holders); `attribute` returns (jobs, error) or
        (jobs, error, holders)."""
        if not self.settings.jobs_enabled or self.attribute is None:
            return [], "", 0.0, ()
        started = time.perf_counter()
        if self._attr_worker is None:
            self._attr_worker = Worker("gpulens-attribution")
        if self._attr_worker.busy:
            self._attr_misses += 1
            return [], "attribution of the previous sample has not finished", 0.0, ()
        future = self._attr_worker.submit(self.attribute, snapshot)
        try:
            result = future.result(timeout=self.settings.deadline)
        except FutureTimeout:
            self._attr_misses += 1
            self._attribution_late()
            return (
                [],
                f"attribution did not finish within {self.settings.deadline:g}s",
                self.settings.deadline,
                (),
            )
        except Exception as exc:
            self.log.warning("attribution failed: %s", error_text(exc))
            return [], error_text(exc), time.perf_counter() - started, ()
        if self._attr_late:
            self._attr_late = False
            self.log.info("attribution finishes within its %gs deadline again", self.settings.deadline)
        jobs, error = result[0], result[1]
        holders = tuple(result[2]) if len(result) > 2 else ()
        return list(jobs), error, time.perf_counter() - started, holders

    def _attribution_late(self) -> None:
        """One line per outage: the first missed deadline after attribution was on time."""
        if self._attr_late:
            return
        self._attr_late = True
        listed = self.probe.mapping_listed() if self.probe is not None else 0
        stats = self.probe.mapping_stats() if self.probe is not None else None
        where = ""
        if stats is not None:
            where = (
                f" (job mapping directory: {max(listed, stats.listed)} entries,"
                f" last refresh {stats.refresh_seconds:.2f}s)"
            )
        self.log.warning(
            "attribution did not finish within its %gs deadline%s; the jobs collector reports failure"
            " until it does",
            self.settings.deadline,
            where,
        )

    def _attribution_health(self) -> AttributionHealth | None:
        if not self.settings.jobs_enabled or self.attribute is None:
            return None
        stats = self.probe.mapping_stats() if self.probe is not None else None
        return AttributionHealth(deadline_misses=self._attr_misses, mapping=stats)

    def _area_status(self, gpus: list[GpuSample], timings: Mapping[Area, float]) -> dict[str, AreaTiming]:
        out: dict[str, AreaTiming] = {}
        for area in self.settings.areas:
            ok = all(g.up and area not in g.failed_areas for g in gpus)
            out[area] = AreaTiming(seconds=timings.get(area, 0.0), success=ok)
        return out

    def _down_snapshot(self, error: str, started: float) -> NodeSnapshot:
        areas: dict[str, AreaTiming] = {a: AreaTiming(0.0, False) for a in self.settings.areas}
        if self.settings.jobs_enabled:
            areas[Area.JOBS] = AreaTiming(0.0, False)
        xids = self.xid.counts() if self.xid is not None else ()
        return NodeSnapshot(
            timestamp=self.clock(),
            duration_seconds=time.perf_counter() - started,
            nvml_up=False,
            nvml_error=error,
            xids=xids,
            areas=areas,
        )

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._attr_worker is not None:
            self._attr_worker.stop()
            self._attr_worker = None
        if self.xid is not None:
            self.xid.reset()
        self.backend.shutdown()
