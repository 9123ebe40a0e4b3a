"""Publish a simulated node's state for the native simulated NVML library.

The engine runs in one process (the `gpulens sim run` launcher, or a test); any number of other
processes load the native `libnvidia-ml.so.1`, which reads what this publisher writes into a
shared-memory file (the layout is `layout.py` / `layout.h`): every GPU's `GpuState`, the MIG
instances and processes, the driver events, and running integrals of each device's activity from
which the library answers GPM queries over any interval between two publishes.

`publish()` writes one consistent snapshot (under the seqlock, through the library's own
`gpulens_sim_publish`); `start()` keeps doing so from a daemon thread at the engine's state
quantum, so a reader's view is never older than that. Programs find the file through
`GPULENS_SIM_SHM` (see `environment()`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import struct
import tempfile
import threading
import time
import weakref
from pathlib import Path

from gpulens.sim.native import build
from gpulens.sim.native.layout import (
    ACTIVITY_FIELDS,
    LAYOUT_MAGIC,
    LAYOUT_VERSION,
    MAX_GPUS,
    MAX_MIG,
    MAX_NVLINKS,
    MAX_PROFILES,
    MAX_RETIRED,
    N_ACTIVITY,
    N_LOCATIONS,
    N_NVLINK_COUNTERS,
    N_REASON_BITS,
    PROC_KIND,
    UTIL_SAMPLES,
    EventRec,
    GpuRec,
    ProcRec,
    ShmHeader,
)
from gpulens.sim.nvml.mig import engine_counts
from gpulens.sim.pci import parse_bus_id
from gpulens.sim.state import GpuIdentity, GpuState, ProcessState, SimEvent, SimNode

LOG = logging.getLogger("gpulens.sim.native")

ENV_SHM = "GPULENS_SIM_SHM"
STATE_QUANTUM = 0.1  # seconds between publishes: the engine's own state quantum
EVENT_LOOKBACK = 1.0  # simulated seconds re-read each publish, so an event at the edge is not lost
BODY_OFFSET = ShmHeader.used_size.offset
U32 = 0xFFFFFFFF

# One process record in a single `pack_into` instead of eleven ctypes attribute stores (about 200
# records per publish on `large`); tests/sim/test_native_publisher.py ties it to `ProcRec`.
PROC_STRUCT = struct.Struct("@QdIIIIIIII32s")


def _clip(text: str, size: int) -> bytes:
    """A C string that fits `size` bytes with its NUL."""
    return text.encode()[: size - 1]


def _clipped(cache: dict[str, bytes], text: str, size: int) -> bytes:
    """`_clip`, remembered in `cache` (one cache per field size): names repeat every publish."""
    clipped = cache.get(text)
    if clipped is None:
        clipped = cache[text] = _clip(text, size)
    return clipped


def _clock_speed(clock: object) -> float:
    """Simulated seconds per real second between publishes: 0 for a clock that only moves when
    told to (a test's ManualClock), the clock's `speed` when sped up, else real time."""
    if hasattr(clock, "advance"):
        return 0.0
    speed = getattr(clock, "speed", 1.0)
    return float(speed) if isinstance(speed, int | float) and speed > 0 else 1.0


if PROC_STRUCT.size != ctypes.sizeof(ProcRec):  # the field-by-field agreement is tested
    raise RuntimeError(f"PROC_STRUCT is {PROC_STRUCT.size} bytes, ProcRec {ctypes.sizeof(ProcRec)}")


def pack_process(
    buffer: ctypes.Array[ctypes.c_char],
    offset: int,
    proc: ProcessState,
    names: dict[str, bytes],
) -> None:
    """Write `proc` as one `ProcRec` at `offset`; `names` caches the clipped names. The name is
    NUL-padded to its full size (ctypes left the tail of a longer previous name after the NUL)."""
    name = _clipped(names, proc.name, 32)
    memory = proc.used_memory_bytes
    PROC_STRUCT.pack_into(
        buffer,
        offset,
        memory or 0,
        proc.start_time,
        proc.pid & U32,
        PROC_KIND[proc.kind],
        int(memory is not None),
        proc.sm_util_percent & U32,
        proc.mem_util_percent & U32,
        proc.gpu_instance_id & U32,
        proc.compute_instance_id & U32,
        0,
        name,
    )


class Publisher:
    """Writes `node`'s state into a shared-memory file the native library maps.

    `activity_quantum` is how often (simulated seconds) the activity integrals behind GPM move on:
    each step costs one `activity_between` per GPU and MIG instance. 0 updates them on every
    publish (tests, which publish after each change).
    """

    def __init__(
        self,
        node: SimNode,
        *,
        directory: str | os.PathLike[str] | None = None,
        activity_quantum: float = 1.0,
        proc_capacity: int = 4096,
        event_ring: int = 1024,
    ) -> None:
        if len(node.identities) > MAX_GPUS:
            raise ValueError(f"the native simulated driver serves at most {MAX_GPUS} GPUs")
        self.node = node
        self.activity_quantum = activity_quantum
        self._lib = build.load()
        self._publish = self._lib.gpulens_sim_publish
        self._publish.restype = None
        self._publish.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64]
        gpus = len(node.identities)
        self._gpu_offset = ctypes.sizeof(ShmHeader)
        self._event_offset = self._gpu_offset + gpus * ctypes.sizeof(GpuRec)
        self._proc_offset = self._event_offset + event_ring * ctypes.sizeof(EventRec)
        self._proc_capacity = proc_capacity
        self._event_ring = event_ring
        self.capacity = self._proc_offset + proc_capacity * ctypes.sizeof(ProcRec)

        where = directory or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())
        remove_stale_files(where)
        fd, name = tempfile.mkstemp(prefix=f"{FILE_PREFIX}{os.getpid()}-", suffix=FILE_SUFFIX, dir=where)
        self.path = Path(name)
        # a publisher nobody closed (a script that returns early, a failed start-up below) must not
        # leave its file in /dev/shm: the finalizer removes it when the object goes away or the
        # interpreter exits; close() runs it at once (it runs once)
        self._remove_file = weakref.finalize(self, _remove_quietly, name)
        try:
            os.ftruncate(fd, self.capacity)
            self._map = mmap.mmap(fd, self.capacity)
        finally:
            os.close(fd)
        self._map_anchor = ctypes.c_char.from_buffer(self._map)
        self._map_address = ctypes.addressof(self._map_anchor)
        shared = ShmHeader.from_buffer(self._map)
        shared.magic = LAYOUT_MAGIC
        shared.layout_version = LAYOUT_VERSION
        shared.header_size = ctypes.sizeof(ShmHeader)
        shared.capacity = self.capacity
        del shared

        # the next body is built here, then copied in under the seqlock
        self._staging = ctypes.create_string_buffer(self.capacity)
        self._staging_address = ctypes.addressof(self._staging)
        self._header = ShmHeader.from_buffer(self._staging)
        self._gpus = [
            GpuRec.from_buffer(self._staging, self._gpu_offset + i * ctypes.sizeof(GpuRec))
            for i in range(gpus)
        ]
        self._events = (EventRec * event_ring).from_buffer(self._staging, self._event_offset)
        # clipped C strings, one cache per field (each has its own size)
        self._names: dict[str, bytes] = {}  # process names
        self._mig_uuids: dict[str, bytes] = {}
        self._mig_profiles: dict[str, bytes] = {}
        self._mig_engines: dict[tuple[str, int, int], tuple[int, int, int, int, int]] = {}
        self._header.capacity = self.capacity
        self._header.gpu_offset = self._gpu_offset
        self._header.event_offset = self._event_offset
        self._header.proc_offset = self._proc_offset
        self._header.event_ring = event_ring
        self._header.proc_capacity = proc_capacity
        self._header.gpu_count = gpus
        driver = node.driver
        self._header.driver_version = _clip(driver.driver_version, 32)
        self._header.nvml_version = _clip(driver.nvml_version, 32)
        self._header.cuda_driver_version = driver.cuda_driver_version
        self._identities: tuple[GpuIdentity, ...] = ()

        self._lock = threading.Lock()
        self._events_total = 0
        self._event_cursor: float | None = None
        self._recent: set[SimEvent] = set()
        self._activity_time: float | None = None
        self._integrals: dict[tuple[int, int | None], list[float]] = {}
        self._warned_capacity = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.publishes = 0
        self.publish()

    # --- the environment of programs that load the library ------------------------------------

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's) plus what makes a program load and find the library."""
        env = dict(os.environ if base is None else base)
        env[ENV_SHM] = str(self.path)
        library_dir = str(build.library_dir())
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (library_dir, env.get("LD_LIBRARY_PATH", "")) if p
        )
        return env

    # --- publishing ----------------------------------------------------------------------------

    def publish(self, *, activity: bool | None = None) -> None:
        """Write the node's state now. `activity` forces (True) or skips (False) moving the
        activity integrals on; by default they move when `activity_quantum` has passed."""
        with self._lock:
            node = self.node
            now = node.clock.now()
            states = [node.gpu_state(i) for i in range(len(node.identities))]
            h = self._header
            h.sim_time = now
            h.speed = _clock_speed(node.clock)
            h.mono_ns = time.monotonic_ns()
            h.init_error = int(node.init_error() or 0)
            if node.identities is not self._identities:  # written once (a test may swap them)
                self._identities = node.identities
                for rec, identity in zip(self._gpus, node.identities, strict=True):
                    _fill_identity(rec, identity)
            if activity is None:
                activity = self._activity_time is None or now - self._activity_time >= self.activity_quantum
            if activity:
                self._advance_activity(states, now)
            procs = 0
            for rec, state in zip(self._gpus, states, strict=True):
                procs = self._fill_state(rec, state, now, procs)
            h.proc_count = procs
            self._publish_events(now)
            h.events_total = self._events_total
            h.used_size = self._proc_offset + procs * ctypes.sizeof(ProcRec)
            self._publish(
                self._map_address, self._staging_address + BODY_OFFSET, BODY_OFFSET, h.used_size - BODY_OFFSET
            )
            self.publishes += 1

    def _advance_activity(self, states: list[GpuState], now: float) -> None:
        start = self._activity_time
        self._activity_time = now
        for index, state in enumerate(states):
            keys: list[int | None] = [None] + [m.gpu_instance_id for m in state.mig_instances]
            for gi in keys:
                integral = self._integrals.get((index, gi))
                if integral is None:  # a device seen for the first time starts from zero now
                    self._integrals[(index, gi)] = [0.0] * N_ACTIVITY
                    continue
                if start is None or now <= start:
                    continue
                mean = self.node.activity_between(index, gi, start, now)
                span = now - start
                for k, name in enumerate(ACTIVITY_FIELDS):
                    integral[k] += getattr(mean, name) * span

    def _fill_state(self, rec: GpuRec, state: GpuState, now: float, procs: int) -> int:
        index = state.index
        rec.activity[:] = self._integrals.get((index, None), [0.0] * N_ACTIVITY)
        rec.activity_time = self._activity_time or now
        rec.hang_until = now + state.hang_seconds if state.hang_seconds > 0 else 0.0
        rec.lost = int(state.lost)
        rec.util_gpu, rec.util_mem = state.utilization_gpu_percent, state.utilization_memory_percent
        # the samples the driver keeps at this publish (none on a MIG GPU: the library answers
        # NOT_SUPPORTED there without reading them)
        kept = () if state.mig_mode_current == 1 else self.node.utilization_samples(index, now)
        kept = kept[-UTIL_SAMPLES:]
        rec.util_sample_count = len(kept)
        for k, (stamp, percent) in enumerate(kept):
            rec.util_sample_us[k] = round(stamp * 1_000_000)
            rec.util_sample_pct[k] = percent
        rec.temperature = state.temperature_c
        rec.memory_temperature = -1 if state.memory_temperature_c is None else state.memory_temperature_c
        rec.power_mw, rec.power_limit_mw = state.power_mw, state.power_limit_mw
        rec.default_power_limit_mw = state.default_power_limit_mw
        rec.clock_graphics, rec.clock_sm = state.graphics_clock_mhz, state.sm_clock_mhz
        rec.clock_mem, rec.clock_video = state.memory_clock_mhz, state.video_clock_mhz
        rec.fan_percent = -1 if state.fan_percent is None else state.fan_percent
        rec.pstate, rec.compute_mode, rec.persistence = (
            state.performance_state,
            state.compute_mode,
            state.persistence_mode,
        )
        rec.pcie_tx_kbps, rec.pcie_rx_kbps = state.pcie_tx_kbps, state.pcie_rx_kbps
        rec.pcie_replay = state.pcie_replay_count
        rec.pcie_gen, rec.pcie_width = state.pcie_link_generation, state.pcie_link_width
        rec.pcie_tx_bytes, rec.pcie_rx_bytes = state.pcie_tx_bytes_total, state.pcie_rx_bytes_total
        rec.memory_total, rec.memory_reserved = state.memory_total_bytes, state.memory_reserved_bytes
        rec.memory_used = state.memory_used_bytes
        rec.bar1_total, rec.bar1_used = state.bar1_total_bytes, state.bar1_used_bytes
        rec.energy_mj = state.energy_mj
        rec.clock_event_reasons = state.clock_event_reasons
        rec.supported_clock_event_reasons = state.supported_clock_event_reasons
        reasons = [0] * N_REASON_BITS
        for bit, ns in state.clock_event_reason_ns.items():
            position = int(bit).bit_length() - 1
            if 0 <= position < N_REASON_BITS:
                reasons[position] = ns
        rec.clock_reason_ns[:] = reasons
        rec.ecc_enabled = -1 if state.ecc_enabled is None else int(state.ecc_enabled)
        for error in (0, 1):
            for counter in (0, 1):
                rec.ecc_totals[error][counter] = state.ecc_totals.get((error, counter), 0)
                rec.memory_errors[error][counter][:] = [
                    state.memory_error_counters.get((error, counter, location), 0)
                    for location in range(N_LOCATIONS)
                ]
        rows = state.remapped_rows
        rec.remap_supported = int(rows is not None)
        rec.remap[:] = [int(v) for v in rows] if rows is not None else [0, 0, 0, 0]
        pages = state.retired_pages
        rec.retired_supported = int(pages is not None)
        rec.retired_pending = int(bool(state.retired_pages_pending))
        for cause in (0, 1):
            entries = list((pages or {}).get(cause, ()))[:MAX_RETIRED]
            rec.retired_count[cause] = len(entries)
            for k, (address, stamp) in enumerate(entries):
                rec.retired_address[cause][k] = address
                rec.retired_time_us[cause][k] = stamp
        rec.mig_current = -1 if state.mig_mode_current is None else state.mig_mode_current
        rec.mig_pending = -1 if state.mig_mode_pending is None else state.mig_mode_pending
        rec.accounting = int(state.accounting_enabled)
        links = state.nvlinks[:MAX_NVLINKS]
        rec.nvlink_count = len(links)
        for k, link in enumerate(links):
            out = rec.nvlinks[k]
            out.link, out.active = link.link, int(link.active)
            out.tx_kib, out.rx_kib = link.tx_kib_total, link.rx_kib_total
            out.errors[:] = [link.errors.get(c, 0) for c in range(N_NVLINK_COUNTERS)]
        rec.proc_first, rec.proc_count, procs = self._add_procs(state.processes, procs)
        rec.client_first, rec.client_count, procs = self._add_procs(state.mps_clients, procs)
        instances = state.mig_instances[:MAX_MIG]
        rec.mig_count = len(instances)
        for k, mig in enumerate(instances):
            out = rec.mig[k]
            out.activity[:] = self._integrals.get((index, mig.gpu_instance_id), [0.0] * N_ACTIVITY)
            out.slot, out.gpu_instance_id = mig.slot, mig.gpu_instance_id
            out.compute_instance_id, out.placement_start = mig.compute_instance_id, mig.placement_start
            out.memory_total, out.memory_used = mig.memory_total_bytes, mig.memory_used_bytes
            out.memory_reserved = mig.memory_reserved_bytes
            out.sm_count, out.slices = mig.profile.sm_count, mig.profile.compute_slices
            key = (mig.profile.name, rec.compute_slices, rec.architecture)  # 1g.10gb: A100 and H100
            engines = self._mig_engines.get(key)
            if engines is None:  # a profile's engine counts are fixed: computed once
                engines = self._mig_engines[key] = _engines(mig.profile, rec.compute_slices, rec.architecture)
            out.copy, out.decoder, out.encoder, out.jpeg, out.ofa = engines
            out.uuid = _clipped(self._mig_uuids, mig.uuid, 80)
            out.profile = _clipped(self._mig_profiles, mig.profile.name, 16)
            out.proc_first, out.proc_count, procs = self._add_procs(mig.processes, procs)
            out.client_first, out.client_count, procs = self._add_procs(mig.mps_clients, procs)
        return procs

    def _add_procs(self, group: tuple[ProcessState, ...], at: int) -> tuple[int, int, int]:
        """(first, count, next free) after writing `group` into the process table at `at`."""
        room = self._proc_capacity - at
        if len(group) > room and not self._warned_capacity:
            LOG.warning(
                "native simulated driver: more than %d processes, the rest are left out", self._proc_capacity
            )
            self._warned_capacity = True
        chosen = group[: max(0, room)]
        offset = self._proc_offset + at * PROC_STRUCT.size
        for proc in chosen:
            pack_process(self._staging, offset, proc, self._names)
            offset += PROC_STRUCT.size
        return at, len(chosen), at + len(chosen)

    def _publish_events(self, now: float) -> None:
        """Append the events up to `now` to the ring, each once.

        Events are read again over the last EVENT_LOOKBACK seconds and the ones already published
        skipped: an event injected at exactly the last publish's time is then not lost.
        """
        if self._event_cursor is None:
            self._event_cursor = now  # only events after the publisher started
            return
        start = min(self._event_cursor, now) - EVENT_LOOKBACK
        fresh = [e for e in self.node.events_between(start, now) if e not in self._recent]
        self._recent = {e for e in self._recent if e.time > start} | set(fresh)
        self._event_cursor = max(self._event_cursor, now)
        for event in fresh:
            out = self._events[self._events_total % self._event_ring]
            out.time, out.gpu, out.event_type, out.data = (
                event.time,
                event.gpu_index,
                event.event_type,
                event.data,
            )
            out.gpu_instance_id, out.compute_instance_id = event.gpu_instance_id, event.compute_instance_id
            self._events_total += 1

    # --- running ---------------------------------------------------------------------------------

    def start(self, interval: float = STATE_QUANTUM) -> Publisher:
        """Publish every `interval` real seconds from a daemon thread until `close()`."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, args=(interval,), name="gpulens-sim-publisher", daemon=True
            )
            self._thread.start()
        return self

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.publish()
            except Exception:  # a scenario bug must not stop the node: readers keep the last state
                LOG.exception("publishing the simulated node failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if not self._map.closed:
            del self._map_anchor
            self._map.close()
        self._remove_file()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# a published node's file: gpulens-nvml-<publisher pid>-<random>.shm
FILE_PREFIX = "gpulens-nvml-"
FILE_SUFFIX = ".shm"


def remove_stale_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the files of publishers that died without cleaning up (SIGKILL, OOM kill): a node's
    file is ~0.5 MB of /dev/shm (memory) and nothing else ever removes it. A file is stale when
    the pid in its name runs no process; one whose pid is alive (or cannot be checked: another
    user's) is left alone. Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not (name.startswith(FILE_PREFIX) and name.endswith(FILE_SUFFIX)):
            continue
        pid_text = name[len(FILE_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process (or not a pid we can ask about): not ours to judge
    return True


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _fill_identity(rec: GpuRec, identity: GpuIdentity) -> None:
    """What does not change while the node runs: written once."""
    model = identity.model
    rec.index, rec.minor_number = identity.index, identity.minor_number
    address = parse_bus_id(identity.pci_bus_id)
    rec.pci_ok = int(address is not None)
    if address is not None:
        rec.pci_domain, rec.pci_bus = address.domain, address.bus
        rec.pci_device, rec.pci_function = address.device, address.function
        rec.pci_bus_id_legacy = _clip(address.legacy_bus_id, 16)
        rec.pci_bus_id = _clip(address.bus_id, 32)
    rec.pci_device_id = model.pci_device_id
    rec.architecture = model.nvml_architecture
    rec.cc_major, rec.cc_minor = model.cuda_compute_capability
    rec.sm_count = model.sm_count
    rec.model_power_limit_mw = model.power_limit_watts * 1000
    rec.max_sm_clock, rec.max_mem_clock = model.max_sm_clock_mhz, model.max_memory_clock_mhz
    rec.max_pcie_gen, rec.max_pcie_width = model.pcie_generation, model.pcie_width
    rec.model_nvlinks = model.nvlink_links
    rec.ecc_default = int(model.ecc_default)
    rec.mig_capable = int(model.mig_capable)
    rec.compute_slices = model.compute_slices
    rec.gpm_supported = int(model.gpm_supported)
    rec.has_serial = int(identity.serial is not None)
    rec.serial = _clip(identity.serial or "", 32)
    rec.name = _clip(model.nvml_name, 96)
    rec.uuid = _clip(identity.uuid, 80)
    rec.board_part_number = _clip(identity.board_part_number, 32)
    rec.vbios_version = _clip(identity.vbios_version, 32)
    for profile_id in range(MAX_PROFILES):
        profile = model.mig_profile_by_nvml_id(profile_id) if model.mig_capable else None
        out = rec.profiles[profile_id]
        out.valid = int(profile is not None)
        if profile is None:
            continue
        copy, decoder, encoder, jpeg, ofa = _engines(profile, model.compute_slices, model.nvml_architecture)
        out.id, out.slices, out.instances = (
            profile.smi_profile_id,  # as the Python driver: the id `nvidia-smi mig -lgip` prints
            profile.compute_slices,
            profile.max_instances,
        )
        out.sm_count, out.memory_mb = profile.sm_count, profile.memory_bytes // 1024**2
        out.copy, out.decoder, out.encoder, out.jpeg, out.ofa = copy, decoder, encoder, jpeg, ofa
        out.name = _clip(f"MIG {profile.name}", 32)


def _engines(profile: object, model_slices: int, architecture: int) -> tuple[int, int, int, int, int]:
    counts = engine_counts(profile, model_slices, architecture)  # type: ignore[arg-type]
    return counts["copy"], counts["decoder"], counts["encoder"], counts["jpeg"], counts["ofa"]
