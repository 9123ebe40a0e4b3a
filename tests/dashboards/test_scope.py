"""The mixin's scope in the dashboards: cluster and scrape-job variables used by every query."""

from __future__ import annotations

import re

import pytest

from gpulens.dashboards.build import render_all
from gpulens.promscope.config import DEFAULT, MixinConfig
from tests.dashboards.model import dashboards, data_panels

# the analyzer's recommendations come from wherever its textfile is scraped (node_exporter), the
# remediation receiver's series from its own job, and fleet / model / recovery level series have no
# job: those queries take the cluster but not the exporters' selector and scrape job
CLUSTER_ONLY = re.compile(
    r"(gpulens_recommendation_\w+|gpulens_remediate_\w+|(fleet|model|recovery):\w+:\w+)\{"
)


def selectors(expr: str) -> list[str]:
    """The matcher lists of an expression ({...}), strings inside them included."""
    return re.findall(r"\{((?:[^{}\"]|\"(?:[^\"\\]|\\.)*\")*)\}", expr)


@pytest.mark.parametrize("uid", sorted(dashboards()))
def test_every_dashboard_starts_with_cluster_and_scrape_job_variables(uid: str) -> None:
    variables = [v["name"] for v in dashboards()[uid]["templating"]["list"]]
    assert variables[:3] == ["datasource", "cluster", "job"]
    by_name = {v["name"]: v for v in dashboards()[uid]["templating"]["list"]}
    assert by_name["cluster"]["query"] == f"label_values(gpu_info{{{DEFAULT.selector}}}, cluster)"
    assert (
        by_name["job"]["query"] == f'label_values(gpu_info{{{DEFAULT.selector}, cluster=~"$cluster"}}, job)'
    )
    for name in ("cluster", "job"):
        assert by_name[name]["includeAll"] and by_name[name]["allValue"] == ".*"


def test_every_matcher_list_of_every_query_takes_the_cluster_and_the_scrape_job() -> None:
    for ref in data_panels():
        for expr in ref.exprs:
            for matchers in selectors(expr):
                assert 'cluster=~"$cluster"' in matchers, f"{ref.name}: {{{matchers}}}"
                if not CLUSTER_ONLY.search(expr):
                    assert f'{DEFAULT.selector}, job=~"$job"' in matchers, f"{ref.name}: {{{matchers}}}"


def test_every_variable_query_after_cluster_honours_cluster_and_scrape_job() -> None:
    for uid, board in dashboards().items():
        for variable in board["templating"]["list"][3:]:
            assert 'cluster=~"$cluster"' in variable["query"], f"{uid}: {variable['name']}"
            assert 'job=~"$job"' in variable["query"], f"{uid}: {variable['name']}"


def test_a_custom_config_renames_the_cluster_label_and_replaces_the_selector() -> None:
    config = MixinConfig(selector='namespace="gpu"', cluster_label="k8s_cluster")
    for board in render_all(config):
        assert 'cluster=~"$cluster"' not in board.text.replace('k8s_cluster=~"$cluster"', "")
        assert ".*gpulens.*" not in board.text
        assert 'namespace=\\"gpu\\", job=~\\"$job\\"' in board.text
