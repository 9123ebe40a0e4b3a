"""What a report's device-plugin files make of one node's sharing, read back as the plugin reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpulens.analyzer.emit import CONFIGMAP_FILE, LABELS_FILE, configmap_text, labels_text
from gpulens.analyzer.pluginsharing import PluginSharing
from gpulens.sim.nodesharing import NodeSharingError, SelectedConfig, read_node_sharing


def _config(kind: str | None, replicas: int = 4) -> dict[str, Any]:
    doc: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "none"}}
    if kind is not None:
        block = {
            "failRequestsGreaterThanOne": True,
            "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}],
        }
        doc["sharing"] = {kind: block}
    return doc


def _report(tmp_path: Path, configs: dict[str, dict[str, Any]], chosen: dict[str, str]) -> Path:
    config = tmp_path / "config"
    config.mkdir()
    (config / CONFIGMAP_FILE).write_text(configmap_text(configs))
    (config / LABELS_FILE).write_text(labels_text(chosen, {}))
    return config


def test_an_mps_config_gives_each_client_100_over_replicas_percent_of_the_threads(tmp_path):
    config = _report(tmp_path, {"gpulens-mps-3": _config("mps", 3)}, {"node-a": "gpulens-mps-3"})
    found = read_node_sharing(config, "node-a")
    assert found == SelectedConfig("gpulens-mps-3", PluginSharing.MPS, 3)
    assert found is not None and found.thread_percentage == 33  # the plugin's integer division


def test_a_time_slicing_config_is_read_as_time_slicing(tmp_path):
    config = _report(tmp_path, {"gpulens-ts-2": _config("timeSlicing", 2)}, {"node-a": "gpulens-ts-2"})
    assert read_node_sharing(config, "node-a") == SelectedConfig(
        "gpulens-ts-2", PluginSharing.TIME_SLICING, 2
    )


def test_a_config_without_sharing_shares_nothing(tmp_path):
    config = _report(tmp_path, {"gpulens-none": _config(None)}, {"node-a": "gpulens-none"})
    assert read_node_sharing(config, "node-a") == SelectedConfig("gpulens-none", PluginSharing.EXCLUSIVE, 1)


def test_each_node_reads_the_config_its_own_label_selects(tmp_path):
    configs = {"gpulens-mps-2": _config("mps", 2), "gpulens-ts-4": _config("timeSlicing", 4)}
    config = _report(tmp_path, configs, {"node-a": "gpulens-mps-2", "node-b": "gpulens-ts-4"})
    found = {host: read_node_sharing(config, host) for host in ("node-a", "node-b")}
    assert {h: (s.sharing, s.replicas) for h, s in found.items() if s} == {
        "node-a": (PluginSharing.MPS, 2),
        "node-b": (PluginSharing.TIME_SLICING, 4),
    }


def test_a_node_the_report_does_not_label_keeps_what_it_runs(tmp_path):
    config = _report(tmp_path, {"gpulens-mps-2": _config("mps", 2)}, {"node-a": "gpulens-mps-2"})
    assert read_node_sharing(config, "node-b") is None


def test_a_report_without_device_plugin_files_changes_no_node(tmp_path):
    assert read_node_sharing(tmp_path, "node-a") is None


@pytest.mark.parametrize(
    ("breaks", "message"),
    [
        (
            "no-configmap",
            f"{CONFIGMAP_FILE}: expected the ConfigMap {LABELS_FILE} selects 'gpulens-mps-2' from",
        ),
        ("missing-key", "data.gpulens-mps-2: expected the config node-labels.sh selects for node-a"),
        ("bad-replicas", "data.gpulens-mps-2.sharing.mps.resources: expected resources with replicas >= 1"),
        ("bad-yaml", f"{CONFIGMAP_FILE}: expected valid YAML"),
        ("bad-shell", f"{LABELS_FILE}: line 5: expected shell words"),
    ],
)
def test_unreadable_files_get_one_line_errors_naming_them(tmp_path, breaks, message):
    config = _report(tmp_path, {"gpulens-mps-2": _config("mps", 2)}, {"node-a": "gpulens-mps-2"})
    configmap, labels = config / CONFIGMAP_FILE, config / LABELS_FILE
    if breaks == "no-configmap":
        configmap.unlink()
    elif breaks == "missing-key":
        configmap.write_text(configmap_text({"other": _config("mps", 2)}))
    elif breaks == "bad-replicas":
        configmap.write_text(configmap_text({"gpulens-mps-2": _config("mps", 0)}))
    elif breaks == "bad-yaml":
        configmap.write_text("data: [")
    else:
        labels.write_text(labels.read_text() + "kubectl label node 'node-a\n")
    with pytest.raises(NodeSharingError) as err:
        read_node_sharing(config, "node-a")
    assert message in str(err.value) and "\n" not in str(err.value)
