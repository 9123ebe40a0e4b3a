"""`gpulens mixin build [--config FILE] [--out DIR] [--check]`: alerts, rules, runbooks and
dashboards for one mixin config (selector, clusterLabel, runbookURLPattern; docs/alerts.md, "The
mixin"). Outside a source checkout --out defaults to ./gpulens-mixin; without grafanalib a config
other than the default gets its rules and runbooks, and one line saying what dashboards need."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpulens.mixin import build
from gpulens.mixin.rules import RuleRenderError
from gpulens.promscope.config import DEFAULT, ConfigError, load

DEFAULT_OUT = "gpulens-mixin"  # where an installed gpulens writes without --out
DASHBOARDS_NEED = "dashboards for a config of your own need grafanalib: pip install 'gpulens[dashboards]'"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mixin", help="alert rules, recording rules and dashboards for your selector, cluster label, runbooks"
    )
    commands = parser.add_subparsers(dest="mixin_command", metavar="ACTION")
    build_parser = commands.add_parser(
        "build",
        help="with --out: write DIR/rules/*.yml, DIR/runbooks/*.md and DIR/dashboards/*.json for "
        "--config; without: regenerate the committed alerts/ files (default config) in a source "
        f"checkout, else write into ./{DEFAULT_OUT}",
    )
    build_parser.add_argument(
        "--config", type=Path, help="YAML with selector, clusterLabel, runbookURLPattern (default: built in)"
    )
    build_parser.add_argument("--out", type=Path, help="directory to write rules/ and dashboards/ into")
    build_parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any generated file is out of date"
    )
    build_parser.set_defaults(func=run_build)
    parser.set_defaults(func=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _error(message: str) -> int:
    print(f"gpulens mixin build: {message}", file=sys.stderr)
    return 2


def run_build(args: argparse.Namespace) -> int:
    try:
        config = load(args.config) if args.config is not None else DEFAULT
        if args.out is not None or not build.IN_SOURCE_TREE:
            outcome = build.build_to(config, args.out or Path(DEFAULT_OUT), check=args.check)
        elif config != DEFAULT:
            return _error("the committed files use the default config: pass --out DIR for your own")
        else:
            outcome = build.build(check=args.check)
    except (ConfigError, RuleRenderError) as exc:
        return _error(str(exc))
    if args.check:
        for path in outcome.changed:
            print(f"out of date: {path} (run `gpulens mixin build`)", file=sys.stderr)
        return 1 if outcome.changed else 0
    for path in outcome.changed:
        print(f"wrote {path}")
    if not outcome.changed:
        print("mixin files are up to date")
    if outcome.dashboards_missing:  # one line, and a failure: not everything asked for was written
        print(
            f"gpulens mixin build: rules and runbooks written, no dashboards: {DASHBOARDS_NEED}",
            file=sys.stderr,
        )
        return 1
    return 0
