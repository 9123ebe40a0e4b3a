"""The fault timeline: what has gone wrong with each GPU at a given moment, and which driver events
that produced.

Everything is a pure function of time (seconds relative to the node's start), so asking about any
instant in any order gives the same answer, and a repeating timeline costs the same in its first
cycle and its thousandth: counters are occurrence counts times increments, states come from the
latest occurrence of each entry. Runtime injections (tests) are appended as one-shot entries.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from gpulens.sim.scenario import (
    FOREVER,
    EccFault,
    EccStormFault,
    Fault,
    HangFault,
    InitErrorFault,
    LostFault,
    MigCreateFault,
    MigDestroyFault,
    MigInstanceSpec,
    MpsRestartFault,
    NvlinkErrorFault,
    PcieReplayFault,
    RowRemapFault,
    Scenario,
    ThrottleFault,
    XidFault,
)
from gpulens.sim.state import NO_INSTANCE

# nvmlEventType* bits
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
EVENT_MIG_CONFIG_CHANGE = 0x100
EVENT_SINGLE_BIT_ECC_STORM = 0x200
EVENT_DRAM_RETIREMENT = 0x400
EVENT_DRAM_RETIREMENT_FAILURE = 0x800

XID_DBE = 48  # double-bit (uncorrectable) ECC error
XID_ROW_REMAP = 63  # row remapping recorded
XID_ROW_REMAP_FAILURE = 64


@dataclass(frozen=True)
class RawEvent:
    """An event at a time relative to the node's start (the engine adds the epoch)."""

    at: float
    gpu: int
    event_type: int
    data: int = 0
    gpu_instance_id: int = NO_INSTANCE
    compute_instance_id: int = NO_INSTANCE


@dataclass
class _Entry:
    fault: Fault
    repeats: bool
    order: int


@dataclass
class GpuFaults:
    """What the timeline says about one GPU at one instant."""

    lost: bool = False
    hang_seconds: float = 0.0
    throttle: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, location) -> volatile
    ecc_total: dict[tuple[int, int], int] = field(default_factory=dict)  # ... -> since the simulation began
    pcie_replay: int = 0
    nvlink_errors: dict[int, dict[int, int]] = field(default_factory=dict)  # link -> counter -> n
    remap_pending: bool = False
    remap_failed: bool = False
    remap_rows: int = 0  # uncorrectable rows remapped during the simulation
    mps_down: bool = False
    mps_restarts: int = 0  # completed restarts
    mps_up_since: float = -math.inf  # relative time the current MPS server started


class Timeline:
    """Answers "what is the fault state of GPU g at relative time r" for a scenario."""

    def __init__(self, scenario: Scenario) -> None:
        self.repeat = scenario.repeat
        self._lock = threading.Lock()
        self._by_gpu: dict[int | None, list[_Entry]] = {}
        self._count = 0
        for fault in scenario.faults:
            self._add(fault, repeats=self.repeat is not None)
        self._lost_override: dict[int, bool] = {}

    def _add(self, fault: Fault, repeats: bool) -> None:
        entry = _Entry(fault, repeats, self._count)
        self._count += 1
        self._by_gpu.setdefault(fault.gpu, []).append(entry)

    def add(self, fault: Fault) -> None:
        """A one-shot runtime entry (never repeats)."""
        with self._lock:
            self._add(fault, repeats=False)

    def set_lost_override(self, gpu: int, lost: bool | None) -> None:
        with self._lock:
            if lost is None:
                self._lost_override.pop(gpu, None)
            else:
                self._lost_override[gpu] = lost

    def _entries(self, gpu: int | None) -> list[_Entry]:
        with self._lock:
            return list(self._by_gpu.get(gpu, ()))

    # -- occurrences ----------------------------------------------------------------------------
    def _occurrences(self, entry: _Entry, r: float) -> tuple[int, float]:
        """(how many occurrences started at or before r, start of the latest one)."""
        at = entry.fault.at
        if r < at:
            return 0, -math.inf
        if not entry.repeats or self.repeat is None:
            return 1, at
        k = math.floor((r - at) / self.repeat)
        return k + 1, at + k * self.repeat

    def _active(self, entry: _Entry, r: float) -> tuple[bool, float]:
        """Whether the latest occurrence is still running at r, and its end."""
        n, start = self._occurrences(entry, r)
        if n == 0:
            return False, -math.inf
        end = start + entry.fault.duration
        return r < end, end

    def _completed(self, entry: _Entry, r: float) -> int:
        """Occurrences whose duration has fully elapsed by r."""
        n, start = self._occurrences(entry, r)
        if n == 0:
            return 0
        return n if start + entry.fault.duration <= r else n - 1

    # -- node level -----------------------------------------------------------------------------
    def init_error(self, r: float) -> int | None:
        for entry in self._entries(None):
            if isinstance(entry.fault, InitErrorFault) and self._active(entry, r)[0]:
                return entry.fault.code
        return None

    # -- GPU level ------------------------------------------------------------------------------
    def gpu(self, gpu: int, r: float) -> GpuFaults:
        out = GpuFaults()
        last_pending = last_reset = -math.inf
        for entry in self._entries(gpu):
            f = entry.fault
            if isinstance(f, LostFault | HangFault | ThrottleFault | MpsRestartFault):
                active, end = self._active(entry, r)
                if isinstance(f, LostFault):
                    out.lost = out.lost or active
                    if f.duration != FOREVER:  # a GPU back from lost has been reset
                        if not active and end != -math.inf:
                            last_reset = max(last_reset, end)
                        elif active and entry.repeats and self.repeat and self._occurrences(entry, r)[0] > 1:
                            last_reset = max(last_reset, end - self.repeat)
                elif isinstance(f, HangFault) and active:
                    out.hang_seconds = max(out.hang_seconds, end - r)
                elif isinstance(f, ThrottleFault) and active:
                    out.throttle |= f.reasons
                elif isinstance(f, MpsRestartFault):
                    out.mps_down = out.mps_down or active
                    done = self._completed(entry, r)
                    out.mps_restarts += done
                    if done and not active:
                        out.mps_up_since = max(out.mps_up_since, end)
                continue
            n, start = self._occurrences(entry, r)
            if n == 0:
                continue
            if isinstance(f, RowRemapFault):
                if f.state == "pending":
                    out.remap_rows += n * f.rows
                    last_pending = max(last_pending, start)
                else:
                    out.remap_failed = True
            elif isinstance(f, PcieReplayFault):
                out.pcie_replay += n * f.count
            elif isinstance(f, NvlinkErrorFault):
                counters = out.nvlink_errors.setdefault(f.link, {})
                counters[f.counter] = counters.get(f.counter, 0) + n * f.count
        out.remap_pending = last_pending > last_reset
        entries = self._entries(gpu)
        out.ecc_total = self._ecc(entries, r)
        if last_reset == -math.inf:
            out.ecc = dict(out.ecc_total)
        else:  # a reset GPU starts its volatile counts again
            before = self._ecc(entries, last_reset)
            out.ecc = {key: n - before.get(key, 0) for key, n in out.ecc_total.items()}
        override = self._lost_override.get(gpu)
        if override is not None:
            out.lost = override
        return out

    def _ecc(self, entries: list[_Entry], r: float) -> dict[tuple[int, int], int]:
        """ECC errors counted up to r: (error type, location) -> count."""
        out: dict[tuple[int, int], int] = {}
        for entry in entries:
            f = entry.fault
            if not isinstance(f, EccFault | EccStormFault):
                continue
            n, start = self._occurrences(entry, r)
            if n == 0:
                continue
            if isinstance(f, EccFault):
                for etype, count in ((0, f.corrected), (1, f.uncorrected)):
                    if count:
                        out[(etype, f.location)] = out.get((etype, f.location), 0) + n * count
            else:
                partial = min(1.0, (r - start) / f.duration)
                count = (n - 1) * f.corrected + int(f.corrected * partial)
                out[(0, f.location)] = out.get((0, f.location), 0) + count
        return out

    def mig_instances(
        self, gpu: int, initial: tuple[MigInstanceSpec, ...], r: float
    ) -> tuple[MigInstanceSpec, ...]:
        """Instances alive at r: the layout, changed by the latest create/destroy of each id."""
        latest: dict[int, tuple[float, int, MigInstanceSpec | None]] = {
            inst.gpu_instance_id: (-math.inf, -1, inst) for inst in initial
        }
        for entry in self._entries(gpu):
            f = entry.fault
            if not isinstance(f, MigCreateFault | MigDestroyFault):
                continue
            n, start = self._occurrences(entry, r)
            if n == 0:
                continue
            gid = f.mig.gpu_instance_id if isinstance(f, MigCreateFault) else f.instance
            previous = latest.get(gid)
            if previous is None or (start, entry.order) > previous[:2]:
                latest[gid] = (start, entry.order, f.mig if isinstance(f, MigCreateFault) else None)
        alive = [spec for _, _, spec in latest.values() if spec is not None]
        return tuple(sorted(alive, key=lambda s: s.slot))

    # -- events ---------------------------------------------------------------------------------
    def events(self, a: float, b: float) -> list[RawEvent]:
        """Events with a < time <= b (relative times), in time order."""
        out: list[tuple[float, int, RawEvent]] = []
        with self._lock:
            entries = [e for group in self._by_gpu.values() for e in group]
        for entry in entries:
            f = entry.fault
            if f.gpu is None:
                continue
            for at in self._times_between(entry, a, b):
                for event in _events_of(f, at):
                    out.append((at, entry.order, event))
        out.sort(key=lambda item: (item[0], item[1]))
        return [event for _, _, event in out]

    def _times_between(self, entry: _Entry, a: float, b: float) -> list[float]:
        at = entry.fault.at
        if not entry.repeats or self.repeat is None:
            return [at] if a < at <= b else []
        period = self.repeat
        first = max(0, math.floor((a - at) / period) + 1)
        last = math.floor((b - at) / period)
        return [at + k * period for k in range(first, last + 1)]


def _events_of(f: Fault, at: float) -> list[RawEvent]:
    """The driver events one occurrence of a fault produces."""
    assert f.gpu is not None
    gpu = f.gpu
    if isinstance(f, XidFault):
        if f.instance is not None:
            return [RawEvent(at, gpu, EVENT_XID, f.code, f.instance, 0)]
        return [RawEvent(at, gpu, EVENT_XID, f.code)]
    if isinstance(f, EccFault):
        events = []
        if f.corrected:
            events.append(RawEvent(at, gpu, EVENT_SINGLE_BIT_ECC))
        if f.uncorrected:
            events.append(RawEvent(at, gpu, EVENT_DOUBLE_BIT_ECC))
            events.append(RawEvent(at, gpu, EVENT_XID, XID_DBE))
        return events
    if isinstance(f, EccStormFault):
        return [RawEvent(at, gpu, EVENT_SINGLE_BIT_ECC_STORM)]
    if isinstance(f, RowRemapFault):
        if f.state == "pending":
            return [RawEvent(at, gpu, EVENT_DRAM_RETIREMENT), RawEvent(at, gpu, EVENT_XID, XID_ROW_REMAP)]
        return [
            RawEvent(at, gpu, EVENT_DRAM_RETIREMENT_FAILURE),
            RawEvent(at, gpu, EVENT_XID, XID_ROW_REMAP_FAILURE),
        ]
    if isinstance(f, MigCreateFault | MigDestroyFault):
        return [RawEvent(at, gpu, EVENT_MIG_CONFIG_CHANGE)]
    return []
