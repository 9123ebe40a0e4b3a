"""Cardinality controls: NVLink counters summed per GPU by default (per link on request), a family
allow/deny list (tests/dcgm/test_metric_filters.py), and the series count of every scenario as
docs/metrics.md states it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gpulens.sim.scenariofile import list_builtin
from tests.exporter.expo import samples
from tests.exporter.scenario_run import scenario_exposition

DOCS = Path(__file__).parents[2] / "docs" / "metrics.md"


def series_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def documented_counts() -> dict[str, tuple[int, int, int]]:
    section = DOCS.read_text().split("## Series per scenario")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| (\d+) \| (\d+) \| (\d+) \|", section, re.MULTILINE)
    return {name: (int(a), int(b), int(c)) for name, a, b, c in rows}


def _write_row(scenario: str, measured: tuple[int, int, int]) -> None:
    """GPULENS_UPDATE_GOLDEN=1: the scenario's row of the table, added or replaced, rows sorted."""
    text = DOCS.read_text()
    head, rest = text.split("## Series per scenario", 1)
    section, sep, tail = rest.partition("\n## ")
    lines = section.split("\n")
    rows = [i for i, line in enumerate(lines) if re.match(r"^\| `[a-z0-9-]+` \|", line)]
    table = {re.match(r"^\| `([a-z0-9-]+)`", lines[i]).group(1): lines[i] for i in rows}  # type: ignore[union-attr]
    table[scenario] = f"| `{scenario}` | " + " | ".join(map(str, measured)) + " |"
    lines[rows[0] : rows[-1] + 1] = [table[name] for name in sorted(table)]
    DOCS.write_text(head + "## Series per scenario" + "\n".join(lines) + sep + tail)


@pytest.mark.parametrize("scenario", list_builtin())
def test_docs_give_each_scenarios_series_count(scenario: str, tmp_path: Path) -> None:
    measured = (
        series_count(scenario_exposition(scenario, tmp_path / "a")),
        series_count(scenario_exposition(scenario, tmp_path / "b", nvlink_per_link=True)),
        series_count(scenario_exposition(scenario, tmp_path / "c", compat="dcgm,jobstats")),
    )
    if os.environ.get("GPULENS_UPDATE_GOLDEN") and documented_counts().get(scenario) != measured:
        _write_row(scenario, measured)
    assert documented_counts().get(scenario) == measured, (
        "regenerate: GPULENS_UPDATE_GOLDEN=1 pytest tests/exporter/test_cardinality.py"
    )


def test_nvlink_counters_are_summed_per_gpu_and_per_link_on_request(tmp_path: Path) -> None:
    summed = scenario_exposition("dgx-h100", tmp_path / "a")
    per_link = scenario_exposition("dgx-h100", tmp_path / "b", nvlink_per_link=True)
    for name in ("gpu_nvlink_tx_bytes_total", "gpu_nvlink_rx_bytes_total"):
        totals = {s.labels["gpu"]: s.value for s in samples(summed, name)}
        links: dict[str, float] = {}
        for s in samples(per_link, name):
            links[s.labels["gpu"]] = links.get(s.labels["gpu"], 0.0) + s.value
        assert all("link" not in s.labels for s in samples(summed, name))
        assert totals == pytest.approx(links) and len(totals) == 8
    errors = samples(summed, "gpu_nvlink_errors_total")
    assert {s.labels["kind"] for s in errors} == {
        s.labels["kind"] for s in samples(per_link, "gpu_nvlink_errors_total")
    }
    assert len(errors) == 8 * 5 and len(samples(per_link, "gpu_nvlink_errors_total")) == 8 * 18 * 5
    # link state stays per link either way: a link going down is what its alert names
    assert (
        len(samples(summed, "gpu_nvlink_link_up")) == len(samples(per_link, "gpu_nvlink_link_up")) == 8 * 18
    )
