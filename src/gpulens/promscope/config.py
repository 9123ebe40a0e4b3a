"""The mixin's one configuration: which series are gpulens', the cluster label, the runbook links.

kube-prometheus passes every mixin a `_config` with its selectors, `clusterLabel` and
`runbookURLPattern`; gpulens takes the same three from one YAML file (same key names), and applies
them to the alert rules, the recording rules and the dashboards (`gpulens mixin build`). The
defaults below are what the committed files in alerts/ and dashboards/json/ are generated with.

It lives in the shared core, below the parts that apply it (mixin/, analyzer/sources/rules.py,
dashboards/), so each of them reads it from here and none imports another to get it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.promscope.promql import PromQLError, Scope, check_label, check_selector
from gpulens.safeload import InputError, read_yaml_file

DEFAULT_SELECTOR = 'job=~".*gpulens.*"'
# the remediation receiver (`gpulens remediate`) is scraped as its own job: docker compose names it
# "remediate", the Kubernetes and Helm objects "gpulens-remediate"
DEFAULT_REMEDIATE_SELECTOR = 'job=~".*remediate.*"'
REMEDIATE_PREFIX = "gpulens_remediate_"
DEFAULT_CLUSTER_LABEL = "cluster"
DEFAULT_RUNBOOK_URL_PATTERN = "https://github.com/gpulens/gpulens/blob/main/alerts/runbooks/%s.md"
MAX_CONFIG_BYTES = 64 * 1024  # a config is three short strings; anything larger is not one

KEYS = {
    "selector": 'label matchers every gpulens series matches, e.g. job="gpulens-exporter"',
    "remediateSelector": 'label matchers of the remediation receiver\'s series, e.g. job="remediate"',
    "clusterLabel": "the label that names a cluster in a global view, e.g. cluster",
    "runbookURLPattern": "the runbook address with %s where the alert name goes",
}


class ConfigError(ValueError):
    """A config that cannot be used: one line naming the file, the field and what was expected."""


@dataclass(frozen=True)
class MixinConfig:
    selector: str = DEFAULT_SELECTOR
    remediate_selector: str = DEFAULT_REMEDIATE_SELECTOR
    cluster_label: str = DEFAULT_CLUSTER_LABEL
    runbook_url_pattern: str = DEFAULT_RUNBOOK_URL_PATTERN

    def runbook_url(self, alert: str) -> str:
        return self.runbook_url_pattern.replace("%s", alert)

    def describe(self) -> list[str]:
        """The config as `key: value` lines, for generated files' headers (what they were built with)."""
        return [
            f"selector: {self.selector or '(none)'}",
            f"remediateSelector: {self.remediate_selector or '(none)'}",
            f"clusterLabel: {self.cluster_label}",
            f"runbookURLPattern: {self.runbook_url_pattern}",
        ]


DEFAULT = MixinConfig()


def scope(config: MixinConfig) -> Scope:
    """What `promql.apply` adds for `config`: its selector (the receiver's own for its series) and
    its cluster label."""
    return Scope(
        selector=config.selector,
        cluster_label=config.cluster_label,
        overrides=((REMEDIATE_PREFIX, config.remediate_selector),),
    )


def validate(config: MixinConfig, where: str = "config") -> MixinConfig:
    for key, value in (("selector", config.selector), ("remediateSelector", config.remediate_selector)):
        try:
            check_selector(value)
        except PromQLError as exc:
            raise ConfigError(f"{where}: {key}: {exc}") from exc
    try:
        if not config.cluster_label:
            raise PromQLError("expected a label name (the dashboards' cluster variable reads it)")
        check_label(config.cluster_label)
    except PromQLError as exc:
        raise ConfigError(f"{where}: clusterLabel: {exc}") from exc
    pattern = config.runbook_url_pattern
    if pattern.count("%s") != 1 or any(c.isspace() for c in pattern):
        raise ConfigError(
            f"{where}: runbookURLPattern: expected one address with exactly one %s (the alert name), "
            f"got {pattern!r}"
        )
    return config


def from_mapping(data: Any, where: str) -> MixinConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with keys {', '.join(KEYS)}")
    unknown = sorted(str(k) for k in data if k not in KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; expected {', '.join(KEYS)}")
    values: dict[str, str] = {}
    for key in KEYS:
        if key in data:
            value = data[key]
            if not isinstance(value, str):
                raise ConfigError(f"{where}: {key}: expected a string ({KEYS[key]})")
            values[key] = value
    config = MixinConfig(
        selector=values.get("selector", DEFAULT_SELECTOR).strip(),
        remediate_selector=values.get("remediateSelector", DEFAULT_REMEDIATE_SELECTOR).strip(),
        cluster_label=values.get("clusterLabel", DEFAULT_CLUSTER_LABEL).strip(),
        runbook_url_pattern=values.get("runbookURLPattern", DEFAULT_RUNBOOK_URL_PATTERN).strip(),
    )
    return validate(config, where)


def load(path: Path) -> MixinConfig:
    """Read a YAML config; absent keys keep their defaults."""
    try:
        data = read_yaml_file(path, max_bytes=MAX_CONFIG_BYTES)
    except InputError as exc:  # unreadable, not UTF-8, larger than MAX_CONFIG_BYTES, or not YAML
        raise ConfigError(str(exc)) from exc
    return from_mapping(data, str(path))
