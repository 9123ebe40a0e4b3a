"""Analyzer scale benchmark: a synthetic cluster week through the PromQL path and the file path.

DESIGN §8 asks for 10,000 jobs x 7 days through PromQL aggregation in <= 60 s, and 20 M raw
samples through the file path in <= 20 s and <= 4 GB. Both are measured here on one synthetic
cluster, generated with numpy from a seed so every run sees the same data:

- GPUs = ceil(jobs / 8); each GPU runs about 8 single-GPU, exclusive jobs back to back over the
  week (segments of random length), on nodes of 8 H100s. A job has an activity level (idle, low,
  medium, high: the mix a rightsizing report sees) with per-step noise and a memory footprint.
- Per GPU and step the exporter would publish six samples: `gpu_info`, `gpu_sm_active_ratio`,
  `gpu_memory_used_bytes`, `gpu_job_info`, `gpu_job_sm_utilization_ratio`,
  `gpu_job_memory_used_bytes` (labels as in docs/metrics.md).

PromQL path: the samples are written as OpenMetrics, one file per 2 h block (promtool 2.42 has no
`--max-block-duration` and re-reads its whole input once per 2 h block, so one file per block keeps
the backfill linear), backfilled with `promtool tsdb create-blocks-from openmetrics`, and served by
a real Prometheus on 127.0.0.1 with `--query.lookback-delta` below the step (backfilled blocks have
no staleness markers; docs/analyzer.md). Prometheus first compacts the 2 h blocks into the larger
ones a week of scraping leaves behind, and the benchmark waits for that to settle so nothing
competes with the measured queries. Then
`gpulens recommend --prometheus URL --window 7d --end T --step STEP` runs as a subprocess;
its wall time and peak RSS (`wait4`) are measured, and the queries it sent are read from
Prometheus' own `prometheus_http_requests_total`.

The recording-rule run with more jobs (`rules-large`, for the cost per job) writes the rules'
series from the generator into the raw blocks (`recorded_families`) instead of evaluating
`alerts/analyzer_rules.yml` with promtool, which takes about 225 s per 10,000 jobs on 2 cores;
`tests/bench/test_analyzer_bench.py` pins that both give the same series. `runs` (`gpulens bench
--analyzer-runs`) selects the runs, e.g. `rules` alone.

File path: the same cluster at the step that gives the requested number of raw samples, written
as `samples.parquet` (the history format) a few GPUs at a time with pyarrow, then
`gpulens recommend --history DIR` as a subprocess, measured the same way.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from gpulens.analyzer import signals
from gpulens.analyzer.sources import rules
from gpulens.devtools.bench import tsdb as tsdbs

WEEK_S = 7 * 86400
BLOCK_S = tsdbs.BLOCK_S
END = 1_767_830_400.0  # 2026-01-08T00:00:00Z: a multiple of every step and of 2 h
JOBS_PER_GPU = 8
MODEL = "NVIDIA H100 80GB HBM3"
MIB = 1024**2
GIB = 1024**3
# activity levels (idle, low, medium, high, busy) and their share of jobs
LEVELS = np.array([0.01, 0.1, 0.3, 0.6, 0.9])
LEVEL_P = np.array([0.15, 0.3, 0.25, 0.15, 0.15])
MEMORY_GIB = np.array([2, 6, 12, 24, 40, 70])
MEMORY_P = np.array([0.15, 0.25, 0.25, 0.15, 0.12, 0.08])
FAMILIES = (
    "gpu_info",
    "gpu_sm_active_ratio",
    "gpu_memory_used_bytes",
    "gpu_job_info",
    "gpu_job_sm_utilization_ratio",
    "gpu_job_memory_used_bytes",
)
SAMPLES_PER_GPU_STEP = len(FAMILIES)


@dataclass
class Cluster:
    """The synthetic cluster: per (GPU, step) which job runs and what it does."""

    jobs: int
    gpus: int
    steps: int
    step_s: int
    end: float
    job_of: np.ndarray  # [gpus, steps] int32: index of the job running there
    activity: np.ndarray  # [gpus, steps] uint16: device SM activity in thousandths
    job_util: np.ndarray  # [gpus, steps] uint16: the job's SM utilization in thousandths
    memory_mib: np.ndarray  # [gpus, steps] int32: the job's memory in MiB

    @property
    def start(self) -> float:
        return self.end - (self.steps - 1) * self.step_s

    @property
    def samples(self) -> int:
        return self.gpus * self.steps * SAMPLES_PER_GPU_STEP

    def timestamps(self) -> np.ndarray:
        return self.start + self.step_s * np.arange(self.steps, dtype=np.float64)


def make_cluster(jobs: int, step_s: int, seed: int = 0, end: float = END) -> Cluster:
    """Jobs round-robin onto ceil(jobs/8) GPUs, each GPU's week cut into its jobs' segments."""
    if jobs < 1:
        raise ValueError("jobs must be at least 1")
    steps = WEEK_S // step_s
    gpus = math.ceil(jobs / JOBS_PER_GPU)
    if steps < JOBS_PER_GPU:
        raise ValueError(f"step {step_s} s leaves {steps} steps in a week: need at least {JOBS_PER_GPU}")
    rng = np.random.default_rng(seed)
    level = rng.choice(LEVELS, size=jobs, p=LEVEL_P)
    memory = rng.choice(MEMORY_GIB, size=jobs, p=MEMORY_P) * 1024
    job_of = np.empty((gpus, steps), dtype=np.int32)
    for g in range(gpus):
        mine = np.arange(g, jobs, gpus, dtype=np.int32)
        cuts = np.sort(rng.choice(np.arange(1, steps), size=len(mine) - 1, replace=False))
        lengths = np.diff(np.concatenate(([0], cuts, [steps])))
        job_of[g] = np.repeat(mine, lengths)
    noise = rng.normal(0.0, 0.05, size=(gpus, steps))
    activity = np.clip(level[job_of] + noise, 0.0, 1.0)
    job_util = np.clip(activity * 1.15, 0.0, 1.0)
    wobble = rng.uniform(0.9, 1.0, size=(gpus, steps))
    memory_mib = (memory[job_of] * wobble).astype(np.int32)
    return Cluster(
        jobs=jobs,
        gpus=gpus,
        steps=steps,
        step_s=step_s,
        end=end,
        job_of=job_of,
        activity=np.rint(activity * 1000).astype(np.uint16),
        job_util=np.rint(job_util * 1000).astype(np.uint16),
        memory_mib=memory_mib,
    )


def job_id(j: int) -> str:
    return f"job-{j:06d}"


def _gpu_labels(g: int) -> dict[str, str]:
    return {"gpu": str(g % 8), "instance": f"node-{g // 8:04d}:9400", "uuid": f"GPU-{g:08x}-bench"}


def _job_labels(j: int) -> dict[str, str]:
    return {
        "job_id": job_id(j),
        "job_source": "slurm",
        "job_user": f"user-{j % 97:02d}",
        "job_namespace": f"team-{j % 13:02d}",
        "sharing": "exclusive",
    }


# ---------------------------------------------------------------- OpenMetrics + Prometheus path


def _series(family: str, labels: dict[str, str]) -> str:
    return family + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if v) + "} "


def recorded_families() -> dict[str, str]:
    """Analyzer recording rule -> the generated raw family whose value it records, for this cluster.

    Every job here runs alone on one GPU (one `gpu_job_info` series per step, `count by (uuid)`
    = 1), so each per-job aggregate of one device (`avg`, `max`, the `gpu_share` split by the one
    job) is that device's or job's value at the step. Rules of families the cluster lacks, and the
    `job_share` rules (they need `gpu_job_sm_unattributed_ratio`), record nothing. A test pins that
    this equals promtool's evaluation of `alerts/analyzer_rules.yml` over the same raw data.
    """
    out: dict[str, str] = {}
    for table, how in rules.TABLES:
        for chain in table.values():
            for signal in chain:
                if signal.family in FAMILIES and signal.scope != "job_share":
                    out.setdefault(rules.record_name(signal, how), signal.family)
    return out


def recorded_idle() -> dict[str, str]:
    """Idle twin of an activity record (`rules.idle_rules`) -> the generated raw family it thresholds."""
    activity = {rules.record_name(signal, "avg") for chain in signals.ACTIVITY.values() for signal in chain}
    return {rules.idle_record(r): family for r, family in recorded_families().items() if r in activity}


def write_openmetrics_blocks(cluster: Cluster, out_dir: Path, recorded: bool = False) -> list[Path]:
    """OpenMetrics files of whole 2 h blocks; within a file, series are contiguous and in time order.

    With `recorded`, each file also holds the analyzer recording rules' series for its steps, as
    an evaluation at each step (evaluation offset 0) computes them (`recorded_families`): the
    cluster's week without evaluating the rules over it, which takes promtool minutes per
    10,000 jobs.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    times = cluster.timestamps()
    ts_text = [f" {int(t)}\n" for t in times]
    ratio = [f"{i / 1000:g}" for i in range(1001)]
    gpu_of_job = np.empty(cluster.jobs, dtype=np.int32)
    gpu_of_job[cluster.job_of.ravel()] = np.repeat(np.arange(cluster.gpus), cluster.steps)
    gpu_prefix = {
        fam: [
            _series(fam, {**_gpu_labels(g), **({"model": MODEL} if fam == "gpu_info" else {})})
            for g in range(cluster.gpus)
        ]
        for fam in FAMILIES[:3]
    }
    job_prefix = {
        fam: [
            _series(
                fam,
                {
                    **_gpu_labels(int(gpu_of_job[j])),
                    **(_job_labels(j) if fam == "gpu_job_info" else {"job_id": job_id(j)}),
                },
            )
            for j in range(cluster.jobs)
        ]
        for fam in FAMILIES[3:]
    }
    ts_int = [str(int(t)) for t in times]
    records = recorded_families() if recorded else {}
    idle_records = recorded_idle() if recorded else {}
    idle_below = rules.default_idle_below()
    restart_drop = rules.default_restart_drop()
    idle_text = ["1" if float(r) < idle_below else "0" for r in ratio]  # PromQL's `< bool`
    record_prefix = [_series("", {"job_id": job_id(j)}) for j in range(cluster.jobs)]
    block = (times // BLOCK_S).astype(np.int64)
    # promtool 2.42 re-reads a whole file once per 2 h block in it: one block per file for a large
    # cluster, the whole week in one file for a tiny one (about 200,000 samples per file at most)
    per_step = (
        SAMPLES_PER_GPU_STEP + len(records) + len(idle_records) + 3 if recorded else SAMPLES_PER_GPU_STEP
    )
    per_block = cluster.gpus * per_step * max(1, BLOCK_S // cluster.step_s)
    block = block // max(1, 200_000 // per_block)
    paths = []
    for b in np.unique(block):
        k = np.flatnonzero(block == b)
        k0, k1 = int(k[0]), int(k[-1]) + 1
        n = k1 - k0
        ts = ts_text[k0:k1] * cluster.gpus
        jobs = cluster.job_of[:, k0:k1].ravel().tolist()
        path = out_dir / f"block-{int(b)}.om"
        with path.open("w") as out:
            values_of = {
                "gpu_sm_active_ratio": [ratio[v] for v in cluster.activity[:, k0:k1].ravel().tolist()],
                "gpu_job_sm_utilization_ratio": [
                    ratio[v] for v in cluster.job_util[:, k0:k1].ravel().tolist()
                ],
                "gpu_memory_used_bytes": [
                    str(v * MIB) for v in (cluster.memory_mib[:, k0:k1].ravel() + 300).tolist()
                ],
                "gpu_job_memory_used_bytes": [
                    str(v * MIB) for v in cluster.memory_mib[:, k0:k1].ravel().tolist()
                ],
            }
            ones = ["1"] * (n * cluster.gpus)
            for fam in FAMILIES:
                out.write(f"# TYPE {fam} gauge\n")
                if fam in gpu_prefix:
                    prefixes = [p for p in gpu_prefix[fam] for _ in range(n)]
                else:
                    table = job_prefix[fam]
                    prefixes = [table[j] for j in jobs]
                values = values_of.get(fam, ones)
                out.write("".join([p + v + t for p, v, t in zip(prefixes, values, ts, strict=True)]))
            if recorded:
                # a job's steps are contiguous on its one GPU, so GPU-major order keeps each series together
                prefixes = [record_prefix[j] for j in jobs]
                own = {rules.PRESENCE: ones, rules.PRESENCE_TIME: ts_int[k0:k1] * cluster.gpus}
                thousandths = {
                    "gpu_sm_active_ratio": cluster.activity,
                    "gpu_job_sm_utilization_ratio": cluster.job_util,
                }
                idle_of = {
                    record: [idle_text[v] for v in thousandths[fam][:, k0:k1].ravel().tolist()]
                    for record, fam in idle_records.items()
                }
                for record in (rules.PRESENCE, rules.PRESENCE_TIME, *records, *idle_records):
                    out.write(f"# TYPE {record} gauge\n")
                    values = own.get(record) or idle_of.get(record) or values_of[records[record]]
                    name = record
                    out.write(
                        "".join([name + p + v + t for p, v, t in zip(prefixes, values, ts, strict=True)])
                    )
                out.write(f"# TYPE {rules.HEARTBEAT} gauge\n")
                heartbeat = rules.HEARTBEAT
                out.write(
                    "".join(f"{heartbeat} {v}{t}" for v, t in zip(ts_int[k0:k1], ts_text[k0:k1], strict=True))
                )
                out.write(f"# TYPE {rules.IDLE_BELOW} gauge\n")
                out.write("".join(f"{rules.IDLE_BELOW} {idle_below!r}{t}" for t in ts_text[k0:k1]))
                # no restart series: a job's memory never falls under 90 % of its step before
                out.write(f"# TYPE {rules.RESTART_DROP} gauge\n")
                out.write("".join(f"{rules.RESTART_DROP} {restart_drop!r}{t}" for t in ts_text[k0:k1]))
            out.write("# EOF\n")
        paths.append(path)
    return paths


def backfill(paths: list[Path], tsdb: Path, workers: int = 2) -> None:
    """`promtool tsdb create-blocks-from openmetrics` per file, `workers` at a time; files removed."""
    tsdb.mkdir(parents=True, exist_ok=True)

    def one(path: Path) -> None:
        tsdbs.backfill_openmetrics(path, tsdb)
        path.unlink()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, paths))


# ---------------------------------------------------------------- Parquet history (file path)


def write_history(cluster: Cluster, out_dir: Path, gpus_per_group: int = 64) -> int:
    """`samples.parquet` + `meta.json` in the history format, a few GPUs per row group (bounded)."""
    # deferred: pyarrow and pandas (the analyzer extra) only for the file-path benchmark
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpulens.analyzer.history import FORMAT, LABELS, META_FILE, SAMPLES_FILE, SCHEMA, VERSION

    out_dir.mkdir(parents=True, exist_ok=True)
    times = cluster.timestamps()
    rows = 0
    with pq.ParquetWriter(out_dir / SAMPLES_FILE, SCHEMA, compression="zstd") as writer:
        for g0 in range(0, cluster.gpus, gpus_per_group):
            g1 = min(cluster.gpus, g0 + gpus_per_group)
            gpus = np.repeat(np.arange(g0, g1), cluster.steps)
            jobs = cluster.job_of[g0:g1].ravel()
            n = len(gpus)
            gpu_labels = [_gpu_labels(g) for g in range(g0, g1)]
            uniq_jobs, job_idx = np.unique(jobs, return_inverse=True)
            job_labels = [_job_labels(int(j)) for j in uniq_jobs]
            values = {
                "gpu_info": np.ones(n),
                "gpu_sm_active_ratio": cluster.activity[g0:g1].ravel() / 1000.0,
                "gpu_memory_used_bytes": (cluster.memory_mib[g0:g1].ravel() + 300.0) * MIB,
                "gpu_job_info": np.ones(n),
                "gpu_job_sm_utilization_ratio": cluster.job_util[g0:g1].ravel() / 1000.0,
                "gpu_job_memory_used_bytes": cluster.memory_mib[g0:g1].ravel() * float(MIB),
            }
            for fam in FAMILIES:
                columns: dict[str, pa.Array] = {
                    "timestamp": pa.array(np.tile(times, g1 - g0)),
                    "metric": pa.array([fam]).take(pa.array(np.zeros(n, dtype=np.int32))),
                    "value": pa.array(values[fam]),
                }
                per_job = fam.startswith("gpu_job_")
                for label in LABELS:
                    if label in ("gpu", "instance", "uuid"):
                        dictionary = [labels[label] for labels in gpu_labels]
                        index = gpus - g0
                    elif label == "model" and fam == "gpu_info":
                        dictionary, index = [MODEL], np.zeros(n, dtype=np.int64)
                    elif per_job and (
                        label == "job_id" or (fam == "gpu_job_info" and label in job_labels[0])
                    ):
                        dictionary = [labels[label] for labels in job_labels]
                        index = job_idx
                    else:
                        dictionary, index = [""], np.zeros(n, dtype=np.int64)
                    columns[label] = pa.array(dictionary, pa.string()).take(pa.array(index))
                writer.write_table(pa.table(columns, schema=SCHEMA))
                rows += n
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "kind": "usage",
        "source": "gpulens bench (synthetic cluster)",
        "step_s": float(cluster.step_s),
        "start": float(times[0]),
        "end": float(times[-1]),
        "samples": rows,
        "families": sorted(FAMILIES),
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return rows


# ---------------------------------------------------------------- measuring the analyzer


@dataclass
class Run:
    """One analyzer subprocess: how long, how much memory, what it said."""

    wall_s: float
    max_rss_bytes: int
    returncode: int
    stderr: str  # its last 2,000 characters (errors, the last progress lines)
    jobs_out: int
    cpu_s: float = 0.0  # user + system CPU of the analyzer process itself
    first_lines: str = ""  # its first 2,000 characters: which path it took (before the progress)


def run_analyzer(args: list[str], workdir: Path, name: str, progress: TextIO | None) -> Run:
    """`gpulens <args> --format json` as a child; wall time and its own peak RSS from wait4."""
    out = workdir / f"{name}.json"
    err = workdir / f"{name}.stderr"
    cmd = [sys.executable, "-m", "gpulens.cli", *args, "--format", "json", "--progress"]
    with out.open("w") as stdout, err.open("w") as stderr:
        began = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
    text = err.read_text()
    if progress is not None and text:
        progress.write("".join(f"  | {line}\n" for line in text.splitlines()[-5:]))
    jobs = 0
    if proc.returncode == 0:
        jobs = len(json.loads(out.read_text())["jobs"])
    cpu = float(usage.ru_utime + usage.ru_stime)
    return Run(wall, int(usage.ru_maxrss) * 1024, proc.returncode, text[-2000:], jobs, cpu, text[:2000])


@dataclass
class PathResult:
    """What one path measured, with the setup it ran on."""

    path: str  # prometheus | history
    command: str
    jobs: int
    gpus: int
    steps: int
    step_s: int
    samples: int
    series: int
    setup_s: dict[str, float]
    wall_s: float
    max_rss_bytes: int
    jobs_profiled: int
    returncode: int
    queries: int | None = None
    chunks: int | None = None
    error: str = ""
    extra: dict[str, float] = field(default_factory=dict)
    aggregation: str = ""  # rules | raw: what the analyzer said it read (PromQL paths)
    # every run's wall time, in run order: `wall_s` (and RSS, CPU, queries) is the median run's
    walls_s: list[float] = field(default_factory=list)
    # job_id -> recommendation (kind, MIG profile, MPS settings); compared across paths, not reported
    recommendations: dict[str, list[object]] = field(default_factory=dict, repr=False)


def _say(progress: TextIO | None, message: str) -> None:
    if progress is not None:
        print(f"analyzer bench: {message}", file=progress, flush=True)


@dataclass
class Backfilled:
    """A week for `jobs` jobs in 2 h blocks: raw samples, and the analyzer rules evaluated over them."""

    cluster: Cluster
    raw: Path  # raw blocks
    rules: Path  # rule blocks
    setup_s: dict[str, float]


def backfill_week(
    jobs: int, step_s: int, workdir: Path, progress: TextIO | None, evaluate_rules: bool = True
) -> Backfilled:
    """Generate, backfill, and evaluate the analyzer rules (interval = step) with promtool.

    Without `evaluate_rules` the generator writes the rules' series itself (`recorded_families`)
    into the raw blocks, and `rules` is an empty directory.
    """
    setup: dict[str, float] = {}
    began = time.monotonic()
    cluster = make_cluster(jobs, step_s)
    files = write_openmetrics_blocks(cluster, workdir / "om", recorded=not evaluate_rules)
    setup["generate_openmetrics_s"] = time.monotonic() - began
    what = "samples" if evaluate_rules else "samples and their recorded series"
    _say(progress, f"{jobs:,} jobs: {cluster.samples:,} {what} in {len(files)} block files, backfilling")
    began = time.monotonic()
    raw = workdir / "raw"
    backfill(files, raw)
    setup["backfill_s"] = time.monotonic() - began
    if not evaluate_rules:
        (workdir / "rules").mkdir(parents=True, exist_ok=True)
        return Backfilled(cluster, raw, workdir / "rules", {k: round(v, 2) for k, v in setup.items()})
    _say(progress, f"{jobs:,} jobs: evaluating the analyzer rules over the week (promtool, every {step_s} s)")
    began = time.monotonic()
    lookback = tsdbs.lookback(step_s)
    with tsdbs.prometheus(raw, lookback, workdir / "rules-backfill.log", compaction=False) as base:
        blocks = tsdbs.backfill_rules(
            base,
            rules.render(f"{step_s}s", tsdbs.BACKFILLED),
            cluster.start,
            cluster.end + step_s,
            workdir / "rule-blocks",
            step_s,
        )
    tsdbs.move_blocks(blocks, workdir / "rules")
    setup["rule_backfill_s"] = time.monotonic() - began
    return Backfilled(cluster, raw, workdir / "rules", {k: round(v, 2) for k, v in setup.items()})


def _analyzer_args(base: str, cluster: Cluster, aggregation: str) -> list[str]:
    return [
        "recommend",
        "--prometheus",
        base,
        "--window",
        "7d",
        "--end",
        str(int(cluster.end)),
        "--step",  # the TSDB's step (and the rules' interval): the raw path's default is 60 s
        f"{cluster.step_s}s",
        "--aggregation",
        aggregation,
    ]


def _measure(
    name: str,
    base: str,
    args: list[str],
    data: Backfilled,
    workdir: Path,
    progress: TextIO | None,
    setup: dict[str, float],
    extra: dict[str, float],
    repeats: int = 1,
) -> PathResult:
    """`gpulens recommend` against `base` `repeats` times: the median run, with the queries it
    cost the server, and every run's wall time (one run on a shared machine is one draw)."""
    shown = ["gpulens", *args]
    shown[shown.index(base)] = "URL"
    _say(progress, f"{name}: {' '.join(shown)}" + (f" ({repeats} runs)" if repeats > 1 else ""))

    def once() -> tuple[Run, float, int]:
        before = tsdbs.query_requests(base)
        load = os.getloadavg()[0]
        run = run_analyzer(args, workdir, f"recommend-{name}", progress)
        _say(progress, f"{name}: {run.wall_s:.1f} s, {run.max_rss_bytes / MIB:.0f} MiB")
        return run, load, tsdbs.query_requests(base) - before

    (run, load, queries), walls = _repeat(once, repeats)
    chunks = re.findall(r"chunk \d+/(\d+)", run.stderr)
    cluster = data.cluster
    step = re.search(r"step (\d+) s", run.stderr)
    result = _result(
        name,
        " ".join(shown),
        cluster,
        run,
        load,
        step_s=int(step.group(1)) if step else cluster.step_s,
        setup_s={**data.setup_s, **{k: round(v, 2) for k, v in setup.items()}},
        extra=extra,
        queries=queries,
        chunks=int(chunks[-1]) if chunks else None,
        aggregation=_aggregation(run.first_lines),
        recommendations=_recommendations(workdir / f"recommend-{name}.json") if run.returncode == 0 else {},
    )
    result.walls_s = walls
    return result


def _repeat(
    once: Callable[[], tuple[Run, float, int]], repeats: int
) -> tuple[tuple[Run, float, int], list[float]]:
    """`once()` (run, load at start, queries) `repeats` times, stopping at a failed run (it fails
    again): the run reported (`median_run`) and every run's wall time, in order."""
    measured: list[tuple[Run, float, int]] = []
    for _ in range(max(1, repeats)):
        measured.append(once())
        if measured[-1][0].returncode:
            break
    return median_run(measured), [round(m[0].wall_s, 2) for m in measured]


def median_run(measured: list[tuple[Run, float, int]]) -> tuple[Run, float, int]:
    """The run with the median wall time (the upper one of an even count); a failed run if any."""
    failed = [m for m in measured if m[0].returncode]
    if failed:
        return failed[0]
    ordered = sorted(measured, key=lambda m: m[0].wall_s)
    return ordered[len(ordered) // 2]


def _result(
    name: str,
    command: str,
    cluster: Cluster,
    run: Run,
    load: float,
    step_s: int,
    setup_s: dict[str, float],
    extra: dict[str, float],
    queries: int | None = None,
    chunks: int | None = None,
    aggregation: str = "",
    recommendations: dict[str, list[object]] | None = None,
) -> PathResult:
    """What every path reports of one analyzer run on `cluster`, the load average it started at."""
    return PathResult(
        path=name,
        command=command,
        jobs=cluster.jobs,
        gpus=cluster.gpus,
        steps=cluster.steps,
        step_s=step_s,
        samples=cluster.samples,
        series=cluster.gpus * 3 + cluster.jobs * 3,
        setup_s=setup_s,
        wall_s=round(run.wall_s, 2),
        max_rss_bytes=run.max_rss_bytes,
        jobs_profiled=run.jobs_out,
        returncode=run.returncode,
        error=_error(run),
        extra={**extra, "load_average_1m": round(load, 2), "analyzer_cpu_s": round(run.cpu_s, 2)},
        queries=queries,
        chunks=chunks,
        aggregation=aggregation,
        recommendations=recommendations or {},
    )


def _aggregation(stderr: str) -> str:
    if "reading the analyzer recording rules" in stderr:
        return "rules"
    return "raw" if "joining raw series" in stderr else "unknown"


def _recommendations(path: Path) -> dict[str, list[object]]:
    """job_id -> what was recommended (kind, MIG profile, MPS settings), to compare runs."""
    keys = ("recommendation", "mig_profile", "mps_active_thread_percentage", "mps_pinned_memory_limit_bytes")
    return {j["job_id"]: [j.get(k) for k in keys] for j in json.loads(path.read_text())["jobs"]}


def bench_single(
    data: Backfilled,
    workdir: Path,
    progress: TextIO | None,
    paths: tuple[str, ...],
    compaction: bool = True,
    repeats: int = 1,
) -> list[PathResult]:
    """One Prometheus holding the whole week (raw + rule blocks): the rules path, and the raw path."""
    tsdb = workdir / "tsdb"
    for block in [*tsdbs.blocks(data.raw), *tsdbs.blocks(data.rules)]:
        shutil.copytree(block, tsdb / block.name)
    step = data.cluster.step_s
    results = []
    with tsdbs.prometheus(tsdb, tsdbs.lookback(step), workdir / "prometheus.log", compaction) as base:
        setup: dict[str, float] = {}
        blocks = len(list(tsdb.glob("01*")))
        if compaction:
            began = time.monotonic()
            _say(progress, f"waiting for Prometheus to compact {blocks} blocks")
            blocks = tsdbs.wait_for_compaction(base)
            setup["compaction_s"] = time.monotonic() - began
        for path in paths:
            aggregation = "auto" if path.startswith("rules") else "raw"
            args = _analyzer_args(base, data.cluster, aggregation)
            extra = {"tsdb_blocks": float(blocks)}
            results.append(_measure(path, base, args, data, workdir, progress, setup, extra, repeats))
    shutil.rmtree(tsdb, ignore_errors=True)
    return results


def bench_thanos(
    data: Backfilled, workdir: Path, progress: TextIO | None, repeats: int = 1
) -> PathResult | None:
    """Thanos: the week split at its middle into two Prometheus shards, each with a sidecar and the
    rule blocks of its half; the analyzer asks the querier."""
    if tsdbs.thanos_binary() is None:
        _say(progress, "thanos: not built (make thanos): skipped")
        return None
    mid = (
        int((data.cluster.start + (data.cluster.steps // 2) * data.cluster.step_s) // tsdbs.BLOCK_S)
        * tsdbs.BLOCK_S
    )
    shards = [workdir / "shard-a", workdir / "shard-b"]
    staging = workdir / "staging"
    for block in [*tsdbs.blocks(data.raw), *tsdbs.blocks(data.rules)]:
        shutil.copytree(block, staging / block.name)
    tsdbs.split_blocks(staging, mid * 1000, shards[0], shards[1])
    step = data.cluster.step_s
    setup: dict[str, float] = {}
    with tsdbs.thanos_cluster(shards, tsdbs.lookback(step), workdir, compaction=True) as (base, members):
        began = time.monotonic()
        _say(progress, "thanos: waiting for both shards to compact their blocks")
        blocks = sum(tsdbs.wait_for_compaction(m.prometheus_url) for m in members)
        setup["compaction_s"] = time.monotonic() - began
        args = _analyzer_args(base, data.cluster, "auto")
        extra = {"tsdb_blocks": float(blocks), "shards": float(len(members)), "split_at": float(mid)}
        result = _measure("thanos", base, args, data, workdir, progress, setup, extra, repeats)
    for shard in shards:
        shutil.rmtree(shard, ignore_errors=True)
    return result


def _error(run: Run) -> str:
    lines = run.stderr.strip().splitlines()
    return "" if run.returncode == 0 else (lines[-1] if lines else f"exit status {run.returncode}")


def file_step(jobs: int, samples: int) -> int:
    """The step (whole seconds) that gives about `samples` raw samples for `jobs` jobs over a week."""
    gpus = math.ceil(jobs / JOBS_PER_GPU)
    steps = max(JOBS_PER_GPU, round(samples / (gpus * SAMPLES_PER_GPU_STEP)))
    return max(1, round(WEEK_S / steps))


def bench_history(
    jobs: int, samples: int, workdir: Path, progress: TextIO | None, repeats: int = 1
) -> PathResult:
    """Write about `samples` raw samples as a history and time `gpulens recommend --history`
    (`repeats` times: the median run)."""
    step_s = file_step(jobs, samples)
    began = time.monotonic()
    cluster = make_cluster(jobs, step_s, seed=1)
    history = workdir / "history"
    rows = write_history(cluster, history)
    setup = {"generate_parquet_s": round(time.monotonic() - began, 2)}
    args = ["recommend", "--history", "DIR"]
    _say(progress, f"file path: {rows:,} samples (step {step_s} s), gpulens recommend --history")

    def once() -> tuple[Run, float, int]:
        load = os.getloadavg()[0]
        run = run_analyzer(["recommend", "--history", str(history)], workdir, "recommend-history", progress)
        return run, load, 0

    (run, load, _), walls = _repeat(once, repeats)
    assert rows == cluster.samples, "the history holds every sample of the cluster"
    parquet = float((history / "samples.parquet").stat().st_size)
    command = "gpulens " + " ".join(args)
    result = _result("history", command, cluster, run, load, step_s, setup, {"parquet_bytes": parquet})
    result.walls_s = walls
    return result


def agreement(a: PathResult | None, b: PathResult | None) -> dict[str, object] | None:
    """How many jobs got the same recommendation from two runs (and a few that did not)."""
    if a is None or b is None or a.returncode or b.returncode:
        return None
    jobs = sorted(set(a.recommendations) | set(b.recommendations))
    differ = [j for j in jobs if a.recommendations.get(j) != b.recommendations.get(j)]
    return {
        "paths": [a.path, b.path],
        "jobs": len(jobs),
        "equal": len(jobs) - len(differ),
        "differ": differ[:5],
    }


RUNS = ("rules", "raw", "thanos", "rules-large", "history")  # every analyzer run, in order


def run_analyzer_bench(
    jobs: int,
    samples: int,
    prom_step_s: int,
    workdir: Path,
    progress: TextIO | None = sys.stderr,
    compaction: bool = True,
    large_jobs: int = 50_000,
    thanos: bool = True,
    runs: frozenset[str] = frozenset(RUNS),
    repeats: int = 3,
) -> dict[str, Any]:
    """The selected `runs` (all by default); returns the JSON-ready `analyzer` section.

    One week for `jobs` jobs, the rules evaluated over it by promtool: the recording-rule and raw
    paths on one Prometheus, the rule path through Thanos over two shards holding half the week
    each; the rule path again for `large_jobs` (0: skipped) on a week whose recorded series the
    generator writes (`recorded_families`: promtool's evaluation of a 50,000-job week alone
    takes over 15 minutes on 2 cores); the file path on `samples` raw samples. Every path
    runs `repeats` times on the same data and reports its median run (`walls_s`: every run's
    wall time); setup is done once.
    """
    unknown = set(runs) - set(RUNS)
    if unknown:
        raise ValueError(f"unknown analyzer runs: {', '.join(sorted(unknown))} (known: {', '.join(RUNS)})")
    workdir.mkdir(parents=True, exist_ok=True)
    rules_run = raw_run = thanos_run = large_run = hist = None
    not_measured: list[str] = []
    single = tuple(r for r in ("rules", "raw") if r in runs)
    if single or (thanos and "thanos" in runs):
        week = backfill_week(jobs, prom_step_s, workdir / "week", progress)
        measured = (
            bench_single(week, workdir / "single", progress, single, compaction, repeats) if single else []
        )
        by_name = {r.path: r for r in measured}
        rules_run, raw_run = by_name.get("rules"), by_name.get("raw")
        if thanos and "thanos" in runs:
            try:
                thanos_run = bench_thanos(week, workdir / "thanos", progress, repeats)
            except tsdbs.TsdbError as exc:  # the other paths are still worth reporting
                _say(progress, f"thanos: {exc}")
                not_measured.append(f"Thanos: {exc}")
        shutil.rmtree(workdir / "week", ignore_errors=True)
    if large_jobs and "rules-large" in runs:
        try:
            big = backfill_week(
                large_jobs, prom_step_s, workdir / "week-large", progress, evaluate_rules=False
            )
            (large_run,) = bench_single(
                big, workdir / "single-large", progress, ("rules-large",), compaction, repeats
            )
        except tsdbs.TsdbError as exc:  # the other paths are still worth reporting
            _say(progress, f"rules-large: {exc}")
            not_measured.append(f"recording rules, {large_jobs:,} jobs: {exc}")
        shutil.rmtree(workdir / "week-large", ignore_errors=True)
    if "history" in runs:
        hist = bench_history(jobs, samples, workdir / "file", progress, repeats)
        _say(progress, f"file path: {hist.wall_s:.1f} s, {hist.max_rss_bytes / MIB:.0f} MiB")
        shutil.rmtree(workdir / "file" / "history", ignore_errors=True)
    agreements = [
        agreement(rules_run, raw_run),
        agreement(thanos_run, rules_run),
        agreement(thanos_run, raw_run),
    ]
    done = [r for r in (rules_run, raw_run, thanos_run, large_run, hist) if r is not None]
    for run in done:
        run.recommendations = {}
    return {
        "cluster": (
            f"ceil(jobs/{JOBS_PER_GPU}) H100 GPUs on nodes of 8, about {JOBS_PER_GPU} exclusive single-GPU "
            "jobs per GPU back to back over 7 days, activity levels idle/low/medium/high/busy"
        ),
        "families": list(FAMILIES),
        "prometheus_compaction": compaction,
        "repeats": repeats,
        "thanos_version": tsdbs.THANOS_VERSION if thanos_run else None,
        "paths": [dataclasses.asdict(r) for r in done],
        "agreement": [a for a in agreements if a is not None],
        "not_measured": not_measured,
    }
