"""Event sets: real blocking, Timeout when idle, events from registration on."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator

import pynvml
import pytest

from gpulens.sim.nvml import SimLib
from tests.sim.static_node import StaticNode, example_node, installed

XID = pynvml.nvmlEventTypeXidCriticalError


@pytest.fixture(name="sim")
def _sim(nvml_driver: str) -> Iterator[tuple[StaticNode, SimLib]]:
    yield from installed(example_node(), nvml_driver)


def handle(i: int):
    return pynvml.nvmlDeviceGetHandleByIndex(i)


@pytest.fixture
def event_set(sim) -> Iterator[object]:
    event_set = pynvml.nvmlEventSetCreate()
    yield event_set
    pynvml.nvmlEventSetFree(event_set)


def test_a_wait_on_an_idle_event_set_ends_in_timeout(sim, event_set) -> None:
    pynvml.nvmlDeviceRegisterEvents(handle(2), XID, event_set)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(event_set, 150)


def test_xid_after_inject_is_delivered_once(sim, event_set) -> None:
    node, _ = sim
    pynvml.nvmlDeviceRegisterEvents(handle(2), XID, event_set)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(event_set, 10)
    node.clock.advance(1)
    node.inject(2, XID, data=79)
    data = pynvml.nvmlEventSetWait(event_set, 1000)
    assert (data.eventType, data.eventData) == (XID, 79)
    assert ctypes.cast(data.device, ctypes.c_void_p).value == ctypes.cast(handle(2), ctypes.c_void_p).value
    assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(event_set, 10)


def test_a_waiting_call_wakes_up_for_an_event_injected_meanwhile(sim, event_set) -> None:
    node, _ = sim
    pynvml.nvmlDeviceRegisterEvents(handle(2), XID, event_set)

    def later() -> None:
        time.sleep(0.1)
        node.clock.advance(1)
        node.inject(2, XID, data=48)

    thread = threading.Thread(target=later)
    thread.start()
    # a wait holding the GIL would keep `later` from injecting, and end in Timeout
    data = pynvml.nvmlEventSetWait_v2(event_set, 5000)
    thread.join()
    assert data.eventData == 48


def test_events_before_registration_are_not_delivered(sim, event_set) -> None:
    node, _ = sim
    node.inject(2, XID, data=13)
    node.clock.advance(1)
    pynvml.nvmlDeviceRegisterEvents(handle(2), XID, event_set)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(event_set, 10)


def test_only_registered_gpus_and_types_are_delivered(sim, event_set) -> None:
    node, _ = sim
    pynvml.nvmlDeviceRegisterEvents(handle(2), XID, event_set)
    node.clock.advance(1)
    node.inject(3, XID, data=31)  # another GPU
    node.inject(2, pynvml.nvmlEventTypePState)  # another type
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(event_set, 10)


def test_mig_instance_xid_arrives_on_the_parent_with_instance_ids(sim, event_set) -> None:
    node, _ = sim
    pynvml.nvmlDeviceRegisterEvents(handle(0), XID, event_set)
    node.clock.advance(1)
    node.inject(0, XID, data=43, gpu_instance_id=4, compute_instance_id=0)
    data = pynvml.nvmlEventSetWait(event_set, 1000)
    assert (data.eventData, data.gpuInstanceId, data.computeInstanceId) == (43, 4, 0)


def test_supported_event_types_include_xid(sim) -> None:
    supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle(2))
    assert supported & XID
    assert supported & pynvml.nvmlEventMigConfigChange


def test_registering_unsupported_types_is_not_supported(sim, event_set) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(handle(2), pynvml.nvmlEventTypeAll, event_set)
    supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle(2))
    pynvml.nvmlDeviceRegisterEvents(handle(2), pynvml.nvmlEventTypeAll & supported, event_set)


def test_registering_on_a_mig_device_is_not_supported(sim, event_set) -> None:
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(mig, XID, event_set)


def test_a_freed_event_set_is_invalid(sim) -> None:
    event_set = pynvml.nvmlEventSetCreate()
    pynvml.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait(event_set, 10)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetFree(event_set)
