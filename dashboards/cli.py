"""`gpulens dashboards build [--check]`: regenerate the committed dashboard JSON and ConfigMap."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gpulens.dashboards.build import DEFAULT_CONFIGMAP, DEFAULT_JSON_DIR, build
from gpulens.promscope.config import DEFAULT, ConfigError, load


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("dashboards", help="Grafana dashboards generated from Python (grafanalib)")
    commands = parser.add_subparsers(dest="dashboards_command", metavar="ACTION")
    build_parser = commands.add_parser(
        "build", help="write dashboards/json/*.json and the Kubernetes ConfigMap"
    )
    build_parser.add_argument(
        "--out", type=Path, default=DEFAULT_JSON_DIR, help=f"JSON directory (default: {DEFAULT_JSON_DIR})"
    )
    build_parser.add_argument(
        "--configmap",
        type=Path,
        default=DEFAULT_CONFIGMAP,
        help=f"ConfigMap YAML to write (default: {DEFAULT_CONFIGMAP})",
    )
    build_parser.add_argument("--no-configmap", action="store_true", help="do not write the ConfigMap")
    build_parser.add_argument(
        "--config",
        type=Path,
        help="mixin config (selector, clusterLabel, runbookURLPattern; docs/alerts.md); default: built in",
    )
    build_parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any generated file is out of date"
    )
    build_parser.set_defaults(func=run_build)
    parser.set_defaults(func=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_build(args: argparse.Namespace) -> int:
    try:
        config = load(args.config) if args.config is not None else DEFAULT
    except ConfigError as exc:
        print(f"gpulens dashboards build: {exc}", file=sys.stderr)
        return 2
    if config != DEFAULT and (
        args.out == DEFAULT_JSON_DIR or (not args.no_configmap and args.configmap == DEFAULT_CONFIGMAP)
    ):
        print(
            "gpulens dashboards build: the committed dashboards use the default config: "
            "pass --out DIR and --configmap PATH (or --no-configmap) for your own",
            file=sys.stderr,
        )
        return 2
    configmap = None if args.no_configmap else args.configmap
    beside_the_json = configmap is not None and configmap.parent == args.out  # created with it
    if configmap is not None and not beside_the_json and not configmap.parent.is_dir():
        print(
            f"gpulens dashboards build: {configmap.parent} does not exist; "
            "pass --configmap PATH or --no-configmap",
            file=sys.stderr,
        )
        return 2
    outcome = build(args.out, configmap, check=args.check, config=config)
    if args.check:
        stale = [*outcome.changed, *outcome.removed]
        for path in stale:
            print(f"out of date: {path} (run `gpulens dashboards build`)", file=sys.stderr)
        return 1 if stale else 0
    for path in outcome.changed:
        print(f"wrote {path}")
    for path in outcome.removed:
        print(f"removed stale {path}")
    if not outcome.changed and not outcome.removed:
        print("dashboards are up to date")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulens.dashboards")
    register(parser.add_subparsers(dest="command", metavar="COMMAND"))
    args = parser.parse_args(["dashboards", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))
