"""The analyzer benchmark: synthetic cluster, both paths end to end, and how it is reported."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpulens.analyzer.history import read_history
from gpulens.analyzer.sources import rules
from gpulens.devtools.bench import tsdb as tsdbs
from gpulens.devtools.bench.analyzer_bench import (
    FAMILIES,
    JOBS_PER_GPU,
    Run,
    backfill,
    backfill_week,
    file_step,
    make_cluster,
    median_run,
    recorded_families,
    recorded_idle,
    run_analyzer_bench,
    write_history,
    write_openmetrics_blocks,
)
from gpulens.devtools.bench.analyzer_report import (
    analyzer_markdown,
    analyzer_target_lines,
    analyzer_why,
    cost_per_job,
)
from gpulens.devtools.bench.report import render_markdown


def _path(
    name: str, wall_s: float, rss: int, jobs: int = 10_000, samples: int = 20_000_000
) -> dict[str, Any]:
    promql = name != "history"
    return {
        "path": name,
        "command": f"gpulens recommend --{name}",
        "jobs": jobs,
        "gpus": jobs // 8,
        "steps": 2016,
        "step_s": 300,
        "samples": samples,
        "series": 100,
        "setup_s": {"generate_s": 1.0},
        "wall_s": wall_s,
        "max_rss_bytes": rss,
        "jobs_profiled": jobs,
        "returncode": 0,
        "queries": 5 if promql else None,
        "chunks": 1 if name == "raw" else None,
        "error": "",
        "extra": {"analyzer_cpu_s": wall_s / 2},
        "aggregation": ("raw" if name == "raw" else "rules") if promql else "",
    }


def _analyzer(
    rules_s: float, file_s: float, rss: int, jobs: int = 10_000, raw_s: float = 45.0
) -> dict[str, Any]:
    return {
        "cluster": "c",
        "families": list(FAMILIES),
        "prometheus_compaction": True,
        "paths": [
            _path("rules", rules_s, 2**28, jobs),
            _path("raw", raw_s, 2**28, jobs),
            _path("history", file_s, rss, jobs),
        ],
        "agreement": [{"paths": ["rules", "raw"], "jobs": jobs, "equal": jobs, "differ": []}],
    }


def test_every_job_runs_on_one_gpu_and_every_gpu_step_has_a_job():
    cluster = make_cluster(50, 3600)
    assert cluster.gpus == 7 and cluster.steps == 168
    counts = np.bincount(cluster.job_of.ravel(), minlength=50)
    assert (counts > 0).all()
    for j in range(50):
        rows = np.flatnonzero((cluster.job_of == j).any(axis=1))
        assert len(rows) == 1  # single GPU, one contiguous stretch
        steps = np.flatnonzero(cluster.job_of[rows[0]] == j)
        assert (np.diff(steps) == 1).all()


def test_the_file_step_gives_about_the_requested_samples():
    step = file_step(10_000, 20_000_000)
    cluster_samples = (10_000 // JOBS_PER_GPU) * len(FAMILIES) * (7 * 86400 // step)
    assert abs(cluster_samples - 20_000_000) / 20_000_000 < 0.01


def test_openmetrics_blocks_hold_every_sample_once(tmp_path):
    cluster = make_cluster(9, 1800)
    paths = write_openmetrics_blocks(cluster, tmp_path)
    lines = [line for path in paths for line in path.read_text().splitlines() if not line.startswith("#")]
    assert len(lines) == cluster.samples
    assert all(path.read_text().endswith("# EOF\n") for path in paths)


def test_the_parquet_history_reads_back_with_every_sample(tmp_path):
    cluster = make_cluster(20, 3600)
    rows = write_history(cluster, tmp_path / "h", gpus_per_group=2)
    assert rows == cluster.samples == pq.ParquetFile(tmp_path / "h" / "samples.parquet").metadata.num_rows
    history = read_history(tmp_path / "h")
    assert set(history.samples["metric"].astype(str)) == set(FAMILIES)
    jobs = history.samples[history.samples["metric"] == "gpu_job_info"]["job_id"].astype(str)
    assert jobs.nunique() == 20


def test_targets_are_judged_only_at_full_size():
    lines = analyzer_target_lines(_analyzer(8.0, 25.0, 2 * 10**9 - 1, raw_s=70.0))
    assert lines[0].startswith("analyzer, recording-rule path: 10,000 jobs") and lines[0].endswith(": met")
    assert "raw path" in lines[1] and "70.0 s" in lines[1] and "met" not in lines[1]
    assert lines[2].endswith("the same recommendation for 10,000 of 10,000 jobs")
    assert "NOT met (over by 5.0, 1.25x the target)" in lines[3]
    assert lines[4].endswith("met, within 0 % of the target")
    close = analyzer_target_lines(_analyzer(9.5, 15.0, 10**9))
    assert close[0].endswith(": met, within 5 % of the target")
    small = analyzer_target_lines(_analyzer(8.0, 25.0, 2 * 10**9, jobs=50))
    assert "not judged (scaled-down run)" in small[0]


def _run(wall_s: float, returncode: int = 0) -> Run:
    return Run(wall_s, 2**20, returncode, "", 10)


def test_the_reported_run_is_the_one_with_the_median_wall_time():
    runs = [(_run(12.0), 0.5, 20), (_run(9.0), 0.4, 21), (_run(10.0), 0.3, 22)]
    assert median_run(runs)[0].wall_s == 10.0
    assert median_run(runs[:2])[0].wall_s == 12.0  # an even count: the upper of the two middle runs
    assert median_run([(_run(3.0), 0.1, 1)])[0].wall_s == 3.0


def test_a_failed_run_is_the_one_reported():
    runs = [(_run(9.0), 0.4, 21), (_run(1.0, returncode=2), 0.3, 3)]
    assert median_run(runs)[0].returncode == 2


def test_every_runs_wall_time_is_listed_with_the_reported_one_in_bold():
    analyzer = _analyzer(10.0, 15.0, 10**9)
    analyzer["repeats"] = 3
    analyzer["paths"][0]["walls_s"] = [12.0, 9.0, 10.0]
    markdown = "\n".join(analyzer_markdown(analyzer))
    assert "| every run's wall time (s), in order | 12.0 / 9.0 / **10.0** |" in markdown
    assert "Every path runs 3 time(s) on the same data" in markdown


def test_the_raw_path_is_reported_without_a_target_of_its_own():
    lines = analyzer_target_lines(_analyzer(8.0, 25.0, 10**9, raw_s=70.0))
    (raw,) = [line for line in lines if "raw path" in line]
    assert "no target of its own" in raw and "target <=" not in raw


def test_a_second_rule_run_gives_the_cost_per_job_and_the_estimate():
    analyzer = _analyzer(6.0, 15.0, 10**9)
    analyzer["paths"].append(_path("rules-large", 18.0, 2**28, 50_000))
    cost = cost_per_job(analyzer)
    assert cost is not None
    assert cost["per_job_ms"] == pytest.approx(0.3) and cost["fixed_s"] == pytest.approx(3.0)
    assert cost["estimate_s"] == pytest.approx(33.0)
    line = next(x for x in analyzer_target_lines(analyzer) if "cost per 1,000 jobs" in x)
    assert "50,000 jobs in 18.0 s" in line and ": 0.30 s of wall time" in line
    assert "linear estimate (not measured) for 100,000 jobs: about 33 s" in line
    assert cost_per_job(_analyzer(6.0, 15.0, 10**9)) is None


def test_a_cost_line_below_zero_at_no_jobs_is_said_so():
    analyzer = _analyzer(6.0, 15.0, 10**9)
    analyzer["paths"].append(_path("rules-large", 32.0, 2**28, 50_000))  # 0.65 s per 1,000 jobs
    line = next(x for x in analyzer_target_lines(analyzer) if "cost per 1,000 jobs" in x)
    assert "fixed part, -0.5 s, is below zero" in line and "on top of" not in line


def test_only_the_selected_analyzer_runs_are_measured(tmp_path):
    data = run_analyzer_bench(50, 50_000, 300, tmp_path, None, runs=frozenset({"history"}))
    assert [p["path"] for p in data["paths"]] == ["history"]
    assert not list(tmp_path.glob("week*"))  # no week backfilled for the PromQL runs
    with pytest.raises(ValueError, match="unknown analyzer runs: rule"):
        run_analyzer_bench(50, 50_000, 300, tmp_path, None, runs=frozenset({"rule"}))


def test_recommendations_that_differ_between_paths_are_named():
    analyzer = _analyzer(6.0, 15.0, 10**9)
    analyzer["agreement"] = [{"paths": ["thanos", "rules"], "jobs": 3, "equal": 2, "differ": ["job-000001"]}]
    line = next(x for x in analyzer_target_lines(analyzer) if "Thanos" in x or "NOT the same" in x)
    assert "NOT the same recommendation for 2 of 3 jobs (differ: job-000001 ...)" in line


def test_a_missed_target_says_where_the_time_went():
    assert analyzer_why(_analyzer(8.0, 15.0, 10**9)) == []
    why = analyzer_why(_analyzer(12.0, 25.0, 10**9, raw_s=100.0))
    assert why[0].startswith("- Recording-rule path, why: 12.0 s against 10 s")
    assert not any(line.startswith("- Raw path") for line in why)  # the fallback has no target to miss
    assert any(line.startswith("- File path, why: 25.0 s against 20 s") for line in why)


def test_markdown_has_an_analyzer_section_without_exporters():
    data = {
        "command": "make bench",
        "scenario": "large",
        "machine": {"cpu": "x", "cores": "2", "python": "3.11", "kernel": "k", "date": "d"},
        "exporters": [],
        "analyzer": _analyzer(8.0, 15.0, 10**9),
    }
    text = render_markdown(data)
    assert "## Analyzer" in text and "## Exporter" not in text
    assert "`gpulens recommend --rules`" in text and "| path the analyzer took | rules | raw | - |" in text


def test_a_path_that_could_not_be_measured_is_named_with_its_reason():
    analyzer = {
        **_analyzer(8.0, 15.0, 10**9),
        "not_measured": ["Thanos: thanos not found: run `make thanos`"],
    }
    text = render_markdown(
        {
            "command": "make bench",
            "scenario": "large",
            "machine": _MACHINE,
            "exporters": [],
            "analyzer": analyzer,
        }
    )
    assert "Not measured in this run:\n\n- Thanos: thanos not found: run `make thanos`" in text


def test_a_failed_analyzer_run_is_said_instead_of_its_section():
    data = {
        "command": "make bench",
        "scenario": "large",
        "machine": _MACHINE,
        "exporters": [],
        "analyzer_error": "promtool failed",
    }
    assert "The analyzer run failed: promtool failed" in render_markdown(data)


_MACHINE = {"cpu": "x", "cores": "2", "python": "3.11", "kernel": "k", "date": "d"}


@pytest.mark.slow
def test_tiny_analyzer_bench_runs_every_path_end_to_end(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "bench",
            "--no-exporter",
            "--analyzer-jobs",
            "50",
            "--analyzer-large-jobs",
            "0",  # a second week; the cost per job it gives is tested above
            "--analyzer-samples",
            "50000",
            "--no-analyzer-compaction",
            "--no-analyzer-thanos",  # tests/analyzer/test_thanos.py covers Thanos
            "--analyzer-repeats",
            "2",
            "--out",
            str(tmp_path / "b.md"),
            "--json",
            str(tmp_path / "b.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "b.json").read_text())
    paths = {p["path"]: p for p in data["analyzer"]["paths"]}
    assert set(paths) == {"rules", "raw", "history"}
    assert all(p["returncode"] == 0 for p in paths.values())
    assert (paths["rules"]["aggregation"], paths["raw"]["aggregation"]) == ("rules", "raw")
    assert paths["rules"]["jobs_profiled"] == paths["raw"]["jobs_profiled"] == 50
    assert paths["raw"]["chunks"] == 1 and paths["rules"]["queries"] >= 5
    assert data["analyzer"]["agreement"] == [
        {"paths": ["rules", "raw"], "jobs": 50, "equal": 50, "differ": []}
    ]
    assert abs(paths["history"]["samples"] - 50_000) < 1_000
    assert all(p["max_rss_bytes"] > 10 * 2**20 and p["wall_s"] > 0 for p in paths.values())
    assert all(len(p["walls_s"]) == 2 and p["wall_s"] in p["walls_s"] for p in paths.values())
    assert "## Analyzer" in (tmp_path / "b.md").read_text()
    assert result.stdout.strip().splitlines()[-1].startswith("analyzer, file path: peak RSS")


def _recorded_series(
    base: str, at: float, window_s: int
) -> dict[tuple[tuple[str, str], ...], list[tuple[float, str]]]:
    """Every analyzer rule series Prometheus holds: (name, labels) -> [(timestamp, value)]."""
    import urllib.parse
    import urllib.request

    expr = f'{{__name__=~"job_id:.+|{rules.HEARTBEAT}|{rules.IDLE_BELOW}|{rules.RESTART_DROP}"}}[{window_s}s]'
    query = urllib.parse.urlencode({"query": expr, "time": str(at)})
    with urllib.request.urlopen(f"{base}/api/v1/query?{query}", timeout=60) as resp:
        result = json.load(resp)["data"]["result"]
    return {
        tuple(sorted(item["metric"].items())): [(float(t), v) for t, v in item["values"]] for item in result
    }


@pytest.mark.slow
def test_generated_recorded_series_equal_promtools_evaluation_of_the_rules(tmp_path):
    # the large run writes the rules' series from the generator instead of evaluating
    # alerts/analyzer_rules.yml over its week: they must be the series the evaluation gives
    step = 1800
    promtool = backfill_week(40, step, tmp_path / "promtool", None)
    generated = tmp_path / "generated"
    backfill(write_openmetrics_blocks(promtool.cluster, tmp_path / "om", recorded=True), generated)
    at, window = promtool.cluster.end + 3 * step, 8 * 86400
    with tsdbs.prometheus(promtool.rules, tsdbs.lookback(step), tmp_path / "a.log", compaction=False) as base:
        evaluated = _recorded_series(base, at, window)
    with tsdbs.prometheus(generated, tsdbs.lookback(step), tmp_path / "b.log", compaction=False) as base:
        written = _recorded_series(base, at, window)
    # promtool evaluates at the group's offset within each step; the generator at offset 0
    offset = next(iter(evaluated.values()))[0][0] % step
    assert 0 < offset < step
    heartbeat = (("__name__", rules.HEARTBEAT),)  # valued with the evaluation time
    steps = set(promtool.cluster.timestamps().tolist())

    def at_step(key: tuple, t: float, v: str) -> tuple[float, str]:
        return (round(t - offset, 3), repr(round(float(v) - offset, 3)) if key == heartbeat else v)

    shifted = {key: [at_step(key, t, v) for t, v in samples] for key, samples in evaluated.items()}
    # promtool also evaluates the step after the data: the series recorded with or without jobs
    # (the heartbeat, the idle threshold, the restart drop) alone record it
    for key in (heartbeat, (("__name__", rules.IDLE_BELOW),), (("__name__", rules.RESTART_DROP),)):
        shifted[key] = [(t, v) for t, v in shifted[key] if t in steps]
    written[heartbeat] = [(t, repr(float(v))) for t, v in written[heartbeat]]
    assert set(shifted) == set(written)
    names = {dict(key)["__name__"] for key in written}
    assert names == {
        rules.HEARTBEAT,
        rules.IDLE_BELOW,
        rules.RESTART_DROP,
        rules.PRESENCE,
        rules.PRESENCE_TIME,
        *recorded_families(),
        *recorded_idle(),
    }
    for key in written:
        assert shifted[key] == written[key], key
