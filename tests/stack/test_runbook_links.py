"""The alerts' runbook links work as shipped: every `runbook_url` in the rules the Helm chart and the
kustomization render points at a service of the same install, and that service (the real receiver
or exporter process, on 127.0.0.1 in place of the in-cluster host) answers each with its runbook."""

from __future__ import annotations

import re
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.stack.test_helm import CHART, NAMESPACE, helm, template  # noqa: F401 (helm: a fixture)
from tests.support.procs import free_port, running

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE_RULES = REPO / "deploy" / "kubernetes" / "prometheusrule.yaml"
KPS_PRESET = CHART / "values-kube-prometheus-stack.yaml"
RECEIVER_HOST = f"gpulens-remediate.{NAMESPACE}.svc:9843"  # release gpulens: its Service and port
EXPORTER_HOST = f"gpulens-exporter.{NAMESPACE}.svc:9842"
WITH_RECEIVER = (
    "--set",
    "remediate.enabled=true",
    "--set",
    "remediate.token.create=true",
    "--set",
    "remediate.token.value=0123456789abcdef",
)


def runbook_urls(objects: list[dict[str, Any]]) -> dict[str, str]:
    """alert -> runbook_url of every alert in the PrometheusRules among `objects`."""
    urls = {}
    for obj in objects:
        if obj.get("kind") != "PrometheusRule":
            continue
        for group in obj["spec"]["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    urls[rule["alert"]] = rule["annotations"]["runbook_url"]
    assert urls, "no alert rule rendered"
    return urls


def fetch(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode()


def assert_every_link_answers(urls: dict[str, str], host: str, address: str) -> None:
    for alert, url in sorted(urls.items()):
        assert url == f"http://{host}/runbooks/{alert}", f"{alert}: {url} is not this install's service"
        status, page = fetch(url.replace(host, address, 1))
        assert status == 200, alert
        assert re.search(rf"<title>{alert}</title>", page) and f"<h1>{alert}</h1>" in page, alert


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`gpulens remediate` as the chart runs it (a bearer token required on its writes) over a
    no-op scontrol; its address."""
    tmp = tmp_path_factory.mktemp("receiver")
    (tmp / "token").write_text("0123456789abcdef")
    scontrol = tmp / "scontrol"
    scontrol.write_text("#!/bin/sh\nexit 0\n")
    scontrol.chmod(0o755)
    port = free_port()
    command = [sys.executable, "-m", "gpulens.cli", "remediate", "--backend", "slurm"]
    command += ["--web.listen-address", f"127.0.0.1:{port}", "--scontrol", str(scontrol)]
    command += ["--token-file", str(tmp / "token")]
    with running(command, f"http://127.0.0.1:{port}/-/healthy", tmp / "receiver.log", timeout=60):
        yield f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("exporter")
    port = free_port()
    command = [sys.executable, "-m", "gpulens.exporter.cli", "--simulate", "seed-case"]
    command += ["--web.listen-address", f"127.0.0.1:{port}"]
    with running(command, f"http://127.0.0.1:{port}/-/healthy", tmp / "exporter.log", timeout=120):
        yield f"127.0.0.1:{port}"


@pytest.mark.slow
def test_helm_with_the_receiver_links_every_alert_to_the_receiver_s_runbook(helm, receiver):  # noqa: F811
    urls = runbook_urls(template(helm, *WITH_RECEIVER))
    assert_every_link_answers(urls, RECEIVER_HOST, receiver)


@pytest.mark.slow
def test_helm_kube_prometheus_stack_preset_with_the_receiver_links_to_it(helm, receiver):  # noqa: F811
    urls = runbook_urls(template(helm, "-f", str(KPS_PRESET), *WITH_RECEIVER))
    assert_every_link_answers(urls, RECEIVER_HOST, receiver)


@pytest.mark.slow
def test_helm_without_the_receiver_links_every_alert_to_the_exporter_s_runbook(helm, exporter):  # noqa: F811
    assert_every_link_answers(runbook_urls(template(helm)), EXPORTER_HOST, exporter)


@pytest.mark.slow
def test_kustomize_links_every_alert_to_the_exporter_s_runbook(exporter):
    objects = [doc for doc in yaml.safe_load_all(KUSTOMIZE_RULES.read_text()) if doc]
    assert_every_link_answers(runbook_urls(objects), EXPORTER_HOST, exporter)


def test_an_explicit_runbook_pattern_still_wins(helm):  # noqa: F811
    urls = runbook_urls(template(helm, "--set", "mixin.runbookURLPattern=https://wiki.example/rb/%s"))
    assert urls["GPULost"] == "https://wiki.example/rb/GPULost"
