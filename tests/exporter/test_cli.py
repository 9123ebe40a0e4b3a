"""Flags, environment fallbacks and one-line errors of `gpulens-exporter`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.exporter.cli import parse_config
from gpulens.exporter.collectors import DEFAULT_ENABLED, enabled
from gpulens.exporter.config import DEFAULT_LISTEN, ConfigError, parse_listen


def running(argv: list[str], env: dict[str, str] | None = None) -> tuple[str, ...]:
    """The collectors an exporter started with `argv` runs (what app.py asks `enabled`)."""
    config = parse_config(argv, env={} if env is None else env)
    return enabled(config.collectors, config.compat_spec())


def test_defaults_listen_on_the_documented_port_every_5_seconds() -> None:
    config = parse_config([], env={})
    assert config.listen == DEFAULT_LISTEN == ":9842"
    assert config.interval == 5.0
    assert config.collectors == DEFAULT_ENABLED


def test_processes_collector_is_off_by_default_and_can_be_enabled() -> None:
    assert "processes" not in running([])
    assert "processes" in running(["--collector.processes"])


def test_no_collector_flag_disables_a_default_collector() -> None:
    collectors = running(["--no-collector.health", "--no-collector.xid"])
    assert "health" not in collectors
    assert "xid" not in collectors
    assert "device" in collectors


def test_environment_variables_are_fallbacks_for_flags() -> None:
    env = {"GPULENS_LISTEN": "127.0.0.1:9999", "GPULENS_INTERVAL": "2.5", "GPULENS_LOG_FORMAT": "json"}
    config = parse_config([], env=env)
    assert (config.listen, config.interval, config.log_format) == ("127.0.0.1:9999", 2.5, "json")


def test_exporter_toolkit_flags_set_address_config_path_limit_and_logging(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("{}\n")
    config = parse_config(
        [
            "--web.listen-address=127.0.0.1:9100",
            f"--web.config.file={web}",
            "--web.telemetry-path=/gpu/metrics",
            "--web.max-requests=5",
            "--log.level=warn",
            "--log.format=json",
        ],
        env={},
    )
    assert (config.listen, config.web_config_file, config.telemetry_path) == (
        "127.0.0.1:9100",
        web,
        "/gpu/metrics",
    )
    assert (config.max_requests, config.log_level, config.log_format) == (5, "warn", "json")


def test_logs_default_to_logfmt_and_metrics_to_slash_metrics_with_40_concurrent_scrapes() -> None:
    config = parse_config([], env={})
    assert (config.log_format, config.telemetry_path, config.max_requests) == ("logfmt", "/metrics", 40)


def test_earlier_flag_names_are_aliases(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("{}\n")
    config = parse_config(
        ["--listen", ":9100", "--web.config-file", str(web), "--log-level", "debug", "--log-format", "text"],
        env={},
    )
    assert (config.listen, config.web_config_file, config.log_level) == (":9100", web, "debug")
    assert config.log_format == "logfmt"  # `text` was the default's earlier name


def test_new_environment_names_win_over_the_aliases_names() -> None:
    env = {"GPULENS_WEB_LISTEN_ADDRESS": ":1", "GPULENS_LISTEN": ":2", "GPULENS_WEB_MAX_REQUESTS": "0"}
    config = parse_config([], env=env)
    assert (config.listen, config.max_requests) == (":1", 0)


def test_compat_takes_modes_and_a_dcgm_exporter_version() -> None:
    from gpulens.exporter.compat import CompatSpec

    assert parse_config(["--compat", "dcgm"], env={}).compat_spec() == CompatSpec(dcgm=(4, 8, 2))
    spec = parse_config(["--compat", "dcgm=4.8.3,jobstats"], env={}).compat_spec()
    assert spec == CompatSpec(dcgm=(4, 8, 3), jobstats=True)
    assert spec.dcgm_hostname_label == "hostname"
    assert (
        parse_config(["--compat", "dcgm=4.5.3-4.8.2"], env={}).compat_spec().dcgm_hostname_label == "Hostname"
    )
    assert parse_config(["--compat", "jobstats"], env={}).compat_spec() == CompatSpec(jobstats=True)


def test_metrics_allow_and_deny_take_comma_separated_globs() -> None:
    config = parse_config(
        ["--metrics.allow", "gpu_memory_*, gpu_up", "--metrics.deny", "gpu_memory_free_bytes"], env={}
    )
    assert config.metrics_allow == ("gpu_memory_*", "gpu_up")
    assert config.serves_family("gpu_memory_used_bytes", "gpu_memory_used_bytes")
    assert not config.serves_family("gpu_memory_free_bytes", "gpu_memory_free_bytes")
    assert not config.serves_family("gpu_power_watts", "gpu_power_watts")
    assert config.serves_family("gpulens_nvml_up", "gpulens_nvml_up")  # the exporter's own, unless denied


def test_flags_win_over_environment() -> None:
    config = parse_config(["--interval", "1"], env={"GPULENS_INTERVAL": "7"})
    assert config.interval == 1.0


def test_environment_switches_for_attribution_and_collectors() -> None:
    env = {"GPULENS_NO_ATTRIBUTION_KUBERNETES": "true", "GPULENS_COLLECTOR_PROCESSES": "1"}
    config = parse_config([], env=env)
    assert config.attribution_kubernetes is False
    assert config.attribution_procfs is True
    assert "processes" in running([], env)


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--interval", "0"], {}, "--interval"),
        (["--interval", "abc"], {}, "--interval"),
        (["--web.listen-address", "nonsense"], {}, "--web.listen-address"),
        (["--listen", ":70000"], {}, "--listen"),
        (["--log.format", "xml"], {}, "--log.format"),
        (["--log-format", "xml"], {}, "--log-format"),
        (["--log.level", "loud"], {}, "--log.level"),
        (["--bogus"], {}, "--bogus"),
        ([], {"GPULENS_INTERVAL": "fast"}, "GPULENS_INTERVAL"),
        ([], {"GPULENS_LOG_FORMAT": "xml"}, "--log.format"),
        (["--web.config.file", "/does/not/exist.yml"], {}, "--web.config.file"),
        (["--web.config-file", "/does/not/exist.yml"], {}, "--web.config-file"),
        (["--web.telemetry-path", "metrics"], {}, "--web.telemetry-path"),
        (["--web.telemetry-path", "/-/ready"], {}, "--web.telemetry-path"),
        (["--web.max-requests", "-1"], {}, "--web.max-requests"),
        (["--compat", "prometheus"], {}, "--compat"),
        (["--compat", "dcgm=4.9.0"], {}, "--compat"),
        (["--compat", "dcgm=latest"], {}, "--compat"),
        (["--metrics.deny", "gpu_{up}"], {}, "--metrics.deny"),
        (["--kubernetes.api-url", "apiserver:6443"], {}, "--kubernetes.api-url"),
    ],
)
def test_bad_input_names_the_flag(argv: list[str], env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        parse_config(argv, env=env)


def test_parse_listen_forms() -> None:
    assert parse_listen(":9842") == ("", 9842)
    assert parse_listen("127.0.0.1:1") == ("127.0.0.1", 1)
    assert parse_listen("[::1]:9842") == ("::1", 9842)


def test_bad_flag_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.exporter.cli", "--interval", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "--interval" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_web_config_prints_one_line_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text("basic_auth_users:\n  alice: plaintext\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpulens.exporter",
            "--web.config.file",
            str(config),
            "--web.listen-address",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "basic_auth_users.alice" in result.stderr


def test_unknown_scenario_prints_one_line_and_exits_2() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpulens.exporter",
            "--simulate",
            "no-such-scenario",
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "--simulate" in result.stderr and "no-such-scenario" in result.stderr


def test_the_simulated_node_is_removed_with_its_files_on_exit() -> None:
    import pynvml

    from gpulens.exporter.app import Exporter
    from gpulens.exporter.config import ExporterConfig
    from gpulens.sim.node import simulated_node

    with simulated_node("seed-case") as sim:
        exporter = Exporter(ExporterConfig(simulate="seed-case", pod_resources_socket=None), node=sim.node)
        try:
            assert exporter.sample_once().gpu_count > 0
            assert exporter.procfs == sim.paths.procfs and exporter.procfs.is_dir()
        finally:
            exporter.close()
    assert not sim.paths.root.exists()
    assert pynvml.nvmlLib is None


def test_the_simulated_node_is_removed_when_its_user_fails() -> None:
    import pynvml

    from gpulens.sim.node import simulated_node

    with pytest.raises(RuntimeError), simulated_node("seed-case", dcgm=True) as sim:
        raise RuntimeError("the exporter failed")
    assert not sim.paths.root.exists()
    assert pynvml.nvmlLib is None


def test_the_exporter_package_never_imports_the_simulator() -> None:
    """exporter/ holds only what runs on a node: `--simulate` finds the simulator by entry point."""
    import ast

    root = Path(__file__).resolve().parents[2] / "exporter"
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if n.startswith("gpulens.sim")]
    assert offenders == []


def test_simulate_finds_the_simulated_node_through_its_entry_point() -> None:
    from gpulens.exporter.cli import simulated_node_factory
    from gpulens.sim.node import simulated_node

    assert simulated_node_factory() is simulated_node


def test_simulate_without_the_simulator_entry_point_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.metadata

    from gpulens.exporter.cli import main

    monkeypatch.setattr(importlib.metadata, "distributions", lambda **_kw: iter(()))
    assert main(["--simulate", "seed-case", "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--simulate" in err and "gpulens.simulated_node" in err


def test_without_a_gpu_and_without_simulate_the_log_and_landing_page_say_what_to_do(tmp_path: Path) -> None:
    import urllib.request

    import pynvml

    try:  # on a machine with a working NVIDIA driver there is nothing to advise
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine")
    except pynvml.NVMLError:
        pass
    from tests.support.procs import exporter, wait_http

    with exporter(tmp_path, "--interval", "0.5") as target:
        wait_http(f"http://{target}/-/ready")  # the first sample (NVML down) is published
        with urllib.request.urlopen(f"http://{target}/", timeout=10) as response:
            landing = response.read().decode()
    log = (tmp_path / "exporter.log").read_text()
    for text in (landing, log):
        assert "gpulens-exporter --simulate dgx-h100" in text
        assert "nvidia-smi" in text
    assert log.count("--simulate dgx-h100") == 1  # said once, not every retry


def test_the_hint_names_a_built_in_scenario_and_the_command_that_lists_them_all() -> None:
    from gpulens.cli import main as gpulens
    from gpulens.exporter.hints import no_gpu_hint
    from gpulens.sim.scenariofile import list_builtin

    hint = no_gpu_hint("nvmlInit failed")
    assert "--simulate dgx-h100" in hint and "dgx-h100" in list_builtin()
    assert "`gpulens sim list`" in hint and gpulens(["sim", "list"]) == 0


@pytest.mark.parametrize(
    "argv",
    [["--procfs", "/no\nsuch"], ["--web.config.file", "x\n"], ["--collector.mig", "a\rb"]],
)
def test_a_value_with_control_characters_is_escaped_in_the_one_line_error(argv: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(argv, env={})
    assert str(info.value).isprintable() and "\\" in str(info.value)
