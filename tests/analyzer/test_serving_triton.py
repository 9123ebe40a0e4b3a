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
    assert 'nv_trt_llm_request_metrics{request_type="waiting"}' in row["reason"]
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


def test_a_pods_queue_share_counts_the_samples_in_which_any_of_its_models_queues():
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
    # 3 of 4 samples have a model queueing (not the 3/8 of both models' samples mixed)
    assert figures[("llm", "ensemble-0")].waiting_fraction == 0.75


def test_a_moved_triton_whose_mean_request_time_rose_is_slower_and_says_it_is_a_mean():
    th = load_thresholds()
    warnings = _slower({"serving_e2e_mean_s": 2.4}, {"serving_e2e_mean_s": 1.7}, th)
    assert len(warnings) == 1
    assert "mean request time" in warnings[0] and "not a p95" in warnings[0]
    assert "serving.max_latency_increase" in warnings[0]
    assert _slower({"serving_e2e_mean_s": 1.8}, {"serving_e2e_mean_s": 1.7}, th) == []


# --- TensorRT-LLM's own queue: in-flight batching leaves Triton's pending count at 0 ---------------

IN_FLIGHT = ("llm", "ifb-triton-0")  # pending always 0, the backend's waiting requests > 0 in 5 of 6
CALM = ("llm", "calm-triton-0")  # neither queue above 0
BACKEND_WAITING = {IN_FLIGHT: [2, 3, 0, 1, 4, 2], CALM: [0] * 6}
MODEL = {"model": "tensorrt_llm", "version": "1"}


def _in_flight_samples() -> list[tuple[str, dict[str, str], float, float]]:
    """(family, labels, timestamp, value) of two pods' scrapes, a family's samples together."""
    out = []
    for family, extra, values in (
        ("nv_inference_pending_request_count", {}, lambda waiting: [0] * len(waiting)),
        ("nv_trt_llm_request_metrics", {"request_type": "waiting"}, lambda waiting: waiting),
        ("nv_trt_llm_request_metrics", {"request_type": "active"}, lambda waiting: [8] * len(waiting)),
    ):
        for (ns, pod), waiting in BACKEND_WAITING.items():
            labels = {"namespace": ns, "pod": pod, **MODEL, **extra}
            out += [(family, labels, START + STEP * i, float(v)) for i, v in enumerate(values(waiting))]
    return out


def _in_flight_families() -> dict[str, pd.DataFrame]:
    rows: dict[str, list[dict[str, object]]] = {}
    for family, labels, timestamp, value in _in_flight_samples():
        rows.setdefault(family, []).append({"timestamp": timestamp, "value": value, **labels})
    return {family: pd.DataFrame(r).fillna("") for family, r in rows.items()}


def _pressure(figures: serving.PodServing) -> str:
    row = {
        "serving_server": figures.server.value,
        "serving_waiting_fraction": figures.waiting_fraction,
        "serving_preemptions": figures.preemptions,
    }
    return serving.pressure(row, load_thresholds())


def test_tensorrt_llm_waiting_requests_queue_a_triton_whose_pending_count_stays_zero():
    figures = serving.from_families(_in_flight_families())[IN_FLIGHT]
    assert figures.server is serving.Server.TRITON
    assert figures.waiting_fraction == pytest.approx(5 / 6)
    why = _pressure(figures)
    assert 'nv_trt_llm_request_metrics{request_type="waiting"}' in why
    assert "serving.max_waiting_fraction" in why


def test_a_triton_whose_backend_queues_keeps_its_pool_never_shrunk():
    figures = serving.from_families(_in_flight_families())[IN_FLIGHT]
    row = {
        "serving_server": "triton",
        "serving_waiting_fraction": figures.waiting_fraction,
        "serving_kv_peak": 0.2,  # a pool far from full: only its queue keeps it
    }
    assert serving.needs_its_pool(row, load_thresholds())


def test_a_triton_with_neither_queue_above_zero_is_under_no_pressure():
    figures = serving.from_families(_in_flight_families())[CALM]
    assert figures.waiting_fraction == 0.0
    assert _pressure(figures) == ""


def test_a_triton_queues_in_a_sample_where_either_its_pending_count_or_its_backend_waits():
    def frame(values: list[float], **extra: str) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "timestamp": [600.0 * i for i in range(len(values))],
                "value": values,
                "namespace": "llm",
                "pod": "mixed-0",
                **MODEL,
                **extra,
            }
        )

    figures = serving.from_families(
        {
            "nv_inference_pending_request_count": frame([1, 0, 0, 0]),
            "nv_trt_llm_request_metrics": frame([0, 0, 2, 0], request_type="waiting"),
        }
    )
    assert figures[("llm", "mixed-0")].waiting_fraction == 0.5  # samples 0 and 2, one each


def test_the_simulated_triton_publishes_its_backends_waiting_and_active_requests(history):
    requests = history.families["nv_trt_llm_request_metrics"]
    kinds = set(requests["request_type"].astype(str))
    assert kinds == {"waiting", "active"}
    waiting = requests[requests["request_type"].astype(str) == "waiting"]
    by_pod = waiting.groupby(waiting["pod"].astype(str))["value"].max()
    assert by_pod[QUEUEING[1]] > 0  # its load queues
    assert by_pod[QUIET[1]] == 0


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
def test_prometheus_path_reads_tensorrt_llms_queue_as_the_file_path_does(tmp_path, engine, monkeypatch):
    use_prometheus(engine, monkeypatch)
    lines, typed = [], set()
    for family, labels, timestamp, value in _in_flight_samples():
        if family not in typed:
            lines.append(f"# TYPE {family} gauge")
            typed.add(family)
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{family}{{{text}}} {value} {timestamp:.0f}")
    om = tmp_path / "metrics.om"
    om.write_text("\n".join([*lines, "# EOF", ""]))
    backfill_openmetrics(om, tmp_path / "db")
    end, window = START + 5 * STEP, 7 * STEP
    with prometheus(tmp_path, [], storage=tmp_path / "db", extra_args=["--query.lookback-delta=30s"]) as api:
        via_prom = serving.from_prometheus(PromClient(PromConfig(api.base_url)), window, STEP, end)
    via_files = serving.from_families(_in_flight_families())
    for pod in (IN_FLIGHT, CALM):
        assert via_prom[pod].server is serving.Server.TRITON
        assert via_prom[pod].waiting_fraction == pytest.approx(via_files[pod].waiting_fraction, rel=1e-9)
    assert _pressure(via_prom[IN_FLIGHT]) and not _pressure(via_prom[CALM])


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
