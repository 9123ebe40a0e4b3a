#!/usr/bin/env python3
"""Generate `deploy/kubernetes/prometheusrule.yaml` from the shipped rule files in `alerts/`.

The alert and recording rules are written once (sources in mixin/rules, built into
`alerts/` by `gpulens mixin build`) and unit-tested there (promtool); the
Prometheus Operator wants them wrapped in a `PrometheusRule` object. Generating the wrapper keeps one
source of truth: `python deploy/kubernetes/generate.py` rewrites it, `--check` fails (exit 1) when
the committed file is stale, which the tests and CI use. Both also cover the Helm chart's copy of
the rules (through deploy/helm/generate.py), so editing alerts/ needs this one command.

Rule files are every `alerts/*.yml` whose top level has a `groups` list (so `alertmanager.yml` and
the promtool test files are skipped). Each rule file becomes one PrometheusRule object
(`alerts/gpu_alerts.yml` -> `gpulens-gpu-alerts`), as Prometheus loads each file separately.
Every alert's `runbook_url` there points at `RUNBOOK_URL_PATTERN`, the runbooks the exporter serves.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUTPUT = HERE / "prometheusrule.yaml"
NAME = "gpulens"
LABELS = {
    "app.kubernetes.io/name": "gpulens",
    "app.kubernetes.io/component": "rules",
    "app.kubernetes.io/part-of": "gpulens",
}


# The runbooks the kustomization serves itself (`/runbooks/<Alert>`, gpulens.httpd.runbooks) through
# the exporter's Service, the one Service of the base (the receiver, remediate/, is optional and
# serves the same pages): alert links work without an override. Overlays patch the annotation.
RUNBOOK_URL_PATTERN = "http://gpulens-exporter.gpulens.svc:9842/runbooks/%s"


class RuleSourceError(Exception):
    """A rule file cannot be turned into the PrometheusRule: one line naming the file."""


def rule_files(alerts_dir: Path) -> list[Path]:
    """Every YAML file directly in `alerts_dir` whose top level is a mapping with a `groups` list."""
    found = []
    for path in sorted(alerts_dir.glob("*.y*ml")):
        document = load(path)
        if isinstance(document, dict) and isinstance(document.get("groups"), list):
            found.append(path)
    return found


def load(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RuleSourceError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    except OSError as exc:
        raise RuleSourceError(f"{path}: cannot read: {exc.strerror}") from exc


def resource_name(path: Path) -> str:
    """`alerts/recording_rules.yml` -> `gpulens-recording-rules` (a DNS-1123 object name)."""
    stem = re.sub(r"[^a-z0-9]+", "-", path.stem.lower()).strip("-")
    return stem if stem.startswith(NAME) else f"{NAME}-{stem}"


def prometheus_rules(alerts_dir: Path, runbook_url_pattern: str | None = None) -> list[dict[str, Any]]:
    """One PrometheusRule per rule file, holding its groups in order; with `runbook_url_pattern`
    every alert's runbook_url is that pattern with the alert's name for its %s.

    One object per file mirrors how Prometheus loads `rule_files`: group names need only be unique
    within a file (the operator renders each PrometheusRule into one rule file and rejects
    duplicate group names inside it).
    """
    files = rule_files(alerts_dir)
    if not files:
        raise RuleSourceError(f"{alerts_dir}: no rule file (a YAML file with a top-level `groups` list)")
    rules = []
    for path in files:
        groups = load(path)["groups"]
        seen: set[str] = set()
        for index, group in enumerate(groups):
            name = group.get("name") if isinstance(group, dict) else None
            if not isinstance(name, str) or not name:
                raise RuleSourceError(f"{path}: groups[{index}] has no name")
            if name in seen:
                raise RuleSourceError(f"{path}: group {name!r} is defined twice")
            seen.add(name)
            if runbook_url_pattern is not None:
                _point_runbooks(group, runbook_url_pattern)
        rules.append(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "PrometheusRule",
                "metadata": {"name": resource_name(path), "labels": dict(LABELS)},
                "spec": {"groups": groups},
            }
        )
    return rules


def _point_runbooks(group: dict[str, Any], pattern: str) -> None:
    for rule in group.get("rules") or []:
        annotations = rule.get("annotations") if isinstance(rule, dict) else None
        if isinstance(annotations, dict) and "runbook_url" in annotations and "alert" in rule:
            annotations["runbook_url"] = pattern.replace("%s", str(rule["alert"]))


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, descriptions) as literal blocks, the way people write them."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def render(alerts_dir: Path) -> str:
    sources = ", ".join(str(p.relative_to(alerts_dir.parent)) for p in rule_files(alerts_dir))
    header = (
        f"# Generated by deploy/kubernetes/generate.py from {sources}.\n"
        "# Do not edit: change the rules in alerts/ and run `python deploy/kubernetes/generate.py`.\n"
    )
    body = yaml.dump_all(
        prometheus_rules(alerts_dir, RUNBOOK_URL_PATTERN),
        Dumper=_Dumper,
        sort_keys=False,
        width=110,
        allow_unicode=True,
        explicit_start=True,
    )
    return header + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--alerts", type=Path, default=REPO / "alerts", help="rule directory (default alerts/)"
    )
    parser.add_argument(
        "--output", type=Path, default=OUTPUT, help="file to write (default: beside this script)"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the output file is not up to date")
    args = parser.parse_args(argv)
    try:
        text = render(args.alerts)
    except RuleSourceError as exc:
        print(f"generate: error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        current = args.output.read_text() if args.output.is_file() else ""
        if current != text:
            print(
                f"generate: {args.output} is stale: run `python deploy/kubernetes/generate.py`",
                file=sys.stderr,
            )
            return 1
        if args.alerts == REPO / "alerts" and args.output == OUTPUT:
            return helm_chart_files(["--check"])
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    if args.alerts == REPO / "alerts" and args.output == OUTPUT:
        return helm_chart_files([])
    return 0


def helm_chart_files(argv: list[str]) -> int:
    """The Helm chart embeds the same rules (deploy/helm/generate.py): refresh (or check) them in the
    same run, so editing alerts/ needs this one command."""
    path = REPO / "deploy" / "helm" / "generate.py"
    spec = importlib.util.spec_from_file_location("gpulens_helm_generate", path)
    if spec is None or spec.loader is None:
        print(f"generate: error: cannot load {path}", file=sys.stderr)
        return 2
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return int(module.main(argv))


if __name__ == "__main__":
    sys.exit(main())
