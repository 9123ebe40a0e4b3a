"""`gpulens profile | recommend | report | import-trace`.

`gpulens simulate`, which writes histories, is the simulator's command (sim/history_cli.py).

Every subcommand turns bad input into one line on stderr (`gpulens: error: ...`) and a non-zero
exit status; set GPULENS_DEBUG=1 to see the traceback of an unexpected failure instead.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.memlimit import usable_memory
from gpulens.analyzer.sources.promclient import PromClient, PromConfig, answer_limits, read_secret
from gpulens.analyzer.sources.promqueries import ask_first
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.analyzer.timeparse import parse_duration, parse_time
from gpulens.catalog import CatalogError

# Only light modules above. The analysis (pandas, pyarrow, matplotlib, orjson: the `[analyzer]`
# extra) is imported inside the commands, after their first Prometheus queries are on their way
# (`_early_source`), and so that a base install gets the one-line INSTALL_HINT from `_guard`.

DEFAULT_PROM_STEP_S = 60.0  # raw path without --step: the usual scrape interval

PROFILE_TABLE = (
    "job_id",
    "gpu_model",
    "gpus",
    "sharing",
    "duration_s",
    "samples",
    "coverage",
    "activity_signal",
    "sm_active_mean",
    "sm_active_p95",
    "idle_fraction",
    "memory_peak_bytes",
    "gpu_hours_allocated",
    "gpu_hours_used",
)
# the top-level modules `pip install 'gpulens[analyzer]'` brings (numpy through pandas)
ANALYZER_EXTRA_MODULES = frozenset({"pandas", "numpy", "pyarrow", "sklearn", "matplotlib", "orjson"})
INSTALL_HINT = "pip install 'gpulens[analyzer]'"

RECOMMEND_TABLE = (
    "job_id",
    "gpu_model",
    "gpus",
    "sm_active_p95",
    "memory_peak_bytes",
    "recommendation",
    "mig_profile",
    "mps_active_thread_percentage",
    "confidence",
    "reason",
)


# young-generation collections while a command runs: CPython's 700 ran ~1,300 collections, 1.4 s
# of an 11 s `recommend` over 10,000 jobs, for the few cycles among millions of short-lived
# objects (decoded answers, per-job dicts, the packer's items); 50,000 leaves ~10 (0.2 s)
GC_YOUNG_THRESHOLD = 50_000


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """The young threshold raised for one command and given back after it (the CLI may run
    inside another program); a program that switched collection off keeps it off."""
    young, *older = gc.get_threshold()
    if 0 < young < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, *older)
    try:
        yield
    finally:
        gc.set_threshold(young, *older)


def _guard(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """One clear line and exit 2 for bad input; exit 1 (one line) for anything unexpected."""

    def run(args: argparse.Namespace) -> int:
        try:
            with _fewer_collections():
                return func(args)
        except (AnalyzerError, CatalogError) as exc:
            print(f"gpulens: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
        except Exception as exc:
            if os.environ.get("GPULENS_DEBUG"):
                raise
            missing = _missing_extra(exc)
            if missing:  # the base install has no analyzer libraries: say what to install
                print(f"gpulens: error: the analyzer needs {missing}: {INSTALL_HINT}", file=sys.stderr)
                return 2
            first = str(exc).splitlines()[0] if str(exc) else ""
            print(
                f"gpulens: error: unexpected {type(exc).__name__}: {first} (GPULENS_DEBUG=1 for details)",
                file=sys.stderr,
            )
            return 1

    return run


# public: `gpulens simulate` (sim/history_cli.py) reports its errors as the analyzer's commands do
guard = _guard


def _missing_extra(exc: BaseException) -> str | None:
    """The `[analyzer]` extra's module whose absence `exc` reports, if it is one."""
    if not isinstance(exc, ModuleNotFoundError):
        return None
    missing = (exc.name or "").partition(".")[0]
    return missing if missing in ANALYZER_EXTRA_MODULES else None


def _source_args(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("source (one of --prometheus or --history)")
    src.add_argument("--prometheus", metavar="URL", help="Prometheus-compatible HTTP API base URL")
    src.add_argument("--history", metavar="DIR", help="history directory (gpulens simulate / import-trace)")
    src.add_argument("--window", default=None, help="analysis window, e.g. 7d (required with --prometheus)")
    src.add_argument("--end", default=None, help="end of the window: RFC 3339, unix seconds or now")
    src.add_argument(
        "--step",
        default=None,
        help="PromQL aggregation step (default: the analyzer rules' interval, else 60s, the scrape interval)",
    )
    src.add_argument(
        "--aggregation",
        choices=("auto", "rules", "raw"),
        default="auto",
        help="per-step job aggregates from the analyzer recording rules (alerts/analyzer_rules.yml) when "
        "they cover the window (auto, the default), only from them (rules), or joined from raw series at "
        "query time (raw)",
    )
    src.add_argument("--bearer-token-file", help="file holding a bearer token for the API")
    src.add_argument("--basic-auth-user", help="basic auth user name")
    src.add_argument("--basic-auth-password-file", help="file holding the basic auth password")
    src.add_argument("--ca-file", help="CA bundle to verify the API's TLS certificate")
    src.add_argument("--insecure-skip-verify", action="store_true", help="do not verify TLS certificates")
    src.add_argument("--chunk-size", type=int, default=200, help="jobs per PromQL query (default 200)")
    src.add_argument(
        "--concurrency", type=int, default=4, help="queries (raw path: chunks of jobs) at once (default 4)"
    )
    src.add_argument("--retries", type=int, default=3, help="retries of a failed request (default 3)")
    src.add_argument(
        "--max-series",
        type=int,
        default=None,
        metavar="N",
        help="refuse a Prometheus answer holding more series (default: what --max-memory holds, "
        "at most 2,000,000)",
    )
    src.add_argument(
        "--progress", action="store_true", help="print progress on stderr (default: if a terminal)"
    )
    parser.add_argument("--gpu-model", help="treat every GPU as this catalog model (sources that do not say)")
    parser.add_argument("--thresholds", metavar="FILE", help="YAML thresholds overriding the defaults")
    _limit_args(parser)


def _limit_args(parser: argparse.ArgumentParser) -> None:
    limits = parser.add_argument_group("input limits (checked before a file is read)")
    limits.add_argument(
        "--max-samples", type=int, default=None, metavar="N", help="refuse inputs of more rows (default 1e9)"
    )
    limits.add_argument(
        "--max-memory",
        default=None,
        metavar="SIZE",
        help="refuse inputs that would expand to more memory, e.g. 8GiB (default: half of what the process "
        "may use: the machine's memory or its cgroup's limit, the smaller)",
    )


SIZE_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
SIZE_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


def parse_size(text: str, flag: str) -> int:
    """`8GiB`, `500MB` or a number of bytes; one error line naming the flag otherwise."""
    import re

    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in SIZE_UNITS or float(match.group(1)) * SIZE_UNITS[unit] < 1:
        raise AnalyzerError(f"{flag}: expected a size like 8GiB, 500MB or a number of bytes, got {text!r}")
    return int(float(match.group(1)) * SIZE_UNITS[unit])


def _limits(args: argparse.Namespace) -> Any:
    # deferred: the analyzer extra (see the note below the imports)
    from gpulens.analyzer.history import InputLimits

    default = InputLimits()
    rows = default.max_rows if args.max_samples is None else args.max_samples
    if rows < 1:
        raise AnalyzerError(f"--max-samples: expected a positive number of rows, got {rows}")
    size = default.max_bytes if args.max_memory is None else parse_size(args.max_memory, "--max-memory")
    return InputLimits(max_rows=rows, max_bytes=size)


@dataclass(frozen=True)
class _PromTarget:
    """What a `--prometheus` run reads: the client (its first queries asked) and the window."""

    client: PromClient
    window_s: float
    end: float
    step_s: float | None  # None: not given (the rules' interval, else the default)


def _prom_target(args: argparse.Namespace) -> _PromTarget:
    """The client and window of a `--prometheus` run, with the run's first queries asked.

    Standard library only: the queries run in Prometheus while `_analysis` imports pandas and
    the analysis (~0.7 s, otherwise spent before the first query).
    """
    if not args.window:
        raise AnalyzerError("--window is required with --prometheus (e.g. --window 7d)")
    basic = None
    if args.basic_auth_user:
        password = ""
        if args.basic_auth_password_file:
            password = read_secret(args.basic_auth_password_file, "password")
        basic = (args.basic_auth_user, password)
    if args.chunk_size < 1:
        raise AnalyzerError("--chunk-size must be at least 1")
    if args.concurrency < 1:
        raise AnalyzerError("--concurrency must be at least 1")
    if args.max_series is not None and args.max_series < 1:
        raise AnalyzerError(f"--max-series: expected a positive number of series, got {args.max_series}")
    # what one answer may become, from the memory the run may use (as InputLimits, without pandas)
    budget = usable_memory() // 2 if args.max_memory is None else parse_size(args.max_memory, "--max-memory")
    max_bytes, max_series = answer_limits(budget, args.concurrency)
    config = PromConfig(
        url=args.prometheus,
        bearer_token_file=args.bearer_token_file,
        basic_auth=basic,
        ca_file=args.ca_file,
        insecure_skip_verify=args.insecure_skip_verify,
        retries=max(0, args.retries),
        in_flight=args.concurrency,
        max_response_bytes=max_bytes,
        max_series=max_series if args.max_series is None else args.max_series,
    )
    step_s = parse_duration(args.step, "--step") if args.step else None
    target = _PromTarget(
        PromClient(config), parse_duration(args.window, "--window"), parse_time(args.end), step_s
    )
    ask_first(target.client, target.window_s, target.end, with_coverage=args.aggregation != "raw")
    return target


def _prom_source(args: argparse.Namespace, target: _PromTarget) -> Any:
    # deferred: the analyzer extra (see the note below the imports)
    from gpulens.analyzer.sources.prometheus import Aggregation, PromSource, default_progress

    return PromSource(
        client=target.client,
        window_s=target.window_s,
        end=target.end,
        step_s=DEFAULT_PROM_STEP_S if target.step_s is None else target.step_s,
        step_given=target.step_s is not None,
        aggregation=Aggregation(args.aggregation),
        chunk_size=args.chunk_size,
        concurrency=args.concurrency,
        progress=sys.stderr if args.progress else default_progress(),
    )


def _early_source(args: argparse.Namespace) -> _PromTarget | None:
    """The source options checked and, for `--prometheus`, the run's first queries asked.

    Light (no pandas): a command calls it before anything that imports the analysis, so those
    queries run in Prometheus while Python loads (`_analysis` calls it when the command did not).
    """
    if bool(args.prometheus) == bool(args.history):
        raise AnalyzerError("give exactly one source: --prometheus URL --window 7d, or --history DIR")
    return _prom_target(args) if args.prometheus else None


def _analysis(
    args: argparse.Namespace,
    with_archetypes: bool = True,
    early: _PromTarget | None = None,
    told: Sequence[Any] = (),
    served: frozenset[str] = frozenset(),
    whole: Any = None,
) -> Any:
    """Run the pipeline on the chosen source (`early`: what `_early_source` gave, if called;
    `told`: last week's MPS settings, `hysteresis.told_of`; `served`: last week's servers,
    `recommend.servers_of`; `whole`: last week's jobs measured whole, `timesplit.whole_of`)."""
    prometheus = early if early is not None else _early_source(args)

    # deferred: the analyzer extra (see the note below the imports)
    from gpulens.analyzer import pipeline, serving
    from gpulens.analyzer.profile import parse_model_option
    from gpulens.analyzer.sources import files

    th = load_thresholds(args.thresholds)
    model = parse_model_option(args.gpu_model)
    if prometheus is not None:
        source = _prom_source(args, prometheus)
        profiles = source.profiles(th, model)
        meta = {
            "source": "prometheus",
            "url": args.prometheus,
            "window_s": source.window_s,
            "end": source.end,
            "aggregation": str(source.used),
            "aggregation_reason": source.used_reason,
            "step_s": source.used_step_s,
        }
        fleet = source.fleet(model)
        return pipeline.analyze_profiles(
            profiles,
            th,
            args.prometheus,
            meta,
            with_archetypes,
            gpus=source.gpu_rows(),
            fleet=fleet or None,
            topology=source.topology(),
            serving_table=serving.from_prometheus(
                source.client,
                source.window_s,
                source.used_step_s if math.isfinite(source.used_step_s) else source.step_s,
                source.end,
            ),
            told=told,
            served=served,
            whole=whole,
        )
    window = parse_duration(args.window, "--window") if args.window else None
    end = parse_time(args.end) if args.end else None
    history = files.load(args.history, window, end, sys.stderr if args.progress else None, _limits(args))
    return pipeline.analyze_history(history, th, model, with_archetypes, told, served, whole)


def _print_frame(frame: Any, columns: tuple[str, ...], fmt: str) -> None:
    # deferred: the analyzer extra (see the note below the imports)
    from gpulens.analyzer import jsonout
    from gpulens.analyzer.pipeline import jsonable

    cols = [c for c in columns if c in frame]
    if fmt == "csv":
        frame.drop(columns=["numbers"], errors="ignore").to_csv(sys.stdout, index=False)
    elif fmt == "json":
        rows = [{k: jsonable(v) for k, v in row.items() if k != "numbers"} for _, row in frame.iterrows()]
        # one write of the whole text (jsonout: orjson), not json.dump's write per token
        sys.stdout.write(jsonout.dumps(rows) + "\n")
    else:
        with_pd = frame[cols].copy()
        if "memory_peak_bytes" in with_pd:
            with_pd["memory_peak_bytes"] = (with_pd["memory_peak_bytes"] / 1024**3).round(1)
            with_pd = with_pd.rename(columns={"memory_peak_bytes": "mem_peak_gib"})
        sys.stdout.write(
            with_pd.to_string(index=False, float_format=lambda v: f"{v:.3g}", max_colwidth=90) + "\n"
        )


@_guard
def cmd_profile(args: argparse.Namespace) -> int:
    analysis = _analysis(args, with_archetypes=False)
    if analysis.kind != "usage":
        raise AnalyzerError(f"{args.history}: a requests-only history has no usage profiles")
    frame = analysis.recs[[c for c in analysis.recs if c in _profile_columns()]]
    _print_frame(frame, PROFILE_TABLE, args.format)
    return 0


def _profile_columns() -> tuple[str, ...]:
    # deferred: the analyzer extra (see the note below the imports)
    from gpulens.analyzer.profile import PROFILE_COLUMNS

    return PROFILE_COLUMNS


@_guard
def cmd_recommend(args: argparse.Namespace) -> int:
    analysis = _analysis(args, with_archetypes=False)  # first: it asks Prometheus before importing

    # deferred: the analyzer extra (see the note below the imports)
    from gpulens.analyzer import jsonout
    from gpulens.analyzer.pipeline import jsonable

    if args.textfile:
        # deferred: the analyzer extra (see the note below the imports)
        from gpulens.analyzer.publish import write_textfile

        write_textfile(analysis, args.textfile)
    if args.format == "json":
        payload = {
            "jobs": analysis.job_records(),
            "plan": jsonable(analysis.plan.as_dict()),
            "summary": jsonable(analysis.headline()),
            "config": analysis.emitted.files if analysis.emitted else {},
            "notes": (analysis.emitted.notes if analysis.emitted else []) + analysis.plan.notes,
        }
        sys.stdout.write(jsonout.dumps(payload) + "\n")  # one write (see above)
    elif args.format == "csv":
        _print_frame(analysis.recs, RECOMMEND_TABLE, "csv")
    else:
        _print_frame(analysis.recs, RECOMMEND_TABLE, "table")
        p = analysis.plan
        print(
            f"\nplan: {p.gpus_before} GPUs -> {p.gpus_after} ({p.gpus_freed} freed); utilisation "
            f"{100 * p.utilization_before:.1f} % -> {100 * p.utilization_after:.1f} %"
        )
    return 0


@_guard
def cmd_report(args: argparse.Namespace) -> int:
    early = _early_source(args)  # before the imports below (see `_early_source`)

    # deferred: the analyzer extra (see the note below the imports)
    from gpulens.analyzer.hysteresis import told_of
    from gpulens.analyzer.recommend import servers_of
    from gpulens.analyzer.report import write_report
    from gpulens.analyzer.report_model import parse_prices
    from gpulens.analyzer.timesplit import whole_of
    from gpulens.analyzer.weekly import compare, load_previous

    try:
        prices = parse_prices(args.gpu_price)
    except ValueError as exc:
        raise AnalyzerError(str(exc)) from exc
    # last week's report is read first: what it gave each job is what the job runs under now
    jobs, plan = load_previous(args.previous) if args.previous else ([], {})
    analysis = _analysis(args, early=early, told=told_of(jobs), served=servers_of(jobs), whole=whole_of(jobs))
    previous = None
    if args.previous:
        previous = compare(analysis, jobs, plan, args.previous, load_thresholds(args.thresholds))
    written = write_report(analysis, args.out, prices, previous)
    if args.textfile:
        # deferred: the analyzer extra (see the note below the imports)
        from gpulens.analyzer.publish import write_textfile

        write_textfile(analysis, args.textfile)
    h = analysis.headline()
    freed = h["gpus_freed"]
    outcome = f"{freed} GPUs could be freed" if freed >= 0 else f"the jobs need {-freed} more GPUs"
    print(f"report written to {written['html']} ({outcome})")
    return 0


@_guard
def cmd_import_trace(args: argparse.Namespace) -> int:
    # deferred: the analyzer extra (see the note below the imports)
    from gpulens.analyzer.importers import import_trace, warnings
    from gpulens.analyzer.profile import parse_model_option

    meta = import_trace(args.trace, args.src, args.out, parse_model_option(args.gpu_model), _limits(args))
    for line in warnings(meta):
        print(f"gpulens: warning: {line}", file=sys.stderr)
    print(f"history written to {args.out} ({meta['trace']['pods']} pods, {meta['kind']})")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the analyzer's four subcommands."""
    p = subparsers.add_parser("profile", help="per-job GPU usage profiles")
    _source_args(p)
    p.add_argument("--format", choices=("json", "csv", "table"), default="table")
    p.set_defaults(func=cmd_profile)

    p = subparsers.add_parser(
        "recommend", help="per-job rightsizing recommendations and a consolidation plan"
    )
    _source_args(p)
    p.add_argument("--format", choices=("json", "csv", "table"), default="table")
    p.add_argument("--textfile", metavar="FILE", help="also write recommendations as Prometheus text")
    p.set_defaults(func=cmd_recommend)

    p = subparsers.add_parser("report", help="weekly report: HTML, Markdown, CSV and JSON")
    _source_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--textfile", metavar="FILE", help="also write recommendations as Prometheus text")
    p.add_argument(
        "--gpu-price",
        action="append",
        metavar="MODEL=PRICE",
        help="price per GPU-hour of a model for the cost recovered (repeatable; default=PRICE for the "
        "rest; without any, 2.00 is assumed and the report says so)",
    )
    p.add_argument(
        "--previous",
        metavar="DIR",
        help="last week's report directory: say which of its recommendations were applied and what they did",
    )
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser("import-trace", help="convert a public GPU trace into a history")
    p.add_argument("trace", choices=("alibaba-genai-2026", "alibaba-gpu-v2023"))
    p.add_argument("src", help="trace directory (tarballs or CSVs) or file")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--gpu-model", help="GPU model of the trace (required for alibaba-genai-2026)")
    _limit_args(p)
    p.set_defaults(func=cmd_import_trace)
