"""DCGM_EXP_GPU_HEALTH_STATUS under `--compat dcgm`: dcgm-exporter's per-GPU health family, from the
same verdicts as the native gpu_health_status."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from prometheus_client.core import Metric

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.install import install, uninstall
from gpulens.sim.scenariofile import load_scenario
from tests.dcgm.conftest import START, STEP, Sim, family, one, series

REPEAT = 180.0
WATCHES = {"PCIE", "NVLINK", "MEM", "THERMAL", "POWER", "DRIVER"}


def at_thermal_slowdown(sim: Sim, compat: str) -> list[Metric]:
    """Families 35 s into the faults scenario: GPU 5 in thermal slowdown, GPU 6 power-braked,
    GPU 4 with an uncorrectable ECC error and a pending row remap."""
    exporter = sim.exporter(compat=compat)
    try:
        first = START + 35.0 - STEP
        repeats = max(0.0, sim.clock.now() - first) // REPEAT + (sim.clock.now() > first)
        sim.clock.set(first + repeats * REPEAT)  # the timeline repeats every 3 minutes
        exporter.sample_once()
        sim.clock.advance(STEP)
        return exporter.families(exporter.sample_once())
    finally:
        exporter.close()


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sim]:
    """The faults scenario, started past its first 2 s (when nvmlInit fails: driver not loaded)."""
    monkeypatch.setenv("NODE_NAME", "gpu-faulty-01")
    dirs = {key: tmp_path / key for key in ("proc", "pods", "mapping")}
    for path in dirs.values():
        path.mkdir()
    clock = ManualClock(START)
    node = build_node(
        load_scenario("faults"),
        seed=0,
        clock=clock,
        procfs_root=dirs["proc"],
        pods_root=dirs["pods"],
        job_mapping_dir=dirs["mapping"],
    )
    clock.advance(3.0)
    install(node)
    pynvml.nvmlInit()
    try:
        yield Sim(node, clock, dirs)
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
        uninstall()


def test_every_gpu_has_one_series_per_watch_gpulens_judges(faults: Sim) -> None:
    families = at_thermal_slowdown(faults, "dcgm")
    rows = series(families, "DCGM_EXP_GPU_HEALTH_STATUS", gpu="0")
    assert {labels["health_watch"] for labels, _ in rows} == WATCHES
    assert all(value == 0 and labels["health_error_code"] == "DCGM_FR_OK" for labels, value in rows)
    labels = rows[0][0]
    assert labels["Hostname"] == "gpu-faulty-01"
    assert {"UUID", "pci_bus_id", "device", "modelName", "DCGM_FI_DRIVER_VERSION"} <= set(labels)


def test_values_are_dcgms_health_results_with_its_reason_codes(faults: Sim) -> None:
    families = at_thermal_slowdown(faults, "dcgm")
    thermal = series(families, "DCGM_EXP_GPU_HEALTH_STATUS", gpu="5", health_watch="THERMAL")
    assert [(labels["health_error_code"], value) for labels, value in thermal] == [
        ("DCGM_FR_CLOCK_THROTTLE_THERMAL", 10.0)
    ]
    memory = series(families, "DCGM_EXP_GPU_HEALTH_STATUS", gpu="4", health_watch="MEM")
    assert [(labels["health_error_code"], value) for labels, value in memory] == [
        ("DCGM_FR_VOLATILE_DBE_DETECTED", 20.0)
    ]


def test_it_agrees_with_the_native_family(faults: Sim) -> None:
    families = at_thermal_slowdown(faults, "dcgm")
    systems = {"PCIE": "pcie", "NVLINK": "nvlink", "MEM": "memory", "THERMAL": "thermal", "POWER": "power"}
    systems["DRIVER"] = "driver"
    for labels, value in series(families, "DCGM_EXP_GPU_HEALTH_STATUS"):
        native = one(families, "gpu_health_status", gpu=labels["gpu"], system=systems[labels["health_watch"]])
        assert native is not None and value == native * 10, labels
    assert one(families, "gpu_health_status", gpu="6", system="power") == 1


def test_its_type_follows_the_counters_file_of_the_version(faults: Sim) -> None:
    assert family(at_thermal_slowdown(faults, "dcgm=4.8.2"), "DCGM_EXP_GPU_HEALTH_STATUS").type == "counter"  # type: ignore[union-attr]
    assert family(at_thermal_slowdown(faults, "dcgm=4.8.3"), "DCGM_EXP_GPU_HEALTH_STATUS").type == "gauge"  # type: ignore[union-attr]


def test_releases_before_the_family_existed_do_not_get_it(faults: Sim) -> None:
    assert family(at_thermal_slowdown(faults, "dcgm=3.3.9"), "DCGM_EXP_GPU_HEALTH_STATUS") is None
