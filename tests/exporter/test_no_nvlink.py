"""The pcie_nvlink collector on a GPU whose NVLink the driver does not expose (a VM, a PCIe card)."""

from __future__ import annotations

from pathlib import Path

from tests.exporter.expo import samples, value
from tests.exporter.scenario_run import scenario_exposition

SCENARIO = """
name: h200-vm
description: one H200 passed through to a VM without NVLink, as in the 2026-12-04 conformance run
gpus:
  - model: H200
    nvlink: false
processes:
  - pid: 4242
    gpu: 0
    workload: {pattern: constant, sm: 0.9, memory: 2GiB}
"""

NVLINK_FAMILIES = (
    "gpu_nvlink_link_up",
    "gpu_nvlink_tx_bytes_total",
    "gpu_nvlink_rx_bytes_total",
    "gpu_nvlink_errors_total",
)


def _exposition(tmp_path: Path) -> str:
    scenario = tmp_path / "h200-vm.yaml"
    scenario.write_text(SCENARIO)
    return scenario_exposition(str(scenario), tmp_path / "run")


def test_no_nvlink_families_and_the_collector_still_succeeds(tmp_path: Path) -> None:
    text = _exposition(tmp_path)
    assert [name for name in NVLINK_FAMILIES if samples(text, name)] == []
    assert value(text, "gpulens_collector_success", collector="pcie_nvlink") == 1.0
    assert value(text, "gpu_pcie_link_generation", gpu="0") == 5.0
