"""`--profiling auto|dcgm|gpm|off`: which source feeds the activity ratios, per GPU.

Also the issue's acceptance: GPM values on simulated Hopper GPUs follow the scenario, and the A100
(no GPM) gets the same families through the simulated DCGM.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.core import Metric

from gpulens.exporter.backends.gpm import GpmProfiler
from gpulens.exporter.backends.profiling_source import make_profiler_factory
from gpulens.exporter.config import ExporterConfig
from gpulens.sim.dcgm import BINDINGS_DIR, hostengine
from gpulens.sim.dcgm.hostengine import EngineOptions
from tests.dcgm.conftest import STEP, Sim, one, series, two_samples


def sources(families: list[Metric]) -> dict[str, str]:
    return {
        labels["gpu"]: labels["source"] for labels, _ in series(families, "gpulens_profiling_source_info")
    }


def test_a100_has_no_gpm_families_without_dcgm(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("k8s-a100-mixed")
    families = two_samples(sim.exporter(), sim)
    assert sources(families) == {"0": "nvml", "1": "nvml", "2": "nvml", "3": "nvml"}
    assert series(families, "gpu_sm_active_ratio") == []
    assert series(families, "gpu_mig_sm_active_ratio") == []


def test_a100_gets_profiling_families_through_the_simulated_dcgm(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("k8s-a100-mixed")
    families = two_samples(sim.exporter(profiling="dcgm"), sim)
    assert sources(families) == {"0": "dcgm", "1": "dcgm", "2": "dcgm", "3": "dcgm"}
    assert one(families, "gpu_sm_active_ratio", gpu="2") == pytest.approx(sim.activity(2).sm, abs=1e-9)
    assert one(families, "gpu_tensor_active_ratio", gpu="2") == pytest.approx(
        sim.activity(2).tensor, abs=1e-9
    )
    mig = {labels["gpu_instance"]: v for labels, v in series(families, "gpu_mig_sm_active_ratio", gpu="1")}
    assert set(mig) == {"3", "4", "11", "12", "13"}
    assert mig["4"] == pytest.approx(sim.activity(1, 4).sm, abs=1e-9)


def test_auto_uses_dcgm_when_the_bindings_are_given(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("k8s-a100-mixed")
    families = two_samples(sim.exporter(profiling="auto", dcgm_bindings=BINDINGS_DIR), sim)
    assert set(sources(families).values()) == {"dcgm"}


def test_auto_prefers_dcgm_over_gpm_on_hopper(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("dgx-h100")
    families = two_samples(sim.exporter(profiling="auto", dcgm_bindings=BINDINGS_DIR), sim)
    assert set(sources(families).values()) == {"dcgm"}


def test_auto_falls_back_to_gpm_when_the_profiling_module_is_not_loaded(
    simulate: Callable[[str], Sim], caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulate("dgx-h100")
    hostengine.install(sim.node, EngineOptions(profiling_module=False))
    with caplog.at_level(logging.WARNING, logger="gpulens"):
        families = two_samples(sim.exporter(profiling="auto", dcgm_bindings=BINDINGS_DIR), sim)
    assert set(sources(families).values()) == {"gpm"}
    assert one(families, "gpu_sm_active_ratio", gpu="3") is not None
    assert any("DCGMError_ModuleNotLoaded" in r.getMessage() for r in caplog.records)


def test_auto_falls_back_per_gpu(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("dgx-h100")
    hostengine.install(sim.node, EngineOptions(unsupported_gpus=frozenset({4})))
    families = two_samples(sim.exporter(profiling="auto", dcgm_bindings=BINDINGS_DIR), sim)
    got = sources(families)
    assert got["4"] == "gpm"
    assert {v for k, v in got.items() if k != "4"} == {"dcgm"}


def test_dcgm_mode_never_switches_to_another_source(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("dgx-h100")
    hostengine.install(sim.node, EngineOptions(profiling_module=False))
    families = two_samples(sim.exporter(profiling="dcgm"), sim)
    assert set(sources(families).values()) == {"nvml"}
    assert series(families, "gpu_sm_active_ratio") == []


def test_a_dcgm_host_engine_dying_hands_its_gpus_to_gpm(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("dgx-h100")
    engine = hostengine.install(sim.node)
    exporter = sim.exporter(profiling="auto", dcgm_bindings=BINDINGS_DIR, dcgm_address="localhost:5555")
    try:
        exporter.sample_once()
        sim.clock.advance(STEP)
        before = exporter.families(exporter.sample_once())
        engine.set_options(reachable=False)
        sim.clock.advance(STEP)
        exporter.sample_once()
        sim.clock.advance(STEP)
        after = exporter.families(exporter.sample_once())
    finally:
        exporter.close()
    assert set(sources(before).values()) == {"dcgm"}
    assert set(sources(after).values()) == {"gpm"}
    assert one(after, "gpulens_collector_success", collector="profiling") == 1


def test_off_and_gpm_modes_do_not_touch_dcgm(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("dgx-h100")
    engine = hostengine.install(sim.node)
    families = two_samples(sim.exporter(profiling="gpm", dcgm_bindings=BINDINGS_DIR), sim)
    assert set(sources(families).values()) == {"gpm"}
    assert engine.calls.get("connect", 0) == 0
    off = two_samples(sim.exporter(profiling="off", dcgm_bindings=BINDINGS_DIR), sim)
    assert series(off, "gpulens_profiling_source_info") == []
    assert engine.calls.get("connect", 0) == 0


# ---- GPM follows the scenario on Hopper (H100 built in, H200 from a scenario file) ----------------


def test_gpm_on_h100_matches_the_scenario_activity(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("dgx-h100")
    families = two_samples(sim.exporter(), sim)
    assert set(sources(families).values()) == {"gpm"}
    for gpu in (2, 3, 4, 7):
        expected = sim.activity(gpu)
        assert one(families, "gpu_sm_active_ratio", gpu=str(gpu)) == pytest.approx(expected.sm, abs=0.02)
        assert one(families, "gpu_dram_active_ratio", gpu=str(gpu)) == pytest.approx(expected.dram, abs=0.02)
    training = one(families, "gpu_sm_active_ratio", gpu="3")
    assert training is not None and training > 0.3  # the training job
    assert one(families, "gpu_sm_active_ratio", gpu="7") == pytest.approx(0.0, abs=0.01)  # idle
    mig = one(families, "gpu_mig_sm_active_ratio", gpu="1", gpu_instance="1")
    assert mig == pytest.approx(sim.activity(1, 1).sm, abs=0.02)


H200_SCENARIO = """
name: h200-pair
description: two H200, one busy with a constant job, one idle
node: {hostname: h200-node}
gpus:
  - model: H200-141GB
  - model: H200-141GB
processes:
  - pid: 4242
    gpu: 0
    name: python
    cmdline: [python, solve.py]
    job: {slurm: {id: 77, user: root, account: hpc}}
    start: -1h
    workload: {pattern: constant, memory: 40GiB, sm: 0.6, busy: 0.9}
"""


def test_gpm_on_h200_matches_a_constant_workload(simulate: Callable[[str], Sim], tmp_path: Path) -> None:
    scenario = tmp_path / "h200.yaml"
    scenario.write_text(H200_SCENARIO)
    sim = simulate(str(scenario))
    families = two_samples(sim.exporter(), sim)
    busy = one(families, "gpu_sm_active_ratio", gpu="0")
    assert busy == pytest.approx(sim.activity(0).sm, abs=0.02)
    assert busy is not None and busy > 0.4
    assert one(families, "gpu_sm_active_ratio", gpu="1") == pytest.approx(0.0, abs=0.01)
    assert sources(families) == {"0": "gpm", "1": "gpm"}


def test_auto_falls_back_when_dcgm_reads_blank_not_supported(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("dgx-h100")
    hostengine.install(sim.node, EngineOptions(blank_gpus=frozenset({6})))
    exporter = sim.exporter(profiling="auto", dcgm_bindings=BINDINGS_DIR)
    try:
        for _ in range(2):
            exporter.sample_once()
            sim.clock.advance(STEP)
        families = exporter.families(exporter.sample_once())
    finally:
        exporter.close()
    assert sources(families)["6"] == "gpm"
    assert one(families, "gpu_sm_active_ratio", gpu="6") is not None
    assert sources(families)["5"] == "dcgm"


# ---- the PCIe/NVLink rates feed only the --compat families: not asked of the driver otherwise ---


@pytest.mark.parametrize("rates", [False, True])
def test_gpm_asks_for_the_link_rates_only_when_told(simulate: Callable[[str], Sim], rates: bool) -> None:
    sim = simulate("dgx-h100")
    profiler = GpmProfiler(sim.clock.now, interval=STEP, rates=rates)
    profiler.read(3, sim.handle(3), [])
    sim.clock.advance(STEP)
    _, values, _ = profiler.read(3, sim.handle(3), [])
    assert "sm" in dict(values)
    assert ("pcie_tx_bytes_per_second" in dict(values)) is rates


@pytest.mark.parametrize(("compat", "rates"), [("", False), ("dcgm", True), ("jobstats", True)])
def test_the_compat_families_decide_whether_gpm_reads_link_rates(
    simulate: Callable[[str], Sim], compat: str, rates: bool
) -> None:
    sim = simulate("dgx-h100")
    config = ExporterConfig(interval=STEP, profiling="gpm", compat=compat)
    factory = make_profiler_factory(config, sim.clock.now, node=sim.node)
    assert factory is not None
    assert factory(None).rates is rates
