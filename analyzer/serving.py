"""Inference servers' own metrics (vLLM, SGLang, Triton), joined to jobs by their pod, and what they say.

LLM servers pre-allocate most of their device's memory for the KV cache (vLLM
`--gpu-memory-utilization`, default 0.9; SGLang `--mem-fraction-static`), so a server that answers
a few requests an hour looks like a memory hog to memory-based sizing and like an idle job to the
reclaim rule. Where Prometheus scrapes the server's pod, its own series say what it needs:

- it serves: any series of its pod in the window. It is never reclaimed (it may share).
- KV use: the peak of `vllm:kv_cache_usage_perc` (older vLLM: `vllm:gpu_cache_usage_perc`),
  `sglang:token_usage`, or, for Triton running the TensorRT-LLM backend, used / max of
  `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}` (NVIDIA/TensorRT-LLM
  `triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc`;
  used / max rather than its `fraction`, which older backends lack), a share of its KV pool. With
  the pool's size in bytes (vLLM publishes it as `vllm:cache_config_info{kv_cache_memory_bytes}`
  when the pool is sized with `--kv-cache-memory-bytes`), the memory it needs is its non-KV memory
  (what it holds minus the pool: weights, activations, CUDA graphs) + its peak KV use x (1 +
  `serving.kv_headroom_ratio`), and the flag value that allocates that much on the target slice or
  GPU is named. Without the pool's bytes it is sized from what it holds, as any job: a vLLM pool
  sized by a fraction; SGLang, which publishes its pool in tokens only (`sglang:max_total_num_tokens`,
  `sglang:num_used_tokens` in `python/sglang/srt/metrics/collector.py`; the bytes appear only in its
  log line "KV Cache is allocated. #tokens: N, K size: X GB, V size: Y GB",
  `python/sglang/srt/mem_cache/memory_pool.py`): sizing it needs a series with the pool's bytes, or
  its KV bytes per token beside `max_total_num_tokens`; TensorRT-LLM, which publishes blocks
  (`max`, `used`, `tokens_per`) but not the bytes of a block.
- pressure: a queue (`vllm:num_requests_waiting`, `sglang:num_queue_reqs`; for Triton, a sample
  where any model's `nv_inference_pending_request_count` or the TensorRT-LLM backend's
  `nv_trt_llm_request_metrics{request_type="waiting"}` is above zero: with decoupled, in-flight
  batching the requests wait inside the backend and Triton's pending count stays 0; above zero in
  more than `serving.max_waiting_fraction` of samples) or preemptions
  (`vllm:num_preemptions_total`, SGLang's
  `sglang:num_retracted_requests_total`, more than `serving.max_preemptions` in the window; Triton
  counts none): its KV cache or its instances are short already, so it is never shrunk.
- latency: the p95 (`QUANTILE`) of its e2e request latency and time to first token over the window,
  from its histograms' buckets (`vllm:e2e_request_latency_seconds`, `vllm:time_to_first_token_seconds`,
  SGLang's of the same names), each bucket's increase interpolated as `histogram_quantile` does.
  Triton publishes no such histogram by default (its `nv_inference_first_response_histogram_ms` is
  opt-in, `--metrics-config histogram_latencies=true`, for decoupled models only, and is not read;
  its summaries are opt-in too and over a sliding window): its latency is the MEAN request time,
  `nv_inference_request_duration_us` increase / `nv_inference_request_success` increase over the
  window (the most of its models'), column `serving_e2e_mean_s`. Week over week (`weekly.py`), a
  moved server whose p95 (or Triton's mean) rose by more than `serving.max_latency_increase` is
  rolled back.

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
    TRITON = "triton"


# the prefix of each server's families: a pod's series say which server it runs
PREFIXES = {Server.VLLM: "vllm:", Server.SGLANG: "sglang:", Server.TRITON: "nv_"}


@dataclass(frozen=True)
class Names:
    """One server's series: KV use (current name first), queue, preemption counter, and its flag
    ("": the server publishes none)."""

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
    # Triton Inference Server (triton-inference-server/server docs/user_guide/metrics.md): series
    # per `model` and `version`; KV use from the TensorRT-LLM backend's block gauges (`TRT_KV`)
    Server.TRITON: Names(
        ("nv_trt_llm_kv_cache_block_metrics",),
        "nv_inference_pending_request_count",
        "",
        "kv_cache_free_gpu_mem_fraction",  # TensorRT-LLM's model parameter (a share of free memory)
        "",
        "",
    ),
}
CACHE_INFO = "vllm:cache_config_info"
TRT_KV = "nv_trt_llm_kv_cache_block_metrics"
TRT_KV_LABEL = "kv_cache_block_type"  # its blocks: "used" of "max" (also free, tokens_per, fraction)
# the TensorRT-LLM backend's request gauges (same reporter as TRT_KV): its own queue is "waiting"
# (also active, max, scheduled, context)
TRT_REQUESTS = "nv_trt_llm_request_metrics"
TRT_REQUESTS_LABEL = "request_type"
TRITON_PENDING = NAMES[Server.TRITON].waiting
TRITON_QUEUES = f'{TRITON_PENDING} or {TRT_REQUESTS}{{{TRT_REQUESTS_LABEL}="waiting"}}'
# Triton's cumulative request time and successful requests: their increases give the mean
TRITON_DURATION = "nv_inference_request_duration_us"
TRITON_SUCCESS = "nv_inference_request_success"
TRITON_MODEL = ("model", "version")  # Triton labels each series with its model and version
POD = ("namespace", "pod")
INFO_LABELS = ("gpu_memory_utilization", "kv_cache_memory_bytes")
QUANTILE = 0.95  # the latency percentile compared week over week
# latency histograms' bucket series: (server, "e2e" or "ttft") -> family
BUCKETS: dict[tuple[Server, str], str] = {
    (server, kind): f"{getattr(names, kind)}_bucket"
    for server, names in NAMES.items()
    for kind in ("e2e", "ttft")
    if getattr(names, kind)
}
FAMILIES: tuple[str, ...] = (
    *(
        name
        for names in NAMES.values()
        for name in (*names.kv_usage, names.waiting, names.preemptions)
        if name
    ),
    CACHE_INFO,
    TRT_REQUESTS,
    *BUCKETS.values(),
    TRITON_DURATION,
    TRITON_SUCCESS,
)
LABELS: tuple[str, ...] = (
    *POD,
    "model_name",
    *INFO_LABELS,
    "le",
    "version",
    TRT_KV_LABEL,
    TRT_REQUESTS_LABEL,
)
WAITING = frozenset(n.waiting for n in NAMES.values())
PREEMPTIONS = frozenset(n.preemptions for n in NAMES.values() if n.preemptions)


def _columns(name: str) -> list[str]:
    if name == CACHE_INFO:
        return [*POD, *INFO_LABELS]
    if name in BUCKETS.values():
        return [*POD, "le"]
    if name == TRT_KV:
        return [*POD, *TRITON_MODEL, TRT_KV_LABEL]
    if name == TRT_REQUESTS:
        return [*POD, *TRITON_MODEL, TRT_REQUESTS_LABEL]
    if name.startswith(PREFIXES[Server.TRITON]):
        return [*POD, *TRITON_MODEL]
    return list(POD)


# the history columns the file path reads
FAMILY_COLUMNS: dict[str, list[str]] = {name: _columns(name) for name in FAMILIES}

COLUMNS = (
    "serving_server",
    "serving_kv_peak",
    "serving_waiting_fraction",
    "serving_preemptions",
    "serving_kv_pool_bytes",
    "serving_memory_fraction",
    "serving_e2e_p95_s",
    "serving_ttft_p95_s",
    "serving_e2e_mean_s",
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
    e2e_mean_s: float = math.nan  # Triton: mean request time over the window (counters, not a p95)


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


def _server(families: set[str]) -> Server:
    """The server whose families a pod published (vLLM first, as before Triton was read)."""
    return next(
        (s for s, prefix in PREFIXES.items() if any(f.startswith(prefix) for f in families)), Server.SGLANG
    )


def _assemble(
    reduced: Mapping[str, Mapping[tuple[str, str], float]],
    info: Mapping[tuple[str, str], dict[str, Any]],
    latency: Mapping[str, Mapping[tuple[str, str], float]] | None = None,
) -> dict[tuple[str, str], PodServing]:
    """Per pod, from per-family reductions (`kv`: max; `waiting`: share above 0; counters: max - min;
    `TRT_KV`: peak used / max; `TRITON_DURATION`: mean request seconds) and the latency quantiles
    per bucket family."""
    latency = latency or {}
    out: dict[tuple[str, str], PodServing] = {}
    pods = {pod for values in (*reduced.values(), *latency.values()) for pod in values} | set(info)
    for pod in sorted(pods):
        published = {f for f, values in (*reduced.items(), *latency.items()) if pod in values}
        server = _server(published | ({CACHE_INFO} if pod in info else set()))
        names = NAMES[server]
        kv = next((reduced[f][pod] for f in names.kv_usage if pod in reduced.get(f, {})), math.nan)
        labels = info.get(pod, {})
        e2e, ttft = BUCKETS.get((server, "e2e"), ""), BUCKETS.get((server, "ttft"), "")
        out[pod] = PodServing(
            server=server,
            kv_peak=kv,
            waiting_fraction=reduced.get(names.waiting, {}).get(pod, math.nan),
            preemptions=reduced.get(names.preemptions, {}).get(pod, math.nan),
            kv_pool_bytes=_number(labels.get("kv_cache_memory_bytes", "")),
            memory_fraction=_number(labels.get("gpu_memory_utilization", "")),
            e2e_p95_s=latency.get(e2e, {}).get(pod, math.nan),
            ttft_p95_s=latency.get(ttft, {}).get(pod, math.nan),
            e2e_mean_s=reduced.get(TRITON_DURATION, {}).get(pod, math.nan),
        )
    return out


def _per_pod(series: pd.Series) -> dict[tuple[str, str], float]:
    """A reduction per series (indexed by namespace, pod, then any model labels) as the most of each
    pod's series, as `max by (namespace, pod)` does; NaN values dropped."""
    series = series.dropna()
    if series.empty:
        return {}
    if series.index.nlevels > 2:
        series = series.groupby(level=[0, 1], observed=True).max()
    return {(str(ns), str(pod)): float(v) for (ns, pod), v in series.items()}


def _series_keys(frame: pd.DataFrame, family: str) -> list[pd.Series]:
    """The label columns that tell one series of `family` from another in a pod."""
    columns = [c for c in FAMILY_COLUMNS[family] if c in (*POD, *TRITON_MODEL)]
    return [frame[c].astype(str) for c in columns]


def _kv_blocks(frame: pd.DataFrame) -> dict[tuple[str, str], float]:
    """TensorRT-LLM's peak KV use per pod: used / max blocks at each sample, the most over the window."""
    frame = frame[frame[TRT_KV_LABEL].astype(str).isin(("used", "max"))]
    if frame.empty:
        return {}
    wide = frame.astype({c: str for c in (*POD, *TRITON_MODEL, TRT_KV_LABEL)}).pivot_table(
        index=[*POD, *TRITON_MODEL, "timestamp"], columns=TRT_KV_LABEL, values="value", aggfunc="max"
    )
    if "used" not in wide or "max" not in wide:
        return {}
    pool = wide["max"].where(wide["max"] > 0)
    ratio = (wide["used"] / pool).dropna()
    return _per_pod(ratio.groupby(level=[0, 1, 2, 3], observed=True).max())


def _increase(frame: pd.DataFrame, family: str) -> pd.Series:
    values = frame["value"].astype(float)
    grouped = values.groupby(_series_keys(frame, family), observed=True)
    return grouped.max() - grouped.min()


def _mean_request_s(families: Mapping[str, pd.DataFrame]) -> dict[tuple[str, str], float]:
    """Triton's mean request time per pod: its request time's increase over its successful
    requests' (per model; the most of its models'), in seconds. A mean, not a p95."""
    duration, success = families.get(TRITON_DURATION), families.get(TRITON_SUCCESS)
    if duration is None or success is None or duration.empty or success.empty:
        return {}
    spent = _increase(_scraped(duration), TRITON_DURATION)
    served = _increase(_scraped(success), TRITON_SUCCESS)
    served = served.where(served > 0)
    return _per_pod((spent / served).dropna() / 1e6)


def _triton_waiting(families: Mapping[str, pd.DataFrame]) -> dict[tuple[str, str], float]:
    """Per Triton pod, the share of samples where any model's pending count or the TensorRT-LLM
    backend's waiting requests are above zero (`TRITON_QUEUES`)."""
    frames = []
    pending = families.get(TRITON_PENDING)
    if pending is not None and not pending.empty:
        frames.append(_scraped(pending)[[*POD, "timestamp", "value"]])
    requests = families.get(TRT_REQUESTS)
    if requests is not None and not requests.empty:
        requests = _scraped(requests)
        waiting = requests[requests[TRT_REQUESTS_LABEL].astype(str) == "waiting"]
        frames.append(waiting[[*POD, "timestamp", "value"]])
    if not frames:
        return {}
    samples = pd.concat(frames).astype({"namespace": str, "pod": str})
    above = (
        (samples["value"].astype(float) > 0)
        .groupby([samples["namespace"], samples["pod"], samples["timestamp"]], observed=True)
        .max()
    )
    return _per_pod(above.astype(float).groupby(level=[0, 1], observed=True).mean())


def _scraped(frame: pd.DataFrame) -> pd.DataFrame:
    """The samples that carry a pod (a pod scrape's), the others dropped."""
    return frame[(frame["namespace"].astype(str) != "") & (frame["pod"].astype(str) != "")]


def from_families(families: Mapping[str, pd.DataFrame]) -> dict[tuple[str, str], PodServing]:
    """The file path: a history's serving families (`FAMILY_COLUMNS`), reduced per pod."""
    reduced: dict[str, dict[tuple[str, str], float]] = {}
    info: dict[tuple[str, str], dict[str, Any]] = {}
    latency: dict[str, dict[tuple[str, str], float]] = {}
    for family in FAMILIES:
        frame = families.get(family)
        # Triton's queue reads two families at once (`_triton_waiting`)
        skipped = (TRITON_DURATION, TRITON_SUCCESS, TRT_REQUESTS, TRITON_PENDING)
        if frame is None or frame.empty or family in skipped:
            continue
        frame = _scraped(frame)
        keys = [frame["namespace"].astype(str), frame["pod"].astype(str)]
        if family in BUCKETS.values():
            latency[family] = _quantiles(frame, keys)
            continue
        if family == CACHE_INFO:
            last = frame.astype({c: str for c in (*POD, *INFO_LABELS)}).sort_values("timestamp")
            for row in last.drop_duplicates(list(POD), keep="last").to_dict("records"):
                info[(row["namespace"], row["pod"])] = row
            continue
        if family == TRT_KV:
            reduced[family] = _kv_blocks(frame)
            continue
        values = frame["value"].astype(float)
        series_keys = _series_keys(frame, family)
        if family in WAITING:
            series = (values > 0).astype(float).groupby(series_keys, observed=True).mean()
        elif family in PREEMPTIONS:
            series = _increase(frame, family)
        else:
            series = values.groupby(series_keys, observed=True).max()
        reduced[family] = _per_pod(series)
    triton_waiting = _triton_waiting(families)
    if triton_waiting:
        reduced[TRITON_PENDING] = triton_waiting
    mean = _mean_request_s(families)
    if mean:
        reduced[TRITON_DURATION] = mean
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


def _selector(family: str, **labels: str) -> str:
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return f'{{__name__="{family}"{extra},namespace!="",pod!=""}}'


def queries(window_s: float, step_s: float) -> dict[str, str]:
    """The PromQL path: one query per family, by namespace and pod (the same reductions)."""
    window, step = f"{int(window_s)}s", f"{int(step_s)}s"

    def increase(family: str) -> str:
        sel = _selector(family)
        return f"(max_over_time({sel}[{window}]) - min_over_time({sel}[{window}]))"

    out = {}
    for family in FAMILIES:
        if family in (CACHE_INFO, TRITON_SUCCESS, TRT_REQUESTS):
            continue
        sel = _selector(family)
        if family in BUCKETS.values():
            increase_expr = f"max_over_time({sel}[{window}]) - min_over_time({sel}[{window}])"
            out[family] = f"histogram_quantile({QUANTILE}, sum by (namespace, pod, le) ({increase_expr}))"
            continue
        if family == TRT_KV:
            used = _selector(family, **{TRT_KV_LABEL: "used"})
            pool = _selector(family, **{TRT_KV_LABEL: "max"})
            ratio = f"{used} / ignoring({TRT_KV_LABEL}) ({pool} > 0)"
            out[family] = f"max by (namespace, pod) (max_over_time(({ratio})[{window}:{step}]))"
            continue
        if family == TRITON_DURATION:
            mean = f"{increase(family)} / ({increase(TRITON_SUCCESS)} > 0)"
            out[family] = f"max by (namespace, pod) ({mean}) / 1e6"
            continue
        if family == TRITON_PENDING:
            # `TRITON_QUEUES` in one selector: the pending count has no request_type ("" matches)
            either = (
                f'{{__name__=~"{family}|{TRT_REQUESTS}",{TRT_REQUESTS_LABEL}=~"|waiting",'
                f'namespace!="",pod!=""}}'
            )
            out[family] = f"avg_over_time((max by (namespace, pod) ({either}) > bool 0)[{window}:{step}])"
            continue
        if family in WAITING:
            expr = f"avg_over_time(({sel} > bool 0)[{window}:{step}])"
        elif family in PREEMPTIONS:
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
    info_expr = f"last_over_time({_selector(CACHE_INFO)}[{int(window_s)}s])"
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
        ("serving_e2e_mean_s", "e2e_mean_s"),
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
    server = Server(str(row["serving_server"]))
    names = NAMES[server]
    queues = TRITON_QUEUES if server is Server.TRITON else names.waiting
    waiting, preempted = _f(row, "serving_waiting_fraction"), _f(row, "serving_preemptions")
    limit = th.serving.max_waiting_fraction
    if waiting > limit:
        return (
            f"it queues: {queues} above 0 in {waiting:.0%} of samples "
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


def pool_above_need(row: Mapping[str, Any]) -> str:
    """For a server sized from its KV use (`serving_floor_bytes`) that holds more than that need:
    its pool is sized in bytes (`--kv-cache-memory-bytes`, the only pool whose bytes vLLM
    publishes) and allocated as configured wherever it starts, so a MIG slice or an MPS pinned
    limit sized from its KV use would not hold it until that flag is lowered: why, else ""."""
    floor, need, held = (
        _f(row, "serving_floor_bytes"),
        _f(row, "memory_need_bytes"),
        _f(row, "memory_peak_bytes"),
    )
    if not serves(row) or math.isnan(floor) or not need < held:
        return ""
    return (
        f"its KV pool is allocated in bytes as configured, {_gib(held)} held: a MIG slice or "
        f"MPS limit sized from its KV use ({_gib(need)}) would not hold it until the flag "
        "its reason names is lowered; next week's report places it from what it holds then"
    )


# why a server's KV use cannot size it: the figure each server leaves out (see the module docstring)
UNSIZED = {
    Server.VLLM: "its pool is sized by --gpu-memory-utilization: vllm:cache_config_info has no "
    "kv_cache_memory_bytes",
    Server.SGLANG: "SGLang publishes its KV pool in tokens (sglang:max_total_num_tokens), not in bytes",
    Server.TRITON: f"TensorRT-LLM publishes its KV pool in blocks ({TRT_KV}), not in bytes",
}


def unsized(row: Mapping[str, Any], th: Thresholds) -> str:
    """For a server that published its KV use but cannot be sized from it, why ("" otherwise)."""
    if not serves(row) or math.isnan(_f(row, "serving_kv_peak")) or kv_need(row, th) is not None:
        return ""
    server = Server(str(row["serving_server"]))
    return f"serving ({server.value}): sized from what it holds, not its KV use: {UNSIZED[server]}"


# each server's own pre-allocation knob (a fraction of the device, or of what its weights leave)
PREALLOCATION = {
    Server.VLLM: "--gpu-memory-utilization (or --kv-cache-memory-bytes, which sizes the pool in bytes "
    "and lets gpulens size it from its KV use)",
    Server.SGLANG: "--mem-fraction-static",
    Server.TRITON: "TensorRT-LLM's kv_cache_free_gpu_mem_fraction (or max_tokens_in_paged_kv_cache)",
}


def needs_its_pool(row: Mapping[str, Any], th: Thresholds) -> bool:
    """Whether a server's full memory is real use, not pre-allocation to lower: it queues or
    preempts, or its KV peak with `serving.kv_headroom_ratio` fills its pool."""
    if not serves(row):
        return False
    kv = _f(row, "serving_kv_peak")
    return bool(pressure(row, th)) or kv * (1 + th.serving.kv_headroom_ratio) >= 1


def preallocation_hint(row: Mapping[str, Any]) -> str:
    """For a server that looks memory-saturated, its own knob and how full its KV cache got ("" for
    a job that is no server): a server pre-allocates by design, so framework allocator settings
    are the wrong advice."""
    if not serves(row):
        return ""
    server = Server(str(row["serving_server"]))
    kv = _f(row, "serving_kv_peak")
    used = f"; its KV cache peaked at {kv:.0%} of its pool" if 0 <= kv <= 1 else ""
    return (
        f"memory pre-allocated by its {server.value} server for the KV cache{used}: lower "
        f"{PREALLOCATION[server]} to what it uses; memory, not compute, blocks sharing"
    )


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"
