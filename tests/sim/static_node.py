"""A hand-built `SimNode` for testing the simulated NVML library without the scenario engine.

`StaticNode` serves literal `GpuState`s; tests change them with `update()` and add driver events
with `inject()`. `example_node()` is a small node covering the shapes the library must serve:
a MIG GPU with a hole in its slots, an MPS GPU, a plain GPU with a busy process, an idle GPU.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from gpulens.catalog import GIB, get_model
from gpulens.migplacement import place_mig_layout
from gpulens.sim.clock import ManualClock
from gpulens.sim.nvml import SimLib
from gpulens.sim.state import (
    ActivityState,
    DriverInfo,
    GpuIdentity,
    GpuState,
    MigInstanceState,
    NvLinkState,
    ProcessState,
    SimEvent,
)
from gpulens.sim.topology import Topology

START = 1_700_000_000.0
XID = 0x8  # nvmlEventTypeXidCriticalError


class StaticNode:
    """A node whose GPUs change only when a test says so."""

    def __init__(
        self,
        gpus: Iterable[tuple[GpuIdentity, GpuState]],
        clock: Any | None = None,
        driver: DriverInfo | None = None,
        topology: Topology | None = None,
    ) -> None:
        pairs = list(gpus)
        self.topology = topology
        self.driver = driver or DriverInfo()
        self.identities = tuple(identity for identity, _ in pairs)
        self.clock = clock or ManualClock(START)
        self.init_code: int | None = None
        self._states = [state for _, state in pairs]
        self._events: list[SimEvent] = []
        self._lock = threading.Lock()
        self.state_calls = 0
        # GPU -> the utilization samples its driver keeps ((time, percent), oldest first); a GPU
        # not set here keeps one per second of the last 16 at its state's utilization
        self.samples: dict[int, tuple[tuple[float, int], ...]] = {}

    def init_error(self) -> int | None:
        return self.init_code

    def gpu_state(self, index: int) -> GpuState:
        with self._lock:
            self.state_calls += 1
            return self._states[index]

    def update(self, index: int, **changes: Any) -> GpuState:
        with self._lock:
            self._states[index] = dataclasses.replace(self._states[index], **changes)
            return self._states[index]

    def inject(self, gpu_index: int, event_type: int = XID, data: int = 0, **ids: int) -> SimEvent:
        """An event happening now (the caller advances the clock first if it needs 'later')."""
        event = SimEvent(time=self.clock.now(), gpu_index=gpu_index, event_type=event_type, data=data, **ids)
        with self._lock:
            self._events.append(event)
        return event

    def events_between(self, start: float, end: float) -> list[SimEvent]:
        with self._lock:
            return [e for e in self._events if start < e.time <= end]

    def utilization_samples(self, index: int, end: float) -> tuple[tuple[float, int], ...]:
        if index in self.samples:
            return tuple(s for s in self.samples[index] if s[0] <= end)
        percent = self.gpu_state(index).utilization_gpu_percent
        return tuple((float(t), percent) for t in range(math.floor(end) - 15, math.floor(end) + 1))

    def activity_between(
        self, index: int, gpu_instance_id: int | None, start: float, end: float
    ) -> ActivityState:
        state = self.gpu_state(index)
        if gpu_instance_id is None:
            return state.activity
        return next(m.activity for m in state.mig_instances if m.gpu_instance_id == gpu_instance_id)


def identity(index: int, model_key: str, serial: str | None = "auto") -> GpuIdentity:
    model = get_model(model_key)
    return GpuIdentity(
        index=index,
        model=model,
        uuid=f"GPU-{index:08x}-1111-2222-3333-{index:012x}",
        serial=f"165432{index:07d}" if serial == "auto" else serial,
        pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        minor_number=index,
        board_part_number="692-2G520-0200-000",
        vbios_version="96.00.61.00.01",
    )


def base_state(index: int, model_key: str, **changes: Any) -> GpuState:
    """A healthy, idle GPU of that model; `changes` override any field."""
    model = get_model(model_key)
    links = tuple(
        NvLinkState(link=i, active=True, tx_kib_total=1000 * (i + 1), rx_kib_total=2000 * (i + 1))
        for i in range(model.nvlink_links)
    )
    state = GpuState(
        index=index,
        memory_total_bytes=model.memory_bytes,
        memory_reserved_bytes=512 * 1024**2,
        memory_used_bytes=512 * 1024**2,
        temperature_c=34,
        power_mw=model.idle_power_watts * 1000,
        power_limit_mw=model.power_limit_watts * 1000,
        default_power_limit_mw=model.power_limit_watts * 1000,
        energy_mj=123_456_789,
        graphics_clock_mhz=345,
        sm_clock_mhz=345,
        memory_clock_mhz=model.max_memory_clock_mhz,
        video_clock_mhz=765,
        performance_state=0,
        pcie_link_generation=model.pcie_generation,
        pcie_link_width=model.pcie_width,
        nvlinks=links,
        mig_mode_current=0 if model.mig_capable else None,
        mig_mode_pending=0 if model.mig_capable else None,
    )
    return dataclasses.replace(state, **changes)


def mig_instances(
    model_key: str, gpu_index: int, layout: list[tuple[int, str]]
) -> tuple[MigInstanceState, ...]:
    """MIG devices for (slot, profile name) pairs; GPU instance ids follow NVML's habit of
    numbering from the largest instances (7g=0, 4g=1 ... 1g=7..14), here simply slot-based."""
    model = get_model(model_key)
    placements = place_mig_layout(model, [(name, None) for _, name in layout])
    out = []
    for (slot, _name), placement in zip(layout, placements, strict=True):
        gi = slot + 1
        profile = placement.profile
        procs = (
            ProcessState(
                pid=20_000 + gpu_index * 100 + slot,
                kind="compute",
                used_memory_bytes=GIB,
                sm_util_percent=40,
                mem_util_percent=10,
                gpu_instance_id=gi,
                compute_instance_id=0,
                start_time=START - 600,
            ),
        )
        out.append(
            MigInstanceState(
                slot=slot,
                gpu_instance_id=gi,
                compute_instance_id=0,
                profile=profile,
                placement_start=placement.start,
                uuid=f"MIG-{gpu_index:08x}-aaaa-bbbb-cccc-{slot:012x}",
                memory_total_bytes=profile.memory_bytes,
                memory_used_bytes=GIB + 12 * 1024**2,
                memory_reserved_bytes=12 * 1024**2,
                activity=ActivityState(sm=0.25 * (slot + 1), dram=0.1, tensor=0.05),
                processes=procs,
            )
        )
    return tuple(out)


def example_node(clock: Any | None = None) -> StaticNode:
    """Four GPUs: 0 = H100 in MIG (slots 0, 1, 3 used; slot 2 empty), 1 = H100 with an MPS server
    and two clients, 2 = A100-40GB running one busy training process, 3 = idle A100-40GB."""
    h100, a100 = "H100-80GB", "A100-SXM4-40GB"
    mig = mig_instances(h100, 0, [(0, "3g.40gb"), (1, "2g.20gb"), (3, "1g.10gb")])
    mps_server = ProcessState(
        pid=30_001, kind="mps_server", used_memory_bytes=300 * 1024**2, name="nvidia-cuda-mps-server"
    )
    mps_clients = tuple(
        ProcessState(
            pid=30_010 + i, kind="mps_client", used_memory_bytes=(i + 2) * GIB, sm_util_percent=20 + i
        )
        for i in range(2)
    )
    trainer = ProcessState(
        pid=40_000,
        kind="compute",
        used_memory_bytes=10 * GIB,
        sm_util_percent=37,
        mem_util_percent=12,
        start_time=START - 3600,
    )
    gpus = [
        (
            identity(0, h100),
            base_state(
                0,
                h100,
                mig_mode_current=1,
                mig_mode_pending=1,
                mig_instances=mig,
                memory_used_bytes=sum(m.memory_used_bytes for m in mig),
            ),
        ),
        (
            identity(1, h100),
            base_state(
                1,
                h100,
                compute_mode=3,
                processes=(mps_server,),
                mps_clients=mps_clients,
                utilization_gpu_percent=55,
                memory_used_bytes=6 * GIB,
            ),
        ),
        (
            identity(2, a100),
            base_state(
                2,
                a100,
                processes=(trainer,),
                utilization_gpu_percent=41,
                utilization_memory_percent=18,
                memory_used_bytes=10 * GIB + 512 * 1024**2,
                power_mw=212_000,
                temperature_c=61,
                sm_clock_mhz=1410,
                graphics_clock_mhz=1410,
                ecc_totals={(0, 0): 4, (1, 0): 0, (0, 1): 17, (1, 1): 1},
                activity=ActivityState(
                    sm=0.4, sm_occupancy=0.2, dram=0.3, tensor=0.1, pcie_tx_bytes_per_second=2 * 1024**2
                ),
            ),
        ),
        (identity(3, a100), base_state(3, a100)),
    ]
    return StaticNode(gpus, clock=clock)


def installed(node: StaticNode, driver: str = "python") -> Iterator[tuple[StaticNode, SimLib]]:
    """`node` served by `driver` ("python" or "native") and initialised; shut down and removed
    afterwards. Test modules wrap it in a fixture: `yield from installed(example_node(), driver)`.
    """
    from tests.sim.drivers import installed as driver_installed

    yield from driver_installed(node, driver)
