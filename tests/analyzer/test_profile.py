"""Per-job profiles: signal choice, reductions, multi-GPU, gaps and NaN."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.profile import job_kinds, profiles_from_samples, segment_quantiles
from tests.analyzer import synth
from tests.analyzer.synth import SynthJob, flat, steady

GIB = 1024**3


def one(frame, th):
    return profiles_from_samples(frame, synth.STEP, th).set_index("job_id")


def test_reductions_follow_promql_definitions(th):
    values = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    job = SynthJob("j", "GPU-a", values, flat(len(values), 4 * GIB))
    row = one(synth.frame([job]), th).loc["j"]
    assert row["sm_active_mean"] == pytest.approx(0.5)
    assert row["sm_active_p50"] == pytest.approx(0.5)
    assert row["sm_active_p95"] == pytest.approx(0.95)  # linear interpolation, like quantile_over_time
    assert row["sm_active_max"] == pytest.approx(1.0)
    assert row["idle_fraction"] == pytest.approx(1 / 11)  # only 0.0 is under 5 %
    assert row["burstiness"] == pytest.approx(values.std() / values.mean())
    assert row["activity_signal"] == "sm_active"
    assert row["samples"] == 11 and row["coverage"] == 1.0
    assert row["duration_s"] == 11 * synth.STEP
    assert row["gpu_hours_allocated"] == pytest.approx(11 * 60 / 3600)
    assert row["gpu_hours_used"] == pytest.approx(0.5 * 11 * 60 / 3600)


def test_utilization_is_the_fallback_when_sm_activity_is_absent(th):
    job = SynthJob("j", "GPU-a", flat(20, 0.4), flat(20, GIB), activity_family="gpu_utilization_ratio")
    row = one(synth.frame([job]), th).loc["j"]
    assert row["activity_signal"] == "utilization"
    assert row["sm_active_mean"] == pytest.approx(0.4)


def test_mig_jobs_read_their_instance_and_slice_size(th):
    job = SynthJob(
        "m",
        "GPU-h",
        flat(20, 0.5),
        flat(20, 5 * GIB),
        model="NVIDIA H100 80GB HBM3",
        sharing="mig",
        gpu_instance="9",
        mig_profile="2g.20gb",
    )
    row = one(synth.frame([job]), th).loc["m"]
    assert row["mig_profile_now"] == "2g.20gb"
    assert row["device_sms"] == 32
    assert row["gpu_share"] == pytest.approx(2 / 7)
    assert row["gpu_model"] == "H100-80GB"


def test_multi_gpu_jobs_average_activity_and_peak_memory_per_gpu(th):
    job = SynthJob("big", "GPU-0", flat(20, 0.9), flat(20, 30 * GIB), extra_uuids=["GPU-1"])
    frame = synth.frame([job])
    second = (frame["uuid"] == "GPU-1") & (frame["metric"] == "gpu_sm_active_ratio")
    frame.loc[second, "value"] = 0.5
    memory = (frame["uuid"] == "GPU-1") & (frame["metric"] == "gpu_job_memory_used_bytes")
    frame.loc[memory, "value"] = 40 * GIB
    row = one(frame, th).loc["big"]
    assert row["gpus"] == 2
    assert row["sm_active_mean"] == pytest.approx(0.7)
    assert row["memory_peak_bytes"] == 40 * GIB
    assert row["gpu_hours_allocated"] == pytest.approx(2 * 20 * 60 / 3600)


def test_gaps_and_nan_lower_coverage_instead_of_failing(th):
    job = SynthJob("g", "GPU-a", flat(20, 0.3), flat(20, GIB))
    frame = synth.frame([job])
    act = frame.index[frame["metric"] == "gpu_sm_active_ratio"]
    frame.loc[act[:5], "value"] = np.nan
    frame = frame.drop(act[5:10])
    row = one(frame, th).loc["g"]
    assert row["coverage"] == pytest.approx(0.5)
    assert row["sm_active_mean"] == pytest.approx(0.3)


def test_active_hours_count_the_clock_hours_with_activity_above_zero(th):
    # 5 min steps from 00:05 for 6 h; activity once, at 00:30, and at the last step of 04:00-05:00
    activity = flat(72, 0.0)
    activity[[5, 59]] = 0.01
    job = SynthJob("q", "GPU-a", activity, flat(72, GIB), first_step=1)
    row = profiles_from_samples(synth.frame([job], step=300.0), 300.0, th).set_index("job_id").loc["q"]
    assert (row["active_hours"], row["lifetime_hours"]) == (2, 6)


def test_a_sample_on_the_hour_belongs_to_the_hour_it_ends(th):
    # steps at 00:00 (alone in the hour ending then) and 00:05-01:00: two clock hours
    activity = flat(13, 0.0)
    activity[0] = 0.2
    job = SynthJob("h", "GPU-a", activity, flat(13, GIB))
    row = profiles_from_samples(synth.frame([job], step=300.0), 300.0, th).set_index("job_id").loc["h"]
    assert (row["active_hours"], row["lifetime_hours"]) == (1, 2)


def test_hours_without_a_sample_count_in_the_lifetime_not_as_active(th):
    job = SynthJob("g", "GPU-a", flat(36, 0.3), flat(36, GIB), first_step=1)
    frame = synth.frame([job], step=300.0)
    hour_two = (frame["timestamp"] > synth.START + 3600) & (frame["timestamp"] <= synth.START + 7200)
    frame = frame[~(hour_two & (frame["metric"] == "gpu_sm_active_ratio"))]
    row = profiles_from_samples(frame, 300.0, th).set_index("job_id").loc["g"]
    assert (row["active_hours"], row["lifetime_hours"]) == (2, 3)


def test_shared_jobs_use_per_job_utilisation_and_split_the_gpu(th):
    jobs = [
        SynthJob("a", "GPU-s", flat(20, 0.2), flat(20, GIB), sharing="mps"),
        SynthJob("b", "GPU-s", flat(20, 0.1), flat(20, GIB), sharing="mps"),
    ]
    p = one(synth.frame(jobs), th)
    assert list(p["activity_signal"]) == ["job_sm_utilization"] * 2
    assert list(p["gpu_share"]) == [0.5, 0.5]
    assert p.loc["a", "sharing"] == "mps"


def test_an_mps_clients_running_cap_is_the_last_one_measured_in_the_window(th):
    """Told 20 % by last week's plan, it runs at the device plugin's 100/3 from step 10 on: the cap
    in force at the window's end is the profile's, in percent."""
    caps = np.concatenate([flat(10, 0.20), flat(10, 1 / 3)])
    jobs = [
        SynthJob("a", "GPU-s", flat(20, 0.2), flat(20, GIB), sharing="mps", thread_cap=caps),
        SynthJob("b", "GPU-s", flat(20, 0.1), flat(20, GIB), sharing="mps"),
    ]
    p = one(synth.frame(jobs), th)
    assert p.loc["a", "mps_thread_cap_now_pct"] == pytest.approx(100 / 3)
    assert np.isnan(p.loc["b", "mps_thread_cap_now_pct"])  # no cap measured: none assumed


def test_a_history_without_the_thread_cap_family_profiles_as_before(th):
    jobs = [SynthJob("a", "GPU-s", steady(20, 0.2), flat(20, GIB), sharing="mps", thread_cap=flat(20, 0.25))]
    measured = one(synth.frame(jobs), th)
    frame = synth.frame(jobs)
    unmeasured = one(frame[frame["metric"] != "gpu_job_mps_active_thread_ratio"], th)
    assert np.isnan(unmeasured.loc["a", "mps_thread_cap_now_pct"])
    others = [c for c in measured.columns if c != "mps_thread_cap_now_pct"]
    pd.testing.assert_frame_equal(measured[others], unmeasured[others])


def test_no_jobs_is_an_error(th):
    frame = synth.frame([SynthJob("a", "GPU-a", flat(3, 0.2), flat(3, GIB))])
    with pytest.raises(AnalyzerError, match="no gpu_job_info"):
        profiles_from_samples(frame[frame["metric"] != "gpu_job_info"], 60, th)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.one_of(
                st.floats(0.0, 1.0, allow_nan=False),
                st.floats(0.0, 2.0**50, allow_nan=False),
                st.sampled_from([0.0, 0.25, 0.5, 1.0]),
            ),
            min_size=1,
            max_size=60,
        ),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=4),
)
def test_quantiles_of_all_jobs_at_once_equal_numpys_bit_for_bit(segments, qs):
    arrays = [np.array(s) for s in segments]
    got = segment_quantiles(arrays, qs)
    want = np.array([[np.quantile(a, q) for a in arrays] for q in qs])
    assert got.tobytes() == want.tobytes()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 30), st.integers(0, 10)), min_size=1, max_size=6))
def test_numpy_joins_give_the_per_step_values_of_pandas_merges(jobs):
    """The joined and sorted codes (`_signal_segments`) equal pandas' merge and groupby
    (`_signal_steps`) bit for bit, for single- and multi-GPU jobs, means and peaks."""
    from gpulens.analyzer import signals
    from gpulens.analyzer.profile import _by_family, _signal_segments, _signal_steps, _split_by_job_times

    synth_jobs = [
        SynthJob(
            f"j{i}",
            f"GPU-{i}",
            steady(steps, 0.1 + 0.1 * extra, seed=i),
            steady(steps, 0.5, seed=i + 100) * GIB,
            first_step=start,
            extra_uuids=[f"GPU-{i}-{k}" for k in range(extra)],
        )
        for i, (extra, steps, start) in enumerate(jobs)
    ]
    frame = synth.frame(synth_jobs)
    # each GPU of a multi-GPU job a little different, so order and peaks matter
    frame["value"] = frame["value"] * (1 + 0.01 * frame["uuid"].str.count("-"))
    fams = _by_family(frame)
    info = fams["gpu_job_info"]
    names = [job.job_id for job in synth_jobs]
    for chain, how in ((signals.ACTIVITY, "mean"), (signals.MEMORY, "max")):
        for signal in chain["exclusive"]:
            want = _split_by_job_times(_signal_steps(fams, info, signal, names, how))
            got = _signal_segments(fams, info, signal, names, how)
            assert sorted((j, t.tobytes(), v.tobytes()) for j, t, v in got) == sorted(
                (j, t.tobytes(), v.tobytes()) for j, t, v in want
            ), signal.name


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", "", None]), st.sampled_from(["x", "y", None])), max_size=40)
)
def test_first_rows_are_the_rows_drop_duplicates_keeps(rows):
    import pandas as pd

    from gpulens.analyzer.profile import _first_rows

    frame = pd.DataFrame(rows, columns=["job_id", "uuid"], dtype=object).astype({"job_id": "category"})
    kept = frame.iloc[_first_rows(frame, ["job_id", "uuid"])]
    pd.testing.assert_frame_equal(kept, frame.drop_duplicates())


def test_a_job_seen_alone_and_time_sliced_on_its_gpu_reads_the_shared_signals():
    # the exporter labels a time-sliced GPU exclusive at the steps one job runs on it: the
    # exclusive table's device activity would give the job its neighbours' at the other steps
    series = pd.DataFrame(
        {
            "job_id": ["a", "a", "b", "c", "c"],
            "uuid": ["GPU-0", "GPU-0", "GPU-1", "GPU-2", "GPU-2"],
            "gpu_instance": ["", "", "", "1", "1"],
            "sharing": ["exclusive", "time_slicing", "exclusive", "exclusive", "mig"],
        }
    )
    assert job_kinds(series) == {"a": "shared", "b": "exclusive", "c": "mig"}


def test_a_job_alone_on_its_gpu_until_a_neighbour_arrived_runs_time_sliced(th):
    # the exporter labels the first job's steps before the neighbour exclusive: its mode is the
    # one it shares in, not its first label (last week's time-slicing read "exclusive" otherwise)
    jobs = [
        SynthJob("a", "GPU-t", flat(40, 0.2), flat(40, GIB), sharing="time_slicing"),
        SynthJob("b", "GPU-t", flat(20, 0.1), flat(20, GIB), sharing="time_slicing", first_step=20),
    ]
    frame = synth.frame(jobs)
    alone = (frame["metric"] == "gpu_job_info") & (frame["job_id"] == "a")
    alone &= frame["timestamp"] < synth.START + 20 * synth.STEP
    frame.loc[alone, "sharing"] = "exclusive"
    p = one(frame, th)
    assert (p.loc["a", "sharing"], p.loc["b", "sharing"]) == ("time-slicing", "time-slicing")
