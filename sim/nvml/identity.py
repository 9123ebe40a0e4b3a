"""Init/shutdown, system versions, device enumeration and identity (name, UUID, serial, PCI)."""

from __future__ import annotations

import ctypes

import pynvml

from gpulens.sim.nvml._core import (
    DEV,
    INT,
    PTR,
    STR_IN,
    UINT,
    Context,
    NvmlFail,
    SymbolTable,
    Target,
    out_int,
    out_ptr,
    out_str,
    out_struct,
    out_uint,
)
from gpulens.sim.pci import parse_bus_id

TABLE = SymbolTable()

ERROR_STRINGS = {
    pynvml.NVML_SUCCESS: "Success",
    pynvml.NVML_ERROR_TIMEOUT: "Timeout",
    **pynvml.NVMLError._errcode_to_string,
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    pynvml.NVML_ERROR_NO_DATA: "No data",
    pynvml.NVML_ERROR_IN_USE: "In use by another client",
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
}


@TABLE.define("nvmlInitWithFlags", UINT, needs_init=False)
def init_with_flags(ctx: Context, flags: int) -> None:
    code = ctx.node.init_error()
    if code:
        raise NvmlFail(code)
    with ctx.lock:
        ctx.refcount += 1


@TABLE.define("nvmlInit_v2", needs_init=False)
def init_v2(ctx: Context) -> None:
    init_with_flags(ctx, 0)


@TABLE.define("nvmlShutdown", needs_init=False)
def shutdown(ctx: Context) -> None:
    with ctx.lock:
        if ctx.refcount <= 0:
            raise NvmlFail(pynvml.NVML_ERROR_UNINITIALIZED)
        ctx.refcount -= 1


@TABLE.define("nvmlErrorString", INT, restype=ctypes.c_void_p, needs_init=False)
def error_string(ctx: Context, code: int) -> int:
    """Returns a `const char*` (pynvml sets `restype = c_char_p` on the pointer before calling)."""
    text = ERROR_STRINGS.get(code, "Unknown Error")
    return ctx.c_string(f"error:{code}", text)


@TABLE.define("nvmlSystemGetDriverVersion", PTR, UINT)
def driver_version(ctx: Context, buf: int, size: int) -> None:
    out_str(buf, size, ctx.node.driver.driver_version)


@TABLE.define("nvmlSystemGetNVMLVersion", PTR, UINT)
def nvml_version(ctx: Context, buf: int, size: int) -> None:
    out_str(buf, size, ctx.node.driver.nvml_version)


@TABLE.define("nvmlSystemGetCudaDriverVersion", PTR)
def cuda_driver_version(ctx: Context, out: int) -> None:
    out_int(out, ctx.node.driver.cuda_driver_version)


TABLE.alias("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion")


@TABLE.define("nvmlSystemGetProcessName", UINT, PTR, UINT)
def process_name(ctx: Context, pid: int, buf: int, size: int) -> None:
    """The name of a process that has a context on some simulated GPU (NOT_FOUND otherwise)."""
    for index in range(ctx.gpu_count):
        state = ctx.node.gpu_state(index)
        groups = [state.processes, state.mps_clients]
        groups += [m.processes for m in state.mig_instances] + [m.mps_clients for m in state.mig_instances]
        for group in groups:
            for proc in group:
                if proc.pid == pid:
                    out_str(buf, size, proc.name)
                    return
    raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)


@TABLE.define("nvmlDeviceGetCount_v2", PTR)
def device_count(ctx: Context, out: int) -> None:
    out_uint(out, ctx.gpu_count)


@TABLE.define("nvmlDeviceGetHandleByIndex_v2", UINT, PTR)
def handle_by_index(ctx: Context, index: int, out: int) -> None:
    if index >= ctx.gpu_count:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    ctx.state(index)  # a lost GPU cannot even be opened
    out_ptr(out, ctx.gpu_handle(index))


@TABLE.define("nvmlDeviceGetHandleByUUID", STR_IN, PTR)
def handle_by_uuid(ctx: Context, uuid: bytes | None, out: int) -> None:
    if not uuid:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    wanted = uuid.decode(errors="replace")
    for identity in ctx.node.identities:
        if identity.uuid == wanted:
            ctx.state(identity.index)
            out_ptr(out, ctx.gpu_handle(identity.index))
            return
    for identity in ctx.node.identities:  # MIG UUIDs, only while the instance exists
        state = ctx.node.gpu_state(identity.index)
        for instance in state.mig_instances if state.mig_mode_current == 1 else ():
            if instance.uuid == wanted:
                ctx.state(identity.index)
                out_ptr(out, ctx.mig_handle(identity.index, instance.slot))
                return
    raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)


@TABLE.define("nvmlDeviceGetHandleByPciBusId_v2", STR_IN, PTR)
def handle_by_pci_bus_id(ctx: Context, bus_id: bytes | None, out: int) -> None:
    wanted = parse_bus_id((bus_id or b"").decode(errors="replace"))
    if wanted is None:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    for identity in ctx.node.identities:
        if parse_bus_id(identity.pci_bus_id) == wanted:
            ctx.state(identity.index)
            out_ptr(out, ctx.gpu_handle(identity.index))
            return
    raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)


@TABLE.define("nvmlDeviceGetHandleBySerial", STR_IN, PTR)
def handle_by_serial(ctx: Context, serial: bytes | None, out: int) -> None:
    wanted = (serial or b"").decode(errors="replace")
    for identity in ctx.node.identities:
        if identity.serial and identity.serial == wanted:
            ctx.state(identity.index)
            out_ptr(out, ctx.gpu_handle(identity.index))
            return
    raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)


def device_name(target: Target) -> str:
    name = target.identity.model.nvml_name
    return f"{name} MIG {target.mig.profile.name}" if target.mig else name


@TABLE.define("nvmlDeviceGetName", DEV, PTR, UINT)
def name(ctx: Context, handle: int, buf: int, size: int) -> None:
    out_str(buf, size, device_name(ctx.device(handle)))


@TABLE.define("nvmlDeviceGetUUID", DEV, PTR, UINT)
def uuid(ctx: Context, handle: int, buf: int, size: int) -> None:
    target = ctx.device(handle)
    out_str(buf, size, target.mig.uuid if target.mig else target.identity.uuid)


@TABLE.define("nvmlDeviceGetSerial", DEV, PTR, UINT)
def serial(ctx: Context, handle: int, buf: int, size: int) -> None:
    target = ctx.device(handle)
    if target.identity.serial is None:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    out_str(buf, size, target.identity.serial)


@TABLE.define("nvmlDeviceGetBoardPartNumber", DEV, PTR, UINT)
def board_part_number(ctx: Context, handle: int, buf: int, size: int) -> None:
    target = ctx.device(handle)
    if not target.identity.board_part_number:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    out_str(buf, size, target.identity.board_part_number)


@TABLE.define("nvmlDeviceGetVbiosVersion", DEV, PTR, UINT)
def vbios_version(ctx: Context, handle: int, buf: int, size: int) -> None:
    target = ctx.device(handle)
    target.require_physical()
    out_str(buf, size, target.identity.vbios_version or "96.00.00.00.00")


@TABLE.define("nvmlDeviceGetIndex", DEV, PTR)
def index(ctx: Context, handle: int, out: int) -> None:
    target = ctx.device(handle)
    target.require_physical()
    out_uint(out, target.index)


@TABLE.define("nvmlDeviceGetMinorNumber", DEV, PTR)
def minor_number(ctx: Context, handle: int, out: int) -> None:
    target = ctx.device(handle)
    target.require_physical()
    out_uint(out, target.identity.minor_number)


@TABLE.define("nvmlDeviceGetPciInfo_v3", DEV, PTR)
def pci_info(ctx: Context, handle: int, out: int) -> None:
    """MIG devices report their parent's PCI location."""
    target = ctx.device(handle)
    address = parse_bus_id(target.identity.pci_bus_id)
    if address is None:
        raise NvmlFail(pynvml.NVML_ERROR_UNKNOWN)
    info = out_struct(out, pynvml.nvmlPciInfo_t)
    ctypes.memset(out, 0, ctypes.sizeof(pynvml.nvmlPciInfo_t))
    legacy = address.legacy_bus_id
    # write the raw fields (the _PrintableStructure setters would re-encode str)
    ctypes.memmove(out + type(info).busIdLegacy.offset, legacy.encode()[:15], min(len(legacy), 15))
    busid = address.bus_id
    ctypes.memmove(out + type(info).busId.offset, busid.encode()[:31], min(len(busid), 31))
    info.domain, info.bus, info.device = address.domain, address.bus, address.device
    info.pciDeviceId = target.identity.model.pci_device_id
    info.pciSubSystemId = (target.identity.model.pci_device_id & 0xFFFF0000) | 0x10DE


@TABLE.define("nvmlDeviceGetArchitecture", DEV, PTR)
def architecture(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, ctx.device(handle).identity.model.nvml_architecture)


@TABLE.define("nvmlDeviceGetCudaComputeCapability", DEV, PTR, PTR)
def cuda_compute_capability(ctx: Context, handle: int, major: int, minor: int) -> None:
    cc = ctx.device(handle).identity.model.cuda_compute_capability
    out_int(major, cc[0])
    out_int(minor, cc[1])


@TABLE.define("nvmlDeviceGetBrand", DEV, PTR)
def brand(ctx: Context, handle: int, out: int) -> None:
    ctx.device(handle)
    out_uint(out, pynvml.NVML_BRAND_NVIDIA)


@TABLE.define("nvmlDeviceGetNumGpuCores", DEV, PTR)
def num_gpu_cores(ctx: Context, handle: int, out: int) -> None:
    target = ctx.device(handle)
    target.require_physical()
    cores_per_sm = 128 if target.identity.model.nvml_architecture >= 9 else 64
    out_uint(out, target.identity.model.sm_count * cores_per_sm)


@TABLE.define("nvmlDeviceGetDriverModel_v2", DEV, PTR, PTR)
def driver_model(ctx: Context, handle: int, current: int, pending: int) -> None:
    """WDDM/TCC driver models exist on Windows only: the Linux driver has the symbol, answers NS."""
    ctx.device(handle)
    raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)


TABLE.alias("nvmlDeviceGetDriverModel", "nvmlDeviceGetDriverModel_v2")
