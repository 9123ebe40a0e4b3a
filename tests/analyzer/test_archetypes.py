"""Archetypes: deterministic clusters with human names, skipped for tiny inputs."""

from __future__ import annotations

from gpulens.analyzer import archetypes
from gpulens.analyzer.archetypes import cluster
from gpulens.analyzer.profile import profiles_from_samples
from tests.analyzer import synth
from tests.analyzer.synth import SynthJob, flat, steady

GIB = 1024**3


def fleet():
    jobs = []
    for i in range(5):
        jobs.append(SynthJob(f"idle{i}", f"GPU-i{i}", flat(60, 0.0), flat(60, 2 * GIB)))
        jobs.append(SynthJob(f"train{i}", f"GPU-t{i}", steady(60, 0.9, 0.02, seed=i), flat(60, 30 * GIB)))
        bursty = steady(60, 0.0, 0.0)
        bursty[i::6] = 0.8
        jobs.append(SynthJob(f"inf{i}", f"GPU-b{i}", bursty, flat(60, 6 * GIB)))
    return jobs


def test_tiny_inputs_are_skipped_with_a_reason(th):
    profiles = profiles_from_samples(synth.frame(synth.seed_case()), synth.STEP, th)
    result = cluster(profiles, th)
    assert result.skipped_reason.startswith("4 jobs")
    assert result.summary.empty


def clustered_twice_with_their_names(th):
    """Two clusterings of `fleet()`, checked equal and named after what each group does."""
    profiles = profiles_from_samples(synth.frame(fleet()), synth.STEP, th)
    first, second = cluster(profiles, th), cluster(profiles, th)
    assert first.labels.equals(second.labels)
    assert first.labels[["idle0", "train0", "inf0"]].tolist() == [
        "idle notebook",
        "compute-bound training",
        "bursty inference",
    ]
    return first


def test_clusters_are_deterministic_and_named(th):
    first = clustered_twice_with_their_names(th)
    assert set(first.summary["jobs"]) == {5}


def test_above_the_silhouette_sample_size_clusters_stay_deterministic_and_named(th, monkeypatch):
    # the silhouette is quadratic in the jobs; past SILHOUETTE_SAMPLE it is estimated on a
    # fixed-seed sample, which must still pick the same groups for a clearly separated fleet
    monkeypatch.setattr(archetypes, "SILHOUETTE_SAMPLE", 9)
    clustered_twice_with_their_names(th)
