"""Every exporter setting, fed bad values, fails the same way (in the spirit of scikit-learn's
`check_param_validation`): one line that names the flag (or variable) and what was expected.

The settings are read from ExporterConfig's declarations, so a new flag is covered by being
declared, and its deprecated names warn.
"""

from __future__ import annotations

import dataclasses

import pytest

from gpulens.exporter.cli import build_parser, parse_config
from gpulens.exporter.config import ConfigError, ExporterConfig
from gpulens.settings import Setting, aliases_of, settings_of

VALUED = [(f.name, spec) for f, spec in settings_of(ExporterConfig) if not spec.switch]
SWITCHES = [(f.name, spec) for f, spec in settings_of(ExporterConfig) if spec.switch]
HOSTILE = ("", "abc", "-1", "nan", "inf", "1e309", "/nonexistent/x", "a\nb", "9" * 5000, "[::1]:70000")


def _ids(params: list[tuple[str, Setting]]) -> list[str]:
    return [spec.flag for _, spec in params]


def _outcome(argv: list[str], env: dict[str, str]) -> ExporterConfig | ConfigError:
    try:
        return parse_config(argv, env=env)
    except ConfigError as exc:
        return exc


@pytest.mark.parametrize(("name", "spec"), VALUED, ids=_ids(VALUED))
@pytest.mark.parametrize("raw", HOSTILE)
def test_a_hostile_value_parses_to_the_declared_type_or_fails_in_one_line_naming_the_flag(
    name: str, spec: Setting, raw: str
) -> None:
    result = _outcome([f"{spec.flag}={raw}"], {})
    if isinstance(result, ConfigError):
        message = str(result)
        assert spec.flag in message and "\n" not in message, message
        return
    default = getattr(ExporterConfig(), name)
    value = getattr(result, name)
    assert default is None or isinstance(value, type(default)), (spec.flag, raw, value)


@pytest.mark.parametrize(("name", "spec"), VALUED, ids=_ids(VALUED))
def test_the_environment_variable_fails_like_the_flag_naming_both(name: str, spec: Setting) -> None:
    flag_result = _outcome([f"{spec.flag}=abc"], {})
    env_result = _outcome([], {spec.env: "abc"})
    assert isinstance(flag_result, ConfigError) == isinstance(env_result, ConfigError)
    if isinstance(env_result, ConfigError):
        assert spec.env in str(env_result) and spec.flag in str(env_result)


@pytest.mark.parametrize(("name", "spec"), SWITCHES, ids=_ids(SWITCHES))
def test_a_switch_variable_takes_only_yes_or_no(name: str, spec: Setting) -> None:
    assert getattr(parse_config([], env={spec.env: "yes"}), name) is (not spec.negated)
    with pytest.raises(ConfigError, match=spec.env):
        parse_config([], env={spec.env: "maybe"})


@pytest.mark.parametrize(("old", "new"), sorted(aliases_of(ExporterConfig).items()))
def test_a_deprecated_name_still_works_and_is_reported_with_its_replacement(old: str, new: str) -> None:
    field = next(f for f, spec in settings_of(ExporterConfig) if spec.flag == new)
    value = {"--procfs": "/", "--web.config-file": __file__}.get(old, str(field.default))
    config = parse_config([old, value], env={})
    assert getattr(config, field.name) == parse_config([new, value], env={}).__getattribute__(field.name)
    assert (old, new) in config.deprecated


def test_the_new_names_report_nothing_deprecated() -> None:
    assert parse_config(["--web.listen-address", ":1", "--log.format", "json"], env={}).deprecated == ()


def test_the_earlier_logfmt_name_text_is_reported() -> None:
    config = parse_config(["--log.format", "text"], env={})
    assert config.log_format == "logfmt"
    assert config.deprecated == (("--log.format text", "--log.format logfmt"),)


def test_every_field_but_the_derived_ones_is_a_declared_setting() -> None:
    declared = {f.name for f, _ in settings_of(ExporterConfig)}
    fields = {f.name for f in dataclasses.fields(ExporterConfig)}
    assert fields - declared == {"collectors", "deprecated"}  # from --collector.<name>; from parsing


def test_every_declared_flag_is_in_the_help() -> None:
    options = {o for action in build_parser()._actions for o in action.option_strings}
    assert {spec.flag for _, spec in settings_of(ExporterConfig)} <= options


def test_disable_defaults_runs_only_the_collectors_named() -> None:
    config = parse_config(["--collector.disable-defaults", "--collector.device", "--collector.xid"], env={})
    assert config.collectors == frozenset({"device", "xid"})
    assert parse_config([], env={"GPULENS_COLLECTOR_DISABLE_DEFAULTS": "1"}).collectors == frozenset()


def test_the_mps_control_command_is_split_as_a_shell_would() -> None:
    config = parse_config(["--mps-control", "/opt/nvidia/nvidia-cuda-mps-control --x 'a b'"], env={})
    assert config.mps_control == ("/opt/nvidia/nvidia-cuda-mps-control", "--x", "a b")


def test_an_empty_mps_control_command_turns_the_query_off() -> None:
    assert parse_config(["--mps-control="], env={}).mps_control == ()


def test_an_mps_control_command_with_an_open_quote_is_one_line_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--mps-control: expected a command line"):
        parse_config(["--mps-control", "nvidia-cuda-mps-control 'x"], env={})


def test_an_mps_pipe_dir_that_does_not_exist_yet_is_accepted() -> None:
    # the node's MPS control daemon creates it when it starts, possibly after the exporter
    config = parse_config(["--mps-pipe-dir", "/run/nvidia/mps/nvidia.com/gpu/pipe"], env={})
    assert config.mps_pipe_dir == "/run/nvidia/mps/nvidia.com/gpu/pipe"


@pytest.mark.parametrize("value", ["run/nvidia/mps", "/run/../etc", "/" + "p" * 256])
def test_an_mps_pipe_dir_that_is_not_a_sane_absolute_path_is_one_line_naming_the_flag(value) -> None:
    with pytest.raises(ConfigError, match=r"^--mps-pipe-dir: expected an absolute path"):
        parse_config(["--mps-pipe-dir", value], env={})


def test_an_mps_pipe_dir_that_is_a_file_is_one_line_naming_the_flag(tmp_path) -> None:
    (tmp_path / "pipe").write_text("")
    with pytest.raises(ConfigError, match=r"^--mps-pipe-dir: .*pipe is not a directory$"):
        parse_config(["--mps-pipe-dir", str(tmp_path / "pipe")], env={})
