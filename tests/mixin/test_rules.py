"""The mixin's rule build: committed defaults, and a custom config that promtool accepts and runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpulens.mixin import build, rules
from gpulens.mixin.rules import RuleRenderError, render_text
from gpulens.promscope.config import DEFAULT, MixinConfig
from tests.alerts import rulefiles

CUSTOM = MixinConfig(
    selector='job="gpu-nodes"',
    remediate_selector='job="remediate"',
    cluster_label="k8s_cluster",
    runbook_url_pattern="https://wiki.example/gpu/%s",
)

promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) missing")


def write_rules(config: MixinConfig, directory: Path) -> list[Path]:
    paths = []
    for item in rules.render_all(config):
        path = directory / item.filename
        path.write_text(item.text)
        paths.append(path)
    return paths


def exprs(paths: list[Path]) -> dict[str, str]:
    out = {}
    for path in paths:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                out[rule.get("alert") or rule["record"]] = rule["expr"]
    return out


def test_committed_rule_files_and_runbooks_are_the_default_build():
    stale = build.build(check=True).changed
    assert not stale, f"stale: {[str(p) for p in stale]}; run `gpulens mixin build`"


@promtool
def test_a_custom_config_yields_rules_promtool_accepts(tmp_path):
    paths = write_rules(CUSTOM, tmp_path)
    result = subprocess.run(["promtool", "check", "rules", *map(str, paths)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def scraped_series_uses(expr: str) -> list[tuple[str, str]]:
    """(series, what follows it) for every read of a scraped series (a name without a colon)."""
    names = {s for s in rulefiles.referenced_series(expr) if ":" not in s}
    return [
        (name, expr[m.end() : m.end() + 40])
        for name in names
        for m in re.finditer(rf"(?<![\w:]){re.escape(name)}(?![\w:])(?!\s*\()", expr)
    ]


def test_a_custom_config_puts_its_selector_on_every_scraped_series(tmp_path):
    uses = 0
    for name, expr in exprs(write_rules(CUSTOM, tmp_path)).items():
        assert ".*gpulens.*" not in expr and ".*remediate.*" not in expr, name
        for series, rest in scraped_series_uses(expr):
            wanted = 'job="remediate"' if series.startswith("gpulens_remediate_") else 'job="gpu-nodes"'
            assert rest.startswith("{" + wanted), f"{name}: {series}{rest}"
            uses += 1
    assert uses > 100


def test_a_custom_config_puts_its_cluster_label_in_every_by_and_on_list(tmp_path):
    for name, expr in exprs(write_rules(CUSTOM, tmp_path)).items():
        for keyword, labels in re.findall(r"\b(by|on)\s*\(([^)]*)\)", expr):
            assert labels.split(", ")[0] == "k8s_cluster", f"{name}: {keyword} ({labels})"


def test_a_custom_config_gives_every_alert_its_runbook_address(tmp_path):
    for path in write_rules(CUSTOM, tmp_path):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    assert rule["annotations"]["runbook_url"] == f"https://wiki.example/gpu/{rule['alert']}"


UNIT_TEST = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  # the custom selector picks job gpu-nodes; the same GPU under another job is not read
  - interval: 1m
    input_series:
      - series: 'gpu_up{{job="gpu-nodes",k8s_cluster="east",instance="n1:9842",gpu="0",uuid="GPU-1"}}'
        values: '0x5'
      - series: 'gpu_up{{job="gpulens",k8s_cluster="east",instance="n2:9842",gpu="0",uuid="GPU-2"}}'
        values: '0x5'
    alert_rule_test:
      - eval_time: 2m
        alertname: GPULost
        exp_alerts:
          - exp_labels: {{severity: critical, scope: gpu, class: availability, remediate: isolate_node,
                         recovery: reboot_node, job: gpu-nodes, k8s_cluster: east, instance: "n1:9842",
                         gpu: "0", uuid: GPU-1}}
            exp_annotations:
              summary: "A GPU stopped answering NVML."
              description: >-
                GPU 0 (GPU-1) on n1:9842 has been lost or unreadable for 30 seconds (its NVML calls
                fail or time out). A lost GPU needs a node reboot; check the kernel log for Xid 79.
              runbook_url: "https://wiki.example/gpu/GPULost"
  # two clusters with the same node name stay two nodes in the per-node recording rules
  - interval: 1m
    input_series:
      - series: 'gpu_info{{job="gpu-nodes",k8s_cluster="east",instance="n1:9842",gpu="0",uuid="GPU-1"}}'
        values: '1x5'
      - series: 'gpu_info{{job="gpu-nodes",k8s_cluster="east",instance="n1:9842",gpu="1",uuid="GPU-2"}}'
        values: '1x5'
      - series: 'gpu_info{{job="gpu-nodes",k8s_cluster="west",instance="n1:9842",gpu="0",uuid="GPU-3"}}'
        values: '1x5'
    promql_expr_test:
      - expr: instance:gpu_gpus:count
        eval_time: 2m
        exp_samples:
          - labels: 'instance:gpu_gpus:count{{job="gpu-nodes",k8s_cluster="east",instance="n1:9842"}}'
            value: 2
          - labels: 'instance:gpu_gpus:count{{job="gpu-nodes",k8s_cluster="west",instance="n1:9842"}}'
            value: 1
"""


@promtool
def test_rules_built_with_a_custom_config_alert_on_its_jobs_and_keep_clusters_apart(tmp_path):
    paths = write_rules(CUSTOM, tmp_path)
    test_file = tmp_path / "custom_test.yml"
    test_file.write_text(UNIT_TEST.format(rules=", ".join(p.name for p in paths)))
    result = subprocess.run(
        ["promtool", "test", "rules", test_file.name], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_default_build_reads_scraped_series_through_the_default_selectors():
    files = [*rules.RULE_FILES, rules.ANALYZER_RULE_FILE]
    for name, expr in exprs([build.ALERTS_DIR / f for f in files]).items():
        for series, rest in scraped_series_uses(expr):
            wanted = (
                DEFAULT.remediate_selector if series.startswith("gpulens_remediate_") else DEFAULT.selector
            )
            assert rest.startswith("{" + wanted), f"{name}: {series}{rest}"


def test_an_alert_without_the_runbook_marker_is_refused():
    source = (rules.SOURCE_DIR / "gpu_alerts.yml").read_text()
    broken = source.replace("runbook_url: RUNBOOK_URL", "runbook_url: https://elsewhere/x", 1)
    with pytest.raises(RuleRenderError, match=r"annotations\.runbook_url must be RUNBOOK_URL"):
        render_text(broken, DEFAULT, "gpu_alerts.yml")


def test_a_folded_expression_is_refused_with_its_line():
    text = "groups:\n  - name: g\n    rules:\n      - record: a:b:c\n        expr: >\n          x\n"
    with pytest.raises(RuleRenderError, match=re.escape("line 5: write expressions as | blocks")):
        render_text(text, DEFAULT, "x.yml")


def test_a_single_line_expression_is_scoped_and_stays_valid_yaml():
    text = "groups:\n  - name: g\n    rules:\n      - record: a:b:c\n        expr: x > 0\n"
    rendered = yaml.safe_load(render_text(text, CUSTOM, "x.yml"))
    assert rendered["groups"][0]["rules"][0]["expr"] == 'x{job="gpu-nodes"} > 0'
