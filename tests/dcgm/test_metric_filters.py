"""--metrics.allow / --metrics.deny: which families the exporter serves (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Callable

from tests.dcgm.conftest import Sim, two_samples


def test_the_allow_list_keeps_named_families_and_the_exporters_own(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("seed-case")
    families = two_samples(sim.exporter(metrics_allow=("gpu_memory_*", "gpu_up")), sim)
    names = {f.name for f in families}
    assert {"gpu_up", "gpu_memory_used_bytes", "gpu_memory_total_bytes"} <= names
    assert not {n for n in names if n.startswith("gpu_") and not n.startswith(("gpu_memory_", "gpu_up"))}
    assert "gpulens_collector_success" in names


def test_the_deny_list_drops_families_by_exposed_name(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("seed-case")
    families = two_samples(sim.exporter(metrics_deny=("gpu_clock_event_*", "gpu_energy_joules_total")), sim)
    names = {f.name for f in families}
    assert not any(n.startswith("gpu_clock_event_") for n in names)
    assert "gpu_energy_joules" not in names  # a counter denied by its name on the wire
    assert "gpu_power_watts" in names
