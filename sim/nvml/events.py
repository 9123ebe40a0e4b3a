"""Event sets: Xid critical errors and the other driver events, delivered from registration on.

`nvmlEventSetWait` blocks for real (up to its timeout in milliseconds, sleeping with the GIL
released) and returns NVML_ERROR_TIMEOUT when nothing arrived: the normal idle answer, which an
Xid watcher thread sees almost every time it waits.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import pynvml

from gpulens.sim.nvml._core import (
    DEV,
    PTR,
    UINT,
    ULL,
    Context,
    NvmlFail,
    SymbolTable,
    out_ptr,
    out_struct,
    out_ull,
)
from gpulens.sim.state import SimEvent

TABLE = SymbolTable()

# How often a waiting call looks at the node's timeline. Each look wakes the waiting thread, which a real
# driver does not: at 20 ms an idle Xid watcher cost the exporter ~5 ms of CPU per second. 100 ms keeps
# delivery far inside any sampling interval.
POLL_SECONDS = 0.1

BASE_EVENTS = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeClock
    | pynvml.nvmlEventTypePowerSourceChange
)


@dataclass
class EventSet:
    """What the driver keeps per set: registrations, a cursor into the timeline, undelivered events."""

    registrations: dict[int, tuple[int, float]] = field(default_factory=dict)  # gpu -> (mask, since)
    cursor: float | None = None  # events up to this simulated time have been collected
    queue: collections.deque[SimEvent] = field(default_factory=collections.deque)


def supported_events(ctx: Context, index: int) -> int:
    mask: int = BASE_EVENTS
    if ctx.node.identities[index].model.mig_capable:
        mask |= pynvml.nvmlEventMigConfigChange
    return mask


@TABLE.define("nvmlEventSetCreate", PTR)
def event_set_create(ctx: Context, out: int) -> None:
    out_ptr(out, ctx.new_object(EventSet()))


@TABLE.define("nvmlEventSetFree", PTR)
def event_set_free(ctx: Context, address: int) -> None:
    ctx.free_object(address, EventSet)


@TABLE.define("nvmlDeviceGetSupportedEventTypes", DEV, PTR)
def supported_event_types(ctx: Context, handle: int, out: int) -> None:
    target = ctx.device(handle)
    out_ull(out, 0 if target.is_mig else supported_events(ctx, target.index))


@TABLE.define("nvmlDeviceRegisterEvents", DEV, ULL, PTR)
def register_events(ctx: Context, handle: int, mask: int, address: int) -> None:
    """Only events after registration are recorded; unsupported bits register nothing (NS).

    MIG devices do not take registrations: register on the parent, whose events carry the
    GPU/compute instance ids.
    """
    target = ctx.device(handle)
    event_set = ctx.get_object(address, EventSet)
    if target.is_mig or mask & ~supported_events(ctx, target.index):
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    now = ctx.now()
    with ctx.lock:
        old_mask, since = event_set.registrations.get(target.index, (0, now))
        event_set.registrations[target.index] = (old_mask | mask, since if old_mask else now)
        if event_set.cursor is None:
            event_set.cursor = now


def _collect(ctx: Context, event_set: EventSet) -> None:
    now = ctx.now()
    with ctx.lock:
        start = event_set.cursor
        if start is None or now <= start:
            return
        event_set.cursor = now
    for event in ctx.node.events_between(start, now):
        registration = event_set.registrations.get(event.gpu_index)
        if registration and registration[0] & event.event_type and event.time > registration[1]:
            with ctx.lock:
                event_set.queue.append(event)


@TABLE.define("nvmlEventSetWait_v2", PTR, PTR, UINT)
def event_set_wait(ctx: Context, address: int, data_ptr: int, timeout_ms: int) -> None:
    event_set = ctx.get_object(address, EventSet)
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        _collect(ctx, event_set)
        with ctx.lock:
            event = event_set.queue.popleft() if event_set.queue else None
        if event is not None:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NvmlFail(pynvml.NVML_ERROR_TIMEOUT)
        time.sleep(min(POLL_SECONDS, remaining))
    data = out_struct(data_ptr, pynvml.c_nvmlEventData_t)
    out_ptr(data_ptr + type(data).device.offset, ctx.gpu_handle(event.gpu_index))
    data.eventType = event.event_type
    data.eventData = event.data
    data.gpuInstanceId = event.gpu_instance_id
    data.computeInstanceId = event.compute_instance_id


TABLE.alias("nvmlEventSetWait", "nvmlEventSetWait_v2")
