"""`gpulens`: one entry point for everything that is not the node exporter.

Each subcommand lives in its own module that exposes `register(subparsers) -> None`; the
module adds its parser and sets `func` (taking the parsed namespace, returning an exit code).
Modules are imported only when needed so that `gpulens sim run` stays light and a broken
optional dependency (pandas for the analyzer, say) only affects the commands that need it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpulens import __version__, exits

# subcommand name -> module that implements register(subparsers)
COMMANDS: dict[str, str] = {
    "sim": "gpulens.sim.launcher",
    "simulate": "gpulens.sim.history_cli",
    "profile": "gpulens.analyzer.cli",
    "recommend": "gpulens.analyzer.cli",
    "report": "gpulens.analyzer.cli",
    "import-trace": "gpulens.analyzer.cli",
    "remediate": "gpulens.remediate.cli",
    "dashboards": "gpulens.dashboards.cli",
    "mixin": "gpulens.mixin.cli",
    "bench": "gpulens.devtools.bench.cli",
    "conformance": "gpulens.devtools.conformance.cli",
}


class CliError(Exception):
    """A user-facing error: printed as one line on stderr, exit status 2."""


def build_parser(wanted: str | None = None) -> argparse.ArgumentParser:
    """Build the parser; with `wanted`, import only the module that provides that command."""
    parser = argparse.ArgumentParser(prog="gpulens", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"gpulens {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = sorted({m for name, m in COMMANDS.items() if wanted is None or name == wanted})
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if wanted is not None:
                raise CliError(f"command {wanted!r} is unavailable: {exc}") from exc
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    wanted = next((a for a in args_list if not a.startswith("-")), None)
    try:
        parser = build_parser(wanted if wanted in COMMANDS else None)
        args = parser.parse_args(args_list)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        exits.install()  # SIGTERM/SIGHUP unwind like Ctrl-C: temporary files go on every way out
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"gpulens: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except exits.Terminated as stop:
        return stop.exit_status


if __name__ == "__main__":
    sys.exit(main())
