"""The analyzer on a distributed TSDB: a Thanos querier over two Prometheus shards, each holding
half of a week with its own evaluation of the analyzer's recording rules, gives the recommendations
one Prometheus holding the whole week gives, on the recording-rule path and on the raw path.

Thanos is built from its Go module by `make thanos` (the suite's `make test` runs it); without the
binary the test skips locally and fails in CI.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpulens.analyzer.history import write_history
from gpulens.analyzer.pipeline import analyze_profiles
from gpulens.analyzer.sources import rules
from gpulens.analyzer.sources.promclient import PromClient, PromConfig
from gpulens.analyzer.sources.prometheus import Aggregation, PromSource
from gpulens.devtools.bench import tsdb
from gpulens.devtools.bench.analyzer_bench import (
    Cluster,
    backfill,
    job_id,
    make_cluster,
    write_openmetrics_blocks,
)
from tests.support.procs import REPO_ROOT, find_binary, unavailable

STEP = 300
LOOKBACK = "299s999ms"  # just under the step: backfilled blocks carry no staleness markers
JOBS = 96  # 12 GPUs, about 8 jobs each back to back over the week
RECOMMENDATION = (
    "recommendation",
    "mig_profile",
    "mps_active_thread_percentage",
    "mps_pinned_memory_limit_bytes",
)


def with_thread_cap(cluster: Cluster, at: float, out: Path) -> str:
    """The history of one MPS thread cap (`gpu_job_mps_active_thread_ratio`) for the job that runs
    on the cluster's first GPU across `at`: 20 % before it, 100/3 % from then on. Returns the job."""
    times = cluster.timestamps()
    job = int(cluster.job_of[0, int(np.searchsorted(times, at))])
    steps = times[cluster.job_of[0] == job]
    labels = {"instance": "node-0000:9400", "gpu": "0", "uuid": "GPU-00000000-bench", "gpu_instance": ""}
    frame = pd.DataFrame(
        {
            "timestamp": steps,
            "metric": "gpu_job_mps_active_thread_ratio",
            "value": np.where(steps < at, 0.2, 1 / 3),
            "job_id": job_id(job),
            **labels,
        }
    )
    write_history(out, frame, {"step_s": float(cluster.step_s)})
    return job_id(job)


def thanos() -> str:
    binary = tsdb.thanos_binary()
    if binary is None:
        unavailable(f"thanos {tsdb.THANOS_VERSION} is not built (make thanos)")
    return str(binary)


def with_rules(raw: list[Path], db: Path, start: float, end: float, workdir: Path) -> None:
    """`db` = these raw blocks + the analyzer rules evaluated over [start, end] by a Prometheus on them."""
    for block in raw:
        shutil.copytree(block, db / block.name)
    with tsdb.prometheus(db, LOOKBACK, workdir / f"{db.name}-backfill.log", compaction=False) as base:
        blocks = tsdb.backfill_rules(
            base, rules.render(f"{STEP}s", tsdb.BACKFILLED), start, end, workdir / f"{db.name}-rules", STEP
        )
    tsdb.move_blocks(blocks, db)


def profiles(base: str, aggregation: Aggregation, end: float, th) -> tuple[pd.DataFrame, PromSource]:
    source = PromSource(
        PromClient(PromConfig(base)),
        7 * 86400.0,
        end,
        STEP,
        aggregation=aggregation,
        step_given=False,
        log=None,
    )
    return source.profiles(th).set_index("job_id").sort_index(), source


def assert_same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.index) == list(b.index)
    for column in a.columns:
        if a[column].dtype.kind == "f":
            assert np.allclose(a[column].astype(float), b[column].astype(float), rtol=1e-9, equal_nan=True), (
                column
            )
        else:
            assert list(a[column].astype(str)) == list(b[column].astype(str)), column


def recommendations(frame: pd.DataFrame, th) -> pd.DataFrame:
    return analyze_profiles(frame.reset_index(), th, "x", with_archetypes=False).recs[
        ["job_id", *RECOMMENDATION]
    ]


@pytest.mark.slow
def test_thanos_over_two_shards_gives_the_answers_of_one_prometheus(tmp_path, th):
    thanos()
    find_binary("promtool")
    cluster = make_cluster(JOBS, STEP, seed=3)
    backfill(write_openmetrics_blocks(cluster, tmp_path / "om"), tmp_path / "raw")
    start, end = cluster.start, cluster.end + STEP
    mid = int((start + end) / 2 // tsdb.BLOCK_S * tsdb.BLOCK_S)  # a block boundary inside the week
    # one job's MPS thread cap, changed in the second shard's half: the cap in force is that one
    capped = with_thread_cap(cluster, mid + 10 * STEP, tmp_path / "caps")
    tsdb.backfill_openmetrics(tmp_path / "caps" / "metrics.om", tmp_path / "raw")
    raw = sorted(p for p in (tmp_path / "raw").iterdir() if p.is_dir())
    first = [b for b in raw if tsdb.block_range_ms(b)[1] <= mid * 1000]
    second = [b for b in raw if tsdb.block_range_ms(b)[0] >= mid * 1000]
    assert len(first) + len(second) == len(raw) and first and second
    # each shard evaluates the rules over its own half, as each Prometheus would have live
    with_rules(raw, tmp_path / "single", start, end, tmp_path)
    with_rules(first, tmp_path / "shard-a", start, mid - 1, tmp_path)
    with_rules(second, tmp_path / "shard-b", mid, end, tmp_path)

    with tsdb.prometheus(tmp_path / "single", LOOKBACK, tmp_path / "single.log", compaction=False) as base:
        single_rules, _ = profiles(base, Aggregation.RULES, cluster.end, th)
        single_raw, _ = profiles(base, Aggregation.RAW, cluster.end, th)
    shards = [tmp_path / "shard-a", tmp_path / "shard-b"]
    with tsdb.thanos_cluster(shards, LOOKBACK, tmp_path) as (querier, members):
        assert len(members) == 2
        via_rules, auto = profiles(querier, Aggregation.AUTO, cluster.end, th)
        via_raw, _ = profiles(querier, Aggregation.RAW, cluster.end, th)

    assert auto.used is Aggregation.RULES and auto.used_step_s == STEP
    assert len(via_rules) == JOBS
    # jobs running across the split have samples in both shards: the querier merges them
    straddling = via_rules[(via_rules["start"] < mid) & (via_rules["end"] >= mid)]
    assert len(straddling) > 0
    assert_same(single_rules, via_rules)
    assert_same(single_raw, via_raw)
    for frame in (single_rules, via_rules, via_raw):
        assert frame.loc[capped, "mps_thread_cap_now_pct"] == pytest.approx(100 / 3)
        assert frame["mps_thread_cap_now_pct"].drop(capped).isna().all()
    expected = recommendations(single_raw, th)
    for frame in (single_rules, via_rules, via_raw):
        assert recommendations(frame, th).equals(expected)


def test_make_thanos_builds_the_version_the_tests_look_for():
    makefile = (REPO_ROOT / "Makefile").read_text()
    match = re.search(r"^THANOS_VERSION := (\S+)$", makefile, re.M)
    assert match and match.group(1) == tsdb.THANOS_VERSION
    assert "thanos-$(THANOS_VERSION)" in makefile
    assert str(tsdb.TOOLS_DIR / "bin").endswith("gpulens-tools/bin")
