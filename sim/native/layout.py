"""The shared-memory layout of the native simulated driver, mirrored from `layout.h` with ctypes.

ctypes lays structures out by the platform's C rules, so these classes and the C structs agree
field for field; `check_library()` compares the sizes and offsets the compiled library reports
(`gpulens_sim_layout`) with these, so a change on one side only fails loudly.
"""

from __future__ import annotations

import ctypes

LAYOUT_MAGIC = b"GLSNVML\0"
LAYOUT_VERSION = 2

MAX_GPUS = 64
MAX_MIG = 8
MAX_NVLINKS = 18
MAX_PROFILES = 18
MAX_RETIRED = 16
N_LOCATIONS = 8
N_REASON_BITS = 16
N_NVLINK_COUNTERS = 5

# activity integrals, in this order (ACT_* in layout.h)
ACTIVITY_FIELDS = (
    "graphics",
    "sm",
    "sm_occupancy",
    "tensor",
    "dram",
    "fp64",
    "fp32",
    "fp16",
    "integer",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
)
N_ACTIVITY = len(ACTIVITY_FIELDS)
UTIL_SAMPLES = 16  # GPU utilization samples kept per GPU (engine.UTILIZATION_SAMPLES)

PROC_KIND = {"compute": 0, "graphics": 1, "mps_server": 2, "mps_client": 3}

u32, i32, u64, i64, f64 = ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int64, ctypes.c_double


def _chars(n: int) -> type[ctypes.Array[ctypes.c_char]]:
    return ctypes.c_char * n


class ShmHeader(ctypes.Structure):
    _fields_ = [
        ("magic", _chars(8)),
        ("layout_version", u32),
        ("header_size", u32),
        ("seq", u64),
        ("capacity", u64),
        ("used_size", u64),
        ("sim_time", f64),
        ("speed", f64),
        ("mono_ns", i64),
        ("events_total", u64),
        ("gpu_offset", u64),
        ("event_offset", u64),
        ("proc_offset", u64),
        ("init_error", i32),
        ("cuda_driver_version", i32),
        ("gpu_count", u32),
        ("event_ring", u32),
        ("proc_count", u32),
        ("proc_capacity", u32),
        ("driver_version", _chars(32)),
        ("nvml_version", _chars(32)),
    ]


class EventRec(ctypes.Structure):
    _fields_ = [
        ("time", f64),
        ("event_type", u64),
        ("data", u64),
        ("gpu", u32),
        ("gpu_instance_id", u32),
        ("compute_instance_id", u32),
        ("pad", u32),
    ]


class ProcRec(ctypes.Structure):
    _fields_ = [
        ("used_memory", u64),
        ("start_time", f64),
        ("pid", u32),
        ("kind", u32),
        ("memory_known", u32),
        ("sm_util", u32),
        ("mem_util", u32),
        ("gpu_instance_id", u32),
        ("compute_instance_id", u32),
        ("pad", u32),
        ("name", _chars(32)),
    ]


class NvLinkRec(ctypes.Structure):
    _fields_ = [
        ("tx_kib", u64),
        ("rx_kib", u64),
        ("errors", u64 * N_NVLINK_COUNTERS),
        ("link", u32),
        ("active", u32),
    ]


class ProfileRec(ctypes.Structure):
    _fields_ = [
        ("memory_mb", u64),
        ("valid", u32),
        ("id", u32),
        ("slices", u32),
        ("instances", u32),
        ("sm_count", u32),
        ("copy", u32),
        ("decoder", u32),
        ("encoder", u32),
        ("jpeg", u32),
        ("ofa", u32),
        ("name", _chars(32)),
    ]


class MigRec(ctypes.Structure):
    _fields_ = [
        ("activity", f64 * N_ACTIVITY),
        ("memory_total", u64),
        ("memory_used", u64),
        ("memory_reserved", u64),
        ("slot", u32),
        ("gpu_instance_id", u32),
        ("compute_instance_id", u32),
        ("placement_start", u32),
        ("sm_count", u32),
        ("slices", u32),
        ("copy", u32),
        ("decoder", u32),
        ("encoder", u32),
        ("jpeg", u32),
        ("ofa", u32),
        ("proc_first", u32),
        ("proc_count", u32),
        ("client_first", u32),
        ("client_count", u32),
        ("pad", u32),
        ("uuid", _chars(80)),
        ("profile", _chars(16)),
    ]


_GPU_U32 = [
    *("index", "minor_number", "pci_domain", "pci_bus", "pci_device", "pci_function"),
    *("pci_ok", "pci_device_id", "architecture"),
]
_GPU_MODEL = [
    *("sm_count", "model_power_limit_mw", "max_sm_clock", "max_mem_clock", "max_pcie_gen"),
    *("max_pcie_width", "model_nvlinks", "ecc_default", "mig_capable", "compute_slices"),
    *("gpm_supported", "has_serial"),
]


class GpuRec(ctypes.Structure):
    _fields_ = [
        ("activity", f64 * N_ACTIVITY),
        ("activity_time", f64),
        ("hang_until", f64),
        ("util_sample_us", u64 * UTIL_SAMPLES),
        ("util_sample_pct", u32 * UTIL_SAMPLES),
        ("util_sample_count", u32),
        ("util_sample_pad", u32),
        *[(name, u32) for name in _GPU_U32],
        ("cc_major", i32),
        ("cc_minor", i32),
        *[(name, u32) for name in _GPU_MODEL],
        ("lost", u32),
        ("util_gpu", u32),
        ("util_mem", u32),
        ("temperature", u32),
        ("memory_temperature", i32),
        ("power_mw", u32),
        ("power_limit_mw", u32),
        ("default_power_limit_mw", u32),
        ("clock_graphics", u32),
        ("clock_sm", u32),
        ("clock_mem", u32),
        ("clock_video", u32),
        ("fan_percent", i32),
        ("pstate", u32),
        ("compute_mode", u32),
        ("persistence", u32),
        ("pcie_tx_kbps", u32),
        ("pcie_rx_kbps", u32),
        ("pcie_replay", u32),
        ("pcie_gen", u32),
        ("pcie_width", u32),
        ("ecc_enabled", i32),
        ("remap_supported", i32),
        ("remap", u32 * 4),
        ("retired_supported", i32),
        ("retired_pending", u32),
        ("retired_count", u32 * 2),
        ("mig_current", i32),
        ("mig_pending", i32),
        ("accounting", u32),
        ("nvlink_count", u32),
        ("mig_count", u32),
        ("proc_first", u32),
        ("proc_count", u32),
        ("client_first", u32),
        ("client_count", u32),
        ("pad", u32),
        ("memory_total", u64),
        ("memory_reserved", u64),
        ("memory_used", u64),
        ("bar1_total", u64),
        ("bar1_used", u64),
        ("energy_mj", u64),
        ("clock_event_reasons", u64),
        ("supported_clock_event_reasons", u64),
        ("clock_reason_ns", u64 * N_REASON_BITS),
        ("pcie_tx_bytes", u64),
        ("pcie_rx_bytes", u64),
        ("ecc_totals", (u64 * 2) * 2),
        ("memory_errors", ((u64 * N_LOCATIONS) * 2) * 2),
        ("retired_address", (u64 * MAX_RETIRED) * 2),
        ("retired_time_us", (u64 * MAX_RETIRED) * 2),
        ("nvlinks", NvLinkRec * MAX_NVLINKS),
        ("mig", MigRec * MAX_MIG),
        ("profiles", ProfileRec * MAX_PROFILES),
        ("name", _chars(96)),
        ("uuid", _chars(80)),
        ("serial", _chars(32)),
        ("pci_bus_id", _chars(32)),
        ("pci_bus_id_legacy", _chars(16)),
        ("board_part_number", _chars(32)),
        ("vbios_version", _chars(32)),
    ]


def expected_layout() -> list[int]:
    """What `gpulens_sim_layout` must report, in its order."""
    return [
        LAYOUT_VERSION,
        ctypes.sizeof(ShmHeader),
        ctypes.sizeof(GpuRec),
        ctypes.sizeof(MigRec),
        ctypes.sizeof(ProcRec),
        ctypes.sizeof(EventRec),
        ctypes.sizeof(NvLinkRec),
        ctypes.sizeof(ProfileRec),
        ShmHeader.used_size.offset,
        ShmHeader.driver_version.offset,
        GpuRec.lost.offset,
        GpuRec.memory_total.offset,
        GpuRec.nvlinks.offset,
        GpuRec.mig.offset,
        GpuRec.profiles.offset,
        GpuRec.name.offset,
        MigRec.memory_total.offset,
        MigRec.uuid.offset,
        ProcRec.pid.offset,
        ProcRec.name.offset,
    ]


def library_layout(lib: ctypes.CDLL) -> list[int]:
    """The sizes and offsets the compiled library was built with."""
    function = lib.gpulens_sim_layout
    function.restype = ctypes.c_uint
    function.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint]
    count = function(None, 0)
    values = (ctypes.c_uint64 * count)()
    function(values, count)
    return list(values)


def check_library(lib: ctypes.CDLL) -> None:
    """Raise if the library reads another layout than this module writes."""
    built, here = library_layout(lib), expected_layout()
    if built != here:
        raise RuntimeError(f"native simulated NVML library layout {built} differs from layout.py {here}")
