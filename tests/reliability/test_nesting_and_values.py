"""Nesting, impossible values and expanding inputs (issue 17 item 9).

Every YAML or JSON file a user hands gpulens, nested a thousand deep or blown up by aliases, is one
line naming the file (and the keys down to the depth) instead of a RecursionError; an impossible
sample (an infinite timestamp, a 1e30-byte memory value, a negative lifetime, a duty cycle far
above 100 %) in a history or a trace is refused or dropped with a count, as the importers' docstring
says; a small Parquet or gzip file that would expand beyond the memory limit is refused from its
footer or header, before it is expanded.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import SCHEMA, InputLimits, read_history, write_history
from gpulens.analyzer.importers import import_trace, warnings
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.analyzer.weekly import load_previous
from gpulens.catalog import get_model
from gpulens.exporter.config import ConfigError as WebConfigError
from gpulens.httpd.webconfig import load_web_config
from gpulens.promscope.config import ConfigError as MixinConfigError
from gpulens.promscope.config import load as load_mixin_config
from gpulens.safeload import MAX_DEPTH, InputError, load_json, load_yaml, read_yaml_file
from gpulens.sim.scenario import ScenarioError
from gpulens.sim.scenariofile import load_scenario
from tests.analyzer import synth

DEPTH = 1200
BLOCK_DEPTH = 200  # block YAML grows with the square of its depth; the mixin config stops at 64 KiB


def deep_documents(prefix: str) -> dict[str, str]:
    """Shapes of YAML nested DEPTH deep under a top-level key `prefix` (a real field of each file)."""
    n = BLOCK_DEPTH
    block_map = f"{prefix}:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, n)) + "  " * n + "x: 1\n"
    block_seq = f"{prefix}:\n" + "".join("  " * i + "-\n" for i in range(1, n)) + "  " * n + "- 1\n"
    return {
        "flow sequence": f"{prefix}: " + "[" * DEPTH + "]" * DEPTH + "\n",
        "flow mapping": f"{prefix}: " + "{a: " * DEPTH + "1" + "}" * DEPTH + "\n",
        "block mapping": block_map,
        "block sequence": block_seq,
        "mixed": f"{prefix}: " + "[{a: " * (DEPTH // 2) + "1" + "}]" * (DEPTH // 2) + "\n",
    }


LAUGHS = "".join(
    f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]\n"
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
)


def billion_laughs(prefix: str) -> str:
    return "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + LAUGHS + f"{prefix}: *i\n"


LOADERS: dict[str, tuple[str, Callable[[Path], object], type[Exception]]] = {
    "scenario file": ("gpus", load_scenario, ScenarioError),
    "web config file": ("tls_server_config", load_web_config, WebConfigError),
    "thresholds file": ("activity", load_thresholds, AnalyzerError),
    "mixin config": ("selector", load_mixin_config, MixinConfigError),
}


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text and "RecursionError" not in text, text
    return text


@pytest.mark.parametrize("kind", sorted(LOADERS))
@pytest.mark.parametrize("shape", sorted(deep_documents("x")))
def test_deeply_nested_yaml_is_one_line_naming_the_file_and_field(
    tmp_path: Path, bad_input: Any, kind: str, shape: str
) -> None:
    prefix, load, error = LOADERS[kind]
    path = tmp_path / "deep.yml"
    path.write_text(deep_documents(prefix)[shape])
    with pytest.raises(error) as failed:
        load(path)
    bad_input(f"nesting: {kind}")
    message = one_line(failed.value)
    assert str(path) in message
    assert f"nested deeper than {MAX_DEPTH} levels at {prefix}" in message


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_yaml_aliases_cannot_stand_for_a_billion_nodes(tmp_path: Path, bad_input: Any, kind: str) -> None:
    prefix, load, error = LOADERS[kind]
    path = tmp_path / "laughs.yml"
    path.write_text(billion_laughs(prefix))
    with pytest.raises(error) as failed:
        load(path)
    bad_input(f"nesting: {kind}")
    message = one_line(failed.value)
    assert str(path) in message and "once aliases are expanded" in message


def test_ordinary_yaml_and_aliases_still_load() -> None:
    assert load_yaml("a: &x {b: [1, 2]}\nc: *x\n") == {"a": {"b": [1, 2]}, "c": {"b": [1, 2]}}
    nested = "v: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    assert load_yaml(nested) is not None


def test_an_unreadable_yaml_file_is_one_line_in_the_callers_words(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(InputError) as failed:
        read_yaml_file(missing, "--config absent.yaml", unreadable="cannot read config")
    assert str(failed.value) == "--config absent.yaml: cannot read config: No such file or directory"


def test_a_file_that_is_not_yaml_is_one_line_with_the_parsers_first_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("a: [1, 2\nb: 3\n")
    with pytest.raises(InputError) as failed:
        read_yaml_file(path)
    message = one_line(failed.value)
    assert message.startswith(f"{path}: not valid YAML: ")


def test_deep_json_is_a_decode_error_not_a_recursion_error() -> None:
    for text in ('{"a": ' * 100_000 + "1" + "}" * 100_000, b"[" * 100_000 + b"]" * 100_000):
        with pytest.raises(json.JSONDecodeError, match="nested deeper than"):
            load_json(text)
    assert load_json(json.dumps({"s": "[[[[{{{{" * 100, "t": [[1]]}))["t"] == [[1]]


def test_a_deeply_nested_history_meta_is_one_line(tmp_path: Path, bad_input: Any) -> None:
    root = tmp_path / "h"
    write_history(root, synth.frame(synth.seed_case(3)), {"step_s": 60.0})
    (root / "meta.json").write_text('{"format": ' * DEPTH + "1" + "}" * DEPTH)
    with pytest.raises(AnalyzerError) as failed:
        read_history(root)
    bad_input("nesting: history meta.json")
    assert "meta.json: not valid JSON: nested deeper than" in one_line(failed.value)


def test_a_deeply_nested_previous_report_is_one_line(tmp_path: Path, bad_input: Any) -> None:
    (tmp_path / "jobs.json").write_text('{"jobs": ' + "[" * DEPTH + "]" * DEPTH + "}")
    (tmp_path / "plan.json").write_text("{}")
    with pytest.raises(AnalyzerError) as failed:
        load_previous(tmp_path)
    bad_input("nesting: --previous report")
    assert f"--previous {tmp_path}: not a gpulens report: nested deeper than" in one_line(failed.value)


def test_a_deeply_nested_scenario_via_the_cli_exits_2_with_one_line(tmp_path: Path, bad_input: Any) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(deep_documents("gpus")["flow sequence"])
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "simulate", str(path), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    bad_input("nesting: scenario via the CLI")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert str(path) in lines[0] and "nested deeper than" in lines[0]


# -- impossible samples in a history: refused, one line naming file, family and column -----------


def history_with(tmp_path: Path, metric: str, timestamp: float, value: float, csv: bool = False) -> Path:
    frame = synth.frame(synth.seed_case(5))
    root = tmp_path / "h"
    write_history(root, frame, {"step_s": 60.0})
    table = pq.read_table(root / "samples.parquet").to_pandas()
    row = table.index[table["metric"] == metric][2]
    table.loc[row, ["timestamp", "value"]] = [timestamp, value]
    (root / "samples.parquet").unlink()
    (root / "metrics.om").unlink()
    if csv:
        table.to_csv(root / "samples.csv", index=False)
    else:
        pq.write_table(
            pa.Table.from_pandas(table, schema=SCHEMA, preserve_index=False), root / "samples.parquet"
        )
    return root


IMPOSSIBLE = {
    "infinite timestamp": ("gpu_job_memory_used_bytes", math.inf, 1.0, "column timestamp"),
    "NaN timestamp": ("gpu_sm_active_ratio", math.nan, 0.5, "column timestamp"),
    "negative timestamp": ("gpu_sm_active_ratio", -1.0, 0.5, "column timestamp"),
    "timestamp after 2242": ("gpu_sm_active_ratio", 1e13, 0.5, "column timestamp"),
    "1e30-byte memory": ("gpu_job_memory_used_bytes", None, 1e30, "column value"),
    "negative memory": ("gpu_job_memory_used_bytes", None, -5.0, "column value"),
    "ratio of 3": ("gpu_sm_active_ratio", None, 3.0, "column value"),
    "infinite ratio": ("gpu_sm_active_ratio", None, math.inf, "column value"),
    "infinite info": ("gpu_info", None, -math.inf, "column value"),
}


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
def test_an_impossible_sample_in_a_history_is_one_line_naming_file_family_and_column(
    tmp_path: Path, bad_input: Any, case: str, fmt: str
) -> None:
    metric, timestamp, value, column = IMPOSSIBLE[case]
    frame_ts = synth.frame(synth.seed_case(5))["timestamp"].iloc[0]
    root = history_with(tmp_path, metric, frame_ts if timestamp is None else timestamp, value, fmt == "csv")
    streaming: dict[str, list[str]] = {metric: []}
    for families in (None, streaming):  # the long table and the streaming path
        with pytest.raises(AnalyzerError) as failed:
            read_history(root, families=families)
        bad_input("impossible value: history")
        message = one_line(failed.value)
        assert message.startswith(str(root / f"samples.{fmt}")) and f"{metric}: {column}" in message


def test_nan_values_are_gaps_not_errors(tmp_path: Path) -> None:
    frame_ts = synth.frame(synth.seed_case(5))["timestamp"].iloc[0]
    root = history_with(tmp_path, "gpu_sm_active_ratio", frame_ts, math.nan)
    assert read_history(root).samples["value"].isna().sum() >= 1


# -- impossible values in traces: times refuse the file, measurements are dropped and counted -------


def genai_trace(src: Path, util: list[tuple[object, object]], mem: list[tuple[object, object]]) -> Path:
    src.mkdir(parents=True, exist_ok=True)
    pods = ["aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"]
    u = ["value,timestamp_anon,container_ip"] + [f"{v},{t},{pods[i % 2]}" for i, (v, t) in enumerate(util)]
    m = ["timestamp_anon,value,container_ip"] + [f"{t},{v},{pods[i % 2]}" for i, (v, t) in enumerate(mem)]
    (src / "pod_gpu_duty_cycle_anon.csv").write_text("\n".join(u) + "\n")
    (src / "pod_gpu_memory_used_bytes_anon.csv").write_text("\n".join(m) + "\n")
    return src


def good_rows(n: int, value: float) -> list[tuple[object, object]]:
    return [(value, 1_662_858_720 + 60 * (i // 2)) for i in range(n)]


@pytest.mark.parametrize("bad", ["inf", "-inf", "1e300", "-60"])
def test_a_trace_time_that_cannot_be_placed_refuses_the_file(
    tmp_path: Path, bad_input: Any, bad: str
) -> None:
    util = good_rows(400, 40.0)
    util[7] = (40.0, bad)
    src = genai_trace(tmp_path / "t", util, good_rows(400, 2e9))
    with pytest.raises(AnalyzerError) as failed:
        import_trace("alibaba-genai-2026", src, tmp_path / "h", get_model("H100-80GB"))
    bad_input("impossible value: trace time")
    message = one_line(failed.value)
    assert "pod_gpu_duty_cycle_anon.csv: column 'timestamp_anon'" in message and "row 8" in message
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize(
    ("file", "value", "column"),
    [
        ("memory", "1e30", "value"),
        ("memory", "inf", "value"),
        ("memory", "-1", "value"),
        ("util", "900", "value"),
    ],
)
def test_a_glitched_trace_measurement_is_dropped_and_counted(
    tmp_path: Path, bad_input: Any, file: str, value: str, column: str
) -> None:
    util, mem = good_rows(400, 40.0), good_rows(400, 2e9)
    rows = mem if file == "memory" else util
    rows[11] = (value, rows[11][1])
    src = genai_trace(tmp_path / "t", util, mem)
    meta = import_trace("alibaba-genai-2026", src, tmp_path / "h", get_model("H100-80GB"))
    bad_input("impossible value: trace measurement")
    [dropped] = meta["trace"]["dropped"]
    assert (dropped["rows"], dropped["first_row"], dropped["column"]) == (1, 12, column)
    [line] = warnings(meta)
    assert "dropped 1 rows" in line and "row 12" in line
    history = read_history(tmp_path / "h")
    assert history.samples["value"].max() < 1e11


def test_a_trace_in_the_wrong_unit_is_refused_not_dropped(tmp_path: Path, bad_input: Any) -> None:
    src = genai_trace(tmp_path / "t", good_rows(400, 40.0), good_rows(400, 2e9 * 1024))  # KiB read as bytes
    with pytest.raises(AnalyzerError, match=r"in 400 of 400 rows .*wrong column or unit"):
        import_trace("alibaba-genai-2026", src, tmp_path / "h", get_model("H100-80GB"))
    bad_input("impossible value: trace measurement")


def test_a_pod_deleted_before_it_was_created_is_dropped_and_counted(tmp_path: Path, bad_input: Any) -> None:
    src = tmp_path / "v"
    src.mkdir()
    rows = ["name,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time"]
    rows += [f"p{i},1,1000,,LS,Running,{100 * i},{100 * i + 50}" for i in range(200)]
    rows[5] = "p4,1,1000,,LS,Running,900,100"
    rows[9] = "p8,1e30,1000,,LS,Running,900,1000"
    (src / "openb_pod_list_default.csv").write_text("\n".join(rows) + "\n")
    meta = import_trace("alibaba-gpu-v2023", src, tmp_path / "h", None)
    bad_input("impossible value: trace measurement", 2)
    assert sorted((d["column"], d["rows"]) for d in meta["trace"]["dropped"]) == [
        ("deletion_time", 1),
        ("num_gpu", 1),
    ]
    assert meta["trace"]["pods"] == 198


def test_the_published_traces_hold_no_impossible_values(tmp_path: Path) -> None:
    traces = Path("/work/shared/traces")
    if not (traces / "alibaba-gpu-v2023").is_dir():
        pytest.skip("shared traces not present")
    meta = import_trace("alibaba-gpu-v2023", traces / "alibaba-gpu-v2023", tmp_path / "h", None)
    assert meta["trace"]["dropped"] == []


# -- inputs that expand: refused from their footer or header, before they are read ---------------


def compressible_history(root: Path, rows: int) -> Path:
    """`rows` identical samples: a few KB of Parquet standing for rows x 80 bytes in memory."""
    write_history(root, synth.frame(synth.seed_case(2)), {"step_s": 60.0})
    chunk = pa.table(
        {
            "timestamp": pa.array(np.full(rows // 4, 1.7e9)),
            "metric": pa.array(["gpu_utilization_ratio"] * (rows // 4)),
            "value": pa.array(np.full(rows // 4, 0.5)),
            **{name: pa.array([""] * (rows // 4)) for name in SCHEMA.names[3:]},
        },
        schema=SCHEMA,
    )
    with pq.ParquetWriter(root / "samples.parquet", SCHEMA, compression="zstd") as writer:
        for _ in range(4):
            writer.write_table(chunk)
    return root


@pytest.fixture
def never_expanded(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """From the call on, reading any Parquet row data fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the file was expanded before its size was checked")

    def install() -> None:
        monkeypatch.setattr(pq.ParquetFile, "read_row_group", refuse)
        monkeypatch.setattr(pq.ParquetFile, "read", refuse)
        monkeypatch.setattr(pq, "read_table", refuse)

    return install


@pytest.mark.parametrize("families", [None, {"gpu_utilization_ratio": ["uuid"]}])
def test_a_small_parquet_file_that_expands_beyond_the_memory_limit_is_refused_unread(
    tmp_path: Path, bad_input: Any, never_expanded: Callable[[], None], families: Any
) -> None:
    root = compressible_history(tmp_path / "h", 400_000)
    never_expanded()
    assert (root / "samples.parquet").stat().st_size < 200_000
    with pytest.raises(AnalyzerError) as failed:
        read_history(root, families=families, limits=InputLimits(max_bytes=8 * 1024**2))
    bad_input("expanding input: parquet")
    message = one_line(failed.value)
    assert message.startswith(f"{root / 'samples.parquet'}: would expand to about")
    assert "400,000 rows" in message and "(--max-memory)" in message


def test_a_parquet_file_with_more_rows_than_the_limit_is_refused_unread(
    tmp_path: Path, bad_input: Any, never_expanded: Callable[[], None]
) -> None:
    root = compressible_history(tmp_path / "h", 400_000)
    never_expanded()
    with pytest.raises(
        AnalyzerError, match=r"400,000 rows, more than the limit of 100,000 \(--max-samples\)$"
    ):
        read_history(root, limits=InputLimits(max_rows=100_000))
    bad_input("expanding input: parquet")


def test_the_limits_are_cli_flags(tmp_path: Path, bad_input: Any) -> None:
    root = compressible_history(tmp_path / "h", 400_000)
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "profile", "--history", str(root), "--max-memory", "8MiB"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    bad_input("expanding input: parquet via the CLI")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "would expand to about" in lines[0] and "limit of 8.00 GiB" not in lines[0]


def test_a_gzip_member_that_expands_beyond_the_limit_is_refused_before_decompressing(
    tmp_path: Path, bad_input: Any
) -> None:
    src = tmp_path / "t"
    src.mkdir()
    body = b"value,timestamp_anon,container_ip\n" + b"0.0,1662858720.0,aaaa\n" * 1_000_000
    for stem in ("pod_gpu_duty_cycle_anon", "pod_gpu_memory_used_bytes_anon"):
        with tarfile.open(src / f"{stem}.tar.gz", "w:gz") as tar:
            info = tarfile.TarInfo(f"{stem}.csv")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    assert (src / "pod_gpu_duty_cycle_anon.tar.gz").stat().st_size < 1_000_000
    with pytest.raises(AnalyzerError) as failed:
        import_trace(
            "alibaba-genai-2026",
            src,
            tmp_path / "h",
            get_model("H100-80GB"),
            InputLimits(max_bytes=16 * 1024**2),
        )
    bad_input("expanding input: trace archive")
    message = one_line(failed.value)
    assert (
        "pod_gpu_duty_cycle_anon.tar.gz:pod_gpu_duty_cycle_anon.csv" in message and "--max-memory" in message
    )


SEED_CASE = Path(__file__).resolve().parents[2] / "sim" / "scenarios" / "seed-case.yaml"


@pytest.mark.parametrize(
    ("before", "after", "field"),
    [
        ("ana: 1101", "ana: 4294967295", "users.ana"),  # (uid_t)-1 is "no change", never a user
        ("ana: 1101", "ana: 100000000000000000000000", "users.ana"),
        ("seed: 42", "seed: 100000000000000000000000000000000000000", "seed"),
        ("memory: 10GiB, sm: 0.24", "memory: 1000000000000000000000000000000, sm: 0.24", "workload.memory"),
        ("sm: 0.24", "sm: .inf", "workload.sm"),
        ("start: -2h", "start: .nan", "processes[0].start"),
        ("step: 0.6s", "step: -0.6s", "workload.step"),
    ],
)
def test_absurd_scenario_values_are_one_line_naming_the_field(
    tmp_path: Path, bad_input: Any, before: str, after: str, field: str
) -> None:
    text = SEED_CASE.read_text()
    assert before in text
    path = tmp_path / "absurd.yaml"
    path.write_text(text.replace(before, after, 1))
    with pytest.raises(ScenarioError) as failed:
        load_scenario(path)
    bad_input("impossible value: scenario file")
    message = one_line(failed.value)
    assert message.startswith(f"{path}: ") and field in message


def test_a_deeply_nested_prometheus_answer_is_one_line_naming_the_api(
    capsys: pytest.CaptureFixture[str], bad_input: Any
) -> None:
    from gpulens.cli import main
    from tests.analyzer.fakeprom import fake_prometheus

    body = b'{"status": "success", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with fake_prometheus([(200, body)]) as (url, _):
        code = main(["profile", "--prometheus", url, "--window", "1h"])
    bad_input("nesting: Prometheus answer")
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert f"{url}/api/v1/query: malformed response (not JSON)" in lines[0]
