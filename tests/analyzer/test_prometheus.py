"""The PromQL path against a real Prometheus backfilled from a generated history."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request

import numpy as np
import pandas as pd
import pytest

from gpulens.analyzer import demand
from gpulens.analyzer.history import write_history
from gpulens.analyzer.pipeline import gpu_info_rows
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.recommend import recommend
from gpulens.analyzer.signals import ACTIVITY
from gpulens.analyzer.sources import files
from gpulens.analyzer.sources.promclient import PromClient, PromConfig
from gpulens.analyzer.sources.prometheus import (
    MAX_QUERY_CHARS,
    PromSource,
    _regex,
    chunk_jobs,
    signal_expr,
    stats_queries,
)
from gpulens.cli import main
from tests.analyzer import synth
from tests.analyzer.synth import SynthJob, flat, steady
from tests.support.procs import (
    PROMETHEUS_ENGINES,
    backfill_openmetrics,
    find_binary,
    free_port,
    prometheus,
    running,
    use_prometheus,
)

GIB = 1024**3
STEPS = 60


def assert_same_demand(a: demand.Demand | None, b: demand.Demand | None) -> None:
    """The per-bin series (`demand`) of two paths: the same bins, jobs and values."""
    assert a is not None and b is not None
    assert a.bin_s == b.bin_s
    for figure in ("sm", "dram"):
        x, y = getattr(a, figure), getattr(b, figure)
        assert sorted(x) == sorted(y), figure
        for job in x:
            assert x[job].first == y[job].first, (figure, job)
            assert np.allclose(x[job].values, y[job].values, rtol=1e-6, atol=1e-7), (figure, job)


def history_frame(start: float) -> pd.DataFrame:
    jobs = synth.seed_case(STEPS)
    jobs += [
        SynthJob(
            "mig-1",
            "GPU-mig-0001",
            steady(STEPS, 0.5, 0.1, seed=9),
            flat(STEPS, 8 * GIB),
            model="NVIDIA H100 80GB HBM3",
            sharing="mig",
            gpu_instance="7",
            mig_profile="1g.10gb",
        ),
        SynthJob(
            "mps-1",
            "GPU-mps-0001",
            steady(40, 0.2, 0.1, seed=3),
            flat(40, 4 * GIB),
            sharing="mps",
            first_step=10,
            # told 20 %, then the device plugin's 100/3: the cap in force is the last one measured
            thread_cap=np.concatenate([flat(20, 0.2), flat(20, 1 / 3)]),
        ),
        SynthJob(
            "mps-2", "GPU-mps-0001", steady(STEPS, 0.1, 0.1, seed=4), flat(STEPS, 3 * GIB), sharing="mps"
        ),
        SynthJob(
            "util-1",
            "GPU-util-0001",
            steady(STEPS, 0.3, 0.1, seed=5),
            flat(STEPS, GIB),
            activity_family="gpu_utilization_ratio",
            name="embed-batch",
        ),
    ]
    # a leak that restarts every 15 steps (a sawtooth): its restarts and per-cycle growth
    jobs.append(
        SynthJob(
            "saw-1",
            "GPU-saw-0001",
            steady(STEPS, 0.2, 0.05, seed=6),
            2 * GIB + (np.arange(STEPS) % 15) / 15 * 12 * GIB,
        )
    )
    # two MPS clients whose shares are all 0: the GPU's remainder is split equally between them
    jobs += [
        SynthJob(f"unlisted-{i}", "GPU-unlisted-0001", flat(STEPS, 0.0), flat(STEPS, GIB), sharing="mps")
        for i in (1, 2)
    ]
    # two MPS clients without per-process samples: only the device's SM activity, split between them
    jobs += [
        SynthJob(
            f"share-{i}", "GPU-share-0001", flat(30, 0.0), flat(30, GIB), sharing="mps", activity_family="x"
        )
        for i in (1, 2)
    ]
    # MPS clients of an older exporter: raw per-process utilization, no device figure nor remainder
    old = [
        SynthJob(
            f"old-mps-{i}",
            "GPU-old-0001",
            steady(STEPS, 0.1 * i, 0.05, seed=i),
            flat(STEPS, GIB),
            sharing="mps",
        )
        for i in (1, 2)
    ]
    # a model the catalog does not know, with its memory total: advice from memory alone
    old.append(
        SynthJob(
            "odd-1", "GPU-odd-0005", steady(STEPS, 0.1, 0.05, seed=8), flat(STEPS, GIB), model="NVIDIA Odd"
        )
    )
    # a request at 00:00 (alone in the clock hour ending then), none in the hour after
    quiet = flat(STEPS, 0.0)
    quiet[0] = 0.01
    old.append(SynthJob("quiet-1", "GPU-quiet-0001", quiet, flat(STEPS, GIB)))
    # mps-1 and mps-2 come with today's shares (device figure + remainder); the others without
    frame = pd.concat(
        [synth.with_device_shares(synth.frame(jobs, start=start)), synth.frame(old, start=start)]
    )
    frame = frame[frame["metric"] != "x"]
    odd = frame[(frame["metric"] == "gpu_info") & (frame["uuid"] == "GPU-odd-0005")]
    frame = pd.concat(
        [frame, odd.assign(metric="gpu_memory_total_bytes", value=24.0 * GIB)], ignore_index=True
    )
    device = frame[(frame["metric"] == "gpu_info") & (frame["uuid"] == "GPU-share-0001")]
    device = device.assign(metric="gpu_sm_active_ratio", model="", value=np.linspace(0.2, 0.8, len(device)))
    frame = pd.concat([frame, device], ignore_index=True)
    gap = (frame["metric"] == "gpu_sm_active_ratio") & (frame["uuid"] == "GPU-seed-0001")
    frame.loc[gap & (frame["timestamp"] == start + 600), "value"] = np.nan  # NaN sample
    return frame.drop(frame.index[gap & (frame["timestamp"] == start + 1200)])  # and a gap


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
def test_prometheus_path_gives_the_same_profiles_as_the_file_path(tmp_path, th, capsys, engine, monkeypatch):
    use_prometheus(engine, monkeypatch)
    promtool = find_binary("promtool")
    start = 1_767_225_600.0  # aligned to the step, as `gpulens simulate` aligns its histories
    write_history(tmp_path / "h", history_frame(start), {"step_s": synth.STEP})
    backfill_openmetrics(tmp_path / "h" / "metrics.om", tmp_path / "db", promtool)
    end = start + STEPS * synth.STEP
    window = 6 * 3600.0
    from_files = (
        files.profiles(files.load(str(tmp_path / "h"), window, end), th).set_index("job_id").sort_index()
    )
    # backfilled blocks carry no staleness markers: a lookback shorter than the step stops a series
    # from lingering after its last sample, as staleness does on live data
    with prometheus(tmp_path, [], storage=tmp_path / "db", extra_args=["--query.lookback-delta=30s"]) as api:
        source = PromSource(PromClient(PromConfig(api.base_url)), window, end, synth.STEP, chunk_size=3)
        from_prom = source.profiles(th).set_index("job_id").sort_index()
        gpu_rows = source.gpu_rows()
        code = main(
            [
                "recommend",
                "--prometheus",
                api.base_url,
                "--window",
                "6h",
                "--end",
                str(end),
                "--format",
                "json",
            ]
        )
        via_cli = json.loads(capsys.readouterr().out)
    assert code == 0
    assert_same_demand(demand.of(from_files), demand.of(from_prom))
    code = main(
        [
            "recommend",
            "--history",
            str(tmp_path / "h"),
            "--window",
            "6h",
            "--end",
            str(end),
            "--format",
            "json",
        ]
    )
    via_files = json.loads(capsys.readouterr().out)
    assert code == 0
    pick = (
        "job_id",
        "recommendation",
        "mig_profile",
        "mps_active_thread_percentage",
        "mps_pinned_memory_limit_bytes",
    )
    assert [[j[k] for k in pick] for j in via_cli["jobs"]] == [
        [j[k] for k in pick] for j in via_files["jobs"]
    ]
    assert via_cli["plan"]["gpus_freed"] == via_files["plan"]["gpus_freed"]
    # gpu_info's `gpu` label reaches emit on both paths: the same inventory rows, the same files
    assert sorted(gpu_rows, key=lambda r: r["uuid"]) == sorted(
        gpu_info_rows(files.load(str(tmp_path / "h"), window, end)), key=lambda r: r["uuid"]
    )
    assert {r["gpu"] for r in gpu_rows} >= {"0", "1", "2", "3"}
    assert via_cli["config"] == via_files["config"]
    assert via_cli["notes"] == via_files["notes"]
    assert list(from_prom.index) == list(from_files.index)
    for column in from_files.columns:
        a, b = from_files[column], from_prom[column]
        if a.dtype.kind == "f":
            assert np.allclose(a.astype(float), b.astype(float), rtol=1e-6, equal_nan=True), column
        else:
            assert list(a.astype(str)) == list(b.astype(str)), column
    assert from_prom.loc["seed-1", "coverage"] < 1.0
    assert from_prom.loc["util-1", "activity_signal"] == "utilization"
    assert from_prom.loc["util-1", "job_name"] == "embed-batch"  # the workload's name, on both paths
    assert from_prom.loc["mig-1", "mig_profile_now"] == "1g.10gb"
    assert from_prom.loc["share-1", "activity_signal"] == "sm_active_equal_split"
    assert from_prom.loc["mps-1", "activity_signal"] == "sm_active_share"
    assert from_prom.loc["mps-1", "mps_thread_cap_now_pct"] == pytest.approx(100 / 3)
    assert np.isnan(from_prom.loc["mps-2", "mps_thread_cap_now_pct"])  # none measured
    # mps-1's cap splits its GPU's remainder by room under it: its share often reaches its cap, so
    # it takes less than by share, and uncapped mps-2 more (the same on both paths, above)
    uncapped = history_frame(start)
    uncapped = uncapped[uncapped["metric"] != "gpu_job_mps_active_thread_ratio"]
    by_share = profiles_from_samples(uncapped, synth.STEP, th).set_index("job_id")
    assert from_prom.loc["mps-1", "sm_active_mean"] < by_share.loc["mps-1", "sm_active_mean"]
    assert from_prom.loc["mps-2", "sm_active_mean"] > by_share.loc["mps-2", "sm_active_mean"]
    assert from_prom.loc["old-mps-1", "activity_signal"] == "job_sm_utilization"
    assert from_prom.loc["odd-1", "device_memory_bytes"] == 24 * GIB
    assert from_prom.loc["share-1", "sm_active_max"] == pytest.approx(0.4)
    # shares plus the remainder (0.05 a step in `with_device_shares`) on the whole GPU's scale
    assert from_prom.loc["unlisted-1", "sm_active_mean"] == pytest.approx(0.025)
    assert (from_prom.loc["quiet-1", "active_hours"], from_prom.loc["quiet-1", "lifetime_hours"]) == (1, 2)
    assert from_prom.loc["saw-1", "memory_restarts"] == 3
    assert from_prom.loc["saw-1", "memory_period_s"] == 15 * synth.STEP
    assert from_prom.loc["saw-1", "memory_cycle_slope_bytes_per_hour"] == pytest.approx(48 * GIB)


def test_chunks_respect_both_the_job_count_and_the_matcher_length():
    jobs = [f"job-{i:05d}" for i in range(1000)]
    chunks = chunk_jobs(jobs, 200)
    assert [j for c in chunks for j in c] == jobs
    assert all(len(c) <= 200 and len(_regex(c)) <= 1800 for c in chunks)
    assert len(chunk_jobs(jobs[:10], 3)) == 4


def test_a_stats_query_past_the_length_limit_is_asked_in_parts_each_under_it():
    """A shared job's demand repeats the device matcher: its eight activity reductions of a full
    chunk would pass VictoriaMetrics' 16 KiB; each reduction is still asked, once."""
    uuids = _regex([f"GPU-{i:036d}" for i in range(4)])
    inner = signal_expr(ACTIVITY["shared"][0], _regex(["job-1", "job-2"]), "avg", uuids)
    reductions = {f"r{i}": "avg_over_time({sub})" for i in range(8)}
    queries = stats_queries(reductions, inner, "1h")
    assert len(" or ".join(queries)) > MAX_QUERY_CHARS and len(queries) > 1
    assert all(len(q) <= MAX_QUERY_CHARS for q in queries)
    assert sorted(s for q in queries for s in re.findall(r'"stat", "(r\d)"', q)) == sorted(reductions)


def test_job_ids_are_escaped_in_the_matcher():
    regex = _regex(["a.b", 'c"d'])
    assert regex == 'a\\\\.b|c\\"d'
    expr = signal_expr(ACTIVITY["exclusive"][0], regex, "avg")
    assert 'job_id=~"a\\\\.b|c\\"d"' in expr


@pytest.mark.slow
def test_victoriametrics_answers_the_same_queries(tmp_path, th):
    """Any PromQL-compatible store: VictoriaMetrics (Debian `victoria-metrics`, skipped if absent).

    VictoriaMetrics imports Prometheus text (ms timestamps) and has no lookback flag, so a series
    lingers one step past its end and gaps are filled: counts may differ by a sample, numbers
    slightly; jobs, signals and recommendations must not.
    """
    binary = shutil.which("victoria-metrics")
    if binary is None:
        pytest.skip("victoria-metrics is not installed (apt-get install victoria-metrics)")
    start = 1_767_225_600.0
    write_history(tmp_path / "h", history_frame(start), {"step_s": synth.STEP})
    end, window = start + STEPS * synth.STEP, 6 * 3600.0
    from_files = files.profiles(files.load(str(tmp_path / "h"), window, end), th)
    lines = []
    for line in (tmp_path / "h" / "metrics.om").read_text().splitlines():
        if not line.startswith("#"):
            head, stamp = line.rsplit(" ", 1)
            lines.append(f"{head} {int(float(stamp) * 1000)}")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [
        binary,
        f"-storageDataPath={tmp_path / 'vm'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=100y",
    ]
    with running(cmd, f"{base}/health", tmp_path / "vm.log"):
        request = urllib.request.Request(f"{base}/api/v1/import/prometheus", data="\n".join(lines).encode())
        urllib.request.urlopen(request, timeout=30).read()
        urllib.request.urlopen(f"{base}/internal/force_flush", timeout=30).read()
        source = PromSource(PromClient(PromConfig(base)), window, end, synth.STEP, chunk_size=3)
        from_vm = source.profiles(th)
    a, b = from_files.set_index("job_id").sort_index(), from_vm.set_index("job_id").sort_index()
    assert list(a.index) == list(b.index)
    assert list(a["activity_signal"]) == list(b["activity_signal"])
    assert (abs(a["samples"] - b["samples"]) <= 1).all()
    assert np.allclose(a["sm_active_mean"], b["sm_active_mean"], atol=0.02)
    assert np.allclose(a["memory_peak_bytes"], b["memory_peak_bytes"])
    assert list(recommend(a.reset_index(), th)["recommendation"]) == list(
        recommend(b.reset_index(), th)["recommendation"]
    )
