"""`gpulens simulate`: simulator scenarios run faster than real time into a history.

The command belongs to the simulator (`history.py` does the work, with the exporter's sampler and
the analyzer's history writer): `gpulens.cli` maps `simulate` here, so the analyzer, which reads
histories, never imports the simulator that writes them. Errors are reported as the analyzer's
commands report them (`gpulens.analyzer.cli.guard`): one line, exit 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys

from gpulens.analyzer.cli import guard


@guard
def cmd_simulate(args: argparse.Namespace) -> int:
    from gpulens.analyzer.timeparse import parse_duration, parse_time
    from gpulens.sim.history import simulate

    meta = simulate(
        args.scenario,
        duration_s=parse_duration(args.duration, "--duration"),
        out=args.out,
        step_s=parse_duration(args.step, "--step"),
        seed=args.seed,
        start=parse_time(args.start, "--start") if args.start else None,
        progress=sys.stderr if args.progress else None,
    )
    steps, step, samples = meta["steps"], meta["step_s"], meta["samples"]
    print(f"history written to {args.out} ({steps} steps of {step:g} s, {samples} samples)")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpulens simulate`."""
    p = subparsers.add_parser(
        "simulate", help="run a simulator scenario faster than real time into a history"
    )
    p.add_argument(
        "scenario",
        nargs="+",
        help="scenario name (e.g. seed-case, dgx-h100) or YAML file; several (one node each) make one fleet",
    )
    p.add_argument("--duration", default="7d", help="simulated time span (default 7d)")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument(
        "--step", default="5m", help="sampling step in simulated time (default 5m: a week in about a minute)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", default=None, help="simulated start time (default: aligned, 7 days ago)")
    p.add_argument("--progress", action="store_true", help="print progress on stderr")
    p.set_defaults(func=cmd_simulate)
