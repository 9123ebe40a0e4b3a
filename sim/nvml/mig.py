"""MIG: mode, MIG device handles and their ids, attributes, GPU-instance profiles."""

from __future__ import annotations

import ctypes

import pynvml

from gpulens.catalog import ARCH_HOPPER, MigProfile
from gpulens.sim.nvml._core import (
    DEV,
    MIB,
    PTR,
    UINT,
    Context,
    NvmlFail,
    SymbolTable,
    Target,
    in_struct,
    out_ptr,
    out_struct,
    out_uint,
)
from gpulens.sim.state import MigInstanceState

TABLE = SymbolTable()


@TABLE.define("nvmlDeviceGetMigMode", DEV, PTR, PTR)
def mig_mode(ctx: Context, handle: int, current: int, pending: int) -> None:
    target = ctx.device(handle)
    state = target.state
    if target.is_mig or state.mig_mode_current is None:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    out_uint(current, state.mig_mode_current)
    out_uint(pending, state.mig_mode_current if state.mig_mode_pending is None else state.mig_mode_pending)


def mig_capable(target: Target) -> bool:
    """The physical GPU has a MIG mode at all (nvmlDeviceGetMigMode answers), on or off."""
    return not target.is_mig and target.state.mig_mode_current is not None


def max_mig_devices(target: Target) -> int:
    """0 when MIG is unsupported or off (the real call does not fail then)."""
    if target.is_mig or not target.mig_enabled:
        return 0
    return target.identity.model.compute_slices


@TABLE.define("nvmlDeviceGetMaxMigDeviceCount", DEV, PTR)
def max_mig_device_count(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, max_mig_devices(ctx.device(handle)))


@TABLE.define("nvmlDeviceGetMigDeviceHandleByIndex", DEV, UINT, PTR)
def mig_device_handle_by_index(ctx: Context, handle: int, slot: int, out: int) -> None:
    """NOT_FOUND for an empty slot: callers iterate 0..max-1 and skip the holes. With MIG off on a
    MIG-capable GPU every slot is empty: NOT_FOUND too (a real H200, driver 580), not NOT_SUPPORTED."""
    target = ctx.device(handle)
    if target.is_mig:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if not mig_capable(target):
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if not target.mig_enabled:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)
    if slot >= max_mig_devices(target):
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if not any(m.slot == slot for m in target.state.mig_instances):
        raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)
    out_ptr(out, ctx.mig_handle(target.index, slot))


@TABLE.define("nvmlDeviceIsMigDeviceHandle", DEV, PTR)
def is_mig_device_handle(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, int(ctx.device(handle).is_mig))


def mig_only(ctx: Context, handle: int) -> Target:
    target = ctx.device(handle)
    if target.mig is None:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return target


@TABLE.define("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", DEV, PTR)
def parent_handle(ctx: Context, handle: int, out: int) -> None:
    out_ptr(out, ctx.gpu_handle(mig_only(ctx, handle).index))


def instance_of(ctx: Context, handle: int) -> MigInstanceState:
    """The MIG instance behind a handle for the GPU/compute-instance id calls. A full-GPU handle of
    a MIG-capable GPU is an invalid argument to them (a real H200, MIG off, driver 580, raises
    INVALID_ARGUMENT, where the reference says NOT_SUPPORTED); a GPU without MIG stays NOT_SUPPORTED."""
    target = ctx.device(handle)
    if target.mig is not None:
        return target.mig
    if mig_capable(target):
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)


@TABLE.define("nvmlDeviceGetGpuInstanceId", DEV, PTR)
def gpu_instance_id(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, instance_of(ctx, handle).gpu_instance_id)


@TABLE.define("nvmlDeviceGetComputeInstanceId", DEV, PTR)
def compute_instance_id(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, instance_of(ctx, handle).compute_instance_id)


def engine_counts(profile: MigProfile, model_slices: int, architecture: int) -> dict[str, int]:
    """Copy/decoder/encoder/JPEG/OFA engines of a profile (NVIDIA MIG user guide tables).

    Hopper has one NVDEC and one NVJPG per compute slice (7 each), so every profile gets as many as
    it has slices, and the one OFA goes with the full GPU or +me (a real H200's 1g.18gb: one decoder,
    one JPEG, no OFA). Ampere has 5 NVDECs and one NVJPG/OFA: small profiles share them unevenly.
    Blackwell keeps Ampere's table until a real record says otherwise.
    """
    full = profile.compute_slices == model_slices
    media = 1 if full or profile.media_extensions else 0
    if architecture == ARCH_HOPPER:
        return {
            "copy": profile.copy_engines,
            "decoder": profile.compute_slices,
            "encoder": 0,
            "jpeg": profile.compute_slices,
            "ofa": media,
        }
    decoders = {1: 0, 2: 1, 3: 2, 4: 2}.get(profile.compute_slices, 5 if full else 4)
    if profile.media_extensions:
        decoders = 1
    return {
        "copy": profile.copy_engines,
        "decoder": decoders if model_slices != 4 else profile.compute_slices,
        "encoder": 0,
        "jpeg": media,
        "ofa": media,
    }


@TABLE.define("nvmlDeviceGetAttributes_v2", DEV, PTR)
def attributes(ctx: Context, handle: int, out: int) -> None:
    target = mig_only(ctx, handle)
    mig = target.mig
    assert mig is not None
    model = target.identity.model
    engines = engine_counts(mig.profile, model.compute_slices, model.nvml_architecture)
    attrs = out_struct(out, pynvml.c_nvmlDeviceAttributes)
    attrs.multiprocessorCount = mig.profile.sm_count
    attrs.sharedCopyEngineCount = engines["copy"]
    attrs.sharedDecoderCount = engines["decoder"]
    attrs.sharedEncoderCount = engines["encoder"]
    attrs.sharedJpegCount = engines["jpeg"]
    attrs.sharedOfaCount = engines["ofa"]
    attrs.gpuInstanceSliceCount = mig.profile.compute_slices
    attrs.computeInstanceSliceCount = mig.profile.compute_slices
    attrs.memorySizeMB = mig.memory_total_bytes // MIB


def _profile(ctx: Context, handle: int, profile_id: int) -> tuple[Target, MigProfile]:
    # MIG mode need not be on: a MIG-capable GPU describes its profiles with MIG off (a real H200,
    # driver 580), which is how tools size instances before enabling MIG
    target = ctx.device(handle)
    if not mig_capable(target):
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if profile_id >= pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    profile = target.identity.model.mig_profile_by_nvml_id(profile_id)
    if profile is None:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return target, profile


def _fill_profile(info: ctypes.Structure, target: Target, profile: MigProfile) -> None:
    model = target.identity.model
    engines = engine_counts(profile, model.compute_slices, model.nvml_architecture)
    info.id = profile.smi_profile_id  # the profile's id on the device (`nvidia-smi mig -lgip`), not
    # the NVML_GPU_INSTANCE_PROFILE_* argument: a real H200 answers 19 for 1_SLICE (0)
    info.isP2pSupported = 0
    info.sliceCount = profile.compute_slices
    info.instanceCount = profile.max_instances
    info.multiprocessorCount = profile.sm_count
    info.copyEngineCount = engines["copy"]
    info.decoderCount = engines["decoder"]
    info.encoderCount = engines["encoder"]
    info.jpegCount = engines["jpeg"]
    info.ofaCount = engines["ofa"]
    info.memorySizeMB = profile.memory_bytes // MIB


@TABLE.define("nvmlDeviceGetGpuInstanceProfileInfo", DEV, UINT, PTR)
def gpu_instance_profile_info(ctx: Context, handle: int, profile_id: int, out: int) -> None:
    target, profile = _profile(ctx, handle, profile_id)
    _fill_profile(out_struct(out, pynvml.c_nvmlGpuInstanceProfileInfo_t), target, profile)


@TABLE.define("nvmlDeviceGetGpuInstanceProfileInfoV", DEV, UINT, PTR)
def gpu_instance_profile_info_v(ctx: Context, handle: int, profile_id: int, out: int) -> None:
    if (
        in_struct(out, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t).version
        != pynvml.nvmlGpuInstanceProfileInfo_v2
    ):
        raise NvmlFail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    target, profile = _profile(ctx, handle, profile_id)
    info = out_struct(out, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    _fill_profile(info, target, profile)
    info.version = 0  # a real H200 (driver 580) hands the struct back with its version cleared
    info.name = f"MIG {profile.name}".encode()
