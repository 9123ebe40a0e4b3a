"""Workload patterns have the shapes their names promise, and their smooth envelope is their mean."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.patterns import Sample, Workload, WorkloadSpec, square_fraction
from gpulens.sim.scenariofile import parse_scenario

GIB = 1024**3
T0 = 1_750_000_000.0


def workload(pattern: str, seed: int = 1, **kw: object) -> Workload:
    spec = WorkloadSpec(pattern=pattern, memory_bytes=kw.pop("memory", 10 * GIB), sm=kw.pop("sm", 0.5), **kw)  # type: ignore[arg-type]
    return Workload(spec, seed, pid=4242)


def samples(w: Workload, start: float, stop: float, step: float) -> list[Sample]:
    n = int((stop - start) / step)
    return [w.sample(start + k * step) for k in range(n)]


def test_square_fraction_covers_the_duty_cycle_over_whole_periods() -> None:
    assert square_fraction(0.0, 10.0, 2.0, 0.25) == pytest.approx(0.25)
    assert square_fraction(0.0, 0.5, 2.0, 0.25) == pytest.approx(1.0)
    assert square_fraction(0.5, 2.0, 2.0, 0.25) == pytest.approx(0.0)
    assert square_fraction(100.0 - 1, 100.0, 0.8, 0.85) <= 1.0  # rounding at period boundaries


def test_constant_holds_its_level_with_small_jitter() -> None:
    w = workload("constant", sm=0.4, busy=0.6)
    got = samples(w, 0, 600, 1.0)
    assert statistics.mean(s.sm for s in got) == pytest.approx(0.4, abs=0.01)
    assert all(0.37 <= s.sm <= 0.43 for s in got)
    assert all(s.busy == 0.6 for s in got)


def test_training_alternates_compute_and_data_loading_steps() -> None:
    w = workload("training", sm=0.3, duty=0.5, step_seconds=20.0, warmup_seconds=0.0)
    got = samples(w, 1000, 1040, 0.5)
    high = [s for s in got if s.busy > 0.9]
    low = [s for s in got if s.busy < 0.1]
    assert len(high) > 10 and len(low) > 10
    assert all(s.pcie_rx > 0 for s in low)  # the data-loading phase moves data over PCIe
    assert all(s.tensor > 0.2 for s in high) and all(s.tensor < 0.05 for s in low)
    longer = samples(w, 1000, 1800, 0.5)
    assert statistics.mean(s.busy for s in longer) == pytest.approx(0.5, abs=0.05)
    assert statistics.mean(s.sm for s in longer) == pytest.approx(0.3, abs=0.03)


def test_training_warms_up_memory_and_activity() -> None:
    w = workload("training", sm=0.5, warmup_seconds=100.0, memory=8 * GIB)
    assert w.sample(0.0).memory == 2 * GIB
    assert w.sample(50.0).memory == pytest.approx(5 * GIB, rel=0.01)
    assert w.sample(200.0).memory == 8 * GIB
    assert w.expected(10.0).sm < w.expected(200.0).sm


def test_inference_is_bursty_around_its_rate() -> None:
    w = workload("inference", rate=0.3, sm=0.6, period_seconds=3600.0)
    got = samples(w, 0, 3600, 1.0)
    busy = [s.busy for s in got]
    assert statistics.mean(busy) == pytest.approx(0.3, abs=0.05)
    assert statistics.pstdev(busy) > 0.15  # bursts, not a flat line
    assert max(s.sm for s in got) <= 0.6 + 1e-9


def test_inference_follows_its_load_cycle() -> None:
    w = workload("inference", rate=0.3, period_seconds=3600.0)
    quarters = [
        statistics.mean(w.expected(t).busy for t in range(q * 900, (q + 1) * 900, 10)) for q in range(4)
    ]
    assert max(quarters) > 1.5 * min(quarters)


def test_notebook_is_mostly_idle_and_keeps_its_memory() -> None:
    w = workload("notebook", sm=0.4, active=0.2, slot_seconds=60.0, memory=6 * GIB)
    got = samples(w, 0, 6 * 3600, 5.0)
    idle = sum(1 for s in got if s.sm == 0) / len(got)
    assert 0.8 <= idle <= 0.95
    assert all(s.memory == 6 * GIB for s in got)
    assert max(s.sm for s in got) > 0.3


def test_growing_memory_rises_linearly_then_stays() -> None:
    w = workload("growing", memory=10 * GIB, memory_start_bytes=2 * GIB, over_seconds=1000.0)
    assert w.sample(0).memory == 2 * GIB
    assert w.sample(500).memory == 6 * GIB
    assert w.sample(1000).memory == w.sample(5000).memory == 10 * GIB


def test_growing_with_repeat_is_a_sawtooth() -> None:
    w = workload("growing", memory=10 * GIB, memory_start_bytes=2 * GIB, over_seconds=1000.0, repeat=True)
    assert w.sample(1500).memory == 6 * GIB


@pytest.mark.parametrize("pattern", ["constant", "training", "inference", "notebook", "growing"])
def test_the_smooth_envelope_is_the_mean_of_the_samples(pattern: str) -> None:
    w = workload(pattern, sm=0.4)
    got = samples(w, 3600, 3 * 86400 + 3600, 37.0)
    expected = [w.expected(3600 + k * 37.0) for k in range(len(got))]
    assert statistics.mean(s.sm for s in got) == pytest.approx(
        statistics.mean(e.sm for e in expected), abs=0.03
    )
    assert statistics.mean(s.busy for s in got) == pytest.approx(
        statistics.mean(e.busy for e in expected), abs=0.04
    )


def test_the_seed_changes_the_noise_but_not_the_level() -> None:
    a, b = workload("inference", seed=1), workload("inference", seed=2)
    assert [a.sample(t).busy for t in range(50)] != [b.sample(t).busy for t in range(50)]
    assert [a.sample(t).busy for t in range(50)] == [
        workload("inference", seed=1).sample(t).busy for t in range(50)
    ]


@settings(max_examples=200, deadline=None)
@given(
    pattern=st.sampled_from(["constant", "training", "inference", "notebook", "growing"]),
    sm=st.floats(0.0, 1.0),
    age=st.floats(-10.0, 1e7),
)
def test_every_sample_is_physically_consistent(pattern: str, sm: float, age: float) -> None:
    s = workload(pattern, sm=sm).sample(age)
    assert 0.0 <= s.sm <= 1.0 and 0.0 <= s.busy <= 1.0
    assert s.busy >= s.sm - 1e-12  # SMs are only active while a kernel runs
    assert s.tensor <= s.sm + 1e-12 and s.occupancy <= 1.0 and s.dram <= 1.0
    assert s.pcie_rx >= 0 and s.pcie_tx >= 0 and s.nvlink_rx >= 0
    assert 0 <= s.memory <= 10 * GIB


def test_a_sampler_at_a_multiple_of_the_step_does_not_always_see_the_same_phase() -> None:
    w = workload("training", sm=0.25, duty=0.4, step_seconds=2.5, warmup_seconds=0.0)
    busy = [w.sample(1000 + 5.0 * k).busy for k in range(400)]
    assert statistics.mean(busy) == pytest.approx(0.4, abs=0.06)


def test_a_notebooks_smooth_envelope_keeps_its_cells_running_or_not() -> None:
    # cells run for minutes: a reader averaging over its interval sees them, so only the jitter
    # is averaged out, not the slots (else its duty cycle reads flat at its long-run mean)
    w = workload("notebook", sm=0.4, active=0.3, slot_seconds=300.0)
    ages = [3600 + 30.0 * k for k in range(2000)]
    assert all((w.expected(a).busy > 0) == (w.sample(a).sm > 0) for a in ages)
    assert {round(w.expected(a).busy, 9) for a in ages} == {0.0, round(0.4 * 1.3 + 0.05, 9)}


def test_a_time_sliced_notebooks_duty_cycle_is_what_a_server_beside_it_waits_for() -> None:
    # the process utilization the exporter reads (its duty cycle, by which the analyzer plans a
    # server's time-sliced neighbours) bursts when the busy time a neighbour's latency is slowed
    # by (sim/serving.py) does, not flat at the notebook's mean
    notebook = {"pattern": "notebook", "memory": "4GiB", "sm": 0.5, "active": 0.3}
    scenario = parse_scenario(
        {
            "gpus": [{"model": "A100-80GB"}],
            "processes": [
                {"pid": 300, "gpu": 0, "workload": notebook},
                {"pid": 301, "gpu": 0, "workload": {"pattern": "constant", "memory": "4GiB", "sm": 0.05}},
            ],
        },
        "t.yaml",
    )
    clock = ManualClock(T0)
    node = build_node(scenario, clock=clock)
    felt = Workload(scenario.processes[0].workload, node.seed, pid=300)
    read, waited = [], []
    for age in (3600 + 300.0 * k for k in range(288)):
        clock.set(T0 + age)
        read.append({p.pid: p.sm_util_percent for p in node.gpu_state(0).processes}[300])
        waited.append(felt.sample(age).busy)
    assert 0 in read and max(read) == round((0.5 * 1.3 + 0.05) * 100)
    assert [r > 0 for r in read] == [w > 0 for w in waited]
