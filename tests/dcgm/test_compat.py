"""`--compat dcgm`: dcgm-exporter 4.8 names, units, types, HELP and labels from the same snapshot."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client.core import Metric

from gpulens.exporter.render import render
from tests.dcgm.conftest import STEP, Sim, family, one, series, two_samples

MIB = 1024 * 1024
GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}

# dcgm-exporter's etc/default-counters.csv (4.8): the enabled rows gpulens can serve, with their type
DEFAULT_COUNTERS = {
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEMORY_TEMP": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_RESERVED": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gauge",
    "DCGM_FI_PROF_DRAM_ACTIVE": "gauge",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "gauge",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "gauge",
}


@pytest.fixture
def h100(simulate: Callable[[str], Sim], monkeypatch: pytest.MonkeyPatch) -> tuple[Sim, list[Metric]]:
    monkeypatch.setenv("NODE_NAME", "dgx-h100-01")
    sim = simulate("dgx-h100")
    return sim, two_samples(sim.exporter(compat="dcgm", profiling="auto"), sim)


def test_the_default_counters_exist_with_dcgm_exporters_types(h100: tuple[Sim, list[Metric]]) -> None:
    _, families = h100
    for name, kind in DEFAULT_COUNTERS.items():
        f = family(families, name)
        assert f is not None, name
        assert f.type == kind, name
        assert f.samples, name


def test_help_texts_follow_the_default_counters_file(h100: tuple[Sim, list[Metric]]) -> None:
    _, families = h100
    assert family(families, "DCGM_FI_DEV_GPU_UTIL").documentation == "GPU utilization (in %)."  # type: ignore[union-attr]
    assert (
        family(families, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION").documentation  # type: ignore[union-attr]
        == "Total energy consumption since boot (in mJ)."
    )
    assert (
        family(families, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE").documentation  # type: ignore[union-attr]
        == "Ratio of cycles the tensor (HMMA) pipe is active."
    )


def test_units_are_dcgm_exporters(h100: tuple[Sim, list[Metric]]) -> None:
    _, f = h100
    g = {"gpu": "3"}
    assert one(f, "DCGM_FI_DEV_GPU_UTIL", **g) == pytest.approx(one(f, "gpu_utilization_ratio", **g) * 100)  # type: ignore[operator]
    assert one(f, "DCGM_FI_DEV_FB_USED", **g) == one(f, "gpu_memory_used_bytes", **g) // MIB  # type: ignore[operator]
    assert one(f, "DCGM_FI_DEV_FB_FREE", **g) == one(f, "gpu_memory_free_bytes", **g) // MIB  # type: ignore[operator]
    assert one(f, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", **g) == pytest.approx(
        one(f, "gpu_energy_joules_total", **g) * 1000  # type: ignore[operator]
    )
    assert one(f, "DCGM_FI_DEV_SM_CLOCK", **g) == pytest.approx(one(f, "gpu_sm_clock_hertz", **g) / 1e6)  # type: ignore[operator]
    assert one(f, "DCGM_FI_DEV_POWER_USAGE", **g) == one(f, "gpu_power_watts", **g)
    assert one(f, "DCGM_FI_DEV_GPU_TEMP", **g) == one(f, "gpu_temperature_celsius", **g)
    pcie = one(f, "DCGM_FI_PROF_PCIE_RX_BYTES", **g)  # bytes per second, from GPM's MiB/s
    assert pcie == pytest.approx(h100[0].activity(3).pcie_rx_bytes_per_second, rel=0.01)
    tensor = one(f, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", **g)
    assert tensor == one(f, "gpu_tensor_active_ratio", **g)
    assert tensor is not None and 0 < tensor <= 1  # a ratio, not a percentage


def test_gpu_series_carry_dcgm_exporters_labels(h100: tuple[Sim, list[Metric]]) -> None:
    _, f = h100
    ((labels, _),) = series(f, "DCGM_FI_DEV_GPU_TEMP", gpu="3")
    ((info, _),) = series(f, "gpu_info", gpu="3")
    assert set(labels) == GPU_LABELS
    assert labels["UUID"] == info["uuid"]
    assert labels["pci_bus_id"] == info["pci_bus_id"]
    assert labels["device"] == "nvidia3"
    assert labels["modelName"] == info["model"] == "NVIDIA H100 80GB HBM3"
    assert labels["DCGM_FI_DRIVER_VERSION"] == info["driver_version"]
    assert labels["Hostname"] == "dgx-h100-01"


def test_mig_gpus_have_only_per_instance_series_like_dcgm_exporter(h100: tuple[Sim, list[Metric]]) -> None:
    _, f = h100
    temps = series(f, "DCGM_FI_DEV_GPU_TEMP", gpu="0")
    instances = {labels["GPU_I_ID"]: labels["GPU_I_PROFILE"] for labels, _ in temps}
    native = {
        labels["gpu_instance"]: labels["mig_profile"]
        for labels, _ in series(f, "gpu_mig_instance_info", gpu="0")
    }
    assert instances == native == {"2": "3g.40gb", "3": "2g.20gb", "9": "1g.10gb", "10": "1g.10gb"}
    assert all(set(labels) == GPU_LABELS | {"GPU_I_PROFILE", "GPU_I_ID"} for labels, _ in temps)
    power = one(f, "gpu_power_watts", gpu="0")
    assert [v for _, v in series(f, "DCGM_FI_DEV_POWER_USAGE", gpu="0")] == [power] * 4  # repeated per GI
    assert series(f, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == []  # not available on MIG
    for gi in ("2", "3", "9", "10"):
        used = one(f, "gpu_mig_memory_used_bytes", gpu="0", gpu_instance=gi)
        assert one(f, "DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_ID=gi) == used // MIB  # type: ignore[operator]
        sm = one(f, "gpu_mig_sm_active_ratio", gpu="0", gpu_instance=gi)
        assert one(f, "DCGM_FI_PROF_SM_ACTIVE", gpu="0", GPU_I_ID=gi) == sm


def test_the_last_xid_is_a_gauge_with_code_and_message(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("dgx-h100")
    exporter = sim.exporter(compat="dcgm")
    try:
        exporter.sample_once()
        sim.clock.advance(1)
        sim.node.inject_xid(5, 13)
        sim.clock.advance(STEP)
        first = exporter.families(exporter.sample_once())
        sim.clock.advance(1)
        sim.node.inject_xid(5, 31)
        sim.clock.advance(STEP)
        second = exporter.families(exporter.sample_once())
    finally:
        exporter.close()
    ((labels, value),) = series(first, "DCGM_FI_DEV_XID_ERRORS", gpu="5")
    assert value == 13
    assert (labels["err_code"], labels["err_msg"]) == ("13", "Graphics Engine Exception")
    ((labels, value),) = series(second, "DCGM_FI_DEV_XID_ERRORS", gpu="5")
    assert (value, labels["err_code"], labels["err_msg"]) == (31, "31", "GPU memory page fault")
    ((labels, value),) = series(second, "DCGM_FI_DEV_XID_ERRORS", gpu="4")
    assert (value, labels["err_code"]) == (0, "0")  # another GPU: still no Xid


def test_the_xid_gauge_is_0_with_no_error_until_the_first_xid(h100: tuple[Sim, list[Metric]]) -> None:
    _, f = h100
    found = series(f, "DCGM_FI_DEV_XID_ERRORS")
    assert len({labels["gpu"] for labels, _ in found}) == 8
    assert {(labels["err_code"], labels["err_msg"], value) for labels, value in found} == {
        ("0", "No Error", 0.0)
    }


def test_no_xid_series_when_xid_events_are_not_watched(simulate: Callable[[str], Sim]) -> None:
    from gpulens.exporter.collectors import REGISTRY

    sim = simulate("dgx-h100")
    families = two_samples(sim.exporter(compat="dcgm", collectors=frozenset(REGISTRY) - {"xid"}), sim)
    assert series(families, "DCGM_FI_DEV_XID_ERRORS") == []  # unknown is not "no error"


def test_nvlink_bandwidth_total_is_both_directions_in_mb_per_second(h100: tuple[Sim, list[Metric]]) -> None:
    sim, f = h100
    activity = sim.activity(3)
    value = one(f, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="3")
    expected = (activity.nvlink_tx_bytes_per_second + activity.nvlink_rx_bytes_per_second) / 1e6
    assert value == pytest.approx(expected, rel=0.01)
    assert series(f, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="0") == []  # MIG GPU: absent, like PROF NVLink


def test_dcgm_4_8_3_and_later_spell_the_host_label_hostname(
    simulate: Callable[[str], Sim], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "node-7")
    sim = simulate("seed-case")
    families = two_samples(sim.exporter(compat="dcgm=4.8.3"), sim)
    labels = [labels for labels, _ in series(families, "DCGM_FI_DEV_GPU_TEMP")]
    assert labels and all(lab.get("hostname") == "node-7" and "Hostname" not in lab for lab in labels)


def test_pcie_rates_and_a100_profiling_come_through_dcgm(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("k8s-a100-mixed")
    f = two_samples(sim.exporter(compat="dcgm", profiling="dcgm"), sim)
    assert one(f, "DCGM_FI_PROF_PCIE_RX_BYTES", gpu="2") == pytest.approx(
        sim.activity(2).pcie_rx_bytes_per_second
    )
    assert one(f, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu="2") == pytest.approx(sim.activity(2).tensor)
    assert series(f, "DCGM_FI_PROF_PCIE_RX_BYTES", gpu="1") == []  # absent on MIG (dcgm-exporter #726)
    assert len(series(f, "DCGM_FI_PROF_SM_ACTIVE", gpu="1")) == 5


def test_compat_families_are_off_by_default(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("dgx-h100")
    families = two_samples(sim.exporter(), sim)
    assert not [f.name for f in families if f.name.startswith("DCGM_")]


def test_the_exposition_keeps_dcgm_names_without_a_total_suffix(h100: tuple[Sim, list[Metric]]) -> None:
    _, families = h100
    rendered = render(families)
    text = rendered.text.decode()
    om = rendered.openmetrics.decode()
    assert '\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{DCGM_FI_DRIVER_VERSION="550.54.15"' in text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text  # as dcgm-exporter serves it
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\n" in om  # OpenMetrics counters need _total
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in om.replace("# HELP", "").replace("# TYPE", "")
    assert one(families, "gpulens_collector_success", collector="dcgm_compat") == 1


def test_docs_map_every_compat_family_to_a_native_one() -> None:
    from pathlib import Path

    from gpulens.exporter.collectors.dcgm_compat import FIELDS, XID_FIELD

    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    section = docs.split("## dcgm-exporter compatibility")[1]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| DCGM_")}
    for f in (*FIELDS, XID_FIELD):
        assert f.name in rows, f.name
        assert f"| {f.field_id} | {f.type} |" in rows[f.name], f.name


def test_hostname_is_node_name_else_the_simulated_hosts_name(
    simulate: Callable[[str], Sim], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    sim = simulate("k8s-a100-mixed")
    families = two_samples(sim.exporter(compat="dcgm"), sim)
    assert {labels["Hostname"] for labels, _ in series(families, "DCGM_FI_DEV_GPU_TEMP")} == {
        "k8s-gpu-worker-3"
    }
