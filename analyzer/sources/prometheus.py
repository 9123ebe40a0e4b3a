"""Profiles from a Prometheus-compatible HTTP API, aggregated inside PromQL.

The analyzer never pulls raw samples: per-job reductions (`avg_over_time`, `quantile_over_time`,
`max_over_time`, `stddev_over_time`, `count_over_time`) run over subqueries of per-step job
aggregates, for chunks of jobs at a time (a `job_id=~"a|b|..."` matcher), so the cost scales
with the TSDB. Signals and reductions are the ones `profile.stats_from_samples` computes with
pandas (`signals.py` is shared), so both paths give the same profile for the same data.

Works with Prometheus, Thanos, Mimir and VictoriaMetrics (plain `/api/v1/query`, POST form).
Transient failures (connection errors, 429, 5xx) are retried with backoff; anything else is one
clear `AnalyzerError` line. Requests go through `gpulens.httpclient`: each attempt has a total
deadline (`timeout_s`, not a per-read timeout), answers are bounded (`max_response_bytes`), and a
redirect to another origin is refused, so the bearer token or basic auth never leaves for it.
"""

from __future__ import annotations

import base64
import json
import math
import ssl
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import pandas as pd

from gpulens import httpclient
from gpulens.analyzer import signals
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.profile import STAT_KEYS, Identity, JobStats, build_profiles, job_kinds
from gpulens.analyzer.thresholds import Thresholds
from gpulens.catalog import GpuModel

RETRY_STATUS = {429, 500, 502, 503, 504}
# a stats query repeats the job matcher ~7 times; VictoriaMetrics rejects queries over 16 KiB by default
MAX_REGEX_CHARS = 1800


@dataclass
class PromConfig:
    """How to reach the API."""

    url: str
    bearer_token: str | None = None
    bearer_token_file: str | None = None
    basic_auth: tuple[str, str] | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    timeout_s: float = 120.0  # per attempt, in total; Prometheus' own --query.timeout is 2m
    retries: int = 3
    backoff_s: float = 0.5
    max_response_bytes: int = 256 << 20


class PromClient:
    """Instant queries with auth, TLS options, retries and strict response checking."""

    def __init__(self, config: PromConfig) -> None:
        self.config = config
        self.base = config.url.rstrip("/")
        parsed = urllib.parse.urlparse(self.base)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise AnalyzerError(f"--prometheus: {config.url!r} is not an http(s) URL")
        self.headers = {"Accept": "application/json", "User-Agent": "gpulens-analyzer"}
        token = config.bearer_token
        if config.bearer_token_file:
            try:
                token = Path(config.bearer_token_file).read_text().strip()
            except OSError as exc:
                raise AnalyzerError(
                    f"{config.bearer_token_file}: cannot read bearer token: {exc.strerror}"
                ) from exc
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        elif config.basic_auth:
            user, password = config.basic_auth
            encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {encoded}"
        self.context: ssl.SSLContext | None = None
        if parsed.scheme == "https":
            try:
                self.context = ssl.create_default_context(cafile=config.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise AnalyzerError(f"{config.ca_file}: cannot load CA file: {exc}") from exc
            if config.insecure_skip_verify:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE

    def _post(self, path: str, params: dict[str, str]) -> bytes:
        data = urllib.parse.urlencode(params).encode()
        url = f"{self.base}{path}"
        headers = {**self.headers, "Content-Type": "application/x-www-form-urlencoded"}
        last = ""
        for attempt in range(self.config.retries + 1):
            if attempt:
                time.sleep(self.config.backoff_s * 2 ** (attempt - 1))
            try:
                answer = httpclient.request(
                    "POST",
                    url,
                    deadline=self.config.timeout_s,
                    headers=headers,
                    body=data,
                    max_bytes=self.config.max_response_bytes,
                    context=self.context,
                )
            except (httpclient.TooLarge, httpclient.RedirectRefused) as exc:
                raise AnalyzerError(str(exc)) from None  # retrying cannot help
            except httpclient.HttpError as exc:
                last = str(exc).removeprefix(f"POST {url}: ")
                continue
            if 200 <= answer.status < 300:
                return answer.body
            if answer.status in RETRY_STATUS:
                last = f"HTTP {answer.status}"
                continue
            if answer.status in (400, 422):
                return answer.body  # PromQL errors come back as JSON with status "error"
            if answer.status in (401, 403):
                raise AnalyzerError(f"{url}: HTTP {answer.status}: check the bearer token / basic auth")
            raise AnalyzerError(f"{url}: HTTP {answer.status}")
        raise AnalyzerError(
            f"{url}: cannot reach Prometheus after {self.config.retries + 1} attempts: {last}"
        )

    def query(self, expr: str, at: float) -> list[dict]:
        """Instant vector query; returns the `result` list (labels in `metric`, `[ts, "v"]`)."""
        body = self._post("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        where = f"{self.base}/api/v1/query"
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise AnalyzerError(f"{where}: malformed response (not JSON): {body[:60]!r}") from exc
        if not isinstance(payload, dict) or "status" not in payload:
            raise AnalyzerError(f'{where}: malformed response: no "status" field')
        if payload["status"] != "success":
            kind, error = payload.get("errorType", "error"), payload.get("error", "unknown error")
            raise AnalyzerError(f"{where}: query failed ({kind}): {error}")
        data = payload.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise AnalyzerError(f"{where}: malformed response: data.result is not a list")
        if data.get("resultType") not in ("vector", None):
            raise AnalyzerError(f"{where}: expected an instant vector, got {data.get('resultType')!r}")
        for item in data["result"]:
            if not isinstance(item, dict) or "metric" not in item or not _is_sample(item.get("value")):
                raise AnalyzerError(f"{where}: malformed response: a result lacks metric/value")
        return data["result"]


def _is_sample(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)


def _value(item: dict) -> float:
    try:
        return float(item["value"][1])
    except (TypeError, ValueError):
        return math.nan


def _regex(jobs: list[str]) -> str:
    """An RE2 alternation that matches exactly these job ids, escaped for a PromQL string."""
    special = set("\\.+*?()|[]{}^$")
    escaped = ["".join("\\" + c if c in special else c for c in job) for job in jobs]
    return "|".join(escaped).replace("\\", "\\\\").replace('"', '\\"')


def chunk_jobs(
    jobs: list[str],
    size: int,
    max_regex_chars: int = MAX_REGEX_CHARS,
    gpus_of: dict[str, list[str]] | None = None,
) -> list[list[str]]:
    """Chunks of at most `size` jobs whose matchers stay short enough for every store's query limit.

    With `gpus_of` (job -> its GPU uuids) the uuid matcher a chunk needs counts against the same
    length budget: device series are selected by uuid, so co-located jobs (in order) share it.
    """
    chunks: list[list[str]] = []
    current: list[str] = []
    seen: set[str] = set()
    length = 0
    for job in jobs:
        new = [u for u in (gpus_of or {}).get(job, []) if u not in seen]
        cost = len(_regex([job])) + 1 + sum(len(_regex([u])) + 1 for u in new)
        if current and (len(current) >= size or length + cost > max_regex_chars):
            chunks.append(current)
            current, length, seen = [], 0, set()
            new = list((gpus_of or {}).get(job, []))
            cost = len(_regex([job])) + 1 + sum(len(_regex([u])) + 1 for u in new)
        current.append(job)
        seen.update(new)
        length += cost
    if current:
        chunks.append(current)
    return chunks


def signal_expr(signal: signals.Signal, regex: str, how: str, uuid_regex: str | None = None) -> str:
    """Per-step, per-job aggregate of one signal (mirrors `profile._signal_steps`).

    `uuid_regex` (the chunk's GPUs) narrows the device side of the join to series that can match:
    the same result, but the store no longer evaluates every GPU of the cluster at every step.
    """
    sel = f'job_id=~"{regex}"'
    dev = f'{{uuid=~"{uuid_regex}"}}' if uuid_regex is not None else ""
    if signal.scope == "job":
        return f"{how} by (job_id) ({signal.family}{{{sel}}} >= 0)"
    if signal.scope == "gpu_share":
        on_gpus = f',uuid=~"{uuid_regex}"' if uuid_regex is not None else ""
        jobs_on_gpu = f'count by (uuid) (gpu_job_info{{job_source!="{signals.SYSTEM_SOURCE}"{on_gpus}}})'
        share = f"(({signal.family}{dev} >= 0) / on(uuid) group_left() {jobs_on_gpu})"
        return f"{how} by (job_id) (gpu_job_info{{{sel}}} * on(uuid) group_left() {share})"
    on = "uuid" if signal.scope == "gpu" else "uuid, gpu_instance"
    return f"{how} by (job_id) (gpu_job_info{{{sel}}} * on({on}) group_left() ({signal.family}{dev} >= 0))"


def _stats_query(reductions: dict[str, str], inner: str, window: str) -> str:
    """One query returning several reductions of `inner`, told apart by a `stat` label."""
    parts = []
    for stat, template in reductions.items():
        expr = template.format(sub=f"({inner})[{window}]", inner=inner, window=window)
        parts.append(f'label_replace({expr}, "stat", "{stat}", "", "")')
    return " or ".join(parts)


def _by_job(result: list[dict]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for item in result:
        job = item["metric"].get("job_id", "")
        out.setdefault(job, {})[item["metric"].get("stat", "")] = _value(item)
    return out


@dataclass
class PromSource:
    """Profiles for `window_s` seconds ending at `end`, aggregated at `step_s` resolution."""

    client: PromClient
    window_s: float
    end: float
    step_s: float
    chunk_size: int = 200
    progress: TextIO | None = None
    concurrency: int = 4  # chunks queried at once

    @property
    def window(self) -> str:
        return f"{int(self.window_s)}s:{int(self.step_s)}s"

    def _say(self, message: str) -> None:
        if self.progress is not None:
            print(f"gpulens: {message}", file=self.progress, flush=True)

    def _labels(self, family: str, keys: list[str]) -> pd.DataFrame:
        result = self.client.query(f"last_over_time({family}[{int(self.window_s)}s])", self.end)
        rows = [{k: item["metric"].get(k, "") for k in keys} for item in result]
        return pd.DataFrame(rows, columns=keys)

    def identity(self) -> Identity:
        series = self._labels(
            f'gpu_job_info{{job_source!="{signals.SYSTEM_SOURCE}"}}',
            ["job_id", "uuid", "gpu_instance", *signals.IDENTITY_LABELS],
        )
        if series.empty:
            raise AnalyzerError(
                f"{self.client.base}: no gpu_job_info series in the {int(self.window_s)} s window ending at "
                f"{self.end:.0f}: no jobs to profile (check --window/--end and that the exporter is scraped)"
            )
        series = series.drop_duplicates().reset_index(drop=True)
        gpus = self._labels("gpu_info", ["uuid", "model", "instance"]).drop_duplicates("uuid")
        migs = self._labels("gpu_mig_instance_info", ["uuid", "gpu_instance", "mig_profile"])
        migs = migs.drop_duplicates(["uuid", "gpu_instance"])
        return Identity(series, gpus.reset_index(drop=True), migs.reset_index(drop=True))

    def _chain(
        self,
        chain: tuple[signals.Signal, ...],
        jobs: list[str],
        how: str,
        reductions: dict[str, str],
        gpus_of: dict[str, list[str]],
    ) -> dict[str, tuple[str, dict[str, float]]]:
        out: dict[str, tuple[str, dict[str, float]]] = {}
        pending = list(jobs)
        for signal in chain:
            if not pending:
                break
            uuids = sorted({u for job in pending for u in gpus_of.get(job, [])})
            inner = signal_expr(signal, _regex(pending), how, _regex(uuids))
            for job, values in _by_job(
                self.client.query(_stats_query(reductions, inner, self.window), self.end)
            ).items():
                if job in pending and values.get("count", 1) > 0:
                    out[job] = (signal.name, values)
            pending = [j for j in pending if j not in out]
        return out

    def _chunk_stats(
        self, kind: str, jobs: list[str], gpus_of: dict[str, list[str]], idle: float
    ) -> dict[str, JobStats]:
        """All aggregates of one chunk of jobs of one kind (five to a dozen queries)."""
        activity_red = {
            "mean": "avg_over_time({sub})",
            "p50": "quantile_over_time(0.5, {sub})",
            "p95": "quantile_over_time(0.95, {sub})",
            "max": "max_over_time({sub})",
            "count": "count_over_time({sub})",
            "stddev": "stddev_over_time({sub})",
            "idle": f"avg_over_time(({{inner}} < bool {idle!r})[{{window}}])",
        }
        memory_red = {
            "max": "max_over_time({sub})",
            "p95": "quantile_over_time(0.95, {sub})",
            "count": "count_over_time({sub})",
        }
        presence_red = {
            "start": "min_over_time(timestamp({inner})[{window}])",
            "end": "max_over_time(timestamp({inner})[{window}])",
            "samples": "count_over_time({sub})",
            "gpus": "max_over_time({sub})",
        }
        stats: dict[str, JobStats] = {}
        regex = _regex(jobs)
        presence = f'count by (job_id) (gpu_job_info{{job_id=~"{regex}"}})'
        for job, values in _by_job(
            self.client.query(_stats_query(presence_red, presence, self.window), self.end)
        ).items():
            if job in jobs and values.get("samples", 0) > 0:
                stats[job] = JobStats(
                    start=values["start"],
                    end=values["end"],
                    samples=int(values["samples"]),
                    gpus=int(values["gpus"]),
                )
        present = [j for j in jobs if j in stats]
        for job, (name, values) in self._chain(
            signals.ACTIVITY[kind], present, "avg", activity_red, gpus_of
        ).items():
            stats[job].activity_signal = name
            stats[job].activity = {k: values.get(k, math.nan) for k in STAT_KEYS}
        for job, (name, values) in self._chain(
            signals.MEMORY[kind], present, "max", memory_red, gpus_of
        ).items():
            stats[job].memory_signal = name
            stats[job].memory_peak = values.get("max", math.nan)
            stats[job].memory_p95 = values.get("p95", math.nan)
        dram_red = {"p95": "quantile_over_time(0.95, {sub})", "count": "count_over_time({sub})"}
        for job, (_, values) in self._chain(signals.DRAM[kind], present, "avg", dram_red, gpus_of).items():
            stats[job].dram_p95 = values.get("p95", math.nan)
        tensor_red = {"mean": "avg_over_time({sub})", "count": "count_over_time({sub})"}
        for job, (_, values) in self._chain(
            signals.TENSOR[kind], present, "avg", tensor_red, gpus_of
        ).items():
            stats[job].tensor_mean = values.get("mean", math.nan)
        return stats

    def stats(self, identity: Identity, thresholds: Thresholds) -> dict[str, JobStats]:
        """Per-job aggregates, chunk by chunk, `concurrency` chunks in flight at a time.

        Jobs are ordered by their first GPU before chunking, so a chunk's jobs share few GPUs and
        the device side of each join (selected by uuid) stays small.
        """
        kinds = job_kinds(identity.series)
        idle = thresholds.get("activity", "idle_below")
        ordered = identity.series.sort_values(["uuid", "gpu_instance", "job_id"])
        gpus_of: dict[str, list[str]] = {}
        for job, uuid in ordered[["job_id", "uuid"]].itertuples(index=False):
            if uuid not in gpus_of.setdefault(job, []):
                gpus_of[job].append(uuid)
        chunks = [
            (kind, chunk)
            for kind in ("exclusive", "mig", "shared")
            for chunk in chunk_jobs(
                [j for j in gpus_of if kinds.get(j) == kind], self.chunk_size, gpus_of=gpus_of
            )
        ]
        stats: dict[str, JobStats] = {}
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            futures = {
                pool.submit(self._chunk_stats, kind, jobs, gpus_of, idle): (kind, len(jobs))
                for kind, jobs in chunks
            }
            try:
                for done, future in enumerate(as_completed(futures), start=1):
                    stats.update(future.result())
                    kind, size = futures[future]
                    self._say(f"prometheus: chunk {done}/{len(chunks)} done: {size} {kind} jobs")
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
        return dict(sorted(stats.items()))

    def profiles(self, thresholds: Thresholds, gpu_model: GpuModel | None = None) -> pd.DataFrame:
        identity = self.identity()
        stats = self.stats(identity, thresholds)
        return build_profiles(identity, stats, self.step_s, thresholds, gpu_model)


def default_progress() -> TextIO | None:
    """Progress lines go to stderr when it is a terminal."""
    return sys.stderr if sys.stderr.isatty() else None
