"""The CLI: formats, and one clear error line (never a traceback) for bad input."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from gpulens.analyzer.history import write_history
from gpulens.analyzer.pipeline import JOB_FIELDS
from gpulens.cli import main
from tests.analyzer import synth
from tests.analyzer.fakeprom import fake_prometheus
from tests.support.procs import free_port


@pytest.fixture
def seed_history(tmp_path):
    path = tmp_path / "seed"
    write_history(path, synth.frame(synth.seed_case(60)), {"source": "test", "step_s": synth.STEP})
    return path


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("gpulens: error: ")
    assert "Traceback" not in err
    return lines[0]


def test_recommend_json_has_the_documented_fields(capsys, seed_history):
    code, out, _ = run(capsys, "recommend", "--history", str(seed_history), "--format", "json")
    assert code == 0
    payload = json.loads(out)
    job = payload["jobs"][0]
    for field in JOB_FIELDS:
        assert field in job, field
    assert 0 <= job["sm_active_p95"] <= 1
    plan = payload["plan"]
    assert (plan["gpus_before"], plan["gpus_after"], plan["gpus_freed"]) == (4, 2, 2)
    assert plan["layout"] and "gres.conf" in payload["config"]  # the seed node is a Slurm node


def test_recommend_csv_and_table(capsys, seed_history):
    code, out, _ = run(capsys, "recommend", "--history", str(seed_history), "--format", "csv")
    assert code == 0 and out.splitlines()[0].startswith("job_id,")
    assert len(out.splitlines()) == 5
    code, out, _ = run(capsys, "recommend", "--history", str(seed_history), "--format", "table")
    assert code == 0 and "plan: 4 GPUs -> 2 (2 freed)" in out


def test_profile_table_lists_every_job(capsys, seed_history):
    code, out, _ = run(capsys, "profile", "--history", str(seed_history), "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert [r["job_id"] for r in rows] == ["seed-0", "seed-1", "seed-2", "seed-3"]
    assert rows[0]["activity_signal"] == "sm_active"


def test_report_writes_every_output_and_a_textfile(capsys, seed_history, tmp_path):
    textfile = tmp_path / "recs.prom"
    code, out, _ = run(
        capsys,
        "report",
        "--history",
        str(seed_history),
        "--out",
        str(tmp_path / "r"),
        "--textfile",
        str(textfile),
    )
    assert code == 0 and "2 GPUs could be freed" in out
    for name in ("report.html", "summary.md", "jobs.csv", "jobs.json", "plan.json"):
        assert (tmp_path / "r" / name).stat().st_size > 0
    text = textfile.read_text()
    assert 'gpulens_recommendation_info{job_id="seed-0"' in text
    assert 'gpulens_plan_gpus{gpu_model="A100-SXM4-40GB",state="freed"} 2' in text
    promtool = shutil.which("promtool")
    if promtool:
        lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_unreachable_prometheus(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, _, err = run(capsys, "recommend", "--prometheus", url, "--window", "1h", "--retries", "0")
    assert code == 2
    assert "cannot reach Prometheus" in one_error_line(err)


def test_malformed_prometheus_json(capsys):
    with fake_prometheus([(200, b"<html>not json</html>")]) as (url, _):
        code, _, err = run(capsys, "profile", "--prometheus", url, "--window", "1h")
    assert code == 2
    assert "malformed response (not JSON)" in one_error_line(err)


def test_prometheus_result_without_values_is_malformed(capsys):
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}})
    with fake_prometheus([(200, body.encode())]) as (url, _):
        code, _, err = run(capsys, "profile", "--prometheus", url, "--window", "1h")
    assert code == 2 and "lacks metric/value" in one_error_line(err)


def test_promql_errors_are_reported(capsys):
    body = json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with fake_prometheus([(400, body.encode())]) as (url, _):
        code, _, err = run(capsys, "profile", "--prometheus", url, "--window", "1h")
    assert code == 2 and "query failed (bad_data): parse error" in one_error_line(err)


def test_empty_window_from_prometheus(capsys):
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})
    with fake_prometheus([(200, body.encode())]) as (url, _):
        code, _, err = run(capsys, "recommend", "--prometheus", url, "--window", "7d")
    assert code == 2 and "no gpu_job_info series" in one_error_line(err)


def test_transient_errors_are_retried_and_auth_is_sent(capsys, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    empty = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
    # every query is refused once (503), then answered
    with fake_prometheus(lambda body, n: (503, b"busy") if n == 0 else (200, empty)) as (url, seen):
        code, _, err = run(
            capsys, "profile", "--prometheus", url, "--window", "1h", "--bearer-token-file", str(token)
        )
    assert code == 2 and "no gpu_job_info" in err  # got past the 503
    job_info = [r for r in seen if b"last_over_time%28gpu_job_info" in r["body"]]
    assert len(job_info) == 2  # refused, sent again, answered
    assert all(r["headers"]["Authorization"] == "Bearer s3cret" for r in seen)


def test_basic_auth_sends_the_password_file_without_its_newline(capsys, tmp_path):
    password = tmp_path / "password"
    password.write_text("pa55\n")
    empty = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
    with fake_prometheus([(200, empty)]) as (url, seen):
        args = ["--basic-auth-user", "analyst", "--basic-auth-password-file", str(password)]
        code, _, err = run(capsys, "profile", "--prometheus", url, "--window", "1h", *args)
    assert code == 2 and "no gpu_job_info" in err
    expected = "Basic " + base64.b64encode(b"analyst:pa55").decode()
    assert seen and all(r["headers"]["Authorization"] == expected for r in seen)


def test_an_unreadable_password_file_is_one_line_naming_it(capsys, tmp_path):
    missing = tmp_path / "no-such-password"
    args = ["--basic-auth-user", "analyst", "--basic-auth-password-file", str(missing)]
    code, _, err = run(capsys, "profile", "--prometheus", "http://127.0.0.1:9", "--window", "1h", *args)
    assert code == 2
    assert (
        one_error_line(err) == f"gpulens: error: {missing}: cannot read password: No such file or directory"
    )


def test_empty_window_from_a_history(capsys, seed_history):
    code, _, err = run(capsys, "recommend", "--history", str(seed_history), "--window", "1h", "--end", "1000")
    assert code == 2 and "no samples in the window" in one_error_line(err)


def test_all_nan_series_give_insufficient_data_not_a_crash(capsys, tmp_path):
    frame = synth.frame(synth.seed_case(30))
    frame.loc[frame["metric"] == "gpu_sm_active_ratio", "value"] = np.nan
    write_history(tmp_path / "h", frame, {"step_s": synth.STEP})
    code, out, err = run(capsys, "recommend", "--history", str(tmp_path / "h"), "--format", "json")
    assert code == 0, err
    assert {j["recommendation"] for j in json.loads(out)["jobs"]} == {"insufficient-data"}


def test_unknown_gpu_model(capsys, seed_history):
    code, _, err = run(capsys, "recommend", "--history", str(seed_history), "--gpu-model", "Z9000")
    assert code == 2 and "unknown GPU model 'Z9000'" in one_error_line(err)


def test_both_or_no_source(capsys, seed_history):
    code, _, err = run(capsys, "recommend")
    assert code == 2 and "exactly one source" in one_error_line(err)


def test_bad_window(capsys, seed_history):
    code, _, err = run(capsys, "recommend", "--history", str(seed_history), "--window", "7 days")
    assert code == 2 and "--window: '7 days' is not a duration" in one_error_line(err)


def test_corrupt_trace_via_the_cli_in_a_subprocess(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "openb_pod_list_default.csv").write_text("name,num_gpu\n\x00\x01garbage,,,\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "import-trace",
            "alibaba-gpu-v2023",
            str(src),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "openb_pod_list_default.csv" in line


# a base install: importing pandas fails as it does when the [analyzer] extra is not installed
WITHOUT_PANDAS = """
import sys
class NoPandas:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoPandas())
from gpulens.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_the_analyzer_extra_recommend_names_the_install_command(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PANDAS, "recommend", "--history", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert one_error_line(done.stderr) == (
        "gpulens: error: the analyzer needs pandas: pip install 'gpulens[analyzer]'"
    )


def test_a_command_runs_with_fewer_young_collections_and_gives_the_threshold_back():
    import gc

    from gpulens.analyzer.cli import GC_YOUNG_THRESHOLD, _guard

    seen = []
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        _guard(lambda _args: seen.append(gc.get_threshold()) or 0)(None)
        assert seen == [(GC_YOUNG_THRESHOLD, 10, 10)]
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)


def test_collection_switched_off_by_the_calling_program_stays_off():
    import gc

    from gpulens.analyzer.cli import _guard

    seen = []
    before = gc.get_threshold()
    try:
        gc.set_threshold(0)
        _guard(lambda _args: seen.append(gc.get_threshold()[0]) or 0)(None)
        assert seen == [0]
    finally:
        gc.set_threshold(*before)
