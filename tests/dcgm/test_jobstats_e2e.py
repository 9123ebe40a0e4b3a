"""End to end: Princeton jobstats' own GPU queries on a real Prometheus scraping
`gpulens-exporter --simulate dgx-h100 --compat jobstats`.

The query strings are jobstats.py's (`get_job_stats`), in both of its modes: the job found by the
value of `nvidia_gpu_jobId`, and (`GPU_EXPORTER_JOBID = True`) by a `jobid` label. The `cluster`
label comes from the scrape config, as at a jobstats site. Results are read the way jobstats'
`get_data_out` reads them: keyed by the `instance` host and the `minor_number` label.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import PROMETHEUS_ENGINES, PromAPI, exporter, prometheus, use_prometheus

CLUSTER = "della"
DIFF = 20  # seconds of "job run time" the subqueries look back over
# jobstats.py, get_job_stats(): the jobId-value mode ...
BY_VALUE = {
    "gpu_total_memory": "max_over_time((nvidia_gpu_memory_total_bytes{{cluster='{cluster}'}} and nvidia_gpu_jobId == {jobid})[{diff}s:])",  # noqa: E501
    "gpu_used_memory": "max_over_time((nvidia_gpu_memory_used_bytes{{cluster='{cluster}'}} and nvidia_gpu_jobId == {jobid})[{diff}s:])",  # noqa: E501
    "gpu_utilization": "avg_over_time(((nvidia_gpu_duty_cycle{{cluster='{cluster}'}} or (nvidia_gpu_graphics_util_percent{{cluster='{cluster}'}} * 100)) and nvidia_gpu_jobId == {jobid})[{diff}s:])",  # noqa: E501
}
# ... and the jobid-label mode (GPU_EXPORTER_JOBID = True)
BY_LABEL = {
    "gpu_total_memory": "max_over_time(nvidia_gpu_memory_total_bytes{{cluster='{cluster}',jobid='{jobid}'}}[{diff}s:])",  # noqa: E501
    "gpu_used_memory": "max_over_time(nvidia_gpu_memory_used_bytes{{cluster='{cluster}',jobid='{jobid}'}}[{diff}s:])",  # noqa: E501
    "gpu_utilization": "avg_over_time((nvidia_gpu_duty_cycle{{cluster='{cluster}',jobid='{jobid}'}} or (nvidia_gpu_graphics_util_percent{{cluster='{cluster}',jobid='{jobid}'}} * 100))[{diff}s:])",  # noqa: E501
}  # fmt: skip


def job_stats(prom: PromAPI, queries: dict[str, str], jobid: int) -> dict[str, dict[str, dict[str, float]]]:
    """{node: {name: {minor_number: value}}}, as jobstats' get_data_out builds `sp_node`."""
    nodes: dict[str, dict[str, dict[str, float]]] = {}
    for name, template in queries.items():
        for result in prom.query(template.format(cluster=CLUSTER, jobid=jobid, diff=DIFF)):
            node = result["metric"]["instance"].split(":")[0]
            minor = result["metric"]["minor_number"]
            nodes.setdefault(node, {}).setdefault(name, {})[minor] = float(result["value"][1])
    return nodes


@pytest.fixture(scope="module")
def proms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PromAPI | BaseException]]:
    """One exporter scraped by Prometheus 2 and 3 at once, so that both fill jobstats' look-back in
    the same DIFF seconds (one engine after the other, that wait came twice). An engine that cannot
    start (Prometheus 3 not built) is kept as its skip or failure, for that engine's tests only."""
    tmp_path: Path = tmp_path_factory.mktemp("jobstats")
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(
            exporter(tmp_path, "--simulate", "dgx-h100", "--compat", "jobstats", "--interval", "1")
        )
        scrape = {"static_configs": [{"targets": [target], "labels": {"cluster": CLUSTER}}]}
        apis: dict[str, PromAPI | BaseException] = {}
        for engine in PROMETHEUS_ENGINES:
            home = tmp_path / engine
            home.mkdir()
            try:
                with pytest.MonkeyPatch.context() as monkeypatch:
                    use_prometheus(engine, monkeypatch)
                    apis[engine] = stack.enter_context(prometheus(home, [target], scrape_config=scrape))
            except (pytest.skip.Exception, pytest.fail.Exception) as exc:
                apis[engine] = exc
        for api in apis.values():
            if isinstance(api, PromAPI):
                api.wait_for("count(nvidia_gpu_jobId) >= 13", timeout=60)
                filled = f"count_over_time(nvidia_gpu_duty_cycle{{ordinal='3'}}[{DIFF}s]) >= {DIFF - 2}"
                api.wait_for(filled, timeout=60)
        yield apis


@pytest.fixture(params=PROMETHEUS_ENGINES)
def prom(proms: dict[str, PromAPI | BaseException], request: pytest.FixtureRequest) -> PromAPI:
    """jobstats' queries against Prometheus 2 and 3 (left-open ranges and subqueries)."""
    api = proms[request.param]
    if isinstance(api, BaseException):
        raise api
    return api


@pytest.mark.slow
@pytest.mark.parametrize("queries", [BY_VALUE, BY_LABEL], ids=["jobId-value", "jobid-label"])
def test_an_exclusive_job_gets_utilization_and_memory_of_its_gpu(
    prom: PromAPI, queries: dict[str, str]
) -> None:
    (stats,) = job_stats(prom, queries, 5110).values()  # job 5110 holds GPU 3
    assert set(stats) == {"gpu_total_memory", "gpu_used_memory", "gpu_utilization"}
    assert all(list(values) == ["3"] for values in stats.values()), stats
    (native,) = prom.query("gpu_memory_total_bytes{gpu='3'}")
    assert stats["gpu_total_memory"]["3"] == float(native["value"][1])
    assert 0 < stats["gpu_used_memory"]["3"] <= stats["gpu_total_memory"]["3"]
    assert 50 < stats["gpu_utilization"]["3"] <= 100  # percent, as jobstats prints it


@pytest.mark.slow
@pytest.mark.parametrize("queries", [BY_VALUE, BY_LABEL], ids=["jobId-value", "jobid-label"])
def test_a_mig_job_gets_its_instance_utilization_through_the_graphics_fallback(
    prom: PromAPI, queries: dict[str, str]
) -> None:
    (stats,) = job_stats(prom, queries, 5103).values()  # job 5103: a 1g.10gb instance of GPU 0
    assert stats["gpu_total_memory"]["0"] < 12 * 1024**3  # the instance's memory, not the GPU's
    assert 0 <= stats["gpu_utilization"]["0"] <= 100


@pytest.mark.slow
def test_a_job_that_does_not_exist_gets_nothing(prom: PromAPI) -> None:
    assert job_stats(prom, BY_VALUE, 999999) == {}
