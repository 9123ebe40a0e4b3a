"""Inference servers' own metrics (vLLM, SGLang), joined to jobs by their pod, and what they say.

LLM servers pre-allocate most of their device's memory for the KV cache (vLLM
`--gpu-memory-utilization`, default 0.9; SGLang `--mem-fraction-static`), so a server that answers
a few requests an hour looks like a memory hog to memory-based sizing and like an idle job to the
reclaim rule. Where Prometheus scrapes the server's pod, its own series say what it needs:

- it serves: any series of its pod in the window. It is never reclaimed (it may share).
- KV use: the peak of `vllm:kv_cache_usage_perc` (older vLLM: `vllm:gpu_cache_usage_perc`) or
  `sglang:token_usage`, a share of its KV pool. With the pool's size in bytes (vLLM publishes it as
  `vllm:cache_config_info{kv_cache_memory_bytes}` when the pool is sized with
  `--kv-cache-memory-bytes`), the memory it needs is its non-KV memory (what it holds minus the
  pool: weights, activations, CUDA graphs) + its peak KV use x (1 + `serving.kv_headroom_ratio`),
  and the flag value that allocates that much on the target slice or GPU is named. Without the
  pool's bytes (a pool sized by a fraction: the bytes per token depend on the model) it is sized
  from what it holds, as any job.
- pressure: a queue (`vllm:num_requests_waiting`, `sglang:num_queue_reqs` above zero in more than
  `serving.max_waiting_fraction` of samples) or preemptions (`vllm:num_preemptions_total`, SGLang's
  `sglang:num_retracted_requests_total`, more than `serving.max_preemptions` in the window): its
  KV cache is too small already, so it is never shrunk.
- latency: the p95 (`QUANTILE`) of its e2e request latency and time to first token over the window,
  from its histograms' buckets (`vllm:e2e_request_latency_seconds`, `vllm:time_to_first_token_seconds`,
  SGLang's of the same names), each bucket's increase interpolated as `histogram_quantile` does.
  Week over week (`weekly.py`), a moved server whose p95 rose by more than
  `serving.max_latency_increase` is rolled back.

Both sources give the same figures: the file path reduces a history's samples, the PromQL path
asks the same reductions of Prometheus (`queries`), per `namespace`/`pod` as a pod scrape labels
them. Counters are read as max - min over the window (a restart resets them: fewer, never more).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pandas as pd

from gpulens.analyzer.thresholds import Thresholds
from gpulens.catalog import GIB


class Server(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


@dataclass(frozen=True)
class Names:
    """One server's series: KV use (current name first), queue, preemption counter, and its flag."""

    kv_usage: tuple[str, ...]
    waiting: str
    preemptions: str
    flag: str
    e2e: str  # latency histograms (their `_bucket` series are read)
    ttft: str


NAMES = {
    Server.VLLM: Names(
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "--gpu-memory-utilization",
        "vllm:e2e_request_latency_seconds",
        "vllm:time_to_first_token_seconds",
    ),
    Server.SGLANG: Names(
        ("sglang:token_usage",),
        "sglang:num_queue_reqs",
        "sglang:num_retracted_requests_total",
        "--mem-fraction-static",
        "sglang:e2e_request_latency_seconds",
        "sglang:time_to_first_token_seconds",
    ),
}
CACHE_INFO = "vllm:cache_config_info"
POD = ("namespace", "pod")
INFO_LABELS = ("gpu_memory_utilization", "kv_cache_memory_bytes")
QUANTILE = 0.95  # the latency percentile compared week over week
# latency histograms' bucket series: (server, "e2e" or "ttft") -> family
BUCKETS: dict[tuple[Server, str], str] = {
    (server, kind): f"{getattr(names, kind)}_bucket"
    for server, names in NAMES.items()
    for kind in ("e2e", "ttft")
}
FAMILIES: tuple[str, ...] = (
    *(name for names in NAMES.values() for name in (*names.kv_usage, names.waiting, names.preemptions)),
    CACHE_INFO,
    *BUCKETS.values(),
)
LABELS: tuple[str, ...] = (*POD, "model_name", *INFO_LABELS, "le")
# the history columns the file path reads
FAMILY_COLUMNS: dict[str, list[str]] = {
    name: [*POD, *INFO_LABELS]
    if name == CACHE_INFO
    else [*POD, "le"]
    if name in BUCKETS.values()
    else list(POD)
    for name in FAMILIES
}

COLUMNS = (
    "serving_server",
    "serving_kv_peak",
    "serving_waiting_fraction",
    "serving_preemptions",
    "serving_kv_pool_bytes",
    "serving_memory_fraction",
    "serving_e2e_p95_s",
    "serving_ttft_p95_s",
)


@dataclass(frozen=True)
class PodServing:
    """What one pod's server said over the window."""

    server: Server
    kv_peak: float  # share of the KV pool in use at its peak (NaN: no KV series)
    waiting_fraction: float  # share of samples with requests waiting
    preemptions: float  # preempted (retracted) requests in the window
    kv_pool_bytes: float = math.nan  # the pool's size when the server publishes it
    memory_fraction: float = math.nan  # vLLM's gpu_memory_utilization now
    e2e_p95_s: float = math.nan  # p95 e2e request latency over the window (NaN: no histogram)
    ttft_p95_s: float = math.nan  # p95 time to first token


Table = Mapping[tuple[str, str], PodServing]


def _number(text: object) -> float:
    try:
        value = float(str(text))
    except ValueError:
        return math.nan
    return value if math.isfinite(value) and value > 0 else math.nan


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float:
    """Prometheus' `histogram_quantile` of cumulative bucket counts by upper bound (+Inf included):
    linear within the bucket the rank falls in, the lowest bucket starting at 0, the +Inf bucket
    answered with the highest finite bound; NaN without +Inf, with fewer than two buckets or no
    observations. Counts that fall with the bound (a scrape between buckets) are raised to the
    bucket below, as Prometheus does."""
    bounds = sorted(buckets)
    if len(bounds) < 2 or not math.isinf(bounds[-1]):
        return math.nan
    counts: list[float] = []
    for bound in bounds:
        counts.append(max(buckets[bound], counts[-1]) if counts else buckets[bound])
    total = counts[-1]
    if not total > 0 or math.isnan(q):
        return math.nan
    rank = q * total
    i = next(k for k, c in enumerate(counts) if c >= rank)
    if i == len(bounds) - 1:
        return bounds[-2]
    if i == 0 and bounds[0] <= 0:
        return bounds[0]
    start, below = (0.0, 0.0) if i == 0 else (bounds[i - 1], counts[i - 1])
    return start + (bounds[i] - start) * (rank - below) / (counts[i] - below)


def _le(text: object) -> float:
    try:
        return float(str(text))
    except ValueError:
        return math.nan


def _assemble(
    reduced: Mapping[str, Mapping[tuple[str, str], float]],
    info: Mapping[tuple[str, str], dict[str, Any]],
    latency: Mapping[str, Mapping[tuple[str, str], float]] | None = None,
) -> dict[tuple[str, str], PodServing]:
    """Per pod, from per-family reductions (`kv`: max; `waiting`: share above 0; counters: max - min)
    and the latency quantiles per bucket family."""
    latency = latency or {}
    out: dict[tuple[str, str], PodServing] = {}
    pods = {pod for values in (*reduced.values(), *latency.values()) for pod in values} | set(info)
    for pod in sorted(pods):
        vllm = pod in info or any(
            pod in values for f, values in (*reduced.items(), *latency.items()) if f.startswith("vllm:")
        )
        server = Server.VLLM if vllm else Server.SGLANG
        names = NAMES[server]
        kv = next((reduced[f][pod] for f in names.kv_usage if pod in reduced.get(f, {})), math.nan)
        labels = info.get(pod, {})
        out[pod] = PodServing(
            server=server,
            kv_peak=kv,
            waiting_fraction=reduced.get(names.waiting, {}).get(pod, math.nan),
            preemptions=reduced.get(names.preemptions, {}).get(pod, math.nan),
            kv_pool_bytes=_number(labels.get("kv_cache_memory_bytes", "")),
            memory_fraction=_number(labels.get("gpu_memory_utilization", "")),
            e2e_p95_s=latency.get(BUCKETS[(server, "e2e")], {}).get(pod, math.nan),
            ttft_p95_s=latency.get(BUCKETS[(server, "ttft")], {}).get(pod, math.nan),
        )
    return out


def from_families(families: Mapping[str, pd.DataFrame]) -> dict[tuple[str, str], PodServing]:
    """The file path: a history's serving families (`FAMILY_COLUMNS`), reduced per pod."""
    reduced: dict[str, dict[tuple[str, str], float]] = {}
    info: dict[tuple[str, str], dict[str, Any]] = {}
    latency: dict[str, dict[tuple[str, str], float]] = {}
    for family in FAMILIES:
        frame = families.get(family)
        if frame is None or frame.empty:
            continue
        frame = frame[(frame["namespace"].astype(str) != "") & (frame["pod"].astype(str) != "")]
        keys = [frame["namespace"].astype(str), frame["pod"].astype(str)]
        if family in BUCKETS.values():
            latency[family] = _quantiles(frame, keys)
            continue
        if family == CACHE_INFO:
            last = frame.astype({c: str for c in (*POD, *INFO_LABELS)}).sort_values("timestamp")
            for row in last.drop_duplicates(list(POD), keep="last").to_dict("records"):
                info[(row["namespace"], row["pod"])] = row
            continue
        values = frame["value"].astype(float)
        grouped = values.groupby(keys, observed=True)
        if family in {n.waiting for n in NAMES.values()}:
            series = (values > 0).astype(float).groupby(keys, observed=True).mean()
        elif family in {n.preemptions for n in NAMES.values()}:
            series = grouped.max() - grouped.min()
        else:
            series = grouped.max()
        reduced[family] = {(str(ns), str(pod)): float(v) for (ns, pod), v in series.items()}
    return _assemble(reduced, info, latency)


def _quantiles(frame: pd.DataFrame, keys: list[pd.Series]) -> dict[tuple[str, str], float]:
    """Per pod, the `QUANTILE` of its buckets' increase (max - min) over the window."""
    values = frame["value"].astype(float)
    grouped = values.groupby([*keys, frame["le"].map(_le)], observed=True)
    increase = grouped.max() - grouped.min()
    buckets: dict[tuple[str, str], dict[float, float]] = {}
    for (ns, pod, le), v in increase.items():
        if not math.isnan(le):
            buckets.setdefault((str(ns), str(pod)), {})[float(le)] = float(v)
    return {pod: histogram_quantile(QUANTILE, b) for pod, b in buckets.items()}


def queries(window_s: float, step_s: float) -> dict[str, str]:
    """The PromQL path: one query per family, by namespace and pod (the same reductions)."""
    window = f"{int(window_s)}s"
    out = {}
    for family in FAMILIES:
        if family == CACHE_INFO:
            continue
        sel = f'{{__name__="{family}",namespace!="",pod!=""}}'
        if family in BUCKETS.values():
            increase = f"max_over_time({sel}[{window}]) - min_over_time({sel}[{window}])"
            out[family] = f"histogram_quantile({QUANTILE}, sum by (namespace, pod, le) ({increase}))"
            continue
        if family in {n.waiting for n in NAMES.values()}:
            expr = f"avg_over_time(({sel} > bool 0)[{window}:{int(step_s)}s])"
        elif family in {n.preemptions for n in NAMES.values()}:
            expr = f"max_over_time({sel}[{window}]) - min_over_time({sel}[{window}])"
        else:
            expr = f"max_over_time({sel}[{window}])"
        out[family] = f"max by (namespace, pod) ({expr})"
    return out


def from_prometheus(
    client: Any, window_s: float, step_s: float, end: float
) -> dict[tuple[str, str], PodServing]:
    """Ask `queries` and the cache config's labels of `client` (a `PromClient`), reduced per pod."""
    reduced: dict[str, dict[tuple[str, str], float]] = {}
    latency: dict[str, dict[tuple[str, str], float]] = {}
    for family, expr in queries(window_s, step_s).items():
        result = client.query(expr, end)
        (latency if family in BUCKETS.values() else reduced)[family] = {
            (item["metric"].get("namespace", ""), item["metric"].get("pod", "")): float(item["value"][1])
            for item in result
        }
    info_expr = f'last_over_time({{__name__="{CACHE_INFO}",namespace!="",pod!=""}}[{int(window_s)}s])'
    info = {
        (item["metric"].get("namespace", ""), item["metric"].get("pod", "")): dict(item["metric"])
        for item in client.query(info_expr, end)
    }
    return _assemble(reduced, info, latency)


def join(profiles: pd.DataFrame, table: Table | None) -> pd.DataFrame:
    """Profiles with the `COLUMNS` of their pod's server ("" / NaN where the pod has none)."""
    out = profiles.copy()
    table = table or {}
    ns = out["job_namespace"].astype(str) if "job_namespace" in out else pd.Series("", index=out.index)
    pods = out["job_pod"].astype(str) if "job_pod" in out else pd.Series("", index=out.index)
    found = [table.get((n, p)) for n, p in zip(ns, pods, strict=True)]
    out["serving_server"] = [s.server.value if s else "" for s in found]
    for column, attr in (
        ("serving_kv_peak", "kv_peak"),
        ("serving_waiting_fraction", "waiting_fraction"),
        ("serving_preemptions", "preemptions"),
        ("serving_kv_pool_bytes", "kv_pool_bytes"),
        ("serving_memory_fraction", "memory_fraction"),
        ("serving_e2e_p95_s", "e2e_p95_s"),
        ("serving_ttft_p95_s", "ttft_p95_s"),
    ):
        out[column] = [float(getattr(s, attr)) if s else math.nan for s in found]
    return out


# -- what the rules read ------------------------------------------------------------------------


def _f(row: Mapping[str, Any], column: str) -> float:
    value = row.get(column)
    return math.nan if value is None else float(value)


def serves(row: Mapping[str, Any]) -> bool:
    """Whether the job's pod published a server's series in the window."""
    return bool(row.get("serving_server") or "")


def pressure(row: Mapping[str, Any], th: Thresholds) -> str:
    """Why the server must not shrink (its queue or its preemptions), or ""."""
    if not serves(row):
        return ""
    names = NAMES[Server(str(row["serving_server"]))]
    waiting, preempted = _f(row, "serving_waiting_fraction"), _f(row, "serving_preemptions")
    limit = th.serving.max_waiting_fraction
    if waiting > limit:
        return (
            f"it queues: {names.waiting} above 0 in {waiting:.0%} of samples "
            f"(> serving.max_waiting_fraction {limit:.0%})"
        )
    if preempted > th.serving.max_preemptions:
        return (
            f"it preempts: {preempted:.0f} requests in the window ({names.preemptions}, "
            f"> serving.max_preemptions {th.serving.max_preemptions})"
        )
    return ""


@dataclass(frozen=True)
class KvNeed:
    """A server's memory from its KV use: what it holds besides the pool, and the pool it needs."""

    server: Server
    non_kv: float  # weights, activations, CUDA graphs, context: what it holds minus its pool
    pool: float  # the pool it pre-allocates now
    kv_peak: float  # share of the pool in use at its peak
    kv_headroom_ratio: float

    @property
    def kv_used(self) -> float:
        return self.kv_peak * self.pool

    @property
    def floor(self) -> float:
        """The most it ever used: non-KV memory and its peak KV use."""
        return self.non_kv + self.kv_used

    @property
    def footprint(self) -> float:
        """What the server should allocate: non-KV + peak KV use x (1 + kv_headroom_ratio)."""
        return self.non_kv + self.kv_used * (1 + self.kv_headroom_ratio)

    def flag_value(self, device_bytes: float) -> float:
        """The pre-allocation fraction of a device (or slice) of `device_bytes` that gives the footprint,
        rounded up to the hundredth the flags are written with."""
        return math.ceil(self.footprint / device_bytes * 100 - 1e-9) / 100

    def reason(self) -> str:
        return (
            f"serving ({self.server.value}): non-KV memory {_gib(self.non_kv)} + peak KV use "
            f"{_gib(self.kv_used)} ({self.kv_peak:.0%} of its {_gib(self.pool)} pool) x "
            f"{1 + self.kv_headroom_ratio:.2f} (serving.kv_headroom_ratio) = {_gib(self.footprint)}"
        )

    def advice(self, device_bytes: float, where: str) -> str:
        """ "--gpu-memory-utilization 0.42 on a 3g.40gb (40.0 GiB)" and what the pool is then."""
        flag = NAMES[self.server].flag
        text = f"{flag} {self.flag_value(device_bytes):.2f} on {where} ({_gib(device_bytes)})"
        if self.server is Server.VLLM:
            pool = self.kv_used * (1 + self.kv_headroom_ratio)
            text += f" or --kv-cache-memory-bytes {math.ceil(pool / 2**20) * 2**20}"
        return text


def kv_need(row: Mapping[str, Any], th: Thresholds) -> KvNeed | None:
    """The server's need from its KV use, when its pod published KV use and the pool's bytes."""
    if not serves(row):
        return None
    pool, peak = _f(row, "serving_kv_pool_bytes"), _f(row, "memory_peak_bytes")
    kv_peak = _f(row, "serving_kv_peak")
    if not (pool > 0 and peak >= pool and 0 <= kv_peak <= 1):
        return None
    server = Server(str(row["serving_server"]))
    return KvNeed(server, peak - pool, pool, kv_peak, th.serving.kv_headroom_ratio)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"
