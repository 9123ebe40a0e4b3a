"""Triton Inference Server (TensorRT-LLM backend) read through its own metrics (issue 31 item 5).

tests/data/serving-triton.yaml runs a quiet Triton server and one whose pending request count is
above zero all day; `gpulens simulate` records Triton's default series for their pods (pending
requests, successful requests, cumulative request time, the backend's KV block gauges), labelled
with `model` and `version` as Triton labels them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from gpulens.analyzer import frames, serving
from gpulens.analyzer.changes import finding
from gpulens.analyzer.pipeline import analyze_history
from gpulens.analyzer.sources import files
from gpulens.analyzer.sources.promclient import PromClient, PromConfig
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.analyzer.weekly import _slower
from gpulens.sim.history import simulate
from tests.support.procs import (
    PROMETHEUS_ENGINES,
    backfill_openmetrics,
    prometheus,
    use_prometheus,
)

SCENARIO = str(Path(__file__).resolve().parents[1] / "data" / "serving-triton.yaml")
QUIET = ("llm", "chat-triton-5b9d7c6f4-r8t2w")
QUEUEING = ("llm", "rag-triton-0")
STEP = 600.0
START = 1_767_225_600.0  # aligned to the step


def _job(pod: tuple[str, str]) -> str:
    return "/".join(pod)


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    out = tmp_path_factory.mktemp("serving-triton") / "h"
    simulate(SCENARIO, duration_s=86400, out=out, step_s=STEP, start=START, dcgm=False)
    return out


@pytest.fixture(scope="module")
def history(aligned):
    return files.load(str(aligned))


@pytest.fixture(scope="module")
def table(history):
    return serving.from_families(history.families or {})


@pytest.fixture(scope="module")
def recs(history):
    return analyze_history(history, load_thresholds(), with_archetypes=False).recs.set_index("job_id")


def test_tritons_series_join_each_server_to_its_pod(table):
    assert set(table) == {QUIET, QUEUEING}
    assert {figures.server for figures in table.values()} == {serving.Server.TRITON}


def test_kv_use_is_the_peak_of_used_over_max_blocks(table):
    # kv_peak 0.1 of the pool at the load's daily peak, in whole blocks
    assert table[QUIET].kv_peak == pytest.approx(0.1, abs=0.001)
    assert math.isnan(table[QUIET].kv_pool_bytes)  # blocks, never their bytes


def test_a_triton_pod_with_a_few_requests_all_day_is_never_reclaimed(recs):
    row = recs.loc[_job(QUIET)]
    assert row["idle_fraction"] >= load_thresholds().reclaim.min_idle_fraction  # looks idle ...
    assert row["recommendation"] != "reclaim"  # ... but it serves
    assert "its pod publishes triton server metrics" in row["reason"]


def test_a_triton_pod_whose_queue_is_non_empty_most_of_the_time_is_never_shrunk(recs):
    row = recs.loc[_job(QUEUEING)]
    assert row["serving_waiting_fraction"] > load_thresholds().serving.max_waiting_fraction
    assert row["recommendation"] == "exclusive"
    assert "never shrunk" in row["reason"]
    assert "nv_inference_pending_request_count" in row["reason"]
    assert "serving.max_waiting_fraction" in row["reason"]


def test_a_triton_server_is_sized_from_what_it_holds_and_says_why(recs):
    row = recs.loc[_job(QUIET)]
    assert row["memory_need_bytes"] >= row["memory_peak_bytes"]  # its KV use cannot size it
    assert "TensorRT-LLM publishes its KV pool in blocks" in row["reason"]


def test_a_quiet_triton_holding_its_pre_allocated_pool_is_told_to_lower_its_own_fraction(recs):
    row = recs.loc[_job(QUIET)]
    assert row["false_saturation"]
    assert "kv_cache_free_gpu_mem_fraction" in row["false_saturation_hint"]
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in row["false_saturation_hint"]


def test_a_queueing_triton_whose_pool_is_full_is_neither_false_saturation_nor_a_memory_hog(recs):
    row = recs.loc[[_job(QUEUEING)]]
    assert not row["false_saturation"].iloc[0]
    assert finding(next(frames.rows(row.reset_index())), load_thresholds()) == ""


def test_tritons_latency_is_its_mean_request_time_not_a_p95(table):
    figures = table[QUIET]
    # log-normal latencies around a 1.6 s median: a mean a little above it
    assert 1.6 < figures.e2e_mean_s < 2.0
    assert math.isnan(figures.e2e_p95_s) and math.isnan(figures.ttft_p95_s)  # no histogram by default


def test_a_pods_queue_share_is_its_most_queued_models():
    def frame(model: str, values: list[float]) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "timestamp": [600.0 * i for i in range(len(values))],
                "value": values,
                "namespace": "llm",
                "pod": "ensemble-0",
                "model": model,
                "version": "1",
            }
        )

    pending = pd.concat([frame("ensemble", [0, 0, 0, 0]), frame("tensorrt_llm", [1, 1, 0, 1])])
    figures = serving.from_families({"nv_inference_pending_request_count": pending})
    assert figures[("llm", "ensemble-0")].waiting_fraction == 0.75  # not the 3/8 of both mixed


def test_a_moved_triton_whose_mean_request_time_rose_is_slower_and_says_it_is_a_mean():
    th = load_thresholds()
    warnings = _slower({"serving_e2e_mean_s": 2.4}, {"serving_e2e_mean_s": 1.7}, th)
    assert len(warnings) == 1
    assert "mean request time" in warnings[0] and "not a p95" in warnings[0]
    assert "serving.max_latency_increase" in warnings[0]
    assert _slower({"serving_e2e_mean_s": 1.8}, {"serving_e2e_mean_s": 1.7}, th) == []


# --- the PromQL path gives the same figures -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
def test_prometheus_path_gives_the_same_triton_figures(aligned, tmp_path, engine, monkeypatch):
    use_prometheus(engine, monkeypatch)
    backfill_openmetrics(aligned / "metrics.om", tmp_path / "db")
    end, window = START + 86400 - STEP, 25 * 3600.0  # the whole history on both paths
    via_files = serving.from_families(files.load(str(aligned), window, end).families or {})
    # backfilled blocks carry no staleness markers: a lookback shorter than the step stops a series
    # from lingering after its last sample
    with prometheus(tmp_path, [], storage=tmp_path / "db", extra_args=["--query.lookback-delta=30s"]) as api:
        via_prom = serving.from_prometheus(PromClient(PromConfig(api.base_url)), window, STEP, end)
    assert set(via_prom) == set(via_files) == {QUIET, QUEUEING}
    for pod, files_figures in via_files.items():
        prom_figures = via_prom[pod]
        assert prom_figures.server is files_figures.server is serving.Server.TRITON
        for figure in ("kv_peak", "waiting_fraction", "e2e_mean_s"):
            a, b = getattr(prom_figures, figure), getattr(files_figures, figure)
            assert a == pytest.approx(b, rel=1e-9), (pod, figure, a, b)
