"""Put a simulated NVML library where pynvml looks for the real one.

pynvml loads `libnvidia-ml.so.1` lazily, on the first `nvmlInit`, only if `pynvml.nvmlLib` is
still None; it then looks every C function up on that object (and caches the lookups). Setting
`nvmlLib` to a `SimLib` is therefore all it takes for pynvml's wrappers, and for programs that
fetch function pointers through pynvml (nvitop), to run against the simulated node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import pynvml

from gpulens.sim.nvml import SimLib
from gpulens.sim.state import SimNode


def _swap(lib: SimLib | None) -> None:
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0  # pynvml's own count of nvmlInit calls, for the new library


def install(
    node: SimNode, *, exclude: Iterable[str] = (), block: Callable[[float], None] = time.sleep
) -> SimLib:
    """Serve `node` to every pynvml user in this process; replaces any library installed before.

    `exclude` names C symbols to leave out, to play an older driver (pynvml then raises
    FunctionNotFound for them); `block` is how a hanging GPU's call waits (see `SimLib`).
    """
    lib = SimLib(node, exclude=exclude, block=block)
    _swap(lib)
    return lib


def uninstall() -> None:
    """Forget the simulated library; the next nvmlInit would load the real one (if any)."""
    _swap(None)


@contextmanager
def simulated(
    node: SimNode, *, exclude: Iterable[str] = (), block: Callable[[float], None] = time.sleep
) -> Iterator[SimLib]:
    """`with simulated(node) as lib:` — install for the duration of the block."""
    lib = install(node, exclude=exclude, block=block)
    try:
        yield lib
    finally:
        uninstall()
