"""Xid events from an NVML event set, counted as real counters.

Why a separate thread: NVML only queues events that arrive after registration, and sampling every
few seconds would either block on `nvmlEventSetWait` or miss bursts. The watcher waits in a loop with
a short timeout and counts every event the moment it is delivered, so nothing between two samples is
lost; the sampler only copies the counters.

Registration follows k8s-device-plugin: `mask & supported` per device; NOT_SUPPORTED leaves the set
usable; a device that fails to register (lost) is retried when the sampler calls `attach` again.
Events carrying a GPU instance id are also counted per MIG instance.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pynvml

from gpulens.exporter.backends.nvml import error_text
from gpulens.exporter.backends.rawcalls import NO_INSTANCE
from gpulens.exporter.snapshot import XidCount

XID_MASK = pynvml.nvmlEventTypeXidCriticalError


@dataclass
class _Counter:
    count: int = 0
    last: float = 0.0


class XidWatcher:
    """Owns one NVML event set; thread-safe counters keyed by (gpu, gpu_instance, xid)."""

    def __init__(self, clock: Callable[[], float], logger: logging.Logger | None = None) -> None:
        self.clock = clock
        self.log = logger or logging.getLogger("gpulens.exporter.xid")
        # _set_lock guards the event set's life (create, wait, free); registrations take only
        # _registry_lock, because NVML lets one thread register while another waits on the set,
        # and a sample must never wait for the watcher's nvmlEventSetWait (up to its timeout)
        self._set_lock = threading.Lock()
        self._registry_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._event_set: Any = None
        self._registered: dict[int, tuple[int | None, str]] = {}  # handle key -> (gpu index, uuid)
        # forgotten devices awaiting re-registration: an event from one is still counted
        self._forgotten: dict[int, tuple[int | None, str]] = {}
        self._counters: dict[tuple[int, str, int | None, int], _Counter] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error = ""  # the wait/watcher failure last logged, so each is logged once
        self.wait_failed = False

    # ---- registration ------------------------------------------------------------------------
    def attach(self, devices: Sequence[tuple[int, str, Any]]) -> None:
        """Register (index, uuid, handle) devices not yet registered on the current event set."""
        pending = [d for d in devices if ctypes.cast(d[2], ctypes.c_void_p).value not in self._registered]
        if not pending and self._event_set is not None:
            return  # the common case: nothing to register
        if self._event_set is None:
            with self._set_lock:  # no poll() is waiting: there is no set to wait on
                if self._event_set is None:
                    try:
                        self._event_set = pynvml.nvmlEventSetCreate()
                    except pynvml.NVMLError as exc:
                        self.log.warning("xid: cannot create an NVML event set: %s", error_text(exc))
                        return
        with self._registry_lock:
            for index, uuid, handle in pending:
                key = ctypes.cast(handle, ctypes.c_void_p).value
                if key is None or key in self._registered:
                    continue
                try:
                    supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
                except pynvml.NVMLError:
                    supported = XID_MASK
                mask = XID_MASK & supported
                if not mask:
                    self._mark_registered(key, index, uuid)
                    continue
                try:
                    pynvml.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
                except pynvml.NVMLError as exc:
                    if exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
                        self._mark_registered(key, index, uuid)
                    else:
                        self.log.info("xid: GPU %d not registered yet: %s", index, error_text(exc))
                    continue
                self._mark_registered(key, index, uuid)

    def _mark_registered(self, key: int, index: int | None, uuid: str) -> None:
        self._registered[key] = (index, uuid)
        self._forgotten.pop(key, None)

    @property
    def active(self) -> bool:
        """Whether an event set exists (creating it can fail, e.g. on platforms without events)."""
        return self._event_set is not None

    def forget(self, handles: Sequence[Any]) -> None:
        """Forget devices so that `attach` re-registers them (after a GPU came back)."""
        with self._registry_lock:
            for handle in handles:
                key = ctypes.cast(handle, ctypes.c_void_p).value
                if key in self._registered:
                    self._forgotten[key] = self._registered.pop(key)

    def reset(self) -> None:
        """Free the event set (NVML is shutting down); counters are kept."""
        with self._set_lock, self._registry_lock:
            if self._event_set is not None:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
            self._registered = {}
            self._forgotten = {}

    # ---- waiting -----------------------------------------------------------------------------
    def poll(self, timeout_ms: int) -> int:
        """Wait up to `timeout_ms` for the first event, then drain what is queued. Returns the count.

        An NVML error other than TIMEOUT is logged once (until waiting works again) and sets
        `wait_failed`, so the watcher thread backs off instead of spinning.
        """
        handled = 0
        with self._set_lock:
            event_set = self._event_set
            if event_set is None:
                return 0
            wait = timeout_ms
            while True:
                try:
                    data = pynvml.nvmlEventSetWait(event_set, wait)
                except pynvml.NVMLError as exc:
                    if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                        self._wait_ok()
                        return handled
                    self._wait_error(error_text(exc))
                    return handled
                self._wait_ok()
                self._count(data)
                handled += 1
                wait = 0

    def _wait_error(self, message: str) -> None:
        self.wait_failed = True
        if message != self._last_error:
            self.log.warning("xid: waiting for NVML events failed: %s (retrying)", message)
            self._last_error = message

    def _wait_ok(self) -> None:
        self.wait_failed = False
        if self._last_error:
            self.log.info("xid: waiting for NVML events works again")
            self._last_error = ""

    def _count(self, data: Any) -> None:
        if not int(data.eventType) & XID_MASK:
            return
        key = ctypes.cast(data.device, ctypes.c_void_p).value
        if key is None:
            return
        index, uuid = self._registered.get(key) or self._forgotten.get(key, (None, ""))
        if index is None:
            return
        xid = int(data.eventData)
        gi = int(data.gpuInstanceId)
        now = self.clock()
        with self._count_lock:
            targets: list[int | None] = [None]
            if gi != NO_INSTANCE:
                targets.append(gi)
            for target in targets:
                counter = self._counters.setdefault((index, uuid, target, xid), _Counter())
                counter.count += 1
                counter.last = now
        self.log.warning("xid %d on GPU %d%s", xid, index, "" if gi == NO_INSTANCE else f" instance {gi}")

    def counts(self) -> tuple[XidCount, ...]:
        with self._count_lock:
            return tuple(
                XidCount(gpu=g, uuid=u, xid=x, count=c.count, last_timestamp=c.last, gpu_instance=gi)
                for (g, u, gi, x), c in sorted(
                    self._counters.items(),
                    key=lambda kv: (kv[0][0], kv[0][2] is not None, kv[0][2] or 0, kv[0][3]),
                )
            )

    # ---- thread ------------------------------------------------------------------------------
    def start(self, timeout_ms: int = 500) -> None:
        if self._thread is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                if self._event_set is None:
                    self._stop.wait(timeout_ms / 1000)
                    continue
                try:
                    self.poll(timeout_ms)
                except Exception as exc:  # never let the watcher die; log each distinct failure once
                    message = f"{type(exc).__name__}: {exc}"
                    if message != self._last_error:
                        self.log.error("xid: event watcher error: %s (retrying)", message, exc_info=True)
                        self._last_error = message
                    self.wait_failed = True
                if self.wait_failed:
                    self._stop.wait(max(0.1, timeout_ms / 1000))

        self._thread = threading.Thread(target=loop, name="gpulens-xid", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
