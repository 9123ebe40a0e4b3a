"""The sampling cycle's fast paths do less work and give the same answers (no timing asserts).

Each test pins one optimisation of the exporter's hot path on the simulated node: what it must
still return, and the work (NVML calls, states built) it must no longer do.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpulens.exporter.app import Exporter
from gpulens.exporter.config import ExporterConfig
from gpulens.sim import engine
from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import ScenarioNode, build_node
from gpulens.sim.install import install, uninstall
from gpulens.sim.scenariofile import load_scenario

T0 = 1_750_000_000.0
SCENARIOS = ("large", "dgx-h100", "k8s-a100-mixed", "faults", "seed-case")


def _node(name: str, clock: ManualClock | None = None) -> ScenarioNode:
    return build_node(load_scenario(name), clock=clock or ManualClock(start=T0))


@pytest.mark.parametrize("name", SCENARIOS)
def test_instance_activity_equals_the_full_snapshot(name: str) -> None:
    node = _node(name)
    rnd = random.Random(1)
    for _ in range(60):
        gpu, r = rnd.randrange(len(node.identities)), rnd.uniform(-5, 5000)
        snap = node._snapshot(gpu, r, smooth=False)
        for gi in [*snap.instances, 99]:
            # white-box: the fast path is private and pinned to the general one it replaces
            assert node._instance_activity(gpu, gi, r) == snap.instances.get(gi)


@pytest.mark.parametrize("name", SCENARIOS)
def test_gpu_activity_equals_the_full_snapshot(name: str) -> None:
    node = _node(name)
    rnd = random.Random(2)
    for _ in range(60):
        gpu, r = rnd.randrange(len(node.identities)), rnd.uniform(-5, 5000)
        # white-box: the fast path is private and pinned to the general one it replaces
        assert node._gpu_activity(gpu, r) == node._snapshot(gpu, r, smooth=False).gpu


@pytest.fixture
def dgx(tmp_path: Path) -> Iterator[tuple[Exporter, ScenarioNode, ManualClock]]:
    clock = ManualClock(start=T0)
    node = build_node(load_scenario("dgx-h100"), clock=clock)
    install(node)
    exporter = Exporter(
        ExporterConfig(interval=2.0, pod_resources_socket=None, pod_logs_dir=tmp_path), node=node
    )
    try:
        yield exporter, node, clock
    finally:
        exporter.close()
        uninstall()


def _counting(monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> Counter[str]:
    calls: Counter[str] = Counter()
    for name in names:
        original: Callable[..., Any] = getattr(pynvml, name)

        def counted(*args: Any, _name: str = name, _fn: Callable[..., Any] = original) -> Any:
            calls[_name] += 1
            return _fn(*args)

        monkeypatch.setattr(pynvml, name, counted)
    return calls


def _instances(exporter: Exporter, gpu: int) -> dict[int, str]:
    snapshot = exporter.sample_once()
    return {m.gpu_instance: m.profile for m in snapshot.gpus[gpu].mig_instances}


def test_mig_identity_is_read_once_per_instance(dgx, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter, _, clock = dgx
    first = _instances(exporter, 0)
    calls = _counting(monkeypatch, ("nvmlDeviceGetName", "nvmlDeviceGetAttributes"))
    clock.advance(2)
    assert _instances(exporter, 0) == first
    assert calls == Counter()


def test_a_created_mig_instance_is_read_in_the_next_sample(dgx, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter, node, clock = dgx
    before = _instances(exporter, 0)
    calls = _counting(monkeypatch, ("nvmlDeviceGetAttributes",))
    victim = next(iter(before))
    node.destroy_mig_instance(0, victim)
    clock.advance(2)
    assert victim not in _instances(exporter, 0)
    created = node.create_mig_instance(0, "1g.10gb")
    clock.advance(2)
    after = _instances(exporter, 0)
    assert after[created] == "1g.10gb"
    assert calls["nvmlDeviceGetAttributes"] == 1  # only the new instance


def test_one_sample_builds_each_gpu_state_once(dgx, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter, node, clock = dgx
    exporter.sample_once()
    built: Counter[int] = Counter()
    original = ScenarioNode._build_state

    def counted(self: ScenarioNode, index: int, t: float) -> Any:
        built[index] += 1
        return original(self, index, t)

    monkeypatch.setattr(ScenarioNode, "_build_state", counted)
    clock.advance(2)
    exporter.sample_once()
    assert built == Counter({i: 1 for i in range(len(node.identities))})


def test_states_are_shared_within_a_quantum_and_fresh_after_it() -> None:
    clock = ManualClock(start=T0)
    node = _node("dgx-h100", clock)
    first = node.gpu_state(3)
    clock.advance(engine.QUANTUM / 4)
    assert node.gpu_state(3) is first
    clock.advance(engine.QUANTUM)
    assert node.gpu_state(3) is not first


def test_gpm_sample_buffers_are_reused_between_samples(dgx, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter, _, clock = dgx
    for _ in range(2):  # the first two samples allocate each device's two buffers
        exporter.sample_once()
        clock.advance(2)
    calls = _counting(monkeypatch, ("nvmlGpmSampleAlloc", "nvmlGpmSampleFree"))
    snapshot = exporter.sample_once()
    profiling = snapshot.gpus[3].profiling
    assert profiling is not None and dict(profiling.values)["sm"] > 0  # windows still computed
    assert calls == Counter()
