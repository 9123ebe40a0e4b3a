"""Profiling activity from DCGM (`DCGM_FI_PROF_*`), when DCGM's Python bindings are installed.

Why DCGM at all when GPM exists: GPM is Hopper and newer only; DCGM serves the same activity ratios
on Volta/Ampere too (A100 fleets), through its closed profiling module.

How it talks to DCGM:

- The bindings are plain top-level modules; they are imported from `--dcgm-bindings PATH`, else from
  the DCGM 4 path, else the DCGM 3 path, else from wherever `import pydcgm` already works.
- Embedded host engine by default, or a standalone `nv-hostengine` at `--dcgm-address host:port` or
  `unix:///path`. The connection is made when NVML initialises (never on a GPU's read deadline);
  after a failure it is retried in the background with backoff (1 s doubling to 60 s).
- Numeric field ids only (DCGM 4.6 renamed the Python symbols; the numbers never change).
- One DCGM group per GPU holding the GPU and its GPU instances (entity groups 1 and 4), so a GPU
  DCGM cannot profile fails alone. GPU-instance entity ids are DCGM's own and are mapped to (NVML
  index, GPU instance id) through `dcgmGetGpuInstanceHierarchy`, re-read every sample so created and
  destroyed instances follow. GPUs are matched to NVML indices by UUID.
- Watches update at the sampling interval; each read takes the latest cached value (one
  `GetLatest_v2` per group per sample). Blank sentinels, NaN and stale values are absent.

Errors: bindings missing or libdcgm missing stop DCGM for the life of the process (one log line);
connection not valid and "profiling module not loaded" drop the connection and retry; profiling not
supported on a GPU leaves that GPU to the fallback source. `read` returns source "nvml" for a GPU it
does not serve, which the selector (`profiling_source.py`) turns into GPM or NVML utilization.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml

from gpulens.exporter.snapshot import MigSample, ProfilerAnswer, ProfilingSource

DCGM4_BINDINGS = Path("/usr/share/datacenter-gpu-manager-4/bindings/python3")
DCGM3_BINDINGS = Path("/usr/local/dcgm/bindings/python3")
DEFAULT_SEARCH = (DCGM4_BINDINGS, DCGM3_BINDINGS)

FE_GPU = 1  # DCGM_FE_GPU
FE_GPU_I = 4  # DCGM_FE_GPU_I

# DCGM field id -> snapshot PROFILING_KEYS item (ratios 0..1)
RATIO_FIELDS: tuple[tuple[int, str], ...] = (
    (1001, "graphics"),  # PROF_GR_ENGINE_ACTIVE / _UTIL_RATIO
    (1002, "sm"),  # PROF_SM_ACTIVE / SM_UTIL_RATIO
    (1003, "sm_occupancy"),  # PROF_SM_OCCUPANCY
    (1004, "tensor"),  # PROF_PIPE_TENSOR_ACTIVE / TENSOR_UTIL_RATIO
    (1005, "dram"),  # PROF_DRAM_ACTIVE / DRAM_UTIL_RATIO
    (1006, "fp64"),
    (1007, "fp32"),
    (1008, "fp16"),
)
# rates in bytes per second, whole GPU only (blank on GPU instances)
RATE_FIELDS: tuple[tuple[int, str], ...] = (
    (1009, "pcie_tx_bytes_per_second"),
    (1010, "pcie_rx_bytes_per_second"),
    (1011, "nvlink_tx_bytes_per_second"),
    (1012, "nvlink_rx_bytes_per_second"),
)
FIELD_KEYS: dict[int, str] = dict(RATIO_FIELDS + RATE_FIELDS)
RATE_KEYS = frozenset(key for _, key in RATE_FIELDS)

# blank sentinels (dcgmvalue.py): a value at or above these means "no value"
FP64_BLANK = 140737488355328.0
INT64_BLANK = 0x7FFFFFFFFFFFFFF0

ST_NOT_SUPPORTED = -6
ST_NO_PERMISSION = -17
ST_CONNECTION_NOT_VALID = -21
ST_GPU_NOT_SUPPORTED = -22
ST_LIBRARY_NOT_FOUND = -25
ST_REQUIRES_ROOT = -29
ST_MODULE_NOT_LOADED = -33
ST_PROFILING_NOT_SUPPORTED = -36
ST_PROFILING_LIBRARY_ERROR = -37
GPU_UNSUPPORTED = {ST_NOT_SUPPORTED, ST_GPU_NOT_SUPPORTED, ST_PROFILING_NOT_SUPPORTED}

BACKOFF_START = 1.0
BACKOFF_MAX = 60.0

NOT_SERVED: ProfilerAnswer = (ProfilingSource.NVML, (), {})


class DcgmUnavailable(Exception):
    """DCGM cannot be used; `str()` is one line. `permanent`: retrying cannot help."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class DcgmSettings:
    """Where the bindings are and which host engine to use (None: embedded)."""

    bindings: Path | None = None
    address: str | None = None
    search: tuple[Path, ...] = DEFAULT_SEARCH


@dataclass(frozen=True)
class Bindings:
    pydcgm: ModuleType
    dcgm_structs: ModuleType
    dcgm_agent: ModuleType


def load_bindings(settings: DcgmSettings) -> Bindings:
    """Import pydcgm and friends from the configured or standard directories."""
    if settings.bindings is not None:
        candidates: tuple[Path, ...] = (settings.bindings,)
        if not (settings.bindings / "pydcgm.py").is_file():
            raise DcgmUnavailable(f"--dcgm-bindings {settings.bindings}: no pydcgm.py there", permanent=True)
    else:
        candidates = tuple(p for p in settings.search if (p / "pydcgm.py").is_file())
    for path in candidates:
        text = str(path)
        if text not in sys.path:
            sys.path.append(text)
    try:
        return Bindings(
            pydcgm=importlib.import_module("pydcgm"),
            dcgm_structs=importlib.import_module("dcgm_structs"),
            dcgm_agent=importlib.import_module("dcgm_agent"),
        )
    except ImportError as exc:
        searched = ", ".join(str(p) for p in (settings.bindings,) if p) or ", ".join(
            str(p) for p in settings.search
        )
        raise DcgmUnavailable(f"DCGM Python bindings not found (searched {searched}): {exc}", True) from exc


def parse_address(address: str) -> dict[str, str]:
    """`unix:///run/x.sock` -> unixSocketPath; `host[:port]` (or `tcp://host:port`) -> ipAddress."""
    if address.startswith("unix://"):
        return {"unixSocketPath": address[len("unix://") :]}
    return {"ipAddress": address.removeprefix("tcp://")}


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def error_line(exc: BaseException) -> str:
    """`DCGMError_ConnectionNotValid (-21): The connection ...` — one line, whatever the error."""
    code = _code(exc)
    text = " ".join(str(exc).split())
    if code is not None:
        return f"{type(exc).__name__} ({code}): {text}"
    return f"{type(exc).__name__}: {text}"


@dataclass
class _Gpu:
    """One DCGM GPU's watch: its group, the entities in it, and why it is not served (if so)."""

    gpu_id: int
    group: Any = None
    entities: tuple[tuple[int, int], ...] = ()
    unsupported: str = ""


@dataclass
class _Connection:
    handle: Any
    field_group: Any
    gpu_by_uuid: dict[str, int]
    gpus: dict[int, _Gpu] = field(default_factory=dict)
    instance_entities: dict[tuple[int, int], int] = field(default_factory=dict)  # (nvml idx, gi) -> eid
    values: dict[tuple[int, int], dict[int, tuple[float, float]]] = field(default_factory=dict)
    fetched_at: float | None = None


class DcgmProfiler:
    """The profiler interface of `GpmProfiler`: `read`, `forget`, `close`; source "dcgm"."""

    source = ProfilingSource.DCGM

    def __init__(
        self,
        settings: DcgmSettings,
        clock: Callable[[], float],
        interval: float,
        logger: logging.Logger | None = None,
        backoff_start: float = BACKOFF_START,
        optional: bool = False,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.interval = interval
        self.log = logger or logging.getLogger("gpulens.exporter.dcgm")
        self.optional = optional  # auto mode: DCGM not being installed is normal, not a warning
        self._lock = threading.Lock()
        self._conn: _Connection | None = None
        self._bindings: Bindings | None = None
        self._uuids: dict[int, str] = {}
        self._last_message = ""
        self._last_key = ""
        self._logged_unsupported: set[tuple[int, str]] = set()
        self._permanent = False
        self._backoff = backoff_start
        self._backoff_start = backoff_start
        self._stop = threading.Event()
        self._retry: threading.Thread | None = None
        self._name = f"gpulens-{os.getpid()}-{id(self):x}"
        with self._lock:
            self._connect()

    # ---- connection --------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._conn is not None

    @property
    def unavailable_reason(self) -> str:
        return "" if self._conn is not None else self._last_message

    def _connect(self) -> None:
        """Connect and set up watches (caller holds the lock); on failure log once and retry later."""
        try:
            if self._bindings is None:
                self._bindings = load_bindings(self.settings)
            self._conn = self._open(self._bindings)
        except DcgmUnavailable as exc:
            self._fail(str(exc), exc.permanent, key=str(exc))
            return
        except Exception as exc:
            code = _code(exc)
            where = f"DCGM host engine {self.settings.address}" if self.settings.address else "embedded DCGM"
            permanent = code == ST_LIBRARY_NOT_FOUND
            hint = " (libdcgm not installed?)" if permanent else ""
            if code == ST_MODULE_NOT_LOADED:
                hint = " (profiling module not loaded: needs CAP_SYS_ADMIN and DCGM's profiling library)"
            message = f"DCGM profiling unavailable, {where}: {error_line(exc)}{hint}"
            self._fail(message, permanent, key=error_line(exc))
            return
        self.log.info(
            "DCGM profiling source connected (%s, %d GPUs)",
            self.settings.address or "embedded host engine",
            len(self._conn.gpu_by_uuid),
        )
        self._last_message = ""
        self._last_key = ""
        self._backoff = self._backoff_start

    def _fail(self, message: str, permanent: bool, key: str) -> None:
        """Log once per distinct error (`key`: the DCGM error itself, so the line saying the
        connection broke and the retries failing with the same error make one line), then retry."""
        if key != self._last_key:
            suffix = "" if permanent else "; retrying with backoff"
            level = logging.INFO if permanent and self.optional else logging.WARNING
            self.log.log(level, "%s%s", message, suffix)
            self._last_message = message
        self._last_key = key
        self._conn = None
        if permanent:
            self._permanent = True
            return
        if self._retry is None or not self._retry.is_alive():
            self._retry = threading.Thread(target=self._retry_loop, name="gpulens-dcgm-connect", daemon=True)
            self._retry.start()

    def _retry_loop(self) -> None:
        while not self._stop.wait(self._backoff):
            self._backoff = min(self._backoff * 2, BACKOFF_MAX)
            with self._lock:
                if self._stop.is_set() or self._conn is not None:
                    return
                self._connect()
                if self._conn is not None or self._permanent:
                    return

    def _open(self, b: Bindings) -> _Connection:
        kwargs = parse_address(self.settings.address) if self.settings.address else {}
        handle = b.pydcgm.DcgmHandle(opMode=b.dcgm_structs.DCGM_OPERATION_MODE_AUTO, timeoutMs=2000, **kwargs)
        try:
            system = handle.GetSystem()
            gpu_by_uuid: dict[str, int] = {}
            for gpu_id in system.discovery.GetAllSupportedGpuIds():
                attributes = system.discovery.GetGpuAttributes(gpu_id)
                gpu_by_uuid[str(attributes.identifiers.uuid)] = int(gpu_id)
            field_ids = [fid for fid, _ in RATIO_FIELDS + RATE_FIELDS]
            field_group = b.pydcgm.DcgmFieldGroup(handle, name=f"{self._name}-prof", fieldIds=field_ids)
            conn = _Connection(handle=handle, field_group=field_group, gpu_by_uuid=gpu_by_uuid)
            self._sync_watches(conn, b)
        except Exception:
            with contextlib.suppress(Exception):
                handle.Shutdown()
            raise
        return conn

    def _drop(self, exc: BaseException) -> None:
        """The connection broke (caller holds the lock): close what is left and retry later."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.handle.Shutdown()
        self._backoff = self._backoff_start
        self._fail(f"DCGM profiling stopped: {error_line(exc)}", permanent=False, key=error_line(exc))

    # ---- watches ----------------------------------------------------------------------------
    def _sync_watches(self, conn: _Connection, b: Bindings) -> None:
        """Re-read the MIG hierarchy; (re)create the group of each GPU whose entities changed."""
        hierarchy = b.dcgm_agent.dcgmGetGpuInstanceHierarchy(conn.handle.handle)
        by_gpu: dict[int, list[tuple[int, int]]] = {g: [(FE_GPU, g)] for g in conn.gpu_by_uuid.values()}
        instance_entities: dict[tuple[int, int], int] = {}
        for i in range(int(hierarchy.count)):
            item = hierarchy.entityList[i]
            if int(item.entity.entityGroupId) != FE_GPU_I:
                continue
            entity_id = int(item.entity.entityId)
            by_gpu.setdefault(int(item.parent.entityId), [(FE_GPU, int(item.parent.entityId))]).append(
                (FE_GPU_I, entity_id)
            )
            instance_entities[(int(item.info.nvmlGpuIndex), int(item.info.nvmlInstanceId))] = entity_id
        conn.instance_entities = instance_entities
        system = conn.handle.GetSystem()
        for gpu_id, entities in by_gpu.items():
            wanted = tuple(sorted(entities))
            gpu = conn.gpus.setdefault(gpu_id, _Gpu(gpu_id))
            if gpu.entities == wanted:
                continue
            self._delete_group(gpu)
            gpu.entities = wanted
            gpu.unsupported = ""
            gpu.group = system.GetEmptyGroup(f"{self._name}-gpu{gpu_id}-{len(instance_entities)}")
            for entity_group, entity_id in wanted:
                gpu.group.AddEntity(entity_group, entity_id)
            try:
                gpu.group.samples.WatchFields(
                    conn.field_group,
                    int(self.interval * 1_000_000),
                    max(30.0, 3 * self.interval),
                    2,
                )
            except Exception as exc:
                if _code(exc) not in GPU_UNSUPPORTED:
                    raise
                self._unsupported(gpu, error_line(exc))

    def _unsupported(self, gpu: _Gpu, reason: str) -> None:
        gpu.unsupported = reason
        key = (gpu.gpu_id, reason)
        if key not in self._logged_unsupported:
            self._logged_unsupported.add(key)
            self.log.warning("DCGM cannot profile GPU %d: %s", gpu.gpu_id, reason)

    @staticmethod
    def _delete_group(gpu: _Gpu) -> None:
        if gpu.group is not None:
            with contextlib.suppress(Exception):
                gpu.group.Delete()
            gpu.group = None

    # ---- reading ----------------------------------------------------------------------------
    def _refresh(self, conn: _Connection, now: float) -> None:
        """Once per sample: follow the MIG hierarchy and fetch the latest values of every group."""
        if conn.fetched_at is not None and now - conn.fetched_at < self.interval / 2:
            return
        assert self._bindings is not None
        self._sync_watches(conn, self._bindings)
        values: dict[tuple[int, int], dict[int, tuple[float, float]]] = {}
        for gpu in conn.gpus.values():
            if gpu.unsupported or gpu.group is None:
                continue
            latest = gpu.group.samples.GetLatest_v2(conn.field_group)
            own = latest.values.get(FE_GPU, {}).get(gpu.gpu_id, {})
            if own and all(_not_supported(own.get(fid)) for fid, _ in RATIO_FIELDS):
                # some DCGM versions accept the watch and then report every profiling field as
                # blank NOT_SUPPORTED: treat it like a refused watch, so the fallback takes over
                self._unsupported(gpu, "every profiling field reads blank NOT_SUPPORTED")
                continue
            for entity_group, per_entity in latest.values.items():
                for entity_id, per_field in per_entity.items():
                    out = values.setdefault((int(entity_group), int(entity_id)), {})
                    for field_id, series in per_field.items():
                        value = _usable(series)
                        if value is not None:
                            out[int(field_id)] = value
        conn.values = values
        conn.fetched_at = now

    def _values(
        self, conn: _Connection, entity: tuple[int, int], now: float
    ) -> tuple[tuple[str, float], ...]:
        stale_before = now - max(3 * self.interval, 2.0)
        out: list[tuple[str, float]] = []
        for field_id, (ts, value) in sorted(conn.values.get(entity, {}).items()):
            key = FIELD_KEYS.get(field_id)
            if key is None or ts < stale_before:
                continue
            out.append((key, max(0.0, value) if key in RATE_KEYS else min(1.0, max(0.0, value))))
        return tuple(out)

    def _uuid(self, index: int, handle: Any) -> str | None:
        uuid = self._uuids.get(index)
        if uuid is None:
            try:
                uuid = str(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError:
                return None
            self._uuids[index] = uuid
        return uuid

    def read(self, index: int, handle: Any, mig_instances: Sequence[MigSample]) -> ProfilerAnswer:
        """(source, whole-GPU values, {gpu_instance: values}); `NOT_SERVED` when not served."""
        if self._conn is None:
            return NOT_SERVED
        uuid = self._uuid(index, handle)
        # never wait long for another GPU's DCGM calls: fall back for this sample instead
        if uuid is None or not self._lock.acquire(timeout=max(0.05, self.interval / 4)):
            return NOT_SERVED
        try:
            conn = self._conn
            if conn is None:
                return NOT_SERVED
            now = self.clock()
            try:
                self._refresh(conn, now)
            except Exception as exc:
                self._drop(exc)
                return NOT_SERVED
            gpu_id = conn.gpu_by_uuid.get(uuid)
            gpu = conn.gpus.get(gpu_id) if gpu_id is not None else None
            if gpu is None or gpu.unsupported:
                return NOT_SERVED
            gpu_values = self._values(conn, (FE_GPU, gpu.gpu_id), now)
            mig_values: dict[int, tuple[tuple[str, float], ...]] = {}
            for m in mig_instances:
                entity_id = conn.instance_entities.get((index, m.gpu_instance))
                if entity_id is not None:
                    mig_values[m.gpu_instance] = self._values(conn, (FE_GPU_I, entity_id), now)
            return self.source, gpu_values, mig_values
        finally:
            self._lock.release()

    def forget(self, index: int) -> None:
        """A GPU was lost: its UUID is read again when it comes back."""
        self._uuids.pop(index, None)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is None:
                return
            for gpu in conn.gpus.values():
                self._delete_group(gpu)
            with contextlib.suppress(Exception):
                conn.field_group.Delete()
            with contextlib.suppress(Exception):
                conn.handle.Shutdown()


def _not_supported(series: Any) -> bool:
    """The newest value is DCGM's NOT_SUPPORTED blank (FP64 or INT64 flavour)."""
    try:
        value = getattr(series[-1], "value", None)
    except (IndexError, TypeError):
        return False
    return isinstance(value, int | float) and value in (FP64_BLANK + 2, INT64_BLANK + 2)


def _usable(series: Any) -> tuple[float, float] | None:
    """(timestamp s, value) of the newest sample, or None for blank / NaN / non-numeric values."""
    try:
        latest = series[-1]
    except (IndexError, TypeError):
        return None
    if getattr(latest, "isBlank", False):
        return None
    value = getattr(latest, "value", None)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    if math.isnan(number) or number >= FP64_BLANK or (isinstance(value, int) and value >= INT64_BLANK):
        return None
    ts = getattr(latest, "ts", None)
    return (float(ts) / 1e6 if isinstance(ts, int | float) else time.time()), number
