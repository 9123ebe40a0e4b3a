"""The mig-parted validator: mig-parted's spec rules plus the catalog's MIG tables."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.analyzer.validate import mig_parted
from gpulens.catalog import get_model

H100 = get_model("H100-80GB")


def spec(*entries, name="c"):
    return {"version": "v1", "mig-configs": {name: list(entries)}}


def entry(devices="all", enabled=True, **mig):
    out = {"devices": devices, "mig-enabled": enabled}
    if mig or enabled:
        out["mig-devices"] = mig
    return out


def messages(doc, **kw):
    return [p.message for p in mig_parted.validate_spec(doc, "mp.yaml", **kw)]


def test_a_balanced_h100_layout_passes():
    doc = spec(
        {"device-filter": ["0x233010DE"], **entry([0, 1], **{"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})}
    )
    assert messages(doc) == []


def test_mig_disabled_devices_pass():
    assert messages(spec({"devices": "all", "mig-enabled": False})) == []


def test_the_version_is_required():
    assert messages({"mig-configs": {"c": [entry(**{"1g.10gb": 1})]}}) == ["missing 'version' field"]


def test_an_empty_config_is_rejected():
    assert messages({"version": "v1", "mig-configs": {"c": []}}) == ["at least one entry is required"]


def test_unexpected_fields_are_rejected_as_mig_parted_rejects_them():
    doc = spec({**entry(**{"1g.10gb": 1}), "mig_enabled": True})
    assert messages(doc) == ["unexpected field"]


def test_devices_and_mig_enabled_are_required():
    assert sorted(messages(spec({"mig-devices": {"1g.10gb": 1}}))) == [
        "missing required field",
        "missing required field",
    ]


def test_devices_is_all_or_indices():
    assert messages(spec(entry(devices="some", enabled=False))) == ["must be 'all' or a list of GPU indices"]


def test_mig_devices_on_a_disabled_entry_are_rejected():
    doc = spec({"devices": "all", "mig-enabled": False, "mig-devices": {"1g.10gb": 1}})
    assert messages(doc) == ["MIG devices included when 'mig-enabled' is false"]


def test_all_counts_zero_is_rejected():
    assert messages(spec(entry(**{"1g.10gb": 0}))) == ["all counts for all MIG profiles are 0"]


def test_a_malformed_profile_name_is_rejected():
    assert "not a MIG profile name" in messages(spec(entry(**{"3g40gb": 1})))[0]


def test_a_profile_the_model_does_not_have_is_rejected():
    doc = spec(entry(**{"1g.5gb": 1}))
    assert "does not exist on H100-80GB" in messages(doc, models={"c": H100})[0]


def test_the_device_filter_names_the_model():
    doc = spec({"device-filter": "0x20B010DE", **entry(**{"1g.10gb": 1})})  # the double-memory 1g
    assert messages(doc) == []
    doc = spec({"device-filter": "0x20B010DE", **entry(**{"1g.20gb": 1})})
    assert "does not exist on A100-SXM4-40GB" in messages(doc)[0]


def test_more_instances_than_the_profile_allows_are_rejected():
    assert "exceeds the maximum of 4" in messages(spec(entry(**{"1g.20gb": 5})), models={"c": H100})[0]


def test_a_layout_whose_instances_cannot_be_placed_together_is_rejected():
    # compute fits (3 + 3 + 1 = 7) but two 3g instances take all 8 memory slices
    assert messages(spec(entry(**{"4g.40gb": 1, "3g.40gb": 1})), models={"c": H100}) == []
    found = messages(spec(entry(**{"3g.40gb": 2, "1g.10gb": 1})), models={"c": H100})
    assert found and "does not fit" in found[0]


def test_device_indices_must_exist_on_the_node():
    doc = spec(entry([0, 8], enabled=False))
    assert messages(doc, gpu_counts={"c": 8}) == ["index out of range: the node has 8 GPU(s)"]


def test_a_device_configured_by_two_entries_is_rejected():
    doc = spec(entry([0, 1], **{"7g.80gb": 1}), entry([1], enabled=False))
    assert messages(doc, models={"c": H100}) == ["a device is configured by two entries"]


def test_text_that_is_not_yaml_is_one_problem():
    assert [p.message[:8] for p in mig_parted.validate_text("a: [", "mp.yaml")] == ["not YAML"]


@given(st.lists(st.sampled_from([p.name for p in H100.mig_profiles]), min_size=1, max_size=7))
def test_whatever_the_catalog_places_mig_parted_accepts(profiles):
    from gpulens.catalog import CatalogError
    from gpulens.migplacement import place_mig_layout

    try:
        place_mig_layout(H100, [(p, None) for p in profiles])
    except CatalogError:
        return
    counts = {p: profiles.count(p) for p in set(profiles)}
    assert messages(spec(entry(**counts)), models={"c": H100}) == []


@pytest.mark.parametrize("profile", ["1g.10gb", "1g.10gb+me", "2c.3g.40gb", "1g.24gb+me.all", "1g.24gb-me"])
def test_profile_names_of_mig_parted_forms_parse(profile):
    assert mig_parted._PROFILE.match(profile)
