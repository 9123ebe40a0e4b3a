"""The flags of this feature: --profiling dcgm, --dcgm-bindings, --dcgm-address, --compat dcgm."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.exporter.cli import parse_config
from gpulens.exporter.config import ConfigError
from gpulens.sim.dcgm import BINDINGS_DIR


def test_defaults_use_no_compat_and_auto_profiling() -> None:
    config = parse_config([], env={})
    assert (config.profiling, config.compat, config.dcgm_bindings, config.dcgm_address) == (
        "auto",
        "",
        None,
        None,
    )


def test_flags_are_parsed() -> None:
    config = parse_config(
        ["--profiling", "dcgm", "--dcgm-bindings", str(BINDINGS_DIR), "--dcgm-address", "unix:///run/he.sock",
         "--compat", "dcgm"],
        env={},
    )  # fmt: skip
    assert config.profiling == "dcgm"
    assert config.dcgm_bindings == BINDINGS_DIR
    assert config.dcgm_address == "unix:///run/he.sock"
    assert config.compat == "dcgm"


def test_environment_variables_are_the_fallback() -> None:
    config = parse_config(
        [],
        env={"GPULENS_COMPAT": "dcgm", "GPULENS_DCGM_ADDRESS": "dcgm.local:5555", "GPULENS_PROFILING": "gpm"},
    )
    assert (config.compat, config.dcgm_address, config.profiling) == ("dcgm", "dcgm.local:5555", "gpm")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dcgm-address", "unix://relative.sock"], "--dcgm-address: expected unix:///absolute/path"),
        (["--dcgm-address", "host:0"], "--dcgm-address: expected HOST[:PORT] or unix:///PATH"),
        (["--dcgm-address", ":5555"], "--dcgm-address: expected HOST[:PORT] or unix:///PATH"),
        (["--dcgm-bindings", "/no/such/dir"], "--dcgm-bindings: /no/such/dir is not a directory"),
        (["--compat", "nvitop"], "--compat"),
        (["--profiling", "dcp"], "--profiling"),
    ],
)
def test_bad_values_are_one_line_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_config(argv, env={})


def test_a_bad_flag_exits_2_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.exporter.cli", "--dcgm-address", "x:y"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "gpulens-exporter: error: --dcgm-address: expected HOST[:PORT] or unix:///PATH, got 'x:y'"
    ]
