"""The built-in `faults` scenario stepped through on a manual clock: every fault shows up as expected."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.exporter.app import Exporter
from gpulens.exporter.collectors import REGISTRY
from gpulens.exporter.config import ExporterConfig
from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.install import install, uninstall
from gpulens.sim.scenariofile import load_scenario
from tests.exporter.expo import value
from tests.exporter.scenario_run import START


class Stepper:
    def __init__(self, exporter: Exporter, clock: ManualClock) -> None:
        self.exporter = exporter
        self.clock = clock

    def at(self, seconds: float) -> str:
        """Exposition of a sample taken `seconds` after the scenario started."""
        self.clock.advance(START + seconds - self.clock.now())
        return self.exporter.render(self.exporter.sample_once()).text.decode()


@pytest.fixture
def faults(tmp_path: Path) -> Iterator[Stepper]:
    clock = ManualClock(START)
    node = build_node(load_scenario("faults"), seed=0, clock=clock, procfs_root=tmp_path)
    install(node)
    config = ExporterConfig(
        interval=5,
        nvml_timeout=0.5,
        collectors=frozenset(REGISTRY),
        procfs=tmp_path,
        pod_resources_socket=None,
    )
    exporter = Exporter(config, node=node)
    try:
        yield Stepper(exporter, clock)
    finally:
        exporter.close()
        uninstall()


def test_the_fault_timeline(faults: Stepper) -> None:
    text = faults.at(0)  # nvmlInit fails for the first 2 s
    assert value(text, "gpulens_nvml_up") == 0
    assert value(text, "gpulens_gpus") == 0

    text = faults.at(5)  # retried after the backoff: up
    assert value(text, "gpulens_nvml_up") == 1
    assert value(text, "gpulens_gpus") == 8
    assert value(text, "gpu_xid_errors_total", gpu="2", xid="79") is None

    text = faults.at(22)  # Xid 79 then GPU 2 lost; uncorrectable ECC and a pending remap on GPU 4
    assert value(text, "gpu_xid_errors_total", gpu="2", xid="79") == 1
    assert value(text, "gpu_up", gpu="2") == 0
    assert value(text, "gpu_up", gpu="1") == 1
    assert value(text, "gpu_ecc_errors_total", gpu="4", error="uncorrected", scope="volatile") == 1
    assert value(text, "gpu_row_remap_pending", gpu="4") == 1

    assert value(text, "gpu_mps_server_active", gpu="1") == 1
    text = faults.at(38)  # Xid 13 on GPU 3, Xid 31 on MIG instance 3 of GPU 0, thermal slowdown on GPU 5
    assert value(text, "gpu_xid_errors_total", gpu="3", xid="13") == 1
    assert value(text, "gpu_mig_xid_errors_total", gpu="0", gpu_instance="3", xid="31") == 1
    assert value(text, "gpu_xid_errors_total", gpu="0", xid="31") == 1
    assert value(text, "gpu_clock_event_active", gpu="5", reason="hw_thermal_slowdown") == 1
    assert value(text, "gpu_clock_event_active", gpu="6", reason="hw_power_brake_slowdown") == 1
    assert value(text, "gpu_clock_event_active", gpu="4", reason="hw_thermal_slowdown") == 0

    text = faults.at(82)  # the MPS server of GPU 1 is restarting
    assert value(text, "gpu_mps_server_active", gpu="1") == 0

    text = faults.at(100)  # GPU 2 back; MIG instance created at 70 s; PCIe replays and NVLink errors
    assert value(text, "gpu_up", gpu="2") == 1
    assert value(text, "gpu_xid_errors_total", gpu="2", xid="79") == 1  # counters survive the outage
    assert value(text, "gpu_mig_instance_info", gpu="0", gpu_instance="9") == 1
    assert value(text, "gpu_pcie_replays_total", gpu="3") == 12
    assert value(text, "gpu_nvlink_errors_total", gpu="3", kind="crc_flit") == 8  # link 2, summed per GPU
    assert value(text, "gpu_mps_server_active", gpu="1") == 1  # the restarted server has a new pid

    text = faults.at(140)  # row remap failure on GPU 6 at 100 s; the MIG instance destroyed at 130 s
    assert value(text, "gpu_row_remap_failed", gpu="6") == 1
    assert value(text, "gpu_mig_instance_info", gpu="0", gpu_instance="9") is None
