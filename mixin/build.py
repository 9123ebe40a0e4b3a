"""Write the mixin's files: the committed defaults in the source tree, or a config's own set.

In a source checkout `build()` regenerates alerts/gpu_alerts.yml, alerts/recording_rules.yml and
alerts/analyzer_rules.yml (from the analyzer's signal table) with the default config and
refreshes the rule quoted in each alerts/runbooks/<Alert>.md; with
`check` it writes nothing and returns what is out of date (the tests and CI run that).
`build_to(config, out)` writes a user's set: out/rules/*.yml, out/runbooks/*.md (the shipped
runbooks quoting that config's rules) and out/dashboards/*.json. Dashboards are built with
grafanalib (the `dashboards` extra); without it the default config's dashboards are the committed
build shipped in the package, and another config's are left out (`Outcome.dashboards_missing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpulens.generated import read, sync
from gpulens.httpd.runbooks import shipped as shipped_runbooks
from gpulens.mixin import rules
from gpulens.promscope.config import DEFAULT, MixinConfig

REPO = Path(__file__).resolve().parents[1]
ALERTS_DIR = REPO / "alerts"
RUNBOOKS_DIR = ALERTS_DIR / "runbooks"
IN_SOURCE_TREE = RUNBOOKS_DIR.is_dir() and (REPO / "mixin" / "rules").is_dir()


@dataclass(frozen=True)
class Outcome:
    """Files a build wrote, or with check, the files that differ from a fresh build."""

    changed: list[Path]
    dashboards_missing: bool = False  # grafanalib is not installed and the config is not the default


def _write(wanted: dict[Path, str], check: bool) -> Outcome:
    return Outcome(sync(wanted, check=check).changed)


def default_files(alerts_dir: Path = ALERTS_DIR) -> dict[Path, str]:
    """path -> text of every committed file the default config generates."""
    rendered = rules.render_all(DEFAULT)
    wanted = {alerts_dir / item.filename: item.text for item in rendered}
    runbooks = alerts_dir / "runbooks"
    for alert, expr in sorted(rules.alert_exprs(rendered).items()):
        path = runbooks / f"{alert}.md"
        current = read(path)
        if current is not None:  # a missing runbook is the rule tests' finding, not the build's
            wanted[path] = rules.refresh_runbook(current, expr)
    return wanted


def build(check: bool = False, alerts_dir: Path = ALERTS_DIR) -> Outcome:
    return _write(default_files(alerts_dir), check)


def _dashboards(config: MixinConfig) -> dict[str, str] | None:
    """filename -> JSON of each dashboard for `config`; None without grafanalib unless `config` is
    the default, whose build is shipped (dashboards/json/, package data)."""
    try:
        # imported here for grafanalib (the dashboards extra), needed only when dashboards are built
        from gpulens.dashboards.build import render_all
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "grafanalib":
            raise
        if config != DEFAULT:
            return None
        committed = resources.files("gpulens.dashboards").joinpath("json")
        return {
            entry.name: entry.read_text(encoding="utf-8")
            for entry in committed.iterdir()
            if entry.name.endswith(".json")
        }
    return {board.filename: board.text for board in render_all(config)}


def build_to(config: MixinConfig, out: Path, check: bool = False) -> Outcome:
    """A config's rules, runbooks and dashboards under `out` (rules/, runbooks/, dashboards/)."""
    rendered = rules.render_all(config)
    wanted = {out / "rules" / item.filename: item.text for item in rendered}
    runbooks = shipped_runbooks()
    for alert, expr in sorted(rules.alert_exprs(rendered).items()):
        source = runbooks.joinpath(f"{alert}.md")
        if source.is_file():
            wanted[out / "runbooks" / f"{alert}.md"] = rules.refresh_runbook(
                source.read_text(encoding="utf-8"), expr
            )
    boards = _dashboards(config)
    for filename, text in (boards or {}).items():
        wanted[out / "dashboards" / filename] = text
    outcome = _write(wanted, check)
    return Outcome(outcome.changed, dashboards_missing=boards is None)
