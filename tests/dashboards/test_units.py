"""Every unit id the dashboards use exists in Grafana's own unit registry.

Grafana formats an unknown unit id as a custom suffix (`412.30 bogus`) without complaint, so a
misspelt unit is never an error there: it is a wrong number on screen. `@grafana/data`'s
`getValueFormats()` (Apache-2.0, installed with tools/dashboard-render's packages) is the registry;
tools/dashboard-render/units.cjs asks it under node.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from gpulens.dashboards import perses
from tests.dashboards.model import REPO, dashboards, panels
from tests.support.procs import find_binary, unavailable

RENDER_DIR = REPO / "tools" / "dashboard-render"


def units_of(board: dict[str, Any]) -> set[str]:
    """Panel units, per-column override units and heat map axis units."""
    found: set[str] = set()
    for panel in panels(board):
        field = panel.get("fieldConfig", {})
        if field.get("defaults", {}).get("unit"):
            found.add(field["defaults"]["unit"])
        for override in field.get("overrides", []):
            found |= {p["value"] for p in override.get("properties", []) if p.get("id") == "unit"}
        y_axis = panel.get("options", {}).get("yAxis", {})
        if panel.get("type") == "heatmap" and y_axis.get("unit"):
            found.add(y_axis["unit"])
    return found


def grafana_units(ids: list[str]) -> dict[str, dict[str, Any]]:
    """unit id -> {known, text} from Grafana's registry."""
    if not (RENDER_DIR / "node_modules" / "@grafana" / "data").is_dir():
        unavailable("@grafana/data is not installed (make render: npm ci in tools/dashboard-render)")
    node = find_binary("node")
    result = subprocess.run(
        [node, "units.cjs", *ids], cwd=RENDER_DIR, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # a dependency prints a banner first; the answer is the last line
    doc: dict[str, dict[str, Any]] = json.loads(result.stdout.strip().splitlines()[-1])
    return doc


def used_units() -> list[str]:
    return sorted(set().union(*(units_of(board) for board in dashboards().values())))


def test_every_unit_the_dashboards_use_is_in_grafanas_registry() -> None:
    used = used_units()
    assert {"percentunit", "bytes", "watt", "celsius"} <= set(used)  # the reader found the units
    answer = grafana_units(used)
    unknown = sorted(unit for unit in used if not answer[unit]["known"])
    assert not unknown, f"unit ids Grafana does not know: {unknown}"


def test_grafana_formats_our_units_with_their_symbols() -> None:
    answer = grafana_units(["watt", "celsius", "percentunit", "bytes", "Bps"])
    assert {unit: a["text"] for unit, a in answer.items()} == {
        "watt": "412.30 W",
        "celsius": "412.30 °C",
        "percentunit": "41230.00%",
        "bytes": "412.30 B",
        "Bps": "412.30 B/s",
    }


def test_a_misspelt_unit_is_reported_unknown() -> None:
    answer = grafana_units(["watts", "percent_unit"])
    assert not answer["watts"]["known"] and not answer["percent_unit"]["known"]


def test_every_unit_the_dashboards_use_has_a_perses_format() -> None:
    assert not set(used_units()) - set(perses.UNITS)
