"""Real public traces (read from the shared copy, never copied into the repository)."""

from __future__ import annotations

import csv
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import read_history
from gpulens.analyzer.importers import import_trace
from gpulens.analyzer.pipeline import analyze_history
from gpulens.analyzer.recommend import memory_need
from gpulens.analyzer.report import write_report
from gpulens.analyzer.requests import request_table
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.catalog import get_model
from tests.analyzer.invariants import violations


def _traces_dir() -> Path:
    """$GPULENS_TRACES, else the shared copy beside the repository (../shared/traces)."""
    if os.environ.get("GPULENS_TRACES"):
        return Path(os.environ["GPULENS_TRACES"])
    beside = Path(__file__).resolve().parents[3] / "shared" / "traces"
    return beside if beside.is_dir() else Path("/work/shared/traces")


TRACES = _traces_dir()
GENAI = TRACES / "alibaba-genai-2026"
V2023 = TRACES / "alibaba-gpu-v2023"
needs_traces = pytest.mark.skipif(
    not GENAI.is_dir() or not V2023.is_dir(), reason="shared traces not present"
)


@pytest.fixture(scope="module")
def genai(tmp_path_factory):
    if not GENAI.is_dir():
        pytest.skip("shared traces not present")
    out = tmp_path_factory.mktemp("genai") / "history"
    import_trace("alibaba-genai-2026", GENAI, out, get_model("H100-80GB"))
    return out


@pytest.fixture(scope="module")
def genai_analysis(genai):
    return analyze_history(read_history(genai), load_thresholds())


@needs_traces
def test_genai_trace_becomes_a_usage_history(genai):
    history = read_history(genai)
    assert history.meta["source"] == "alibaba-genai-2026"
    assert history.meta["gpu_model"] == "H100-80GB"
    assert 50 < history.step_s < 70
    jobs = history.samples.loc[history.samples["metric"] == "gpu_job_info", "job_id"]
    assert jobs.nunique() == 144


@needs_traces
def test_genai_recommendations_never_go_below_peak_memory(genai_analysis, th):
    analysis = genai_analysis
    recs = analysis.recs
    model = get_model("H100-80GB")
    assert recs["activity_signal"].isin({"utilization", "none"}).all()
    for row in recs.itertuples():
        need = memory_need(row.memory_peak_bytes, th) if row.memory_peak_bytes == row.memory_peak_bytes else 0
        if row.recommendation == "mig":
            assert model.mig_profile(row.mig_profile).memory_bytes >= need >= row.memory_peak_bytes
        if row.recommendation == "mps":
            assert row.mps_pinned_memory_limit_bytes >= need >= row.memory_peak_bytes
    idle = recs[recs["recommendation"] == "reclaim"]
    assert len(idle) >= 5  # the trace has pods that never ran a kernel
    assert (idle["idle_fraction"] >= 0.95).all()
    assert analysis.plan.gpus_freed > 0


@needs_traces
def test_genai_report_renders(genai_analysis, tmp_path):
    analysis = genai_analysis
    written = write_report(analysis, tmp_path / "report")
    html = written["html"].read_text()
    assert html.count("data:image/png;base64,") >= 3
    assert "GPU-hours" in written["markdown"].read_text()
    jobs = json.loads(written["json"].read_text())["jobs"]
    assert len(jobs) == len(analysis.recs)
    assert analysis.emitted.files
    for name in analysis.emitted.files:  # which files depends on the plan (no MIG: no mig-parted)
        assert (tmp_path / "report" / "config" / name).exists()


@needs_traces
def test_v2023_requests_pack_with_a_gpus_freed_figure(tmp_path, th):
    meta = import_trace("alibaba-gpu-v2023", V2023, tmp_path / "h", None)
    assert meta["kind"] == "requests"
    analysis = analyze_history(read_history(tmp_path / "h"), th)
    plan = analysis.plan
    assert plan.gpus_before > plan.gpus_after > 0
    assert plan.gpus_freed == plan.gpus_before - plan.gpus_after
    shares = [e["requested_share"] for e in plan.layout]
    assert max(shares) <= 1.0 + 1e-9
    assert set(analysis.recs["recommendation"]) == {"mps", "exclusive"}
    assert (analysis.recs["confidence_level"] == "low").all()


@needs_traces
@pytest.mark.parametrize(("model", "at_least"), [("H100-80GB", 72), ("H200", 91)])
def test_genai_pods_that_never_overlap_free_gpus_in_turn(model, at_least, tmp_path, th):
    # issue 31's figures: short-lived pods (six too short to size) hold a GPU only while they ran
    import_trace("alibaba-genai-2026", GENAI, tmp_path / "h", get_model(model))
    analysis = analyze_history(read_history(tmp_path / "h"), th, with_archetypes=False)
    assert analysis.plan.gpus_freed >= at_least
    assert violations(analysis, inventory=144) == []
    capped = analysis.recs[analysis.recs["recommendation"] == "mps"]
    assert (
        len(capped) and (capped["mps_active_thread_percentage"] / 100 >= capped["sm_fraction"] - 1e-9).all()
    )
    assert not any(e["sharing"] == "unchanged" for e in analysis.plan.layout)


def test_genai_needs_a_gpu_model(tmp_path):
    with pytest.raises(AnalyzerError, match="--gpu-model"):
        import_trace("alibaba-genai-2026", tmp_path, tmp_path / "out", None)


def test_corrupt_tarball_is_a_one_line_error(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "pod_gpu_duty_cycle_anon.tar.gz").write_bytes(b"\x1f\x8b\x08garbage")
    (src / "pod_gpu_memory_used_bytes_anon.csv").write_text("timestamp_anon,value,container_ip\n1,2,a\n")
    with pytest.raises(AnalyzerError) as err:
        import_trace("alibaba-genai-2026", src, tmp_path / "out", get_model("A100"))
    assert "pod_gpu_duty_cycle_anon.tar.gz: cannot read archive" in str(err.value)


def test_wrong_columns_name_the_file_and_the_expected_columns(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    data = b"when,what\n1,2\n"
    with tarfile.open(src / "pod_gpu_duty_cycle_anon.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("pod_gpu_duty_cycle_anon.csv")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (src / "pod_gpu_memory_used_bytes_anon.csv").write_text("timestamp_anon,value,container_ip\n1,2,a\n")
    with pytest.raises(AnalyzerError, match=r"missing columns \['value', 'timestamp_anon', 'container_ip'\]"):
        import_trace("alibaba-genai-2026", src, tmp_path / "out", get_model("A100"))


def test_non_numeric_values_are_reported_with_an_example(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "pod_gpu_duty_cycle_anon.csv").write_text("value,timestamp_anon,container_ip\nbusy,1,a\n")
    (src / "pod_gpu_memory_used_bytes_anon.csv").write_text("timestamp_anon,value,container_ip\n1,2,a\n")
    with pytest.raises(AnalyzerError, match="column 'value' must be numeric, got 'busy'"):
        import_trace("alibaba-genai-2026", src, tmp_path / "out", get_model("A100"))


def test_missing_values_become_gaps(tmp_path, th):
    src = tmp_path / "src"
    src.mkdir()
    rows = "\n".join(f"{'NULL' if t % 4 == 0 else 20},{1000 + 60 * t},pod-a" for t in range(40))
    (src / "pod_gpu_duty_cycle_anon.csv").write_text("value,timestamp_anon,container_ip\n" + rows + "\n")
    mem = "\n".join(f"{1000 + 60 * t},{2e9},pod-a" for t in range(40))
    (src / "pod_gpu_memory_used_bytes_anon.csv").write_text(
        "timestamp_anon,value,container_ip\n" + mem + "\n"
    )
    import_trace("alibaba-genai-2026", src, tmp_path / "h", get_model("A100"))
    analysis = analyze_history(read_history(tmp_path / "h"), th)
    row = analysis.recs.iloc[0]
    assert row["coverage"] == pytest.approx(0.75)
    assert row["sm_active_mean"] == pytest.approx(0.2)


def _pods_csv(path: Path, rows: list[str]) -> Path:
    path.mkdir()
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    header += "creation_time,deletion_time,scheduled_time"
    (path / "openb_pod_list_default.csv").write_text("\n".join([header, *rows]) + "\n")
    return path


def test_a_failed_pod_held_its_gpus_from_scheduling_until_it_failed(tmp_path, th):
    src = _pods_csv(
        tmp_path / "src",
        [
            "a,1,1,1,1000,,LS,Running,0,1000,0",
            "b,1,1,1,1000,,BE,Failed,100,600,200",  # held a GPU 200..600, beside a
            "c,1,1,1,1000,,BE,Pending,100,900,",  # never scheduled: held nothing
        ],
    )
    import_trace("alibaba-gpu-v2023", src, tmp_path / "h", None)
    analysis = analyze_history(read_history(tmp_path / "h"), th)
    assert analysis.plan.gpus_before == 2  # a and b at once; c never counts
    assert any("Failed pods counted" in note for note in analysis.plan.notes)


def test_a_pod_holds_its_gpus_from_scheduling_not_creation(tmp_path, th):
    src = _pods_csv(
        tmp_path / "src",
        [
            "a,1,1,1,1000,,LS,Running,0,500,0",
            "b,1,1,1,1000,,LS,Running,100,1000,600",  # asked for at 100, scheduled after a ended
        ],
    )
    import_trace("alibaba-gpu-v2023", src, tmp_path / "h", None)
    assert analyze_history(read_history(tmp_path / "h"), th).plan.gpus_before == 1


@needs_traces
def test_v2023_counts_the_failed_pods_that_held_gpus(tmp_path, th):
    import_trace("alibaba-gpu-v2023", V2023, tmp_path / "h", None)
    table = request_table(read_history(tmp_path / "h"))
    with (V2023 / "openb_pod_list_default.csv").open() as f:
        failed = sum(1 for r in csv.DictReader(f) if r["pod_phase"] == "Failed" and float(r["num_gpu"]) > 0)
    assert failed > 1000  # the trace has 1,870 Failed pods, all scheduled
    assert (table["phase"] == "Failed").sum() == failed and not (table["phase"] == "Pending").any()
