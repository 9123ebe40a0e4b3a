"""Start gpulens-exporter against whatever NVML this process sees and check what it serves.

Checks that every family a GPU of that model should have is present with plausible values, and
lints the exposition with `promtool check metrics` when promtool is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

from gpulens.devtools.ports import free_port

# families every GPU must have; (family, low, high) bounds are loose sanity checks
REQUIRED: tuple[tuple[str, float, float], ...] = (
    ("gpu_info", 1, 1),
    ("gpu_up", 1, 1),
    ("gpu_memory_total_bytes", 1e9, 1e12),
    ("gpu_memory_used_bytes", 0, 1e12),
    ("gpu_power_watts", 1, 2000),
    ("gpu_power_limit_watts", 50, 2000),
    ("gpu_energy_joules_total", 0, float("inf")),
    ("gpu_temperature_celsius", 1, 120),
    ("gpu_sm_clock_hertz", 0, 4e9),
    ("gpu_clock_event_active", 0, 1),
    ("gpu_ecc_errors_total", 0, float("inf")),
    ("gpu_pcie_replays_total", 0, float("inf")),
    ("gpulens_nvml_up", 1, 1),
    ("gpulens_collector_success", 0, 1),
)
REQUIRED_NO_MIG = (("gpu_utilization_ratio", 0, 1),)
REQUIRED_HOPPER = (("gpu_sm_active_ratio", 0, 1), ("gpu_dram_active_ratio", 0, 1))


@dataclass
class ExporterReport:
    problems: list[str] = field(default_factory=list)
    families: list[str] = field(default_factory=list)
    promtool: str = "not run"
    exposition: str = ""  # the scraped text, kept so that values can be read against docs/metrics.md


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")


def parse_exposition(text: str) -> dict[str, list[float]]:
    """Values per sample name (labels dropped), from the Prometheus text format."""
    values: dict[str, list[float]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            values.setdefault(match.group(1), []).append(float(match.group(3)))
        except ValueError:
            continue
    return values


def check_exposition(text: str, hopper: bool, mig: bool) -> list[str]:
    values = parse_exposition(text)
    wanted = (
        list(REQUIRED) + ([] if mig else list(REQUIRED_NO_MIG)) + (list(REQUIRED_HOPPER) if hopper else [])
    )
    problems = []
    for family, low, high in wanted:
        samples = values.get(family)
        if not samples:
            problems.append(f"{family}: missing")
        elif not all(low <= v <= high for v in samples):
            problems.append(f"{family}: values {samples[:4]} outside [{low}, {high}]")
    return problems


def run_exporter_check(extra_args: list[str], seconds: float, hopper: bool, mig: bool) -> ExporterReport:
    """Run the exporter for a few samples, scrape it, check families, lint with promtool."""
    report = ExporterReport()
    port = free_port()
    # tools/gpu_conformance.py sets the command when gpulens runs from an uninstalled checkout
    base = os.environ.get("GPULENS_EXPORTER_COMMAND", f"{sys.executable} -m gpulens.exporter.cli").split()
    cmd = [*base, "--web.listen-address", f"127.0.0.1:{port}", "--interval", "1", *extra_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = ""
    try:
        deadline = time.monotonic() + 30 + seconds
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        time.sleep(seconds)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError as exc:
        report.problems.append(f"exporter not reachable: {exc}")
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if not text:
            report.problems.append(f"exporter output: {out[-2000:]}")
    if not text:
        return report
    report.exposition = text
    report.families = sorted(parse_exposition(text))
    report.problems += check_exposition(text, hopper=hopper, mig=mig)
    promtool = shutil.which("promtool")
    if promtool:
        lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        report.promtool = (lint.stdout + lint.stderr).strip() or "clean"
        if lint.returncode != 0 or report.promtool != "clean":
            report.problems.append(f"promtool check metrics: {report.promtool[:500]}")
    return report
