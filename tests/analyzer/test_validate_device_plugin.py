"""The device-plugin validator enforces the NVIDIA k8s-device-plugin's own config rules."""

from __future__ import annotations

import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpulens.analyzer.validate import device_plugin as dp


def ts(replicas=4, **extra):
    block = {
        "failRequestsGreaterThanOne": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}],
    }
    block.update(extra)
    return {"version": "v1", "sharing": {"timeSlicing": block}}


def mps(replicas=4, name="nvidia.com/gpu"):
    return {"version": "v1", "sharing": {"mps": {"resources": [{"name": name, "replicas": replicas}]}}}


def messages(config, **kw):
    return [p.message for p in dp.validate_config(config, "f.yaml", **kw)]


def test_a_time_slicing_config_as_the_plugin_documents_it_passes():
    assert dp.validate_config(ts(), "f.yaml") == []


def test_an_mps_config_for_full_gpus_passes():
    assert dp.validate_config(mps(), "f.yaml") == []


def test_a_config_without_sharing_passes():
    assert dp.validate_config({"version": "v1", "flags": {"migStrategy": "mixed"}}, "f.yaml") == []


def test_one_replica_is_refused_as_the_plugin_refuses_it():
    assert messages(ts(replicas=1)) == ["number of replicas must be >= 2, got 1"]


def test_replicas_must_be_an_integer():
    assert "must be an integer" in messages(ts(replicas="4"))[0]


def test_a_sharing_block_needs_resources():
    config = {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True}}}
    assert messages(config) == ["no resources specified"]


def test_a_resource_needs_replicas():
    config = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu"}]}}}
    assert messages(config) == ["no replicas specified"]


def test_unknown_fields_are_rejected_because_the_plugin_would_silently_ignore_them():
    config = ts()
    config["sharing"]["timeSlicing"]["failRequestGreaterThanOne"] = True  # typo
    problems = dp.validate_config(config, "f.yaml")
    assert [p.where for p in problems] == ["sharing.timeSlicing.failRequestGreaterThanOne"]


def test_flags_must_be_booleans():
    assert messages(ts(renameByDefault="yes")) == ["must be true or false"]


def test_only_version_v1_exists():
    config = ts()
    config["version"] = "v2"
    assert messages(config) == ["unknown version 'v2'; expected v1"]


def test_mps_and_time_slicing_together_is_rejected():
    config = ts()
    config["sharing"]["mps"] = mps()["sharing"]["mps"]
    assert any("uses mps and ignores timeSlicing" in m for m in messages(config))


def test_mps_does_not_share_mig_devices():
    assert "MPS shares full GPUs only" in messages(mps(name="nvidia.com/mig-1g.10gb"))[0]


def test_mps_is_not_supported_with_the_mixed_mig_strategy():
    config = mps()
    config["flags"] = {"migStrategy": "mixed"}
    assert messages(config) == ["MPS is not supported with migStrategy mixed"]


def test_mps_replicas_are_capped_by_the_client_limit():
    assert messages(mps(replicas=49)) == ["49 exceeds the MPS client limit of 48"]
    assert messages(mps(replicas=17), max_mps_clients=dp.mps_max_clients((7, 0))) == [
        "17 exceeds the MPS client limit of 16"
    ]


def test_device_lists_are_rejected_because_the_plugin_ignores_them():
    config = ts()
    config["sharing"]["timeSlicing"]["resources"][0]["devices"] = [0, 1]
    assert messages(config) == ["only 'all' is honoured (the plugin ignores other device lists)"]


def test_resource_names_must_be_valid_kubernetes_names():
    assert "DNS subdomain" in dp.resource_name_problem("nvidia.com/GPU_big")
    assert "longer than 63" in dp.resource_name_problem("x" * 60)
    assert dp.resource_name_problem("gpu") is None


def test_a_client_planned_above_the_equal_thread_split_is_reported():
    found = dp.mps_client_problems("f", "node-1", 2, [("a", 60), ("b", 30)])
    assert len(found) == 1 and "job a is planned at 60 %" in found[0].message
    assert dp.mps_client_problems("f", "node-1", 2, [("a", 50), ("b", 50)]) == []


@given(replicas=st.integers(min_value=2, max_value=48), kind=st.sampled_from(["mps", "ts"]))
def test_every_replica_count_the_plugin_accepts_validates(replicas, kind):
    config = mps(replicas) if kind == "mps" else ts(replicas)
    assert dp.validate_config(config, "f.yaml") == []


@given(replicas=st.integers(max_value=1))
def test_no_replica_count_below_two_validates(replicas):
    assert dp.validate_config(ts(replicas), "f.yaml") != []


def configmap(data):
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpulens-configs"},
        "data": {k: yaml.safe_dump(v) for k, v in data.items()},
    }
    return yaml.safe_dump(doc)


def test_a_configmap_holds_one_config_per_key():
    problems, configs = dp.validate_configmap(configmap({"ts-4": ts(), "mps-2": mps(2)}), "cm.yaml")
    assert problems == [] and set(configs) == {"ts-4", "mps-2"}


def test_a_configmap_key_whose_config_is_invalid_is_reported_with_its_key():
    problems, _ = dp.validate_configmap(configmap({"ts-1": ts(1)}), "cm.yaml")
    assert [p.where for p in problems] == ["data.ts-1.sharing.timeSlicing.resources[0].replicas"]


def test_a_configmap_key_must_be_usable_as_a_label_value():
    problems, _ = dp.validate_configmap(configmap({"-bad": ts()}), "cm.yaml")
    assert "label" in problems[0].message


def test_a_file_that_maps_names_to_configs_is_not_a_configmap():
    problems, _ = dp.validate_configmap(yaml.safe_dump({"group-1": ts()}), "cm.yaml")
    assert "apiVersion: v1 and kind: ConfigMap" in problems[0].message


def test_node_labels_must_select_an_existing_key_on_a_known_node():
    text = (
        "kubectl label node n1 nvidia.com/device-plugin.config=ts-4 --overwrite\n"
        "kubectl label node n2 nvidia.com/device-plugin.config=nope --overwrite\n"
        "kubectl label node ghost nvidia.com/device-plugin.config=ts-4 --overwrite\n"
    )
    problems = dp.validate_node_labels(text, "labels.sh", {"ts-4": ts()}, ["n1", "n2"])
    assert [p.where for p in problems] == ["line 2", "line 3"]
