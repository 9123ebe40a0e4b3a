"""Multi-GPU jobs that would fit fewer GPUs are a finding ranked by GPU-hours (issue 31 item 7)."""

from __future__ import annotations

import pytest

from gpulens.analyzer.pipeline import analyze_profiles
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.thresholds import load_thresholds
from tests.analyzer import synth
from tests.analyzer.synth import GIB, SynthJob, flat, steady

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def th():
    return load_thresholds()


def analysis_of(jobs, th):
    profiles = profiles_from_samples(synth.frame(jobs), synth.STEP, th)
    return analyze_profiles(profiles, th, "synthetic", with_archetypes=False)


def eight_gpu_job(level: float, memory: float) -> SynthJob:
    uuids = [f"GPU-m{i}" for i in range(8)]
    return SynthJob(
        "wide", uuids[0], steady(120, level, 0.01), flat(120, memory), model=H100, extra_uuids=uuids[1:]
    )


def test_an_underused_eight_gpu_job_is_told_how_many_gpus_it_needs(th):
    recs = analysis_of([eight_gpu_job(0.15, 12 * GIB)], th).recs.set_index("job_id")
    row = recs.loc["wide"]
    assert row["gpus"] == 8
    assert row["finding"].startswith("multi-GPU job on 8 GPUs needs 2")
    assert "world size" in row["finding"]
    assert row["action"] == "fix"
    assert row["gpu_hours_recovered"] == pytest.approx(row["gpu_hours_allocated"] * 6 / 8, rel=1e-6)


def test_a_busy_multi_gpu_job_raises_no_finding(th):
    recs = analysis_of([eight_gpu_job(0.85, 12 * GIB)], th).recs.set_index("job_id")
    assert not recs.loc["wide", "finding"].startswith("multi-GPU")


def test_a_multi_gpu_job_whose_memory_needs_its_gpus_raises_no_finding(th):
    recs = analysis_of([eight_gpu_job(0.15, 70 * GIB)], th).recs.set_index("job_id")
    assert not recs.loc["wide", "finding"].startswith("multi-GPU")
