"""Every shipped scenario and both real traces give a sound analysis (tests/analyzer/invariants.py).

Sound: no recommendation below observed peak memory, no compute cap below a latency-sensitive
job's p99 demand, never more GPUs of a model than the fleet has (freed per model >= 0), and every
GPU of the inventory counted, those that ran no job included.
"""

from __future__ import annotations

import pytest

from gpulens.analyzer.history import read_history
from gpulens.analyzer.importers import import_trace
from gpulens.analyzer.pipeline import Analysis, analyze_history
from gpulens.analyzer.sources import files
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.catalog import get_model
from gpulens.sim.history import simulate
from gpulens.sim.scenariofile import BUILTIN_DIR, load_scenario
from tests.analyzer.invariants import violations
from tests.analyzer.test_traces import GENAI, V2023

GIB = 1024**3
SCENARIOS = sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_shipped_scenario_is_sound(scenario, tmp_path, th):
    simulate(scenario, duration_s=3600, out=tmp_path / scenario, step_s=120, seed=0)
    history = read_history(tmp_path / scenario)
    inventory = files.fleet(files.load(str(tmp_path / scenario)))
    analysis = analyze_history(history, th, with_archetypes=False)
    assert violations(analysis, inventory=len(inventory)) == []
    assert len(inventory) == len(load_scenario(scenario).gpus)  # every GPU of the node, idle ones too


@pytest.fixture(scope="module")
def dgx(tmp_path_factory) -> Analysis:
    path = tmp_path_factory.mktemp("dgx") / "history"
    simulate("dgx-h100", duration_s=3600, out=path, step_s=120, seed=1)
    return analyze_history(read_history(path), load_thresholds(), with_archetypes=False)


def test_the_idle_gpu_of_dgx_h100_is_counted(dgx):
    # GPU 7 ran no job: it is in "before". (It is no longer freed: the leaking notebook stays alone,
    # and the three MPS clients, each capped with headroom, need two GPUs where they share one now.)
    assert dgx.plan.gpus_before == 8
    assert dgx.plan.gpus_after + dgx.plan.gpus_freed == 8


def test_the_leaking_notebook_of_dgx_h100_is_a_leak_to_fix(dgx):
    recs = dgx.recs.set_index("job_id")
    # job 5113's kernel grows from 4 to 60 GiB over two hours (sim/scenarios/dgx-h100.yaml)
    assert recs.loc["5113", "memory_trend_bytes_per_hour"] == pytest.approx(28 * GIB, rel=0.05)
    assert recs.loc["5113", "proposed_mode"] == "exclusive"  # alone until fixed, not packed
    assert recs.loc["5113", "finding"].startswith("memory leak")
    assert "5113" in [a["job_id"] for a in dgx.top_actions(n=20) if "memory leak" in a["what_to_do"]]
    steady = recs[recs["memory_trend_bytes_per_hour"] == 0]
    assert len(steady) >= 8 and (steady["memory_leak"] == "").all()


@pytest.fixture(scope="module")
def genai(tmp_path_factory):
    if not GENAI.is_dir():
        pytest.skip("shared traces not present")
    out = tmp_path_factory.mktemp("genai-h200") / "history"
    import_trace("alibaba-genai-2026", GENAI, out, get_model("H200"))
    return out


def test_the_genai_trace_is_sound_on_h200(genai, th):
    analysis = analyze_history(read_history(genai), th, with_archetypes=False)
    assert violations(analysis, inventory=144) == []
    recs = analysis.recs
    latency = recs[recs["latency_sensitive"].fillna(False).astype(bool)]
    assert len(latency) > 20  # most pods of a serving trace are bursty
    capped = latency[latency["recommendation"] == "mps"]
    assert (capped["mps_active_thread_percentage"] / 100 >= capped["sm_active_p99"] - 1e-9).all()


@pytest.mark.skipif(not V2023.is_dir(), reason="shared traces not present")
def test_the_v2023_requests_are_counted_at_peak_concurrency(tmp_path, th):
    import_trace("alibaba-gpu-v2023", V2023, tmp_path / "h", None)
    analysis = analyze_history(read_history(tmp_path / "h"), th)
    plan = analysis.plan
    assert set(analysis.recs["phase"]) <= {"Running", "Succeeded", "Failed"}  # every pod that held GPUs
    assert plan.gpus_before <= 6212  # the cluster's GPUs: pods are not all alive at once
    assert plan.gpus_before > plan.gpus_after > 0
    assert all(v["gpus_freed"] >= 0 for v in plan.by_model.values())
    assert "value of fractional requests at peak concurrency" in plan.notes[0]
    assert "not a usage-based saving" in plan.notes[0]
    assert "the cluster has 6212 GPUs" in plan.notes[1]
