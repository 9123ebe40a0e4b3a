"""A simulated Triton server (TensorRT-LLM backend) publishes the backend's request gauges.

With decoupled, in-flight batching TensorRT-LLM queues requests inside the backend, which publishes
`nv_trt_llm_request_metrics{request_type}` per `model` and `version` (NVIDIA/TensorRT-LLM
`triton_backend/inflight_batcher_llm/src/custom_metrics_reporter`): the analyzer reads its
"waiting" requests as Triton's queue (analyzer/serving.py).
"""

from __future__ import annotations

from gpulens.sim.patterns import Workload, WorkloadSpec
from gpulens.sim.serving import GIB, Server, ServingProcess, ServingSpec, samples

DAY = 86400.0
REQUESTS = "nv_trt_llm_request_metrics"


def _triton(queue: float) -> ServingProcess:
    spec = ServingSpec(
        server=Server.TRITON,
        model_name="llama-3-8b",
        weights_bytes=16 * GIB,
        memory_fraction=0.9,
        kv_cache_memory_bytes=None,
        kv_peak=0.5,
        queue=queue,
        preemptions_per_hour=0.0,
        device_bytes=80 * GIB,
    )
    workload = Workload(WorkloadSpec("inference", 60 * GIB, 0.5, rate=0.4), seed=7, pid=100)
    return ServingProcess(spec, "llm", "triton-0", 0.0, 2 * DAY, workload)


def _requests(proc: ServingProcess, r: float) -> dict[str, float]:
    """One scrape's request gauges by request_type."""
    return {labels["request_type"]: value for family, value, labels in samples(proc, r) if family == REQUESTS}


def test_a_triton_publishes_its_backends_waiting_and_active_requests_per_model():
    proc = _triton(queue=4)
    scrape = [(labels, value) for family, value, labels in samples(proc, 3600.0) if family == REQUESTS]
    assert {labels["request_type"] for labels, _ in scrape} == {"waiting", "active"}
    assert all(
        (labels["namespace"], labels["pod"], labels["model"], labels["version"])
        == ("llm", "triton-0", "llama-3-8b", "1")
        for labels, _ in scrape
    )
    assert _requests(proc, 3600.0)["active"] >= 1


def test_a_triton_whose_load_queues_has_requests_waiting_in_its_backend():
    proc = _triton(queue=4)
    waiting = [_requests(proc, t)["waiting"] for t in range(0, int(DAY), 3600)]
    assert max(waiting) > 0
    assert sum(w > 0 for w in waiting) > len(waiting) / 2  # most of the day, as its pending count


def test_a_triton_that_never_queues_has_no_request_waiting_in_its_backend():
    proc = _triton(queue=0)
    assert all(_requests(proc, t)["waiting"] == 0 for t in range(0, int(DAY), 3600))
