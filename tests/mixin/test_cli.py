"""`gpulens mixin build`: a user's config in, rules and dashboards carrying it out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from gpulens.cli import main

REPO = Path(__file__).resolve().parents[2]

CONFIG = """\
selector: 'namespace="gpu-monitoring"'
clusterLabel: k8s_cluster
runbookURLPattern: 'https://wiki.example/gpu/%s'
"""


def test_build_with_a_config_writes_rules_and_dashboards_that_carry_it(tmp_path, capsys):
    config = tmp_path / "my.yaml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    assert main(["mixin", "build", "--config", str(config), "--out", str(out)]) == 0
    alerts = yaml.safe_load((out / "rules" / "gpu_alerts.yml").read_text())
    lost = next(r for g in alerts["groups"] for r in g["rules"] if r.get("alert") == "GPULost")
    assert lost["expr"] == 'gpu_up{namespace="gpu-monitoring"} == 0'
    assert lost["annotations"]["runbook_url"] == "https://wiki.example/gpu/GPULost"
    fleet = json.loads((out / "dashboards" / "gpulens-fleet.json").read_text())
    variables = {v["name"]: v for v in fleet["templating"]["list"]}
    assert variables["cluster"]["query"] == 'label_values(gpu_info{namespace="gpu-monitoring"}, k8s_cluster)'
    exprs = [t["expr"] for p in fleet["panels"] for t in p.get("targets", [])]
    assert exprs and all('k8s_cluster=~"$cluster"' in e for e in exprs)
    scoped = [e for e in exprs if 'job=~"$job"' in e]
    assert len(scoped) > len(exprs) / 2
    assert all(e.count('job=~"$job"') == e.count('namespace="gpu-monitoring", job=~"$job"') for e in scoped)
    assert f"wrote {out / 'rules' / 'gpu_alerts.yml'}" in capsys.readouterr().out


def test_check_of_a_fresh_build_finds_nothing_stale(tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text(CONFIG)
    args = ["mixin", "build", "--config", str(config), "--out", str(tmp_path / "out")]
    assert main(args) == 0
    assert main([*args, "--check"]) == 0


def test_a_custom_config_never_overwrites_the_committed_files(tmp_path, capsys):
    config = tmp_path / "my.yaml"
    config.write_text(CONFIG)
    assert main(["mixin", "build", "--config", str(config)]) == 2
    assert "pass --out DIR" in capsys.readouterr().err


def test_a_bad_config_is_one_line_and_exit_2(tmp_path, capsys):
    config = tmp_path / "my.yaml"
    config.write_text("clusterLabel: 1\n")
    assert main(["mixin", "build", "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "clusterLabel: expected a string" in err


def test_build_writes_every_runbook_quoting_the_config_s_rule(tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    assert main(["mixin", "build", "--config", str(config), "--out", str(out)]) == 0
    shipped = {p.name for p in (REPO / "alerts" / "runbooks").glob("*.md")}
    assert {p.name for p in (out / "runbooks").glob("*.md")} == shipped
    lost = (out / "runbooks" / "GPULost.md").read_text()
    assert '```promql\ngpu_up{namespace="gpu-monitoring"} == 0\n```' in lost


def without_grafanalib(monkeypatch) -> None:
    """As in an install without the dashboards extra: importing grafanalib fails."""
    monkeypatch.delitem(sys.modules, "gpulens.dashboards.build", raising=False)
    for name in ("grafanalib", "grafanalib._gen", "grafanalib.core"):
        monkeypatch.setitem(sys.modules, name, None)


def test_without_grafanalib_the_default_config_gets_the_shipped_dashboards(tmp_path, monkeypatch):
    without_grafanalib(monkeypatch)
    out = tmp_path / "out"
    assert main(["mixin", "build", "--out", str(out)]) == 0
    committed = {p.name: p.read_text() for p in (REPO / "dashboards" / "json").glob("*.json")}
    assert {p.name: p.read_text() for p in (out / "dashboards").glob("*.json")} == committed
    assert (out / "rules" / "gpu_alerts.yml").read_text() == (REPO / "alerts" / "gpu_alerts.yml").read_text()


def test_without_grafanalib_another_config_gets_its_rules_and_one_line_about_dashboards(
    tmp_path, monkeypatch, capsys
):
    without_grafanalib(monkeypatch)
    config = tmp_path / "my.yaml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    assert main(["mixin", "build", "--config", str(config), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'gpulens[dashboards]'" in err
    assert (out / "rules" / "gpu_alerts.yml").is_file() and (out / "runbooks" / "GPULost.md").is_file()
    assert not (out / "dashboards").exists()
