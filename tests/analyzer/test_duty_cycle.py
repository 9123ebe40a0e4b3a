"""A time-sliced GPU is shared in time: an inference server waits while its neighbours run
kernels, however few SMs those use. Each job's duty cycle (`signals.BUSY`: the exporter's
`gpu_job_duty_cycle_ratio`, else a whole GPU's own utilization) is profiled and binned, and a
server is time-sliced only beside neighbours whose summed duty cycle stays within
`serving.max_latency_increase` (what next week's report rolls it back for); any time-sliced jobs'
duty cycles summed stay within one GPU's time (`time_slicing.max_interference`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpulens.analyzer import demand
from gpulens.analyzer.bins import GpuBin, Item, fits
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.planlayout import interference
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.catalog import get_model
from tests.analyzer import synth

STEPS = 120
L40S = "L40S-48GB"


def _item(job: str, busy: float, sm: float, serving: bool = False) -> Item:
    return Item(
        job_id=job,
        kind=Kind.TIME_SLICING.value,
        model=L40S,
        start=0.0,
        end=float(STEPS),
        gpus=1,
        memory=6 * synth.GIB,
        sm=sm,
        load=sm,
        used_hours=1.0,
        p95=sm,
        sm_series=demand.Series(0, np.full(STEPS, sm, dtype=np.float32)),
        busy_series=demand.Series(0, np.full(STEPS, busy, dtype=np.float32)),
        serving=serving,
    )


def _beside(first: Item, second: Item) -> bool:
    gpu = GpuBin(name="g", model=L40S, mode=Kind.TIME_SLICING.value, items=[first])
    return fits(gpu, second, get_model(L40S), load_thresholds())


def test_a_server_is_not_time_sliced_beside_a_neighbour_busy_more_than_the_latency_it_may_lose():
    # 8 % of the SMs, but kernels running 55 % of the time: the server's requests wait that long
    server = _item("vllm", busy=0.1, sm=0.02, serving=True)
    assert not _beside(server, _item("detect", busy=0.55, sm=0.08))
    assert not _beside(_item("detect", busy=0.55, sm=0.08), server)  # whichever is placed first


def test_a_server_is_time_sliced_beside_neighbours_busy_within_it():
    th = load_thresholds()
    server = _item("vllm", busy=0.1, sm=0.02, serving=True)
    assert _beside(server, _item("detect", busy=th.serving.max_latency_increase, sm=0.08))


def test_jobs_that_serve_no_one_share_time_while_their_busy_time_fits_one_gpu():
    assert _beside(_item("a", busy=0.45, sm=0.08), _item("b", busy=0.45, sm=0.08))


def test_jobs_whose_busy_time_sums_past_one_gpu_are_not_time_sliced_however_few_sms_they_use():
    """Kernels of time-sliced jobs take turns: a trainer busy 81 % of the time beside a pod busy
    50 % would wait (time_slicing.max_interference), though their SM activity sums to 20 %."""
    assert not _beside(_item("trainer", busy=0.81, sm=0.12), _item("etl", busy=0.5, sm=0.08))


def test_a_job_without_a_duty_cycle_leaves_the_time_test_to_the_others():
    without = dataclasses.replace(_item("old", busy=0.0, sm=0.08), busy_series=None)
    assert _beside(_item("trainer", busy=0.81, sm=0.12), without)


def test_a_job_waits_in_the_share_of_its_own_bins_where_the_others_exceed_the_limit():
    own = demand.Series(10, np.full(10, 0.1, dtype=np.float32))
    others = [
        demand.Series(0, np.full(15, 0.2, dtype=np.float32)),  # bins 0-14: 10-14 overlap
        demand.Series(12, np.full(2, 0.2, dtype=np.float32)),  # bins 12-13
    ]
    assert demand.waits(own, others, 0.25) == pytest.approx(0.2)  # bins 12 and 13 of its 10
    assert demand.waits(own, [], 0.25) == 0.0


def _profile(**job: object):
    th = load_thresholds()
    jobs = [
        synth.SynthJob("j", "GPU-a", synth.flat(STEPS, 0.08), synth.flat(STEPS, 4 * synth.GIB), **job)  # type: ignore[arg-type]
    ]
    return profiles_from_samples(synth.frame(jobs), synth.STEP, th)


def test_a_jobs_duty_cycle_is_profiled_from_the_exporters_per_job_figure():
    profiles = _profile(duty=synth.flat(STEPS, 0.55))
    assert profiles.iloc[0]["duty_cycle_p95"] == pytest.approx(0.55)
    busy = demand.of(profiles)
    assert busy is not None and busy.busy["j"].values.max() == pytest.approx(0.55)


def test_without_a_duty_cycle_a_job_has_none():
    profiles = _profile()
    assert np.isnan(profiles.iloc[0]["duty_cycle_p95"])
    busy = demand.of(profiles)
    assert busy is not None and "j" not in busy.busy


def test_a_time_sliced_gpus_interference_reports_its_jobs_summed_busy_time():
    gpu = GpuBin(name="g", model=L40S, mode=Kind.TIME_SLICING.value)
    gpu.items = [_item("a", busy=0.45, sm=0.08), _item("b", busy=0.3, sm=0.08)]
    found = interference(gpu, load_thresholds())
    assert (found["busy_sum_high"], found["busy_over_share"]) == (0.75, 0.0)
    gpu.items.append(_item("c", busy=0.3, sm=0.02))  # 1.05 of the GPU's time in every bin
    found = interference(gpu, load_thresholds())
    assert (found["busy_over_share"], found["risk"]) == (1.0, "high")
