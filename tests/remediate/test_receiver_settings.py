"""Every setting of `gpulens remediate`, fed bad values, fails the same way (in the spirit of
scikit-learn's `check_param_validation`): one line that names the flag (or variable) and what was
expected, never a traceback.

The settings are read from ReceiverConfig's declarations, so a new flag is covered by being
declared; its deprecated names keep working and are reported with what replaces them. The values
go through the `gpulens` command's own parser, as the Helm chart and compose pass them.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.cli import build_parser
from gpulens.remediate.config import ConfigError, ReceiverConfig, config_of
from gpulens.settings import Setting, aliases_of, settings_of

VALUED = [(f.name, spec) for f, spec in settings_of(ReceiverConfig) if not spec.switch]
SWITCHES = [(f.name, spec) for f, spec in settings_of(ReceiverConfig) if spec.switch]
HOSTILE = (
    "",
    "abc",
    "-1",
    "0",
    "nan",
    "inf",
    "1e309",
    "999999999999d",
    "/nonexistent/x",
    "a\nb",
    "9" * 5000,
    "[::1]:70000",
)
BASE = ["remediate", "--backend=slurm"]  # the one required setting, so each case fails on its own flag


def _ids(params: list[tuple[str, Setting]]) -> list[str]:
    return [spec.flag for _, spec in params]


def parse(argv: list[str], env: dict[str, str] | None = None) -> ReceiverConfig:
    return config_of(build_parser("remediate").parse_args(argv), env=env or {})


def _outcome(argv: list[str], env: dict[str, str]) -> ReceiverConfig | ConfigError:
    try:
        return parse(argv, env)
    except ConfigError as exc:
        return exc


@pytest.mark.parametrize(("name", "spec"), VALUED, ids=_ids(VALUED))
@pytest.mark.parametrize("raw", HOSTILE)
def test_a_hostile_value_parses_to_the_declared_type_or_fails_in_one_line_naming_the_flag(
    name: str, spec: Setting, raw: str
) -> None:
    result = _outcome([*BASE, f"{spec.flag}={raw}"], {})
    if isinstance(result, ConfigError):
        message = str(result)
        assert message.startswith(f"{spec.flag}: ") and "\n" not in message, message
        return
    default = getattr(ReceiverConfig(), name)
    value = getattr(result, name)
    assert default is None or isinstance(value, type(default)), (spec.flag, raw, value)


@pytest.mark.parametrize(("name", "spec"), VALUED, ids=_ids(VALUED))
def test_the_environment_variable_fails_like_the_flag_naming_both(name: str, spec: Setting) -> None:
    backend = {"GPULENS_BACKEND": "slurm"}  # the required setting, by its variable this time
    flag_result = _outcome(["remediate", f"{spec.flag}=abc"], backend)
    env_result = _outcome(["remediate"], {**backend, spec.env: "abc"})
    assert isinstance(flag_result, ConfigError) == isinstance(env_result, ConfigError)
    if isinstance(env_result, ConfigError):
        assert str(env_result).startswith(f"{spec.env} ({spec.flag}): ")


@pytest.mark.parametrize(("name", "spec"), SWITCHES, ids=_ids(SWITCHES))
def test_a_switch_variable_takes_only_yes_or_no(name: str, spec: Setting) -> None:
    assert getattr(parse(BASE, {spec.env: "yes"}), name) is True
    with pytest.raises(ConfigError, match=spec.env):
        parse(BASE, {spec.env: "maybe"})


@pytest.mark.parametrize(("old", "new"), sorted(aliases_of(ReceiverConfig).items()))
def test_a_deprecated_name_still_works_and_is_reported_with_its_replacement(old: str, new: str) -> None:
    field = next(f for f, spec in settings_of(ReceiverConfig) if spec.flag == new)
    value = {"--listen": ":9843", "--log-level": "warn"}[old]
    config = parse([*BASE, old, value])
    assert getattr(config, field.name) == getattr(parse([*BASE, new, value]), field.name)
    assert config.deprecated == ((old, new),)


def test_the_plaintext_basic_auth_flags_are_reported_as_replaced_by_the_web_config_file() -> None:
    config = parse([*BASE, "--basic-auth-user", "am", "--basic-auth-password-file", "/etc/pw"])
    assert (config.basic_auth_user, config.basic_auth_password_file) == ("am", Path("/etc/pw"))
    assert config.deprecated == (
        ("--basic-auth-user", "--web.config.file (basic_auth_users)"),
        ("--basic-auth-password-file", "--web.config.file (basic_auth_users)"),
    )


def test_the_new_names_report_nothing_deprecated() -> None:
    assert parse([*BASE, "--web.listen-address", ":1", "--log.level", "warn"]).deprecated == ()


def test_the_flag_wins_over_its_variable() -> None:
    config = parse([*BASE, "--hold-down=5m"], {"GPULENS_HOLD_DOWN": "1h", "GPULENS_BACKEND": "kubernetes"})
    assert (config.hold_down, config.backend) == (300.0, "slurm")


def test_the_backend_may_come_from_its_variable_and_is_required() -> None:
    assert parse(["remediate"], {"GPULENS_BACKEND": "kubernetes"}).backend == "kubernetes"
    with pytest.raises(ConfigError, match=r"^--backend: required"):
        parse(["remediate"])


def test_every_field_but_the_deprecated_record_is_a_declared_setting() -> None:
    declared = {f.name for f, _ in settings_of(ReceiverConfig)}
    assert {f.name for f in dataclasses.fields(ReceiverConfig)} - declared == {"deprecated"}


def test_the_defaults_are_what_the_chart_and_compose_rely_on() -> None:
    config = parse(BASE)
    assert config.listen == ("127.0.0.1", 9843)
    assert (config.breaker_max_nodes, config.breaker_window, config.action_timeout) == (3, 3600.0, 60.0)
    assert (config.hold_down, config.flap_window, config.reconcile_interval) == (600.0, 86400.0, 15.0)
    assert (config.diag, config.diag_level, config.dra_device_taints) == (True, 2, "auto")
    assert not (config.apply or config.drain or config.return_to_service)


def test_a_bad_value_stops_the_receiver_with_one_line_and_status_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", *BASE, "--reconcile-interval", "0s"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        "gpulens: error: --reconcile-interval: expected a positive duration, got 0s"
    ]
