"""deploy/systemd/: the exporter unit and the weekly report service + timer.

`systemd-analyze verify` (when installed) catches unknown keys and bad values, which systemd
otherwise only logs and ignores; the rest pins what the units promise: ordering after the NVIDIA
daemons, hardening that leaves NVML its device nodes, a weekly timer that names a real service.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "deploy" / "systemd"
UNITS = ["gpulens-exporter.service", "gpulens-report.service", "gpulens-report.timer"]


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> every value (systemd keys repeat, so a plain ConfigParser won't do)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in (SYSTEMD / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"{name}: {line!r} outside a section"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_exporter_starts_after_and_wants_the_nvidia_daemons():
    section = unit("gpulens-exporter.service")["Unit"]
    for key in ("After", "Wants"):
        names = " ".join(section[key]).split()
        assert {"nvidia-persistenced.service", "nvidia-dcgm.service"} <= set(names), key


def test_exporter_reads_an_optional_environment_file_and_restarts():
    service = unit("gpulens-exporter.service")["Service"]
    assert service["EnvironmentFile"] == ["-/etc/default/gpulens-exporter"]
    assert service["ExecStart"][0].split()[0].endswith("/gpulens-exporter")
    assert service["Restart"] == ["always"]
    assert service["User"] == ["gpulens"]


def test_exporter_hardening_keeps_the_nvidia_device_nodes_reachable():
    service = unit("gpulens-exporter.service")["Service"]
    assert service["DevicePolicy"] == ["closed"]
    allowed = [value.split()[0] for value in service["DeviceAllow"]]
    # major 195 is "nvidia" in /proc/devices, or "nvidia-frontend" with multi-instance drivers
    assert {"char-nvidia", "char-nvidia-frontend", "char-nvidia-caps", "/dev/nvidiactl"} <= set(allowed)
    assert service.get("PrivateDevices", ["no"]) == ["no"], "PrivateDevices hides /dev/nvidia*"
    assert service["ProtectSystem"] == ["strict"]
    assert service["NoNewPrivileges"] == ["yes"]
    # attribution reads other users' /proc/<pid>; NVML reads /proc/driver/nvidia
    assert "ProcSubset" not in service and "ProtectProc" not in service


def test_environment_example_only_sets_gpulens_variables():
    for line in (SYSTEMD / "gpulens-exporter.env").read_text().splitlines():
        if line and not line.startswith("#"):
            assert line.startswith("GPULENS_") and "=" in line, line


def test_report_timer_is_weekly_persistent_and_names_the_report_service():
    timer = unit("gpulens-report.timer")
    calendar = timer["Timer"]["OnCalendar"][0]
    assert calendar.split()[0] in {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun", "weekly"}
    assert timer["Timer"]["Persistent"] == ["true"]
    assert timer["Timer"]["Unit"] == ["gpulens-report.service"]
    assert (SYSTEMD / "gpulens-report.service").is_file()
    assert timer["Install"]["WantedBy"] == ["timers.target"]


def test_report_service_is_a_oneshot_writing_dated_reports():
    service = unit("gpulens-report.service")["Service"]
    assert service["Type"] == ["oneshot"]
    command = service["ExecStart"][0]
    assert "gpulens report" in command and "--prometheus" in command and "--window" in command
    assert '--out "$STATE_DIRECTORY/' in command
    assert service["StateDirectory"] == ["gpulens/reports"]


def test_units_parse_as_ini():
    for name in UNITS:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read_string((SYSTEMD / name).read_text())
        assert parser.sections()


def test_systemd_analyze_verify_reports_nothing(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("systemd-analyze not installed")
    # verify insists that ExecStart binaries exist: point them at this checkout's venv and /bin/sh
    venv_bin = Path(sys.executable).parent
    if not (venv_bin / "gpulens").exists():
        pytest.skip("gpulens console scripts are not beside this Python")
    for name in UNITS:
        (tmp_path / name).write_text((SYSTEMD / name).read_text().replace("/opt/gpulens/bin", str(venv_bin)))
    result = subprocess.run(
        [analyze, "verify", *(str(tmp_path / n) for n in UNITS)], capture_output=True, text=True, timeout=60
    )
    complaints = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if str(tmp_path) in line or "gpulens" in line
    ]
    assert result.returncode == 0 and not complaints, "\n".join(complaints) or result.stderr


def test_environment_example_is_understood_by_the_exporter():
    from gpulens.exporter.cli import parse_config

    env = dict(
        line.split("=", 1)
        for line in (SYSTEMD / "gpulens-exporter.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    config = parse_config([], env=env)
    assert config.listen == env["GPULENS_WEB_LISTEN_ADDRESS"]
    assert str(config.job_mapping_dir) == env["GPULENS_JOB_MAPPING_DIR"] == "/run/gpulens/jobs"
