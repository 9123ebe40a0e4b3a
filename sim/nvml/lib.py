"""`SimLib`: the object that stands in for `libnvidia-ml.so.1` as `pynvml.nvmlLib`."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterable
from typing import Any

import pynvml

from gpulens.sim.nvml import (
    events,
    fields,
    gpm,
    health,
    identity,
    memory,
    mig,
    pcie,
    power,
    processes,
    topology,
)
from gpulens.sim.nvml._core import LOG, Context, NvmlFail, Symbol
from gpulens.sim.state import SimNode

# the return codes the guard gives C, typed (pynvml ships no type information)
_SUCCESS: int = pynvml.NVML_SUCCESS
_UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
_UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN

AREAS = (identity, memory, power, pcie, fields, health, events, processes, mig, gpm, topology)


def all_symbols() -> list[Symbol]:
    """Every C function the simulated driver exports (later areas never shadow earlier ones)."""
    seen: dict[str, Symbol] = {}
    for area in AREAS:
        for symbol in area.TABLE.symbols:
            if symbol.name in seen:
                raise RuntimeError(f"NVML symbol {symbol.name} defined twice")
            seen[symbol.name] = symbol
    return list(seen.values())


def _padding(prototype: Any, arity: int) -> Any:
    """A prototype whose Python-side calls fill missing trailing arguments with NULL."""

    class Padded(prototype):
        _flags_ = prototype._flags_
        _argtypes_ = prototype._argtypes_
        _restype_ = prototype._restype_

        def __call__(self, *args: Any) -> Any:
            return super().__call__(*args, *([None] * (arity - len(args))))

    return Padded


class SimLib:
    """A simulated NVML shared library serving one `SimNode`.

    Each exported C function is an attribute holding a `ctypes.CFUNCTYPE` callback, which is what
    `getattr(CDLL(...), name)` would give pynvml. Functions the simulated driver does not have are
    simply absent, so pynvml raises FunctionNotFound as it does with an older driver. The callbacks
    are kept referenced by this object for as long as it lives (a collected callback would crash
    the process when called).
    """

    def __init__(
        self, node: SimNode, *, exclude: Iterable[str] = (), block: Callable[[float], None] = time.sleep
    ) -> None:
        # `block` is how a hanging GPU's call waits, in real seconds (a test records it instead)
        self._ctx = Context(node, block=block)
        self._callbacks: dict[str, Any] = {}
        self.missing_symbols: set[str] = set()  # looked up but absent: what a program wanted
        excluded = set(exclude)
        for symbol in all_symbols():
            if symbol.name not in excluded:
                self._export(symbol)

    def __getattr__(self, name: str) -> Any:
        """Only reached for absent symbols (exported ones are instance attributes)."""
        if name.startswith("nvml"):
            self.__dict__.setdefault("missing_symbols", set()).add(name)
        raise AttributeError(name)

    @property
    def node(self) -> SimNode:
        return self._ctx.node

    @property
    def initialized(self) -> bool:
        return self._ctx.refcount > 0

    def symbol_names(self) -> list[str]:
        return sorted(self._callbacks)

    def _export(self, symbol: Symbol) -> None:
        prototype = ctypes.CFUNCTYPE(symbol.restype, *symbol.argtypes)
        if symbol.optional_trailing:
            prototype = _padding(prototype, len(symbol.argtypes))
        callback = prototype(self._guard(symbol))
        self._callbacks[symbol.name] = callback
        setattr(self, symbol.name, callback)

    def _guard(self, symbol: Symbol) -> Callable[..., Any]:
        """Wrap an implementation so it never raises into C and honours the init refcount."""
        ctx, impl, name = self._ctx, symbol.impl, symbol.name
        if symbol.restype is not ctypes.c_int:
            return lambda *args: impl(ctx, *args)

        def call(*args: Any) -> int:
            if symbol.needs_init and ctx.refcount <= 0:
                return _UNINITIALIZED
            try:
                impl(ctx, *args)
            except NvmlFail as fail:
                return fail.code
            except Exception:  # a bug in the simulator must not take the caller's process down
                LOG.exception("simulated %s failed", name)
                return _UNKNOWN
            return _SUCCESS

        call.__name__ = name
        return call
