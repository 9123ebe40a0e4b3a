"""End to end: a real Prometheus scraping `gpulens-exporter --simulate dgx-h100`.

The per-job series must join onto device metrics in PromQL, and a GPU's job memory must add up to
its process memory. The check compares `sum by (gpu) (gpu_job_memory_used_bytes)` with the sum of
`gpu_process_memory_used_bytes` from the opt-in processes collector (raised limit so no process is
left out) in the same scrape: both come from one sample, so they must be equal, not just close.
"""

from __future__ import annotations

import pytest

from tests.support.procs import exporter, prometheus

pytest.importorskip("gpulens.sim.engine")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attribution-e2e")
    args = (
        "--simulate",
        "dgx-h100",
        "--interval",
        "1",
        "--collector.processes",
        "--collector.processes.max",
        "5000",
    )
    with exporter(tmp, *args) as target, prometheus(tmp, [target]) as api:
        api.wait_for("gpu_job_info", timeout=90)
        api.wait_for("gpu_process_memory_used_bytes", timeout=30)
        yield api


def test_job_info_joins_onto_a_device_metric_per_job(prom):
    joined = prom.query("gpu_memory_total_bytes * on (instance, gpu, uuid) group_right gpu_job_info")
    assert joined, "the join returned nothing"
    assert all(r["metric"].get("job_id") for r in joined)
    assert all(float(r["value"][1]) > 0 for r in joined)  # the device value, carried per job
    assert len({r["metric"]["job_id"] for r in joined}) > 1  # several jobs on the node


def test_job_memory_adds_up_to_process_memory_per_gpu(prom):
    # exactly one scrape's worth: both sides of one sample, evaluated at one instant
    diff = prom.query(
        "sum by (instance, gpu) (gpu_job_memory_used_bytes)"
        " - on (instance, gpu) sum by (instance, gpu) (gpu_process_memory_used_bytes)"
    )
    assert diff, "no GPU has both job and process memory"
    assert prom.query("gpulens_processes_dropped") and all(
        float(r["value"][1]) == 0 for r in prom.query("gpulens_processes_dropped")
    )
    assert {r["metric"]["gpu"]: float(r["value"][1]) for r in diff} == {r["metric"]["gpu"]: 0.0 for r in diff}
    gpus_with_processes = {
        r["metric"]["gpu"] for r in prom.query("count by (gpu) (gpu_process_memory_used_bytes)")
    }
    assert {r["metric"]["gpu"] for r in diff} == gpus_with_processes


def test_every_job_row_has_a_source_and_a_sharing_mode(prom):
    info = prom.query("gpu_job_info")
    assert {r["metric"]["job_source"] for r in info} <= {
        "slurm",
        "kubernetes",
        "mapping",
        "unknown",
        "system",
        "other",
    }
    assert {r["metric"]["sharing"] for r in info} <= {"exclusive", "mig", "mps", "time_slicing"}
    usage_keys = {
        (r["metric"]["gpu"], r["metric"].get("gpu_instance", ""), r["metric"]["job_id"])
        for r in prom.query("gpu_job_memory_used_bytes")
    }
    info_keys = {
        (r["metric"]["gpu"], r["metric"].get("gpu_instance", ""), r["metric"]["job_id"]) for r in info
    }
    assert usage_keys == info_keys
