"""Reading a mixin config: defaults for absent keys, one-line errors naming the field."""

from __future__ import annotations

import pytest

from gpulens.promscope.config import DEFAULT, MAX_CONFIG_BYTES, ConfigError, MixinConfig, load


def write(tmp_path, text: str):
    path = tmp_path / "mixin.yaml"
    path.write_text(text)
    return path


def test_absent_keys_keep_their_defaults(tmp_path):
    config = load(write(tmp_path, 'selector: job="gpu"\n'))
    assert config == MixinConfig(selector='job="gpu"', cluster_label=DEFAULT.cluster_label)


def test_an_empty_file_is_the_default(tmp_path):
    assert load(write(tmp_path, "")) == DEFAULT


def test_the_runbook_pattern_takes_the_alert_name():
    config = MixinConfig(runbook_url_pattern="https://wiki/gpu/%s")
    assert config.runbook_url("GPULost") == "https://wiki/gpu/GPULost"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("selektor: x\n", "unknown key 'selektor'"),
        ("selector: 3\n", "selector: expected a string"),
        ("selector: up == 0\n", "selector: .*expected label matchers"),
        ('selector: job="a" namespace="b"\n', "matchers must be separated by commas"),
        ("remediateSelector: up == 0\n", "remediateSelector: .*expected label matchers"),
        ("clusterLabel: ''\n", "clusterLabel: expected a label name"),
        ("clusterLabel: __name__\n", "clusterLabel: label name"),
        ("clusterLabel: k8s-cluster\n", "clusterLabel: label name"),
        (
            "runbookURLPattern: https://wiki/gpu/\n",
            "runbookURLPattern: expected one address with exactly one %s",
        ),
        ("- a\n", "expected a mapping"),
        ("selector: [\n", "not valid YAML"),
    ],
)
def test_a_bad_config_is_one_line_naming_the_field(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message) as caught:
        load(write(tmp_path, text))
    assert "\n" not in str(caught.value)
    assert str(tmp_path / "mixin.yaml") in str(caught.value)


def test_an_oversized_config_is_refused_before_parsing(tmp_path):
    with pytest.raises(ConfigError, match="larger than"):
        load(write(tmp_path, "#" * (MAX_CONFIG_BYTES + 1)))


def test_a_missing_config_says_it_cannot_be_read(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "absent.yaml")


def test_every_key_is_read_under_its_kube_prometheus_style_name(tmp_path):
    text = (
        "selector: 'job=\"e\"'\nremediateSelector: 'job=\"r\"'\nclusterLabel: k8s_cluster\n"
        "runbookURLPattern: https://wiki/%s\n"
    )
    assert load(write(tmp_path, text)) == MixinConfig(
        selector='job="e"',
        remediate_selector='job="r"',
        cluster_label="k8s_cluster",
        runbook_url_pattern="https://wiki/%s",
    )
