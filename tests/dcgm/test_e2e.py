"""End to end: dcgm-exporter's official Grafana dashboard works on `gpulens-exporter --compat dcgm`.

A real Prometheus scrapes `gpulens-exporter --simulate dgx-h100 --compat dcgm`; the dashboard's
template variables are resolved the way Grafana does (label values of DCGM_FI_DEV_GPU_TEMP, "All"
selected: a regex alternation), and every panel query must return data.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.procs import PromAPI, exporter, prometheus

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
def test_every_panel_of_the_dcgm_exporter_dashboard_returns_data(tmp_path: Path) -> None:
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
