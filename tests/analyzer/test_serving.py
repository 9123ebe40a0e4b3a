"""Inference servers (vLLM, SGLang) read through their own metrics (issue 31 item 5).

The shipped `serving-llm` scenario runs a low-traffic vLLM server whose KV pool is mostly empty and
an SGLang server that queues and retracts requests; `gpulens simulate` records both servers' series
labelled with their pod, as a Prometheus pod scrape would.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from gpulens.analyzer import serving
from gpulens.analyzer.pipeline import analyze_history
from gpulens.analyzer.sources import files
from gpulens.analyzer.sources.promclient import PromClient, PromConfig
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.sim.history import simulate
from tests.support.procs import (
    PROMETHEUS_ENGINES,
    backfill_openmetrics,
    prometheus,
    use_prometheus,
)

VLLM = "llm/chat-vllm-6f7b9c8d5-q4x2z"
SGLANG = "llm/rag-sglang-0"
TRITON = "vision/detect-triton-7c9d8b6f5-x7k2p"  # no server metrics scraped
GIB = 1024**3
STEP = 600.0
START = 1_767_225_600.0  # aligned to the step


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    out = tmp_path_factory.mktemp("serving") / "h"
    simulate("serving-llm", duration_s=86400, out=out, step_s=600, dcgm=False)
    return files.load(str(out))


@pytest.fixture(scope="module")
def recs(history):
    return analyze_history(history, load_thresholds(), with_archetypes=False).recs.set_index("job_id")


def test_the_history_joins_each_server_to_its_pod(history):
    table = serving.from_families(history.families or {})
    vllm = table[("llm", "chat-vllm-6f7b9c8d5-q4x2z")]
    assert vllm.server is serving.Server.VLLM
    assert vllm.kv_pool_bytes == 50 * GIB
    assert 0 < vllm.kv_peak <= 0.12
    assert table[("llm", "rag-sglang-0")].server is serving.Server.SGLANG


def test_a_low_traffic_server_is_never_reclaimed(recs):
    row = recs.loc[VLLM]
    assert row["idle_fraction"] >= load_thresholds().reclaim.min_idle_fraction  # looks idle ...
    assert row["recommendation"] != "reclaim"  # ... but it serves


def test_a_quiet_server_without_its_metrics_is_active_every_hour_so_shared_not_reclaimed(recs):
    th = load_thresholds()
    row = recs.loc[TRITON]
    assert row["serving_server"] == ""  # nobody scrapes its metrics: only its activity says it serves
    assert row["sm_active_p50"] <= th.reclaim.serving_min_median  # a request now and then ...
    assert row["idle_fraction"] >= th.reclaim.min_idle_fraction
    hours = int(row["lifetime_hours"])  # a day: 24 clock hours, 25 when it starts off the hour
    assert hours in (24, 25) and row["active_hours"] == hours  # ... in every hour of the day
    assert row["recommendation"] in ("time-slicing", "mps", "mig")
    assert f"active in {hours} of {hours} hours" in row["reason"]
    assert "never reclaimed, may share" in row["reason"]


def test_a_low_traffic_server_is_sized_from_its_kv_use_with_the_flag_value(recs):
    row = recs.loc[VLLM]
    # non-KV 18 GiB (68 held - 50 pool) + at most 12 % of the pool x 1.25, plus memory headroom
    assert row["memory_need_bytes"] < 28 * GIB < row["memory_peak_bytes"]
    assert row["serving_floor_bytes"] <= 18 * GIB + 0.12 * 50 * GIB + 1
    assert "serving (vllm)" in row["reason"]
    assert "--gpu-memory-utilization 0." in row["reason"]
    assert "--kv-cache-memory-bytes" in row["reason"]


def test_a_queueing_server_is_never_shrunk(recs):
    row = recs.loc[SGLANG]
    assert row["recommendation"] == "exclusive"
    assert "never shrunk" in row["reason"] and "sglang:num_queue_reqs" in row["reason"]


def test_preemptions_alone_keep_a_server_from_shrinking():
    th = load_thresholds()
    row = {"serving_server": "vllm", "serving_waiting_fraction": 0.0, "serving_preemptions": 3.0}
    assert "vllm:num_preemptions_total" in serving.pressure(row, th)
    assert serving.pressure({**row, "serving_preemptions": 0.0}, th) == ""


def test_without_the_pools_bytes_a_server_is_sized_from_what_it_holds():
    th = load_thresholds()
    row = {
        "serving_server": "vllm",
        "serving_kv_peak": 0.1,
        "serving_kv_pool_bytes": math.nan,  # pool sized by --gpu-memory-utilization: bytes unknown
        "memory_peak_bytes": 70.0 * GIB,
    }
    assert serving.kv_need(row, th) is None
    assert serving.kv_need({**row, "serving_kv_pool_bytes": 50.0 * GIB}, th) is not None


def test_an_sglang_server_is_sized_from_what_it_holds_as_it_publishes_no_pool_bytes(recs):
    # SGLang publishes its KV pool in tokens (sglang:max_total_num_tokens), never in bytes
    row = recs.loc[SGLANG]
    assert row["memory_need_bytes"] >= row["memory_peak_bytes"]
    assert "serving (sglang): sized from what it holds, not its KV use" in row["reason"]
    assert "sglang:max_total_num_tokens" in row["reason"]


def test_a_server_that_looks_memory_saturated_is_told_its_own_knob_not_allocator_settings():
    hint = serving.preallocation_hint({"serving_server": "sglang", "serving_kv_peak": 0.08})
    assert "--mem-fraction-static" in hint and "peaked at 8% of its pool" in hint
    assert "PYTORCH_CUDA_ALLOC_CONF" not in hint
    assert "kv_cache_free_gpu_mem_fraction" in serving.preallocation_hint({"serving_server": "triton"})
    assert serving.preallocation_hint({"serving_server": ""}) == ""  # no server: the general advice


def test_the_flag_value_gives_the_footprint_on_the_target():
    need = serving.KvNeed(serving.Server.VLLM, 18 * GIB, 50 * GIB, 0.12, 0.25)
    value = need.flag_value(40 * GIB)
    assert value * 40 * GIB >= need.footprint > (value - 0.01) * 40 * GIB


def test_the_headroom_threshold_is_named_and_used():
    th = load_thresholds()
    wider = dataclasses.replace(th, serving=dataclasses.replace(th.serving, kv_headroom_ratio=1.0))
    row = {
        "serving_server": "sglang",
        "serving_kv_peak": 0.5,
        "serving_kv_pool_bytes": 40.0 * GIB,
        "memory_peak_bytes": 60.0 * GIB,
    }
    assert serving.kv_need(row, wider).footprint > serving.kv_need(row, th).footprint
    assert "serving.kv_headroom_ratio" in serving.kv_need(row, th).reason()


def test_each_server_records_its_latency_histograms(history):
    table = serving.from_families(history.families or {})
    for pod in (("llm", "chat-vllm-6f7b9c8d5-q4x2z"), ("llm", "rag-sglang-0")):
        # p95 of a log-normal around the base medians, read through the servers' own buckets
        assert 1.6 < table[pod].e2e_p95_s < 10 and 0.15 < table[pod].ttft_p95_s < 1


def test_the_quantile_interpolates_within_its_bucket_as_prometheus_does():
    buckets = {0.5: 10.0, 1.0: 50.0, 2.0: 90.0, math.inf: 100.0}
    assert serving.histogram_quantile(0.5, buckets) == pytest.approx(0.5 + 0.5 * (50 - 10) / 40)
    assert serving.histogram_quantile(0.95, buckets) == 2.0  # in the +Inf bucket: the highest bound
    assert serving.histogram_quantile(0.05, buckets) == pytest.approx(0.25)  # the first starts at 0
    assert math.isnan(serving.histogram_quantile(0.95, {0.5: 1.0, 1.0: 2.0}))  # no +Inf bucket
    assert math.isnan(serving.histogram_quantile(0.95, {1.0: 0.0, math.inf: 0.0}))  # nothing observed


# --- the PromQL path gives the same figures -----------------------------------------------------


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    out = tmp_path_factory.mktemp("serving-aligned") / "h"
    simulate("serving-llm", duration_s=86400, out=out, step_s=STEP, start=START, dcgm=False)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
def test_prometheus_path_gives_the_same_serving_figures(aligned, tmp_path, engine, monkeypatch):
    use_prometheus(engine, monkeypatch)
    backfill_openmetrics(aligned / "metrics.om", tmp_path / "db")
    end, window = START + 86400 - STEP, 25 * 3600.0  # the whole history on both paths
    via_files = serving.from_families(files.load(str(aligned), window, end).families or {})
    # backfilled blocks carry no staleness markers: a lookback shorter than the step stops a series
    # from lingering after its last sample
    with prometheus(tmp_path, [], storage=tmp_path / "db", extra_args=["--query.lookback-delta=30s"]) as api:
        via_prom = serving.from_prometheus(PromClient(PromConfig(api.base_url)), window, STEP, end)
    assert set(via_prom) == set(via_files) == {("llm", "chat-vllm-6f7b9c8d5-q4x2z"), ("llm", "rag-sglang-0")}
    for pod, files_figures in via_files.items():
        prom_figures = via_prom[pod]
        assert prom_figures.server is files_figures.server
        for figure in (
            "kv_peak",
            "waiting_fraction",
            "preemptions",
            "kv_pool_bytes",
            "e2e_p95_s",
            "ttft_p95_s",
        ):
            a, b = getattr(prom_figures, figure), getattr(files_figures, figure)
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9), (pod, figure, a, b)
        assert files_figures.e2e_p95_s > 0 and files_figures.preemptions >= 0
