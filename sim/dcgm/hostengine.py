"""A simulated DCGM host engine serving a `SimNode`'s GPUs and GPU instances.

Profiling fields (`DCGM_FI_PROF_*`, ids 1001-1012) are computed like DCGM computes them: each watch
updates every `updateFreq` microseconds from the moment it was set, and the latest value of a field
is the average activity over the last completed update period (`SimNode.activity_between`). Before
the first period completes the value is blank, as it is on a real host engine. Fields gpulens does
not need read as blank NOT_SUPPORTED.

Entity ids of GPU instances (entity group 4) are assigned by the engine, not equal to NVML's GPU
instance ids, so callers must map them through `dcgmGetGpuInstanceHierarchy` as with real DCGM.

The engine is installed for the whole process (`install`), the way libdcgm is loaded once per
process; the fake bindings find it with `current()`. Without an installed engine the bindings raise
DCGMError_LibraryNotFound, as the real ones do on a machine without DCGM.
"""

from __future__ import annotations

import itertools
import math
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from gpulens.sim.state import ActivityState, SimNode

# DCGM return codes (dcgm_structs.DCGM_ST_*) the engine produces
ST_OK = 0
ST_BADPARAM = -1
ST_NOT_SUPPORTED = -6
ST_NO_DATA = -14
ST_CONNECTION_NOT_VALID = -21
ST_LIBRARY_NOT_FOUND = -25
ST_MODULE_NOT_LOADED = -33
ST_PROFILING_NOT_SUPPORTED = -36

FE_GPU = 1
FE_GPU_I = 4
INSTANCES_PER_GPU = 8  # DCGM_MAX_INSTANCES_PER_GPU

FP64_BLANK = 140737488355328.0  # DCGM_FP64_BLANK
FP64_NOT_FOUND = FP64_BLANK + 1
FP64_NOT_SUPPORTED = FP64_BLANK + 2

# field id -> ActivityState attribute; 1009-1012 are whole-GPU rates (blank on GPU instances, like
# real DCGM on MIG, dcgm-exporter #726)
PROF_ATTRIBUTES: dict[int, str] = {
    1001: "graphics",
    1002: "sm",
    1003: "sm_occupancy",
    1004: "tensor",
    1005: "dram",
    1006: "fp64",
    1007: "fp32",
    1008: "fp16",
    1009: "pcie_tx_bytes_per_second",
    1010: "pcie_rx_bytes_per_second",
    1011: "nvlink_tx_bytes_per_second",
    1012: "nvlink_rx_bytes_per_second",
}
GPU_ONLY_FIELDS = frozenset({1009, 1010, 1011, 1012})


class EngineError(Exception):
    """A DCGM return code; the fake bindings turn it into the matching DCGMError subclass."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class EngineOptions:
    """How the simulated DCGM installation behaves.

    `listen`: the address a standalone host engine answers on ("host:port" or "unix:///path"); None
    accepts any address. `reachable`: False makes every connection to a standalone host engine (new
    or existing) fail with CONNECTION_NOT_VALID. `profiling_module`: False makes watches of
    profiling fields fail with MODULE_NOT_LOADED (no SYS_ADMIN, or libnvperf missing).
    `unsupported_gpus`: GPU ids whose profiling watches fail with PROFILING_NOT_SUPPORTED.
    `blank_gpus`: GPU ids (and their instances) whose profiling fields are watched fine but always
    read blank NOT_SUPPORTED, as some DCGM versions do on boards they cannot profile.
    """

    listen: str | None = None
    reachable: bool = True
    embedded: bool = True
    profiling_module: bool = True
    unsupported_gpus: frozenset[int] = frozenset()
    blank_gpus: frozenset[int] = frozenset()


@dataclass(frozen=True)
class HierarchyEntry:
    """One GPU instance as `dcgmGetGpuInstanceHierarchy` describes it."""

    entity_id: int
    parent_gpu_id: int
    gpu_uuid: str
    nvml_gpu_index: int
    nvml_instance_id: int
    nvml_compute_instance_id: int
    nvml_profile_id: int
    profile_slices: int


@dataclass
class _Watch:
    update_freq_us: int
    started: float  # seconds since epoch (node clock)


@dataclass
class _Connection:
    embedded: bool
    groups: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    field_groups: dict[int, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    watches: dict[tuple[int, int], _Watch] = field(default_factory=dict)


class SimHostEngine:
    """DCGM's host engine for one simulated node; thread-safe."""

    def __init__(self, node: SimNode, options: EngineOptions | None = None) -> None:
        self.node = node
        self.options = options or EngineOptions()
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._connections: dict[int, _Connection] = {}
        self.calls: dict[str, int] = {}  # call counts, for tests of watch behaviour

    # ---- failure modes at runtime ------------------------------------------------------------
    def set_options(self, **changes: Any) -> None:
        """Change behaviour while running, e.g. `set_options(reachable=False)` (host engine died)."""
        with self._lock:
            self.options = replace(self.options, **changes)

    # ---- connections -------------------------------------------------------------------------
    def connect(self, address: str | None) -> int:
        """A new handle: embedded when `address` is None, else a standalone host engine."""
        self._count("connect")
        with self._lock:
            if address is None:
                if not self.options.embedded:
                    raise EngineError(ST_LIBRARY_NOT_FOUND)
            elif not self.options.reachable or (
                self.options.listen is not None and _normalise(address) != _normalise(self.options.listen)
            ):
                raise EngineError(ST_CONNECTION_NOT_VALID)
            handle = next(self._ids)
            self._connections[handle] = _Connection(embedded=address is None)
            return handle

    def disconnect(self, handle: int) -> None:
        with self._lock:
            self._connections.pop(handle, None)

    def open_handles(self) -> int:
        """Handles connected and not yet disconnected (a client that closes leaves none)."""
        with self._lock:
            return len(self._connections)

    def watch_periods_us(self) -> set[int]:
        """The update periods (µs) of the watches on every open handle."""
        with self._lock:
            return {w.update_freq_us for c in self._connections.values() for w in c.watches.values()}

    def _conn(self, handle: int) -> _Connection:
        conn = self._connections.get(handle)
        if conn is None or (not conn.embedded and not self.options.reachable):
            raise EngineError(ST_CONNECTION_NOT_VALID)
        return conn

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    # ---- discovery ---------------------------------------------------------------------------
    def gpu_ids(self, handle: int) -> list[int]:
        with self._lock:
            self._conn(handle)
        return [identity.index for identity in self.node.identities]

    def gpu_identity(self, handle: int, gpu_id: int) -> tuple[str, str, str]:
        """(uuid, pci bus id, name) of a GPU."""
        with self._lock:
            self._conn(handle)
        if not 0 <= gpu_id < len(self.node.identities):
            raise EngineError(ST_BADPARAM)
        identity = self.node.identities[gpu_id]
        return identity.uuid, identity.pci_bus_id, identity.model.nvml_name

    def hierarchy(self, handle: int) -> list[HierarchyEntry]:
        with self._lock:
            self._conn(handle)
        self._count("hierarchy")
        return list(self._instances().values())

    def _instances(self) -> dict[int, HierarchyEntry]:
        out: dict[int, HierarchyEntry] = {}
        for identity in self.node.identities:
            state = self.node.gpu_state(identity.index)
            if state.lost:
                continue
            ordered = sorted(state.mig_instances, key=lambda m: m.gpu_instance_id)
            for position, inst in enumerate(ordered):
                entity_id = identity.index * INSTANCES_PER_GPU + position
                out[entity_id] = HierarchyEntry(
                    entity_id=entity_id,
                    parent_gpu_id=identity.index,
                    gpu_uuid=identity.uuid,
                    nvml_gpu_index=identity.index,
                    nvml_instance_id=inst.gpu_instance_id,
                    nvml_compute_instance_id=inst.compute_instance_id,
                    nvml_profile_id=inst.profile.nvml_profile,
                    profile_slices=inst.profile.compute_slices,
                )
        return out

    def entities(self, handle: int, entity_group: int) -> list[int]:
        if entity_group == FE_GPU:
            return self.gpu_ids(handle)
        if entity_group == FE_GPU_I:
            return [e.entity_id for e in self.hierarchy(handle)]
        return []

    # ---- groups and field groups -------------------------------------------------------------
    def group_create(self, handle: int, name: str) -> int:
        with self._lock:
            conn = self._conn(handle)
            group_id = next(self._ids)
            conn.groups[group_id] = []
            return group_id

    def group_add_entity(self, handle: int, group_id: int, entity_group: int, entity_id: int) -> None:
        with self._lock:
            conn = self._conn(handle)
            if group_id not in conn.groups:
                raise EngineError(ST_BADPARAM)
            conn.groups[group_id].append((entity_group, entity_id))

    def group_destroy(self, handle: int, group_id: int) -> None:
        with self._lock:
            conn = self._conn(handle)
            conn.groups.pop(group_id, None)
            for key in [k for k in conn.watches if k[0] == group_id]:
                del conn.watches[key]

    def field_group_create(self, handle: int, field_ids: list[int], name: str) -> int:
        with self._lock:
            conn = self._conn(handle)
            if any(existing == name for existing, _ in conn.field_groups.values()):
                raise EngineError(-26)  # DCGM_ST_DUPLICATE_KEY
            fg_id = next(self._ids)
            conn.field_groups[fg_id] = (name, tuple(int(f) for f in field_ids))
            return fg_id

    def field_group_destroy(self, handle: int, fg_id: int) -> None:
        with self._lock:
            conn = self._conn(handle)
            conn.field_groups.pop(fg_id, None)
            for key in [k for k in conn.watches if k[1] == fg_id]:
                del conn.watches[key]

    # ---- watches and values ------------------------------------------------------------------
    def watch(self, handle: int, group_id: int, fg_id: int, update_freq_us: int) -> None:
        self._count("watch")
        with self._lock:
            conn = self._conn(handle)
            if group_id not in conn.groups or fg_id not in conn.field_groups or update_freq_us <= 0:
                raise EngineError(ST_BADPARAM)
            fields = conn.field_groups[fg_id][1]
            if any(f in PROF_ATTRIBUTES for f in fields):
                if not self.options.profiling_module:
                    raise EngineError(ST_MODULE_NOT_LOADED)
                gpus = {self._parent(eg, eid) for eg, eid in conn.groups[group_id]}
                if gpus & set(self.options.unsupported_gpus):
                    raise EngineError(ST_PROFILING_NOT_SUPPORTED)
            conn.watches[(group_id, fg_id)] = _Watch(update_freq_us, self.node.clock.now())

    def unwatch(self, handle: int, group_id: int, fg_id: int) -> None:
        with self._lock:
            self._conn(handle).watches.pop((group_id, fg_id), None)

    @staticmethod
    def _parent(entity_group: int, entity_id: int) -> int:
        return entity_id if entity_group == FE_GPU else entity_id // INSTANCES_PER_GPU

    def latest(self, handle: int, group_id: int, fg_id: int) -> list[tuple[int, int, int, int, float]]:
        """(entity group, entity id, field id, timestamp µs, value) for every entity and field."""
        self._count("latest")
        with self._lock:
            conn = self._conn(handle)
            if group_id not in conn.groups or fg_id not in conn.field_groups:
                raise EngineError(ST_BADPARAM)
            watch = conn.watches.get((group_id, fg_id))
            if watch is None:
                raise EngineError(-16)  # DCGM_ST_NOT_WATCHED
            entities = list(conn.groups[group_id])
            fields = conn.field_groups[fg_id][1]
        now = self.node.clock.now()
        period = watch.update_freq_us / 1e6
        completed = math.floor((now - watch.started) / period + 1e-9)
        end = watch.started + completed * period
        instances = self._instances() if any(eg == FE_GPU_I for eg, _ in entities) else {}
        out: list[tuple[int, int, int, int, float]] = []
        for entity_group, entity_id in entities:
            activity = self._activity(entity_group, entity_id, instances, end - period, end, completed)
            if self._parent(entity_group, entity_id) in self.options.blank_gpus:
                activity = FP64_NOT_SUPPORTED
            for field_id in fields:
                out.append(
                    (
                        entity_group,
                        entity_id,
                        field_id,
                        int(end * 1e6),
                        _value(field_id, entity_group, activity),
                    )
                )
        return out

    def _activity(
        self,
        entity_group: int,
        entity_id: int,
        instances: dict[int, HierarchyEntry],
        start: float,
        end: float,
        completed: int,
    ) -> ActivityState | float:
        """The entity's activity over [start, end], or the blank value to report instead."""
        if completed < 1:
            return FP64_BLANK  # no update period has completed since the watch was set
        if entity_group == FE_GPU:
            if not 0 <= entity_id < len(self.node.identities):
                return FP64_NOT_FOUND
            if self.node.gpu_state(entity_id).lost:
                return FP64_BLANK
            return self.node.activity_between(entity_id, None, start, end)
        entry = instances.get(entity_id)
        if entry is None:
            return FP64_NOT_FOUND
        return self.node.activity_between(entry.nvml_gpu_index, entry.nvml_instance_id, start, end)


def _value(field_id: int, entity_group: int, activity: ActivityState | float) -> float:
    if isinstance(activity, float):
        return activity
    attribute = PROF_ATTRIBUTES.get(field_id)
    if attribute is None or (entity_group == FE_GPU_I and field_id in GPU_ONLY_FIELDS):
        return FP64_NOT_SUPPORTED
    return float(getattr(activity, attribute))


def _normalise(address: str) -> str:
    if address.startswith("unix://"):
        return address
    host, sep, port = address.rpartition(":")
    if not sep:
        return f"{address}:5555"  # DCGM_HE_PORT_NUMBER
    return f"{host}:{port}"


class _Installed:
    """The engine libdcgm would talk to in this process (one per process, like the library)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.engine: SimHostEngine | None = None


_INSTALLED = _Installed()


def install(node: SimNode, options: EngineOptions | None = None) -> SimHostEngine:
    """Make the fake bindings serve `node`; replaces any engine installed before."""
    engine = SimHostEngine(node, options)
    with _INSTALLED.lock:
        _INSTALLED.engine = engine
    return engine


def uninstall() -> None:
    """No DCGM on this machine any more: the bindings raise DCGMError_LibraryNotFound."""
    with _INSTALLED.lock:
        _INSTALLED.engine = None


def current() -> SimHostEngine | None:
    with _INSTALLED.lock:
        return _INSTALLED.engine
