"""Bad files: scenario files, job-mapping files, exporter flags and `--web.config-file` (issue 11).

Every case must end in one clear line naming the input (a `ScenarioError` / `ConfigError` message,
a log line, or `<prog>: error: ...` on stderr with a non-zero exit), never a traceback. Hypothesis
mutates valid inputs to find the cases nobody wrote down; each example is counted as a case.
"""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens.cli import main as gpulens_main
from gpulens.exporter.attribution.logonce import LogOnce
from gpulens.exporter.attribution.mapping_dir import (
    DEFAULT_MAX_BYTES,
    MappingDirectory,
    MappingFormatError,
    parse_mapping_content,
)
from gpulens.exporter.cli import parse_config
from gpulens.exporter.config import ConfigError, ExporterConfig
from gpulens.httpd.webconfig import load_web_config
from gpulens.settings import aliases_of, settings_of
from gpulens.sim.scenario import Scenario, ScenarioError
from gpulens.sim.scenariofile import BUILTIN_DIR, parse_scenario

Count = Callable[..., None]
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "7g.80gb", "1g.10gb", "-1h", "forever", "10GiB", "250%", "xid", "lost", "0x10"]),
    st.lists(st.integers(-3, 100), max_size=4),
    st.dictionaries(st.text(max_size=8), st.integers(-5, 5), max_size=3),
)


def one_line(message: str, *names: str) -> None:
    assert message and "\n" not in message.strip(), f"not one line: {message!r}"
    assert "Traceback" not in message
    for name in names:
        assert name in message, f"{message!r} does not name {name!r}"


# ---- scenario files ------------------------------------------------------------------------------
# a place in a YAML document: the keys and list indexes leading to it
DocPath = tuple[str | int, ...]
DGX = yaml.safe_load((BUILTIN_DIR / "dgx-h100.yaml").read_text())


def paths_of(node: Any, prefix: DocPath = ()) -> list[DocPath]:
    out = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            out.extend(paths_of(child, (*prefix, key)))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            out.extend(paths_of(child, (*prefix, index)))
    return out


DGX_PATHS = [p for p in paths_of(DGX) if p]


def mutate(doc: Any, path: DocPath, action: str, junk: Any) -> Any:
    doc = copy.deepcopy(doc)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "replace":
        parent[last] = junk
    elif action == "delete":
        del parent[last]
    elif action == "unknown-key" and isinstance(parent, dict):
        parent[f"unexpected_{last}"] = junk
    return doc


@FUZZ
@given(
    path=st.sampled_from(DGX_PATHS),
    action=st.sampled_from(["replace", "delete", "unknown-key"]),
    junk=JUNK,
)
def test_mutated_scenarios_load_or_fail_with_one_line(
    bad_input: Count, path: DocPath, action: str, junk: Any
) -> None:
    bad_input("scenario file (fuzzed)")
    doc = mutate(DGX, path, action, junk)
    try:
        scenario = parse_scenario(doc, "fuzz.yaml")
    except ScenarioError as exc:
        one_line(str(exc), "fuzz.yaml")
        return
    assert isinstance(scenario, Scenario)


@FUZZ
@given(
    data=st.recursive(
        JUNK,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(["name", "gpus", "processes", "faults", "node", "users", "seed", "x"]),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_arbitrary_documents_are_rejected_with_one_line(bad_input: Count, data: Any) -> None:
    bad_input("scenario file (fuzzed)")
    try:
        parse_scenario(data, "junk.yaml")
    except ScenarioError as exc:
        one_line(str(exc), "junk.yaml")


IMPOSSIBLE = {
    "too many 2g": ("gpus[0].mig", [{"profile": "2g.20gb"}] * 4),
    "over 7 slices": ("gpus[0].mig", ["4g.40gb", "4g.40gb"]),
    "overlapping starts": (
        "gpus[0].mig",
        [{"profile": "3g.40gb", "start": 0}, {"profile": "2g.20gb", "start": 0}],
    ),
    "bad start": ("gpus[0].mig", [{"profile": "3g.40gb", "start": 3}]),
    "unknown profile": ("gpus[0].mig", ["5g.50gb"]),
    "A100 profile on H100": ("gpus[0].mig", ["1g.5gb"]),
    "duplicate instance id": (
        "gpus[0].mig",
        [{"profile": "1g.10gb", "id": 9}, {"profile": "1g.10gb", "id": 9}],
    ),
    "mig with mps": ("gpus[2].mig", ["7g.80gb"]),
}


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
def test_impossible_mig_layouts_name_the_field(bad_input: Count, case: str) -> None:
    bad_input("scenario file (impossible MIG layout)")
    field_path, layout = IMPOSSIBLE[case]
    doc = copy.deepcopy(DGX)
    gpu = int(field_path.split("[")[1].split("]")[0])
    doc["gpus"][gpu]["mig"] = layout
    doc["processes"] = [p for p in doc["processes"] if p["gpu"] != gpu]
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc, "layout.yaml")
    one_line(str(info.value), "layout.yaml", f"gpus[{gpu}]")


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpus: [{model: H100-80GB, count: two}]", "gpus[0].count"),
        ("gpus: [{model: H100-80GB}]\nextra: 1", "extra"),
        ("gpus: [{model: Z9000}]", "gpus[0].model"),
        ("gpus: []", "gpus"),
        (
            "gpus: [{model: H100-80GB}]\nfaults: {timeline: [{at: soon, gpu: 0, xid: 79}]}",
            "faults.timeline[0].at",
        ),
        (
            "gpus: [{model: H100-80GB}]\n"
            "processes: [{pid: 4242, gpu: 3, workload: {pattern: constant, memory: 1GiB}}]",
            "processes[0].gpu",
        ),
        (
            "gpus: [{model: H100-80GB}]\n"
            "processes: [{pid: 4242, gpu: 0, workload: {pattern: constant, memory: 1TiB}}]",
            "processes[0].workload.memory",
        ),
        ("{{{{", "yaml"),
        ("\x00\x01\x02binary", ""),
    ],
    ids=[
        "wrong-type",
        "unknown-key",
        "unknown-model",
        "no-gpus",
        "bad-time",
        "no-such-gpu",
        "too-much-memory",
        "not-yaml",
        "binary",
    ],
)
def test_bad_scenario_file_via_cli_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_input: Count, text: str, names: str
) -> None:
    bad_input("scenario file (gpulens sim validate)")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert gpulens_main(["sim", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    one_line(err, str(path))
    if names and names != "yaml":
        assert names in err, err


# ---- job-mapping files ---------------------------------------------------------------------------
@FUZZ
@given(data=st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_mapping_content_parses_or_fails_with_one_line(bad_input: Count, data: bytes) -> None:
    bad_input("job-mapping content (fuzzed)")
    try:
        entries = parse_mapping_content(data)
    except MappingFormatError as exc:
        one_line(str(exc))
        return
    for entry in entries:
        assert entry.job_id and "\n" not in entry.job_id


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


BAD_MAPPING_FILES: dict[str, Callable[[Path, Path], object]] = {  # each plants one bad file
    "garbage": lambda d, _: (d / "1").write_text("job 1 2 3 4 extra fields\n{]\n"),
    "huge": lambda d, _: (d / "2").write_bytes(b"4711\n" * (DEFAULT_MAX_BYTES // 5 + 10)),
    "binary": lambda d, _: (d / "3").write_bytes(b"\x7fELF\x00\x01\xff\xfe" * 20),
    "symlink-outside": lambda d, out: (d / "4").symlink_to(out / "secret"),
    "fifo": lambda d, _: os.mkfifo(d / "5"),
    "directory": lambda d, _: (d / "6").mkdir(),
    "dangling-symlink": lambda d, out: (d / "7").symlink_to(out / "missing"),
    "non-utf8": lambda d, _: (d / "0.2").write_bytes(b"job\xe9\xff\n"),
}


def test_bad_mapping_files_are_skipped_with_one_line_each_and_good_ones_used(
    tmp_path: Path, bad_input: Count
) -> None:
    directory, outside = tmp_path / "map", tmp_path / "outside"
    directory.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("AWS_SECRET_ACCESS_KEY=do-not-read\n")
    (directory / "0").write_text("5101\n")
    (directory / "GPU-notauuid").write_text("5102\n")
    for make in BAD_MAPPING_FILES.values():
        make(directory, outside)
    bad_input("job-mapping file", len(BAD_MAPPING_FILES))
    logger = logging.getLogger("tests.reliability.mapping")
    handler = Lines()
    logger.addHandler(handler)
    try:
        mapping = MappingDirectory(directory, LogOnce(logger))
        entries = mapping.refresh()
        first = list(handler.lines)
        mapping.refresh()
        mapping.refresh()
    finally:
        logger.removeHandler(handler)
    assert any(e.job_id == "5101" for values in entries.values() for e in values)
    assert handler.lines == first, "a bad file was logged again on the next refresh"
    for name in ("1", "2", "3", "4", "5", "6", "7", "0.2"):
        named = [line for line in first if str(directory / name) in line]
        assert len(named) == 1, (name, first)
    assert not any("do-not-read" in line for line in first)


# ---- exporter flags and --web.config-file ----------------------------------------------------------
# every declared setting and its deprecated names (exporter/config.py), and collector switches
FLAGS = [
    *(spec.flag for _, spec in settings_of(ExporterConfig)),
    *aliases_of(ExporterConfig),
    "--collector.disable-defaults",
    "--collector.mig",
    "--no-collector.jobs",
]
FLAG_VALUES = st.one_of(
    st.sampled_from(
        [
            "-1",
            "0",
            "nan",
            "inf",
            "1e309",
            "",
            ":",
            "::1:9",
            "[::1]:70000",
            "host:port",
            "0x10",
            "/nonexistent",
            "debug",
            "json",
            "auto",
            "off",
            "9842",
            "-",
            "--interval",
        ]
    ),
    st.text(max_size=12),
)


@FUZZ
@given(argv=st.lists(st.tuples(st.sampled_from(FLAGS), FLAG_VALUES), max_size=4))
def test_exporter_flags_parse_or_fail_with_one_line(bad_input: Count, argv: list[tuple[str, str]]) -> None:
    bad_input("exporter flags (fuzzed)")
    flat = [token for pair in argv for token in pair]
    try:
        parse_config(flat, env={})
    except ConfigError as exc:
        one_line(str(exc))


@FUZZ
@given(
    env=st.dictionaries(
        st.sampled_from(
            [
                "GPULENS_INTERVAL",
                "GPULENS_LISTEN",
                "GPULENS_SIM_SPEED",
                "GPULENS_COLLECTOR_MIG",
                "GPULENS_NO_ATTRIBUTION_PROCFS",
                "GPULENS_LOG_LEVEL",
                "GPULENS_COLLECTOR_PROCESSES_MAX",
            ]
        ),
        FLAG_VALUES,
        max_size=3,
    )
)
def test_exporter_environment_parses_or_fails_with_one_line(bad_input: Count, env: dict[str, str]) -> None:
    bad_input("exporter environment (fuzzed)")
    try:
        parse_config([], env=env)
    except ConfigError as exc:
        one_line(str(exc))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--interval", "-1"], "interval"),
        (["--listen", "127.0.0.1:99999"], "listen"),
        (["--simulate", "no-such-scenario"], "no-such-scenario"),
        (["--web.config-file", "/nonexistent/web.yml"], "/nonexistent/web.yml"),
        (["--no-such-flag"], "--no-such-flag"),
    ],
    ids=["negative-interval", "bad-port", "unknown-scenario", "missing-web-config", "unknown-flag"],
)
def test_exporter_process_exits_2_with_one_line(bad_input: Count, args: list[str], names: str) -> None:
    bad_input("exporter command line (process)")
    done = subprocess.run(
        [sys.executable, "-m", "gpulens.exporter.cli", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    one_line(done.stderr, names)
    assert done.stderr.startswith("gpulens-exporter: error:")


WEB_KEYS = st.sampled_from(["tls_server_config", "basic_auth_users", "http_server_config", "bogus"])
WEB_VALUES = st.one_of(
    JUNK,
    st.dictionaries(
        st.sampled_from(
            ["cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version", "x"]
        ),
        JUNK,
        max_size=4,
    ),
    st.dictionaries(
        st.text(min_size=1, max_size=6), st.sampled_from(["$2y$10$abc", "plain", "", "$2b$"]), max_size=2
    ),
)


@FUZZ
@given(doc=st.one_of(JUNK, st.dictionaries(WEB_KEYS, WEB_VALUES, max_size=3)))
def test_web_config_loads_or_fails_with_one_line_naming_the_file(
    tmp_path_factory: pytest.TempPathFactory, bad_input: Count, doc: Any
) -> None:
    bad_input("--web.config-file (fuzzed)")
    path = tmp_path_factory.mktemp("web") / "web.yml"
    path.write_text(yaml.safe_dump(doc))
    try:
        load_web_config(path)
    except ConfigError as exc:
        one_line(str(exc), str(path))


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"\xff\xfe\x00binary", id="binary"),
        pytest.param(b"tls_server_config: [", id="broken-yaml"),
        pytest.param(b"basic_auth_users:\n  bob: hunter2\n", id="plaintext-password"),
        pytest.param(b"tls_server_config: {cert_file: a.crt, key_file: a.key}\n", id="missing-cert"),
    ],
)
def test_bad_web_config_file_names_the_file(tmp_path: Path, bad_input: Count, content: bytes) -> None:
    bad_input("--web.config-file")
    path = tmp_path / "web.yml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_web_config(path)
    one_line(str(info.value), str(path))
    assert "hunter2" not in str(info.value)


def test_non_utf8_scenario_file_via_cli_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_input: Count
) -> None:
    bad_input("scenario file (gpulens sim validate)")
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\ngpus: [{model: H100-80GB}]\n")
    code = gpulens_main(["sim", "validate", str(path)])
    assert code == 2
    one_line(capsys.readouterr().err, str(path))
