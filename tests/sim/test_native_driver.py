"""What is particular to the native driver: its build, its ABI, its agreement with the Python
driver on every field and GPM metric, the seqlock, and compiled programs linking against it.

The NVML behaviours themselves are the probe suite (tests/sim/test_nvml_*.py), which runs on both
drivers.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpulens.sim.clock import ScaledClock
from gpulens.sim.native import build
from gpulens.sim.native.layout import check_library, expected_layout, library_layout
from gpulens.sim.native.publisher import ENV_SHM, Publisher
from gpulens.sim.nvml import all_symbols
from tests.sim.drivers import installed
from tests.sim.static_node import example_node

REPO = Path(__file__).resolve().parents[2]

C_PROGRAM = r"""
#include <stdio.h>
typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned length);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
const char *nvmlErrorString(nvmlReturn_t result);

int main(void) {
    nvmlReturn_t rc = nvmlInit_v2();
    if (rc) { printf("init: %s\n", nvmlErrorString(rc)); return 1; }
    unsigned count = 0;
    nvmlDeviceGetCount_v2(&count);
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t device;
        char name[96];
        nvmlMemory_t memory;
        if (nvmlDeviceGetHandleByIndex_v2(i, &device) || nvmlDeviceGetName(device, name, sizeof name)
            || nvmlDeviceGetMemoryInfo(device, &memory)) return 1;
        printf("%u %s %llu\n", i, name, memory.total >> 20);
    }
    return nvmlShutdown();
}
"""


def test_the_library_reads_the_layout_the_publisher_writes() -> None:
    lib = build.load()
    assert library_layout(lib) == expected_layout()
    check_library(lib)


def test_the_library_has_the_soname_pynvml_loads() -> None:
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    dynamic = subprocess.run([readelf, "-d", str(build.library_path())], capture_output=True, text=True)
    assert "Library soname: [libnvidia-ml.so.1]" in dynamic.stdout


def test_it_exports_exactly_the_nvml_symbols_of_the_python_driver() -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    listing = subprocess.run(
        [nm, "-D", "--defined-only", str(build.library_path())], capture_output=True, text=True
    )
    exported = {
        line.split()[-1] for line in listing.stdout.splitlines() if line.split()[-1].startswith("nvml")
    }
    assert exported == {symbol.name for symbol in all_symbols()}


def test_a_symbol_it_lacks_is_function_not_found_in_pynvml() -> None:
    for _node, _lib in installed(example_node(), "native"):
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetVgpuSchedulerLog(pynvml.nvmlDeviceGetHandleByIndex(0))


def _field_ids() -> list[int]:
    return list(range(pynvml.NVML_FI_MAX + 2))


def _handles() -> list[Any]:
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    parent = handles[0]
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        with contextlib.suppress(pynvml.NVMLError_NotFound):  # an empty slot
            handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot))
    return handles


def _all_fields(driver: str) -> list[tuple[int, int, int, int]]:
    rows = []
    for _node, _lib in installed(example_node(), driver):
        for handle in _handles():
            for scope in (0, 1, 0xFFFFFFFF):
                values = pynvml.nvmlDeviceGetFieldValues(handle, [(f, scope) for f in _field_ids()])
                rows += [(v.fieldId, v.nvmlReturn, v.valueType, v.value.ullVal) for v in values]
    return rows


def test_every_field_value_equals_the_python_drivers() -> None:
    python, native_rows = _all_fields("python"), _all_fields("native")
    assert len(native_rows) == len(python)
    assert [row for row in native_rows if row not in python] == []
    assert native_rows == python


def _all_metrics(driver: str) -> list[tuple[int, int, float | None, bytes | None, bytes | None]]:
    rows = []
    for node, _lib in installed(example_node(), driver):
        handle = pynvml.nvmlDeviceGetHandleByIndex(1)
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(handle, first)
        node.clock.advance(2)
        pynvml.nvmlGpmSampleGet(handle, second)
        ids = list(range(pynvml.NVML_GPM_METRIC_MAX))
        for chunk in (ids[i : i + 98] for i in range(0, len(ids), 98)):
            request = pynvml.c_nvmlGpmMetricsGet_t()
            request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(chunk)
            request.sample1, request.sample2 = first, second
            for i, metric_id in enumerate(chunk):
                request.metrics[i].metricId = metric_id
            pynvml.nvmlGpmMetricsGet(request)
            for i in range(len(chunk)):
                m = request.metrics[i]
                value = None if math.isnan(m.value) else round(m.value, 9)
                info = m.metricInfo
                rows.append((m.metricId, m.nvmlReturn, value, info.shortName, info.unit))
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)
    return rows


def test_every_gpm_metric_equals_the_python_drivers() -> None:
    assert _all_metrics("native") == _all_metrics("python")


def test_gpm_averages_what_was_published_over_the_interval() -> None:
    """The library integrates the published activity: 2 s at 20 % then 2 s at 60 % is 40 %."""
    from gpulens.sim.state import ActivityState

    for node, _lib in installed(example_node(), "native"):
        handle = pynvml.nvmlDeviceGetHandleByIndex(1)
        node.update(1, activity=ActivityState(sm=0.2))
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(handle, first)
        node.clock.advance(2)
        node.update(1, activity=ActivityState(sm=0.6))
        node.clock.advance(2)
        pynvml.nvmlGpmSampleGet(handle, second)
        (sm,) = _metrics(first, second, [pynvml.NVML_GPM_METRIC_SM_UTIL])
        assert sm == pytest.approx(40.0)


def _metrics(first: object, second: object, ids: list[int]) -> list[float]:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = first, second
    for i, metric_id in enumerate(ids):
        request.metrics[i].metricId = metric_id
    pynvml.nvmlGpmMetricsGet(request)
    return [request.metrics[i].value for i in range(len(ids))]


def test_a_hang_lasts_until_its_end_in_simulated_time_on_a_sped_up_clock() -> None:
    clock = ScaledClock(speed=10)
    node = example_node(clock=clock)
    for published, _lib in installed(node, "native"):
        handle = pynvml.nvmlDeviceGetHandleByIndex(3)
        hang_ends = clock.now() + 2.0  # at the earliest: the hang starts when it is published
        published.update(3, hang_seconds=2.0)  # two simulated seconds: 0.2 s of real time
        pynvml.nvmlDeviceGetPowerUsage(handle)
        answered = clock.now()
    # the C driver slept the hang out on the simulated clock (the Python driver's real wait,
    # a tenth of it at 10x, is recorded in tests/sim/test_nvml_quirks.py)
    assert answered >= hang_ends - 0.01


def test_a_reader_never_sees_half_a_publish() -> None:
    """Two states alternate as fast as the publisher can write them (the copy runs without the
    GIL); every read of power and memory temperature in one call comes from one of them, never a
    mix (the seqlock)."""
    pairs = {(100_000, 40), (300_000, 80)}
    for _node, handle in installed(example_node(), "native"):
        seen = _read_while_flipping(handle.publisher, pairs)
    assert seen <= pairs | {(212_000, 35)}  # the example's own state before the first flip


def _read_while_flipping(publisher: Publisher, pairs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    device = pynvml.nvmlDeviceGetHandleByIndex(2)
    stop = threading.Event()
    states = [{"power_mw": p, "memory_temperature_c": t} for p, t in sorted(pairs)]

    def flip() -> None:
        n = 0
        while not stop.is_set() and n < 20_000:
            publisher.node.update(2, **states[n % 2])  # type: ignore[attr-defined]
            publisher.publish()
            n += 1

    writer = threading.Thread(target=flip)
    writer.start()
    seen = set()
    try:
        for _ in range(3000):
            values = pynvml.nvmlDeviceGetFieldValues(
                device, [pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_MEMORY_TEMP]
            )
            seen.add((values[0].value.uiVal, values[1].value.uiVal))
    finally:
        stop.set()
        writer.join()
    return seen


def test_init_without_a_published_node_is_driver_not_loaded_with_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV_SHM}
    env["LD_LIBRARY_PATH"] = str(build.library_dir())
    code = (
        "import pynvml\ntry:\n    pynvml.nvmlInit()\n"
        "except pynvml.NVMLError_DriverNotLoaded:\n    print('not loaded')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "not loaded"
    assert len(done.stderr.strip().splitlines()) == 1
    assert ENV_SHM in done.stderr


def test_another_process_reads_the_published_node() -> None:
    """pynvml in a child process, found through LD_LIBRARY_PATH, sees the node of this one."""
    with Publisher(example_node()) as publisher:
        code = "import pynvml\npynvml.nvmlInit()\n"
        code += "print(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(2)))\n"
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=publisher.environment(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.stdout.strip() == "NVIDIA A100-SXM4-40GB", done.stderr


def test_a_c_program_linking_libnvidia_ml_runs_on_the_published_node(tmp_path: Path) -> None:
    source = tmp_path / "probe.c"
    source.write_text(C_PROGRAM)
    library_dir = build.library_dir()
    cc = build.compiler()
    subprocess.run(
        [cc, str(source), "-o", str(tmp_path / "probe"), f"-L{library_dir}", "-lnvidia-ml"], check=True
    )
    with Publisher(example_node()) as publisher:
        done = subprocess.run(
            [str(tmp_path / "probe")], env=publisher.environment(), capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "0 NVIDIA H100 80GB HBM3 81559",
        "1 NVIDIA H100 80GB HBM3 81559",
        "2 NVIDIA A100-SXM4-40GB 40960",
        "3 NVIDIA A100-SXM4-40GB 40960",
    ]


def test_native_handles_are_distinct_non_null_pointers() -> None:
    for _node, _lib in installed(example_node(), "native"):
        addresses = [ctypes.cast(h, ctypes.c_void_p).value for h in _handles()]
        assert all(addresses) and len(set(addresses)) == len(addresses)


def test_a_publisher_nobody_closed_leaves_no_file_when_its_program_exits(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from gpulens.sim.native.publisher import Publisher\n"
        "from tests.sim.static_node import example_node\n"
        f"publisher = Publisher(example_node(), directory={str(tmp_path)!r}).start()\n"
        "print(publisher.path)\n"
        "sys.exit(0)  # returns without close()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_publisher_removes_the_files_of_publishers_that_were_killed(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "from gpulens.sim.native.publisher import Publisher\n"
        "from tests.sim.static_node import example_node\n"
        f"publisher = Publisher(example_node(), directory={str(tmp_path)!r}).start()\n"
        "print(publisher.path, flush=True)\n"
        "os.kill(os.getpid(), 9)  # nothing runs after SIGKILL: the file stays\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    stale = Path(done.stdout.strip())
    assert stale.exists()
    live = tmp_path / f"gpulens-nvml-{os.getpid()}-other.shm"  # a running publisher's file
    live.write_bytes(b"")
    unrelated = tmp_path / "gpulens-nvml-notes.txt"
    unrelated.write_bytes(b"")
    publisher = Publisher(example_node(), directory=tmp_path)
    try:
        assert not stale.exists()
        assert live.exists() and unrelated.exists() and publisher.path.exists()
        assert publisher.path.name.startswith(f"gpulens-nvml-{os.getpid()}-")
    finally:
        publisher.close()
