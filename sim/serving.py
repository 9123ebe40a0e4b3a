"""Inference servers' own metrics for a scenario's serving processes (vLLM, SGLang, Triton).

A process with a `serving:` block is an LLM server: it holds what its server pre-allocates (the
flag's fraction of the memory its device shows, or vLLM's `--kv-cache-memory-bytes` pool plus the
weights), however little it serves, and publishes what a Prometheus pod scrape of its `/metrics`
would record, labelled with its pod's `namespace` and `pod` so the analyzer can join the series to
the job. The load follows the process's inference pattern (its smooth daily cycle): KV cache use
and the queue peak when the load does.

Request latency (`Recorder`): requests finish in proportion to the load (`REQUESTS_PER_BUSY_SECOND`
of its uncapped busy time), each minute's with a log-normal e2e latency and time to first token
around a base median times the minute's slowdown: its demand over its MPS thread cap when the cap
binds (the same work takes demand / cap as long), times what sharing its GPU costs: on a
time-sliced GPU (or slice) 1 + the neighbours' busy time (their kernels run while its wait), under
MPS the clients' summed SM demand where it exceeds the GPU. So a server moved onto a shared or
capped GPU records a slower week, as `gpulens report --previous` must notice.

Names, labels and bucket bounds are the servers' own (vLLM `vllm/v1/metrics/loggers.py`:
`model_name`, `engine`; `vllm:cache_config_info` carries `CacheConfig`'s fields as labels; SGLang
`python/sglang/srt/metrics/collector.py`: `model_name`, its default buckets). A Triton server runs
the TensorRT-LLM backend with Triton's default metrics config (triton-inference-server/server
`docs/user_guide/metrics.md`; core `src/metric_model_reporter.cc`): per `model` and `version`, its
pending request count, successful requests and cumulative request time in microseconds (no latency
histogram: those are opt-in), and the backend's request gauges
(`nv_trt_llm_request_metrics{request_type}`: waiting and active; its queue follows the load as the
pending count does) and KV block gauges
(`nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}`: max, used, free, tokens_per, fraction;
NVIDIA/TensorRT-LLM `triton_backend/inflight_batcher_llm/src/custom_metrics_reporter`). Its pool is
`kv_cache_free_gpu_mem_fraction` of the memory left after the weights and non-KV memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from gpulens.sim.patterns import Workload

GIB = 1024**3
# what a server holds besides its weights and KV pool: activations of its profiling run, CUDA
# graphs, the CUDA context (vLLM reports 1-3 GiB of "non-KV" memory for 8B-70B models)
NON_KV_BYTES = 2 * GIB
VLLM_BLOCK_SIZE = 16  # tokens per KV block (vLLM's default)
TRT_LLM_TOKENS_PER_BLOCK = 64  # TensorRT-LLM's default tokens_per_block
# per-token KV bytes of a Llama-3-8B-like model in bf16 (32 layers x 8 KV heads x 128 x 2 x 2)
KV_BYTES_PER_TOKEN = 131072

# the servers' histogram bucket bounds in seconds (their defaults; +Inf is added)
VLLM_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                     7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
SGLANG_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
                      100.0, 200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0)  # fmt: skip
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
                       100.0, 200.0, 400.0)  # fmt: skip
# latency of one request on a GPU of its own (an 8B model answering a chat turn): medians and the
# log-normal spread around them
E2E_MEDIAN_S = 1.6
TTFT_MEDIAN_S = 0.15
LATENCY_SIGMA = 0.35
REQUESTS_PER_BUSY_SECOND = 2.0  # requests finished per second of the server's (uncapped) busy time
BIN_S = 60.0  # latency is integrated minute by minute from the process's start


class Server(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    TRITON = "triton"  # Triton Inference Server with the TensorRT-LLM backend


@dataclass(frozen=True)
class ServingSpec:
    """A validated `serving:` block (docs/simulator.md)."""

    server: Server
    model_name: str
    weights_bytes: int
    # vLLM --gpu-memory-utilization, SGLang --mem-fraction-static (of the device's memory);
    # TensorRT-LLM kv_cache_free_gpu_mem_fraction (of what the weights and non-KV memory leave)
    memory_fraction: float
    kv_cache_memory_bytes: int | None  # vLLM --kv-cache-memory-bytes (then the fraction is ignored)
    kv_peak: float  # share of the KV pool in use at the load's daily peak
    queue: float  # requests waiting at the load's peak (0: never queues)
    preemptions_per_hour: float
    device_bytes: int = 0  # the memory its device (or MIG slice) shows: what the fraction is of

    def pool_bytes(self, device_bytes: int | None = None) -> int:
        """The KV pool the server allocates on a device (or MIG slice) of `device_bytes`."""
        if self.kv_cache_memory_bytes is not None:
            return self.kv_cache_memory_bytes
        device_bytes = self.device_bytes if device_bytes is None else device_bytes
        if self.server is Server.TRITON:
            return int(self.memory_fraction * (device_bytes - self.weights_bytes - NON_KV_BYTES))
        return int(self.memory_fraction * device_bytes) - self.weights_bytes - NON_KV_BYTES

    def reserved_bytes(self, device_bytes: int | None = None) -> int:
        """What the process holds all the time: weights, non-KV memory and the whole pool."""
        return self.weights_bytes + NON_KV_BYTES + self.pool_bytes(device_bytes)


@dataclass(frozen=True)
class Neighbour:
    """Another process on the server's GPU (or MIG slice): what it asks of the GPU, and when."""

    start: float
    end: float
    workload: Workload


@dataclass(frozen=True)
class ServingProcess:
    """One serving process as the scrape of its pod sees it: its pod, lifetime and load, and what
    it shares its GPU with (for its latency)."""

    spec: ServingSpec
    namespace: str
    pod: str
    start: float  # seconds relative to the node's start
    end: float
    workload: Workload  # the process's own pattern (same seed and pid: the same daily cycle)
    demand: Workload | None = None  # the same pattern uncapped: what it asks for (None: no cap)
    cap: float | None = None  # its MPS active-thread share
    neighbours: tuple[Neighbour, ...] = ()
    concurrent: bool = False  # an MPS GPU: clients run at once, not in turn

    def slowdown(self, r: float) -> float:
        """How much longer a request takes at node time `r` than on a GPU of its own."""
        demand = (self.demand or self.workload).sample(r - self.start).sm
        factor = 1.0
        if self.cap is not None and demand > self.cap:
            factor = demand / self.cap  # the same work at `cap` of the SMs
        running = [n.workload.sample(r - n.start) for n in self.neighbours if n.start <= r < n.end]
        if self.concurrent:
            own = min(demand, self.cap) if self.cap is not None else demand
            factor *= max(1.0, own + sum(s.sm for s in running))
        else:
            factor *= 1.0 + sum(s.busy for s in running)
        return factor


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass(frozen=True)
class Histogram:
    """One latency histogram of a server: its family, bucket bounds and base median."""

    family: str
    bounds: tuple[float, ...]
    median_s: float


HISTOGRAMS = {
    Server.VLLM: (
        Histogram("vllm:e2e_request_latency_seconds", VLLM_E2E_BUCKETS, E2E_MEDIAN_S),
        Histogram("vllm:time_to_first_token_seconds", VLLM_TTFT_BUCKETS, TTFT_MEDIAN_S),
    ),
    Server.SGLANG: (
        Histogram("sglang:e2e_request_latency_seconds", SGLANG_E2E_BUCKETS, E2E_MEDIAN_S),
        Histogram("sglang:time_to_first_token_seconds", SGLANG_TTFT_BUCKETS, TTFT_MEDIAN_S),
    ),
    Server.TRITON: (),  # Triton's latency histogram is opt-in (histogram_latencies=true): none
}


class Recorder:
    """The scrapes of one serving process: its gauges (`samples`) and its latency histograms,
    cumulative since it started. Mutable: the minutes integrated so far are kept, so a scrape
    integrates only the minutes since the last one (scrapes come in time order)."""

    def __init__(self, proc: ServingProcess) -> None:
        self.proc = proc
        self.histograms = HISTOGRAMS[proc.spec.server]
        self._bins = 0
        self._buckets = [[0.0] * len(h.bounds) for h in self.histograms]
        self._count = 0.0
        self._sums = [0.0] * len(self.histograms)
        self._e2e_s = 0.0  # every request's e2e time, summed (Triton's request duration counter)

    def _integrate(self, r: float) -> None:
        proc = self.proc
        done = int(max(0.0, min(r, proc.end) - proc.start) // BIN_S)
        demand = proc.demand or proc.workload
        spread = math.exp(LATENCY_SIGMA**2 / 2)  # mean / median of a log-normal
        for k in range(self._bins, done):
            age = (k + 0.5) * BIN_S
            requests = REQUESTS_PER_BUSY_SECOND * demand.expected(age).busy * BIN_S
            if requests <= 0:
                continue
            slow = proc.slowdown(proc.start + age)
            self._count += requests
            self._e2e_s += requests * E2E_MEDIAN_S * slow * spread
            for i, h in enumerate(self.histograms):
                log_median = math.log(h.median_s * slow)
                cum = self._buckets[i]
                for j, bound in enumerate(h.bounds):
                    cum[j] += requests * _normal_cdf((math.log(bound) - log_median) / LATENCY_SIGMA)
                self._sums[i] += requests * h.median_s * slow * spread
        self._bins = max(self._bins, done)

    def samples(self, r: float) -> Iterator[tuple[str, float, dict[str, str]]]:
        """(family, value, labels) of one scrape at node time `r`: `samples` and the histograms'
        `_bucket` (by `le`), `_sum` and `_count` series; nothing when not running."""
        proc = self.proc
        if not proc.start <= r < proc.end:
            return
        yield from samples(proc, r)
        self._integrate(r)
        labels = _labels(proc)
        count = math.floor(self._count)
        if proc.spec.server is Server.TRITON:
            yield "nv_inference_request_success", float(count), labels
            yield "nv_inference_count", float(count), labels  # batch 1: one inference a request
            yield "nv_inference_request_duration_us", float(math.floor(self._e2e_s * 1e6)), labels
        for i, h in enumerate(self.histograms):
            for bound, value in zip(h.bounds, self._buckets[i], strict=True):
                yield f"{h.family}_bucket", float(math.floor(value)), {**labels, "le": repr(bound)}
            yield f"{h.family}_bucket", float(count), {**labels, "le": "+Inf"}
            yield f"{h.family}_sum", self._sums[i], labels
            yield f"{h.family}_count", float(count), labels


def _labels(proc: ServingProcess) -> dict[str, str]:
    """A scrape's labels of the server's series: its pod's, and the server's own model labels."""
    base = {"namespace": proc.namespace, "pod": proc.pod}
    if proc.spec.server is Server.TRITON:
        return {**base, "model": proc.spec.model_name, "version": "1"}
    labels = {**base, "model_name": proc.spec.model_name}
    if proc.spec.server is Server.VLLM:
        labels["engine"] = "0"
    return labels


def samples(proc: ServingProcess, r: float) -> Iterator[tuple[str, float, dict[str, str]]]:
    """(family, value, labels) of one scrape of `proc` at node time `r`; nothing when not running."""
    if not proc.start <= r < proc.end:
        return
    age = r - proc.start
    spec = proc.spec
    workload = proc.workload
    rate = workload.spec.rate
    # the smooth load relative to its daily peak (the inference cycle swings 0.5x..1.5x its rate)
    cycle = workload.expected(age).busy / rate if rate > 0 else 0.0
    at_peak = min(1.0, cycle / 1.5)
    usage = spec.kv_peak * at_peak
    waiting = float(round(spec.queue * at_peak))
    running = float(max(1, round(16 * rate * cycle)))
    preempted = spec.preemptions_per_hour * age / 3600.0
    base = _labels(proc)
    if spec.server is Server.TRITON:
        yield "nv_inference_pending_request_count", waiting, base
        # the backend's own queue and running requests (in-flight batching queues there)
        for kind, value in (("waiting", waiting), ("active", running)):
            yield "nv_trt_llm_request_metrics", value, {**base, "request_type": kind}
        blocks = spec.pool_bytes() // (TRT_LLM_TOKENS_PER_BLOCK * KV_BYTES_PER_TOKEN)
        used = min(blocks, round(usage * blocks))
        kv = "nv_trt_llm_kv_cache_block_metrics"
        for kind, value in (
            ("max", blocks),
            ("free", blocks - used),
            ("used", used),
            ("tokens_per", TRT_LLM_TOKENS_PER_BLOCK),
            ("fraction", used / blocks if blocks else 0.0),
        ):
            yield kv, float(value), {**base, "kv_cache_block_type": kind}
    elif spec.server is Server.VLLM:
        labels = base
        pool = spec.pool_bytes()
        kv_set = spec.kv_cache_memory_bytes
        yield "vllm:num_requests_running", running, labels
        yield "vllm:num_requests_waiting", waiting, labels
        yield "vllm:kv_cache_usage_perc", usage, labels
        yield "vllm:num_preemptions_total", math.floor(preempted), labels
        blocks = pool // (VLLM_BLOCK_SIZE * KV_BYTES_PER_TOKEN)
        info = {  # the info series carries no engine label
            **{k: v for k, v in base.items() if k != "engine"},
            "block_size": str(VLLM_BLOCK_SIZE),
            "gpu_memory_utilization": repr(spec.memory_fraction),
            "num_gpu_blocks": str(blocks),
            "cache_dtype": "auto",
            "kv_cache_memory_bytes": "None" if kv_set is None else str(kv_set),
        }
        yield "vllm:cache_config_info", 1.0, info
    else:
        yield "sglang:num_running_reqs", running, base
        yield "sglang:num_queue_reqs", waiting, base
        yield "sglang:token_usage", usage, base
        yield "sglang:num_retracted_requests_total", math.floor(preempted), base
