"""The machinery every area module of the simulated NVML library shares.

The library is a set of C functions written in Python: each area module declares its functions
with `SymbolTable.define(name, *argtypes)`, the `SimLib` turns every declaration into a
`ctypes.CFUNCTYPE` callback. A callback receives raw C values (ints, addresses) and writes its
results through the pointers it was given, exactly as `libnvidia-ml.so` would, so pynvml's own
wrappers and programs that call the function pointers themselves both run unchanged.

Conventions for implementations (`impl(ctx, *c_args) -> None`):
- raise `NvmlFail(code)` for any NVML_ERROR_*; returning normally means NVML_SUCCESS;
- pointers arrive as ints (`c_void_p`), NULL as None; use the `out_*` helpers to write;
- device handles arrive as ints too; `ctx.device(handle)` turns one into a `Target` and applies
  the per-GPU quirks (GPU_IS_LOST, hangs) in one place.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpulens.sim.state import GpuIdentity, GpuState, MigInstanceState, SimNode

LOG = logging.getLogger("gpulens.sim.nvml")

# argument type shorthands for declarations
PTR = ctypes.c_void_p  # any pointer the callee reads or fills (and device/event-set/sample handles)
DEV = ctypes.c_void_p  # nvmlDevice_t
UINT = ctypes.c_uint
INT = ctypes.c_int
ULL = ctypes.c_ulonglong
STR_IN = ctypes.c_char_p  # input strings only: the callee gets a copy as bytes

MIB = 1024**2
HANDLE_STRIDE = 64  # bytes of handle space per physical GPU: offset 0 = GPU, 1 + slot = MIG device


class NvmlFail(Exception):
    """Raised inside an implementation to return an NVML_ERROR_* code to the caller."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class Symbol:
    """One C function of the simulated library."""

    name: str
    argtypes: tuple[Any, ...]
    impl: Callable[..., Any]
    restype: Any = ctypes.c_int
    needs_init: bool = True  # UNINITIALIZED before nvmlInit / after the last nvmlShutdown
    # trailing arguments a caller may leave out (pynvml's size probe of nvmlDeviceGetRetiredPages_v2
    # passes 4 of 5); the C function would read a garbage register, the simulation reads NULL
    optional_trailing: int = 0


@dataclass
class SymbolTable:
    """The functions one area module contributes; filled at import time, read-only afterwards."""

    symbols: list[Symbol] = field(default_factory=list)

    def define(
        self,
        name: str,
        *argtypes: Any,
        restype: Any = ctypes.c_int,
        needs_init: bool = True,
        optional_trailing: int = 0,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(impl: Callable[..., Any]) -> Callable[..., Any]:
            self.symbols.append(Symbol(name, tuple(argtypes), impl, restype, needs_init, optional_trailing))
            return impl

        return register

    def alias(self, name: str, existing: str) -> None:
        """Another C name for the same function (old and new spellings of one symbol)."""
        original = next(s for s in self.symbols if s.name == existing)
        self.symbols.append(
            Symbol(name, original.argtypes, original.impl, original.restype, original.needs_init)
        )


@dataclass(frozen=True)
class Target:
    """What a device handle points at, at the instant of the call."""

    index: int
    identity: GpuIdentity
    state: GpuState
    mig: MigInstanceState | None = None

    @property
    def is_mig(self) -> bool:
        return self.mig is not None

    @property
    def mig_enabled(self) -> bool:
        """MIG mode is on for the physical GPU (its utilization counters are then unavailable)."""
        return self.state.mig_mode_current == 1

    def require_physical(self) -> None:
        """Device-wide values (temperature, power, clocks, ECC...) are not served on MIG handles."""
        if self.mig is not None:
            raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)


# --- writing through pointers -------------------------------------------------------------------


def _need(ptr: int | None) -> int:
    if not ptr:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return ptr


def out_uint(ptr: int | None, value: int) -> None:
    ctypes.c_uint.from_address(_need(ptr)).value = int(value) & 0xFFFFFFFF


def out_int(ptr: int | None, value: int) -> None:
    ctypes.c_int.from_address(_need(ptr)).value = int(value)


def out_ull(ptr: int | None, value: int) -> None:
    ctypes.c_ulonglong.from_address(_need(ptr)).value = int(value) & 0xFFFFFFFFFFFFFFFF


def out_ptr(ptr: int | None, address: int | None) -> None:
    ctypes.c_void_p.from_address(_need(ptr)).value = address


def out_struct(ptr: int | None, struct_type: type[ctypes.Structure]) -> Any:
    """The caller's struct at `ptr`, to be filled in place."""
    return struct_type.from_address(_need(ptr))


def out_array(ptr: int | None, item_type: Any, count: int) -> Any:
    return (item_type * count).from_address(_need(ptr))


def out_str(ptr: int | None, size: int, text: str) -> None:
    """Copy a NUL-terminated string into the caller's buffer (INSUFFICIENT_SIZE if it does not fit)."""
    raw = text.encode() + b"\0"
    if len(raw) > size:
        raise NvmlFail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(_need(ptr), raw, len(raw))


def in_struct(ptr: int | None, struct_type: type[ctypes.Structure]) -> Any:
    return struct_type.from_address(_need(ptr))


# --- the per-library runtime --------------------------------------------------------------------


class Context:
    """State of one simulated library instance: init refcount, handles, event sets, GPM samples.

    The node is the only source of GPU facts; this object only holds what the *library* keeps
    between calls. All mutation happens under `lock`, never held while a call sleeps.
    """

    def __init__(self, node: SimNode, block: Callable[[float], None] = time.sleep) -> None:
        self.node = node
        self.block = block  # a hang's real wait: time.sleep, or a test's recorder
        self.lock = threading.Lock()
        self.refcount = 0
        self.gpu_count = len(node.identities)
        # real memory backs every handle, so a handle is a valid, unique, non-NULL pointer
        self._handle_block = ctypes.create_string_buffer(max(1, self.gpu_count) * HANDLE_STRIDE)
        self._handle_base = ctypes.addressof(self._handle_block)
        self._objects: dict[int, Any] = {}  # event sets and GPM samples by address
        self._object_memory: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.strings: dict[str, bytes] = {}  # C strings handed out (error strings, GPM metric names)
        self.addresses: dict[str, Any] = {}  # derived from `strings`, cached by the areas that use them
        self.gpm_streaming: set[int] = set()  # GPUs with GPM streaming switched on
        self._targets: dict[int, Target] = {}  # handle -> its Target for the state it was made from

    # handles
    def gpu_handle(self, index: int) -> int:
        return self._handle_base + index * HANDLE_STRIDE

    def mig_handle(self, index: int, slot: int) -> int:
        return self._handle_base + index * HANDLE_STRIDE + 1 + slot

    def decode(self, handle: int | None) -> tuple[int, int | None]:
        """(gpu index, MIG slot or None) of a handle; INVALID_ARGUMENT for anything else."""
        if not handle:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        offset = handle - self._handle_base
        if not 0 <= offset < self.gpu_count * HANDLE_STRIDE:
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        index, rest = divmod(offset, HANDLE_STRIDE)
        return index, (rest - 1 if rest else None)

    def state(self, index: int) -> GpuState:
        """The GPU's state now, after any hang it is in; GPU_IS_LOST if it is lost."""
        state = self.node.gpu_state(index)
        if state.hang_seconds > 0:
            self.block(self.real_seconds(state.hang_seconds))  # ctypes released the GIL for the call
            state = self.node.gpu_state(index)
        if state.lost:
            raise NvmlFail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return state

    def device(self, handle: int | None) -> Target:
        index, slot = self.decode(handle)
        state = self.state(index)
        # a Target is immutable and depends only on (handle, state): the many calls a reader makes
        # on one device within one state quantum share it
        cached = self._targets.get(handle)  # type: ignore[arg-type]
        if cached is not None and cached.state is state:
            return cached
        identity = self.node.identities[index]
        if slot is None:
            target = Target(index, identity, state)
        else:
            mig = next((m for m in state.mig_instances if m.slot == slot), None)
            if mig is None or state.mig_mode_current != 1:
                raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # a stale MIG handle
            target = Target(index, identity, state, mig)
        self._targets[handle] = target  # type: ignore[index]
        return target

    def now(self) -> float:
        return self.node.clock.now()

    def real_seconds(self, simulated: float) -> float:
        """Real time a simulated duration takes: shorter on a sped-up clock (one with `speed`);
        on a real or manual clock one simulated second blocks one real second."""
        speed = getattr(self.node.clock, "speed", 1.0)
        return simulated / speed if isinstance(speed, int | float) and speed > 0 else simulated

    def c_string(self, key: str, text: str) -> int:
        """Address of a NUL-terminated copy of `text` that lives as long as this library."""
        with self.lock:
            raw = self.strings.setdefault(key, text.encode() + b"\0")
        return ctypes.cast(ctypes.c_char_p(raw), ctypes.c_void_p).value or 0

    # opaque objects (event sets, GPM samples): each gets its own few bytes of real memory
    def new_object(self, obj: Any) -> int:
        memory = ctypes.create_string_buffer(8)
        address = ctypes.addressof(memory)
        with self.lock:
            self._object_memory[address] = memory
            self._objects[address] = obj
        return address

    def get_object(self, address: int | None, kind: type) -> Any:
        obj = self._objects.get(address or 0)
        if not isinstance(obj, kind):
            raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def free_object(self, address: int | None, kind: type) -> None:
        with self.lock:
            obj = self._objects.get(address or 0)
            if not isinstance(obj, kind):
                raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            del self._objects[address or 0]
            self._object_memory.pop(address or 0, None)


def fill_array_handshake(
    count_ptr: int | None, buffer_ptr: int | None, items: list[Any], write: Callable[[int, Any], None]
) -> None:
    """NVML's two-call buffer protocol.

    `*count` carries the caller's capacity in and the number of entries out. With no buffer or too
    small a capacity the callee stores the size it needs and returns INSUFFICIENT_SIZE (or
    SUCCESS when there is nothing to return), so pynvml and nvitop can size their arrays.
    """
    capacity = ctypes.c_uint.from_address(_need(count_ptr)).value
    if not items:
        out_uint(count_ptr, 0)
        return
    if not buffer_ptr or capacity < len(items):
        out_uint(count_ptr, len(items))
        raise NvmlFail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, item in enumerate(items):
        write(i, item)
    out_uint(count_ptr, len(items))
