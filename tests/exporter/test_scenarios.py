"""Golden expositions of every built-in scenario, and `promtool check metrics` on each.

Regenerate the golden files after an intended change with:
    GPULENS_UPDATE_GOLDEN=1 .venv/bin/pytest tests/exporter/test_scenarios.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.core import Metric

from gpulens.sim.scenario import SlurmJob
from gpulens.sim.scenariofile import list_builtin, load_scenario
from tests.exporter.expo import samples
from tests.exporter.scenario_run import normalise, scenario_exposition
from tests.support.procs import unavailable

GOLDEN = Path(__file__).parent / "golden"
SCENARIOS = list_builtin()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_exposition_matches_golden(scenario: str, tmp_path: Path) -> None:
    text = normalise(scenario_exposition(scenario, tmp_path))
    golden = GOLDEN / f"{scenario}.prom"
    if os.environ.get("GPULENS_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"no golden file for {scenario}; run with GPULENS_UPDATE_GOLDEN=1 to create it"
    assert text == golden.read_text(), (
        f"{scenario} exposition changed; regenerate with GPULENS_UPDATE_GOLDEN=1"
    )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_promtool_check_metrics_reports_nothing(scenario: str, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        unavailable(
            "promtool is not installed", in_ci="promtool is not installed (apt-get install prometheus)"
        )
    text = scenario_exposition(scenario, tmp_path)
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_gpu_is_up_and_every_collector_succeeds(scenario: str, tmp_path: Path) -> None:
    text = scenario_exposition(scenario, tmp_path)
    assert samples(text, "gpu_up"), "no GPUs"
    failed = [s.labels["collector"] for s in samples(text, "gpulens_collector_success") if s.value != 1]
    down = [s.labels["gpu"] for s in samples(text, "gpu_up") if s.value != 1]
    # a scenario may start with a fault; then only the faulty GPUs' collectors may fail
    assert not failed or down, failed


@pytest.mark.parametrize("compat", ["", "dcgm,jobstats"], ids=["native", "compat"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_openmetrics_output_passes_the_strict_parser(scenario: str, compat: str, tmp_path: Path) -> None:
    """prometheus_client's OpenMetrics parser rejects what the spec forbids (a counter sample
    without `_total` is "Clashing name"); every sample of the text format must come through it."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
    from prometheus_client.parser import text_string_to_metric_families as text_families

    om = scenario_exposition(scenario, tmp_path / "om", openmetrics=True, compat=compat)
    families = list(text_string_to_metric_families(om))
    assert any(f.name == "gpu_up" for f in families)
    text = scenario_exposition(scenario, tmp_path / "text", compat=compat)

    def names(
        fams: list[Metric],
    ) -> list[
        tuple[str, tuple[tuple[str, str], ...]]
    ]:  # (sample name, labels); the text parser appends _total to counters
        return sorted(
            (s.name.removesuffix("_total"), tuple(sorted(s.labels.items()))) for f in fams for s in f.samples
        )

    volatile = (
        "gpulens_collector_duration_seconds",
        "gpulens_sample_duration_seconds",
        "gpulens_job_mapping_refresh_duration_seconds",
        "gpulens_job_mapping_reads",
    )
    om_samples = [s for s in names(families) if s[0] not in volatile]
    text_samples = [s for s in names(list(text_families(text))) if s[0] not in volatile]
    assert om_samples == text_samples
    if compat:
        assert any(f.name.startswith("DCGM_FI_") for f in families)
        slurm = any(isinstance(p.job, SlurmJob) for p in load_scenario(scenario).processes)
        assert any(f.name == "nvidia_gpu_jobId" for f in families) == slurm  # jobstats: Slurm jobs


def test_docs_metrics_md_lists_every_exported_family() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    exported: set[str] = set()
    for golden in GOLDEN.glob("*.prom"):
        exported |= {line.split()[2] for line in golden.read_text().splitlines() if line.startswith("# TYPE")}
    assert exported
    missing = sorted(name for name in exported if not re.search(rf"(?<![a-z0-9_]){name}(?![a-z0-9_])", docs))
    assert missing == [], f"families missing from docs/metrics.md: {missing}"
