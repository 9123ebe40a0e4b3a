"""The analyzer's recording rules: each job's per-step usage, recorded once by Prometheus.

The raw PromQL path (`prometheus.py`) evaluates, at every step of the window, a join of
`gpu_job_info` with a device family, aggregated per job (`signal_expr`), inside a subquery, once
per reduction. These rules record exactly that per-step aggregate as it happens, one series per
job and signal, so the weekly query only reduces stored series with `*_over_time`.

- Every rule expression is `signal_expr` itself (the raw path's inner expression) with the job
  matcher replaced by "every non-system job": the two paths cannot drift apart, and with the
  rule interval equal to the analysis step they reduce the very same numbers.
- One series per (family, scope, per-step aggregation) that any signal chain uses, whatever the
  job's kind: the analyzer picks the chain's first signal with samples, as the raw path does.
- `job_id:gpu_job_info:count` (devices per step) and `job_id:gpu_job_info:timestamp_seconds`
  (the evaluation time) give a job's samples, GPUs, first and last step.
- `cluster:gpulens_analyzer_rules:timestamp_seconds` is a heartbeat (the evaluation time, with
  or without jobs): the analyzer reads the rules only when it spans the whole window, and derives
  the rule interval (= the analysis step) from it. Otherwise it falls back to the raw series.
- Each activity series has an idle twin, `<record>_idle` (1 at a step under the idle threshold,
  else 0: the raw path's `< bool activity.idle_below`), so the idle fraction is an
  `avg_over_time` of stored series instead of a subquery over every step.
  `cluster:gpulens_analyzer_rules:idle_below` records the threshold they were recorded with (the
  thresholds file's default unless `--idle-below` says otherwise): the analyzer reads the twins only
  when that threshold is its own over the whole window, else it keeps the subquery.
- Each memory series has a restart twin, `<record>_restart_timestamp_seconds`: the evaluation time
  at a step whose memory holds under (1 - `leak.restart_drop_fraction`) x the step before's (a leak
  that restarts), absent at other steps. The restarts and their span are then a count and a
  max - min of stored samples; the raw path needs a subquery of two per-step joins at every step
  of the week for them, which cost 20 s of Prometheus per 10,000 jobs. Like the idle twins it
  counts only where `cluster:gpulens_analyzer_rules:restart_drop_fraction` (the fraction it was
  recorded with) is the analyzer's own over the whole window.

The mixin config (mixin: selector, cluster label) applies here as to the alert and
recording rules: every scraped series read gets the selector and every `by` / `on` list the cluster
label, so the rules read only gpulens' scrape jobs and never join or merge two clusters' series.
The raw path reads the series by name, as before: over gpulens' own series the two agree.

`alerts/analyzer_rules.yml` is generated from this module with the default config by `gpulens
mixin build` (make rules) with the other rule files; `gpulens mixin build --config FILE --out DIR`
writes a config's own copy, and `python -m gpulens.analyzer.sources.rules` one with another
interval. A test keeps the committed file in sync.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpulens import atomicfile
from gpulens.analyzer import signals
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.sources.promexpr import signal_expr
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.analyzer.timeparse import parse_duration
from gpulens.promscope.config import DEFAULT, ConfigError, MixinConfig, load, scope
from gpulens.promscope.promql import apply

GROUP = "gpulens.analyzer"
RULE_FILE = "analyzer_rules.yml"  # in alerts/
DEFAULT_INTERVAL = "1m"
HEARTBEAT = "cluster:gpulens_analyzer_rules:timestamp_seconds"
PRESENCE = "job_id:gpu_job_info:count"
PRESENCE_TIME = "job_id:gpu_job_info:timestamp_seconds"
IDLE_BELOW = "cluster:gpulens_analyzer_rules:idle_below"  # the threshold of the `_idle` series
RESTART_DROP = "cluster:gpulens_analyzer_rules:restart_drop_fraction"  # that of the restart twins
JOBS = f'job_source!="{signals.SYSTEM_SOURCE}"'
# per-step aggregation of each signal table (profile._chain_steps: activity averaged, memory peaked)
TABLES: tuple[tuple[dict[str, tuple[signals.Signal, ...]], str], ...] = (
    (signals.ACTIVITY, "avg"),
    (signals.MEMORY, "max"),
    (signals.DRAM, "avg"),
    (signals.BUSY, "avg"),
    (signals.TENSOR, "avg"),
)


@dataclass(frozen=True)
class Recorded:
    """One recorded per-job, per-step series."""

    record: str
    expr: str


def record_name(signal: signals.Signal, how: str) -> str:
    """`job_id:<family>:<how>`: `<how>_share` for the device value split among the GPU's jobs,
    `<how>_of_<figure>` for the per-job shares of a device figure (`sm_active`, `utilization`)."""
    if signal.scope == "gpu_share":
        return f"job_id:{signal.family}:{how}_share"
    if signal.scope == "job_share":
        figure = signal.figure.removeprefix("gpu_").removesuffix("_ratio")
        return f"job_id:{signal.family}:{how}_of_{figure}"
    return f"job_id:{signal.family}:{how}"


def signal_rules() -> list[Recorded]:
    """One rule per distinct (family, scope, aggregation) of the signal tables, in table order."""
    out: dict[str, Recorded] = {}
    for table, how in TABLES:
        for chain in table.values():
            for signal in chain:
                name = record_name(signal, how)
                out.setdefault(name, Recorded(name, signal_expr(signal, None, how)))
    return list(out.values())


def idle_record(record: str) -> str:
    """The idle twin of an activity record: 1 at a step under the idle threshold, else 0."""
    return f"{record}_idle"


def default_idle_below() -> float:
    """The idle threshold the rules record by default: `activity.idle_below` of thresholds.yaml."""
    return load_thresholds().activity.idle_below


def idle_rules(idle_below: float) -> list[Recorded]:
    """One idle twin per activity record, from the signal's own expression (not from the recorded
    series: a rule does not see the series an earlier rule of its group recorded in the same
    evaluation when promtool backfills them)."""
    out: dict[str, Recorded] = {}
    for chain in signals.ACTIVITY.values():
        for signal in chain:
            name = idle_record(record_name(signal, "avg"))
            out.setdefault(name, Recorded(name, f"{signal_expr(signal, None, 'avg')} < bool {idle_below!r}"))
    return list(out.values())


def restart_record(record: str) -> str:
    """The restart twin of a memory record: the evaluation time at a restart, absent elsewhere."""
    return f"{record}_restart_timestamp_seconds"


def default_restart_drop() -> float:
    """The drop the restart twins record by default: `leak.restart_drop_fraction` of thresholds.yaml."""
    return load_thresholds().leak.restart_drop_fraction


def restart_rules(drop_fraction: float, interval_s: float) -> list[Recorded]:
    """One restart twin per memory record: the raw path's restart test (`cycle_reductions`) on
    the signal's own expression over the last two steps, a subquery whose steps are multiples of
    the interval as the raw path's (and, as the idle twins, not the recorded series: promtool
    backfills each rule without the others' output). Valued with the evaluation time, so the
    restarts' span is a max - min of stored samples."""
    step_ms = round(interval_s * 1000)
    keep = 1.0 - drop_fraction
    out: dict[str, Recorded] = {}
    for chain in signals.MEMORY.values():
        for signal in chain:
            two = f"({signal_expr(signal, None, 'max')})[{2 * step_ms - 1}ms:{step_ms}ms]"
            restart = f"last_over_time({two}) < {keep!r} * max_over_time({two})"
            name = restart_record(record_name(signal, "max"))
            out.setdefault(name, Recorded(name, f"time() + 0 * ({restart})"))
    return list(out.values())


def all_rules(
    idle_below: float | None = None, restart_drop: float | None = None, interval_s: float = 60.0
) -> list[Recorded]:
    """Every rule of the group; `idle_below` (default: `default_idle_below()`) for the idle twins,
    `restart_drop` (default: `default_restart_drop()`) and the group's interval for the restart
    twins."""
    idle = default_idle_below() if idle_below is None else idle_below
    drop = default_restart_drop() if restart_drop is None else restart_drop
    presence = f"count by (job_id) (gpu_job_info{{{JOBS}}})"
    return [
        Recorded(HEARTBEAT, "vector(time())"),
        Recorded(PRESENCE, presence),
        # the data's own timestamp, not the evaluation's: the raw path's steps are the data's
        Recorded(PRESENCE_TIME, f"max by (job_id) (timestamp(gpu_job_info{{{JOBS}}}))"),
        *signal_rules(),
        Recorded(IDLE_BELOW, f"vector({idle!r})"),
        *idle_rules(idle),
        Recorded(RESTART_DROP, f"vector({drop!r})"),
        *restart_rules(drop, interval_s),
    ]


HEADER = """\
# gpulens analyzer recording rules: each job's usage per step, read by `gpulens recommend / report
# --prometheus` (docs/analyzer.md, "Recording rules"). Do not edit: generated from the signal table
# the analyzer's raw PromQL path uses (analyzer/signals.py) by `gpulens mixin build` (make rules),
# or with another interval by
#   python -m gpulens.analyzer.sources.rules --out FILE [--interval 5m] [--config mixin.yaml]
#     [--idle-below 0.05] [--restart-drop-fraction 0.5]
# so the rules and the raw path compute the same per-step numbers. Mixin config:
{settings}#
# The group interval is the analysis step (the analyzer reads it from the heartbeat): 1m matches
# the analyzer's default step; 5m stores a fifth of the samples. Every series but the heartbeat
# carries only the job_id label (and the cluster label where the series have one):
#   {heartbeat}  the evaluation time, jobs or not
#   {presence}  devices (GPUs, MIG instances) the job holds
#   {presence_time}  timestamp of the job's newest gpu_job_info sample
#   job_id:<family>:avg | :max  mean (activity) / peak (memory) over the job's devices
#   job_id:gpu_job_sm_utilization_ratio:avg_of_sm_active | :avg_of_utilization  the job's share of
#     its GPU's SM figure plus its part of the unattributed remainder, where the GPU publishes it
#     (MPS, time-slicing): the GPU's jobs add up to the figure, as a whole GPU's one job does
#   job_id:<family>:avg_share  the GPU's value divided by the jobs on it (older data without shares)
#   {idle_below}  the idle threshold of the _idle series ({idle!r})
#   job_id:<family>:<activity>_idle  1 where that activity series is under the threshold, else 0
#   {restart_drop}  the drop of the restart series ({drop!r})
#   job_id:<family>:max_restart_timestamp_seconds  the evaluation time where the job's memory holds
#     under (1 - that drop) x the step before's (a restart), absent elsewhere
"""


def render(
    interval: str = DEFAULT_INTERVAL,
    config: MixinConfig = DEFAULT,
    idle_below: float | None = None,
    restart_drop: float | None = None,
) -> str:
    """The rule file (YAML) with a header; `interval` is the group's evaluation interval, `config`
    the mixin's selector and cluster label (the default is what alerts/ holds), `idle_below` the
    idle twins' threshold and `restart_drop` the restart twins' drop (default: thresholds.yaml's)."""
    idle = default_idle_below() if idle_below is None else idle_below
    drop = default_restart_drop() if restart_drop is None else restart_drop
    interval_s = parse_duration(interval, "interval")
    rule_scope = scope(config)
    group = {
        "name": GROUP,
        "interval": interval,
        "rules": [
            {"record": r.record, "expr": apply(r.expr, rule_scope)} for r in all_rules(idle, drop, interval_s)
        ],
    }
    body = yaml.safe_dump({"groups": [group]}, sort_keys=False, width=200)
    settings = "".join(f"#   {line}\n" for line in config.describe() if not line.startswith("runbook"))
    header = HEADER.format(
        heartbeat=HEARTBEAT,
        presence=PRESENCE,
        presence_time=PRESENCE_TIME,
        settings=settings,
        idle_below=IDLE_BELOW,
        idle=idle,
        restart_drop=RESTART_DROP,
        drop=drop,
    )
    return header + "\n" + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", default=DEFAULT_INTERVAL, help="group evaluation interval (1m..5m)")
    parser.add_argument("--out", type=Path, help="write here instead of stdout")
    parser.add_argument("--config", type=Path, help="mixin config (selector, clusterLabel); default built in")
    parser.add_argument(
        "--idle-below",
        type=float,
        help="idle threshold of the _idle series (activity.idle_below; default: thresholds.yaml's)",
    )
    parser.add_argument(
        "--restart-drop-fraction",
        type=float,
        help="drop of the restart series (leak.restart_drop_fraction; default: thresholds.yaml's)",
    )
    args = parser.parse_args(argv)
    for flag, value in (
        ("--idle-below", args.idle_below),
        ("--restart-drop-fraction", args.restart_drop_fraction),
    ):
        if value is not None and not 0.0 <= value <= 1.0:
            parser.exit(2, f"gpulens: error: {flag} must be in [0, 1], got {value}\n")
    try:
        config = load(args.config) if args.config is not None else DEFAULT
    except ConfigError as exc:
        print(f"gpulens analyzer rules: {exc}", file=sys.stderr)
        return 2
    try:
        text = render(args.interval, config, args.idle_below, args.restart_drop_fraction)
    except AnalyzerError as exc:
        parser.exit(2, f"gpulens: error: {exc}\n")
    if args.out:
        try:
            atomicfile.write_text(args.out, text)
        except atomicfile.WriteFailed as exc:
            parser.exit(2, f"gpulens: error: {exc}\n")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
