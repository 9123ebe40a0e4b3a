"""The two simulated NVML drivers the probe suite runs on, behind one test-facing interface.

- `python`: `SimLib`, ctypes callbacks in this process, installed as `pynvml.nvmlLib`.
- `native`: the C library (`gpulens.sim.native`), which pynvml loads by its usual name; the
  node is published into shared memory. The node a test gets is wrapped so that every change it
  makes (a method call, an attribute set, the clock moving) is published before the test's next
  NVML call, as a running publisher would do within its quantum.

`installed(node, driver)` yields `(node, handle)`; `handle.initialized` tells whether the
library's init refcount is above zero, for either driver.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from typing import Any

import pynvml

from gpulens.sim.install import simulated
from gpulens.sim.native import build
from gpulens.sim.native.publisher import ENV_SHM, Publisher

DRIVERS = ("python", "native")


class _Publishing:
    """A proxy that publishes after every call or attribute change made through it."""

    def __init__(self, target: Any, publisher: Publisher) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_publisher", publisher)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name == "clock":
            return _Publishing(value, self._publisher)
        if not callable(value) or name.startswith("_"):
            return value
        publisher = self._publisher

        def call(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            publisher.publish(activity=True)
            return result

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)
        self._publisher.publish(activity=True)


class NativeHandle:
    """What a test holds of the native library."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self._refcount = build.load().gpulens_sim_refcount

    @property
    def initialized(self) -> bool:
        count: int = self._refcount()
        return count > 0


def _reset_pynvml() -> None:
    with pynvml.libLoadLock:
        pynvml.nvmlLib = None  # the next nvmlInit loads "libnvidia-ml.so.1" as on a GPU node
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def native(node: Any) -> Iterator[tuple[Any, NativeHandle]]:
    """`node` published for the native library, which pynvml in this process will load."""
    build.load()  # loaded by path first, so pynvml's dlopen by soname finds this one
    with Publisher(node, activity_quantum=0) as publisher:
        previous = os.environ.get(ENV_SHM)
        os.environ[ENV_SHM] = str(publisher.path)
        _reset_pynvml()
        try:
            yield _Publishing(node, publisher), NativeHandle(publisher)
        finally:
            _reset_pynvml()
            if previous is None:
                os.environ.pop(ENV_SHM, None)
            else:
                os.environ[ENV_SHM] = previous


def installed(node: Any, driver: str = "python") -> Iterator[tuple[Any, Any]]:
    """`node` served by `driver` and initialised; shut down and removed afterwards."""
    if driver == "native":
        for pair in native(node):
            pynvml.nvmlInit()
            yield pair
            _, handle = pair
            while handle.initialized:
                pynvml.nvmlShutdown()
        return
    with simulated(node) as lib:
        pynvml.nvmlInit()
        yield node, lib
        while lib.initialized:
            pynvml.nvmlShutdown()


def native_library() -> ctypes.CDLL:
    return build.load()
