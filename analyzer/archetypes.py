"""Workload archetypes: k-means over standardised profile features, named from the centroids.

Deterministic (fixed seed, fixed k search) so a weekly report does not reshuffle names between
runs. k is chosen by silhouette score among 2..`max_clusters`; fewer than `min_jobs` usable jobs
means no clustering (the report says so instead of inventing groups).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpulens.analyzer.thresholds import Thresholds


@dataclass
class Archetypes:
    """Per-job archetype names and a summary table (name, jobs, GPU-hours, centroid features)."""

    labels: pd.Series  # index = job_id
    summary: pd.DataFrame
    skipped_reason: str = ""


def features(profiles: pd.DataFrame) -> pd.DataFrame:
    """Feature matrix indexed by job_id; missing DRAM/tensor signals count as 0 (not measured)."""
    frame = profiles.set_index("job_id")
    out = pd.DataFrame(index=frame.index)
    for name in ("sm_active_mean", "sm_active_p95", "idle_fraction", "burstiness"):
        out[name] = frame[name]
    out["memory_fraction"] = frame["memory_peak_bytes"] / frame["device_memory_bytes"]
    out["dram_active_p95"] = frame["dram_active_p95"].fillna(0.0)
    out["tensor_active_mean"] = frame["tensor_active_mean"].fillna(0.0)
    return out.replace([np.inf, -np.inf], np.nan).dropna()


def name_for(centroid: pd.Series) -> str:
    """A human name for a centroid (original units), most specific rule first."""
    c = centroid
    if c["idle_fraction"] >= 0.8 and c["sm_active_p95"] < 0.3:
        return "idle notebook"
    if c["sm_active_p95"] >= 0.6 and (c["tensor_active_mean"] >= 0.2 or c["sm_active_mean"] >= 0.5):
        return "compute-bound training"
    if c["dram_active_p95"] >= 0.5 and c["sm_active_mean"] < 0.5:
        return "memory-bandwidth-bound"
    if c["burstiness"] >= 1.0 or (c["idle_fraction"] >= 0.4 and c["sm_active_p95"] >= 0.3):
        return "bursty inference"
    if c["memory_fraction"] >= 0.6 and c["sm_active_mean"] < 0.3:
        return "memory-bound (large memory, light compute)"
    if c["sm_active_mean"] < 0.3:
        return "light steady service"
    return "steady compute"


def _unique_names(bases: dict[int, str], centroids: dict[int, pd.Series]) -> dict[int, str]:
    """Clusters sharing a name are told apart by activity: light ... heavy (numbered beyond three)."""
    names: dict[int, str] = {}
    for base in set(bases.values()):
        same = sorted(
            (k for k, b in bases.items() if b == base), key=lambda k: centroids[k]["sm_active_mean"]
        )
        if len(same) == 1:
            names[same[0]] = base
            continue
        tags = ["light", "heavy"] if len(same) == 2 else ["light", "medium", "heavy"]
        for rank, k in enumerate(same):
            names[k] = f"{base} ({tags[rank]})" if len(same) <= 3 else f"{base} ({rank + 1})"
    return names


# The silhouette compares every pair of jobs (quadratic: ~20 s of CPU at 10,000 jobs, minutes at
# 50,000); above this many jobs it is estimated on a fixed-seed sample of this size, which keeps
# the choice of k deterministic and leaves smaller fleets' archetypes exactly as before.
SILHOUETTE_SAMPLE = 4000


def _silhouette_sampling(jobs: int, seed: int) -> dict[str, int]:
    if jobs <= SILHOUETTE_SAMPLE:
        return {}
    return {"sample_size": SILHOUETTE_SAMPLE, "random_state": seed}


def cluster(profiles: pd.DataFrame, th: Thresholds) -> Archetypes:
    """Cluster usable jobs; jobs without features get no archetype."""
    # scikit-learn loads in about a second: only runs that cluster pay for it
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score
    from sklearn.preprocessing import StandardScaler

    feats = features(profiles)
    min_jobs = th.archetypes.min_jobs
    if len(feats) < min_jobs:
        reason = f"{len(feats)} jobs with complete profiles (< {min_jobs}): archetypes skipped"
        return Archetypes(pd.Series(dtype=str), pd.DataFrame(), reason)
    scaled = StandardScaler().fit_transform(feats.to_numpy())
    seed = th.archetypes.seed
    best: tuple[float, np.ndarray] | None = None
    unique_rows = len(np.unique(np.round(scaled, 9), axis=0))
    for k in range(2, th.archetypes.max_clusters + 1):
        if k >= unique_rows:
            break
        labels = KMeans(n_clusters=k, random_state=seed, n_init=10).fit_predict(scaled)
        score = silhouette_score(scaled, labels, **_silhouette_sampling(len(scaled), seed))
        if best is None or score > best[0] + 1e-9:
            best = (score, labels)
    labels = np.zeros(len(feats), dtype=int) if best is None else best[1]
    centroids = {k: feats[labels == k].mean() for k in sorted(set(labels))}
    names = _unique_names({k: name_for(c) for k, c in centroids.items()}, centroids)
    series = pd.Series([names[k] for k in labels], index=feats.index, name="archetype")
    hours = profiles.set_index("job_id")["gpu_hours_allocated"]
    summary = (
        feats.assign(archetype=series, gpu_hours=hours.reindex(feats.index))
        .groupby("archetype")
        .agg(
            jobs=("sm_active_mean", "size"),
            gpu_hours=("gpu_hours", "sum"),
            sm_active_mean=("sm_active_mean", "mean"),
            sm_active_p95=("sm_active_p95", "mean"),
            idle_fraction=("idle_fraction", "mean"),
            memory_fraction=("memory_fraction", "mean"),
        )
        .sort_values("gpu_hours", ascending=False)
        .reset_index()
    )
    return Archetypes(series, summary)
