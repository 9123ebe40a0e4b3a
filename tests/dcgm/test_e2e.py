"""End to end: dcgm-exporter's official Grafana dashboard works on `gpulens-exporter --compat dcgm`.

A real Prometheus scrapes `gpulens-exporter --simulate dgx-h100 --compat dcgm`; the dashboard's
template variables are resolved the way Grafana does (label values of DCGM_FI_DEV_GPU_TEMP, "All"
selected: a regex alternation), and every panel query must return data. On the Kubernetes scenario,
with a stand-in kubelet serving the scenario's pod allocations over the pod-resources socket, the
same panels work and the compat series carry pod, namespace and container.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.procs import PROMETHEUS_ENGINES, PromAPI, exporter, prometheus, use_prometheus

# grafana/dcgm-exporter-dashboard.json (grafana.com #12239), every panel expression verbatim
DASHBOARD_EXPRESSIONS = (
    'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
    'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})',
    'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}',
    'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})',
    'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
    'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
    'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}',
)
VARIABLES = {
    "instance": "label_values(DCGM_FI_DEV_GPU_TEMP, instance)",
    "gpu": "label_values(DCGM_FI_DEV_GPU_TEMP, gpu)",
}


def label_values(prom: PromAPI, query: str) -> list[str]:
    match = re.fullmatch(r"label_values\((\w+), (\w+)\)", query)
    assert match, query
    metric, label = match.groups()
    return list(prom.get(f"/api/v1/label/{label}/values", **{"match[]": metric}))


def all_value(values: list[str]) -> str:
    """Grafana's "All" for a multi-value variable without a custom all value: (a|b|c), regex-escaped
    (and the escapes doubled, as they sit inside a PromQL string literal)."""
    return "(" + "|".join(re.escape(v).replace("\\", "\\\\") for v in values) + ")"


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
def test_every_panel_of_the_dcgm_exporter_dashboard_returns_data(
    tmp_path: Path, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_prometheus(engine, monkeypatch)
    with (
        exporter(tmp_path, "--simulate", "dgx-h100", "--compat", "dcgm", "--interval", "1") as target,
        prometheus(tmp_path, [target]) as prom,
    ):
        prom.wait_for("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", timeout=60)
        values = {name: label_values(prom, query) for name, query in VARIABLES.items()}
        assert values["instance"] == [target]
        assert sorted(values["gpu"], key=int) == [str(i) for i in range(8)]
        empty = []
        for expr in DASHBOARD_EXPRESSIONS:
            query = expr
            for name, found in values.items():
                query = query.replace(f"${name}", all_value(found))
            if not prom.query(query):
                empty.append(query)
        assert empty == []
        gpu_util = prom.query('DCGM_FI_DEV_GPU_UTIL{gpu="3"}')
        assert 0 <= float(gpu_util[0]["value"][1]) <= 100
        tensor = prom.query("max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)")
        assert 0 < float(tensor[0]["value"][1]) <= 1


@pytest.mark.slow
def test_the_dashboard_and_pod_queries_work_on_kubernetes_with_pod_labels(tmp_path: Path) -> None:
    from tests.attribution.kubelet import FakeKubelet, kubelet_server
    from tests.dcgm.kubelet_allocations import scenario_allocations

    args = ["--simulate", "k8s-a100-mixed", "--compat", "dcgm", "--profiling", "dcgm", "--interval", "1"]
    with (
        kubelet_server(FakeKubelet(scenario_allocations("k8s-a100-mixed"))) as socket,
        exporter(tmp_path, *args, "--pod-resources-socket", str(socket)) as target,
        prometheus(tmp_path, [target]) as prom,
    ):
        prom.wait_for('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{pod!=""}', timeout=60)
        values = {name: label_values(prom, query) for name, query in VARIABLES.items()}
        assert sorted(values["gpu"], key=int) == ["0", "1", "2", "3"]
        empty = []
        for expr in DASHBOARD_EXPRESSIONS:
            query = expr
            for name, found in values.items():
                query = query.replace(f"${name}", all_value(found))
            if not prom.query(query):
                empty.append(query)
        assert empty == []
        # what Kubernetes users of dcgm-exporter query: per pod, per namespace
        per_pod = prom.query('sum by (namespace, pod, container) (DCGM_FI_DEV_FB_USED{pod!=""})')
        pods = {(r["metric"]["namespace"], r["metric"]["pod"], r["metric"]["container"]) for r in per_pod}
        assert ("research", "pretrain-llm-0", "trainer") in pods
        assert ("ml-serving", "triton-resnet-5c8d7f9b4-8wq2n", "triton") in pods  # a MIG instance's pod
        assert len(pods) == 6  # GPU 0 is time-sliced by three pods: no pod labels there
        tensor = prom.query('max by (pod) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{namespace="research"})')
        assert {r["metric"]["pod"] for r in tensor} == {"pretrain-llm-0", "lora-sweep-3-0", "jupyter-omar-0"}
        unlabelled = prom.query('DCGM_FI_DEV_GPU_TEMP{gpu="0", pod=""}')
        assert len(unlabelled) == 1
