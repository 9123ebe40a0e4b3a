"""Flags, environment fallbacks and one-line errors of `gpulens-exporter`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.exporter.cli import parse_config
from gpulens.exporter.collectors import DEFAULT_ENABLED
from gpulens.exporter.config import DEFAULT_LISTEN, ConfigError, parse_listen


def test_defaults_listen_on_the_documented_port_every_5_seconds() -> None:
    config = parse_config([], env={})
    assert config.listen == DEFAULT_LISTEN == ":9842"
    assert config.interval == 5.0
    assert config.collectors == DEFAULT_ENABLED


def test_processes_collector_is_off_by_default_and_can_be_enabled() -> None:
    assert "processes" not in parse_config([], env={}).collectors
    assert "processes" in parse_config(["--collector.processes"], env={}).collectors


def test_no_collector_flag_disables_a_default_collector() -> None:
    config = parse_config(["--no-collector.health", "--no-collector.xid"], env={})
    assert "health" not in config.collectors
    assert "xid" not in config.collectors
    assert "device" in config.collectors


def test_environment_variables_are_fallbacks_for_flags() -> None:
    env = {"GPULENS_LISTEN": "127.0.0.1:9999", "GPULENS_INTERVAL": "2.5", "GPULENS_LOG_FORMAT": "json"}
    config = parse_config([], env=env)
    assert (config.listen, config.interval, config.log_format) == ("127.0.0.1:9999", 2.5, "json")


def test_flags_win_over_environment() -> None:
    config = parse_config(["--interval", "1"], env={"GPULENS_INTERVAL": "7"})
    assert config.interval == 1.0


def test_environment_switches_for_attribution_and_collectors() -> None:
    env = {"GPULENS_NO_ATTRIBUTION_KUBERNETES": "true", "GPULENS_COLLECTOR_PROCESSES": "1"}
    config = parse_config([], env=env)
    assert config.attribution_kubernetes is False
    assert config.attribution_procfs is True
    assert "processes" in config.collectors


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--interval", "0"], {}, "--interval"),
        (["--interval", "abc"], {}, "--interval"),
        (["--listen", "nonsense"], {}, "--listen"),
        (["--listen", ":70000"], {}, "--listen"),
        (["--log-format", "xml"], {}, "--log-format"),
        (["--bogus"], {}, "--bogus"),
        ([], {"GPULENS_INTERVAL": "fast"}, "GPULENS_INTERVAL"),
        (["--web.config-file", "/does/not/exist.yml"], {}, "--web.config-file"),
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
            "--web.config-file",
            str(config),
            "--listen",
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
    """exporter/ holds only what runs on a node: the simulator is reached from the CLI alone."""
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
    assert offenders == ["cli.py: gpulens.sim.node"]
