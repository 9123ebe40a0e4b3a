"""Read the generated dashboards the way Grafana does: panels, targets, links, variables.

Shared by the static checks and the end-to-end PromQL test; everything here reads the committed
JSON under dashboards/json/, which the reproducibility test proves equal to a fresh build.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JSON_DIR = REPO / "dashboards" / "json"
CONFIGMAP = REPO / "deploy" / "kubernetes" / "dashboards-configmap.yaml"

PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan",
}  # fmt: skip


@dataclass(frozen=True)
class PanelRef:
    dashboard: str  # uid
    title: str
    panel: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.dashboard} / {self.title}"

    @property
    def exprs(self) -> list[str]:
        return [t["expr"] for t in self.panel.get("targets", [])]


def dashboards() -> dict[str, dict[str, Any]]:
    """uid -> dashboard JSON for every generated file."""
    out = {}
    for path in sorted(JSON_DIR.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out[data["uid"]] = data
    return out


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def data_panels() -> list[PanelRef]:
    """Every panel that queries data (rows excluded), across all dashboards."""
    return [
        PanelRef(uid, p.get("title", ""), p)
        for uid, board in dashboards().items()
        for p in panels(board)
        if p.get("type") != "row"
    ]


def link_urls(board: dict[str, Any]) -> list[str]:
    """Dashboard links plus the data links on panels and on table columns."""
    urls = [link["url"] for link in board.get("links", [])]
    for panel in panels(board):
        field = panel.get("fieldConfig", {})
        urls += [link["url"] for link in field.get("defaults", {}).get("links", [])]
        for override in field.get("overrides", []):
            for prop in override.get("properties", []):
                if prop.get("id") == "links":
                    urls += [link["url"] for link in prop["value"]]
    return urls


def linked_uid(url: str) -> str | None:
    match = re.match(r"^/d/([^/?]+)", url)
    return match.group(1) if match else None


def metric_names(expr: str) -> set[str]:
    """Metric names (and recording-rule names) a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_:]*\}?", " ", text)  # template variables
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in PROMQL_KEYWORDS or re.fullmatch(r"\d.*", name):
            continue
        names.add(name)
    return names
