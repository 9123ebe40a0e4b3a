"""The GPU catalog: the data-centre and inference models people run, with MIG tables that place."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.analyzer.validate import device_plugin as dp
from gpulens.catalog import MODELS, CatalogError, get_model, model_for_nvml_name, model_for_pci_device_id
from gpulens.migplacement import place_mig_layout

# issue 16 item 9: each is known by the name people use
COMMON_NAMES = {
    "L4": "L4-24GB",
    "L40S": "L40S-48GB",
    "RTX6000-ADA": "RTX6000-ADA-48GB",
    "A10": "A10-24GB",
    "A10G": "A10G-24GB",
    "T4": "T4-16GB",
    "V100": "V100-SXM2-16GB",
    "A40": "A40-48GB",
    "H100-PCIE": "H100-PCIE-80GB",
    "H100-NVL": "H100-94GB-NVL",
    "H20": "H20-96GB",
    "GH200": "GH200-96GB",
    "B300": "B300-288GB",
}

# mig-parted's default `all-balanced` geometry per model (2 x 1g + 2g + 3g): it must place
BALANCED = {
    "A100-SXM4-40GB": ("1g.5gb", "2g.10gb", "3g.20gb"),
    "A100-80GB": ("1g.10gb", "2g.20gb", "3g.40gb"),
    "H100-80GB": ("1g.10gb", "2g.20gb", "3g.40gb"),
    "H100-PCIE-80GB": ("1g.10gb", "2g.20gb", "3g.40gb"),
    "H100-94GB-NVL": ("1g.12gb", "2g.24gb", "3g.47gb"),
    "H20-96GB": ("1g.12gb", "2g.24gb", "3g.48gb"),
    "GH200-96GB": ("1g.12gb", "2g.24gb", "3g.48gb"),
    "GH200-144GB": ("1g.18gb", "2g.36gb", "3g.72gb"),
    "H200-141GB": ("1g.18gb", "2g.35gb", "3g.71gb"),
    "B200-180GB": ("1g.23gb", "2g.45gb", "3g.90gb"),
    "B300-288GB": ("1g.34gb", "2g.67gb", "3g.135gb"),
}


@pytest.mark.parametrize(("name", "key"), sorted(COMMON_NAMES.items()))
def test_the_models_people_run_are_known_by_their_common_names(name, key):
    model = get_model(name)
    assert model.key == key
    assert model_for_nvml_name(model.nvml_name) is model


def test_a_model_is_found_by_key_nvml_name_or_alias_whatever_the_case_and_spaces():
    for key, model in MODELS.items():
        assert get_model(f" {key.lower()} ") is model
        assert get_model(model.nvml_name.upper()) is model
    with pytest.raises(CatalogError, match="unknown GPU model 'H1000'"):
        get_model("H1000")


@pytest.mark.parametrize(("key", "profiles"), sorted(BALANCED.items()))
def test_mig_parteds_balanced_geometry_places_on_every_seven_slice_model(key, profiles):
    small, medium, large = profiles
    model = MODELS[key]
    placed = place_mig_layout(model, [(small, None), (small, None), (medium, None), (large, None)])
    assert sum(p.profile.compute_slices for p in placed) == 7


def test_models_without_mig_say_so():
    for key in (
        "L4-24GB",
        "L40S-48GB",
        "RTX6000-ADA-48GB",
        "A10-24GB",
        "A10G-24GB",
        "T4-16GB",
        "V100-SXM2-16GB",
        "A40-48GB",
    ):
        model = MODELS[key]
        assert not model.mig_capable
        with pytest.raises(CatalogError, match="does not support MIG"):
            place_mig_layout(model, [("1g.5gb", None)])


def test_pci_device_ids_and_nvml_names_identify_one_model_each():
    assert len({m.pci_device_id for m in MODELS.values()}) == len(MODELS)
    assert len({m.nvml_name.lower() for m in MODELS.values()}) == len(MODELS)
    for model in MODELS.values():
        assert model_for_pci_device_id(model.pci_device_id) is model
    assert model_for_pci_device_id(0x12345678) is None


def test_the_device_plugin_caps_volta_mps_at_16_clients_and_newer_gpus_at_48():
    assert dp.mps_max_clients(MODELS["V100-SXM2-16GB"].cuda_compute_capability) == 16
    assert dp.mps_max_clients(MODELS["T4-16GB"].cuda_compute_capability) == 48
    assert all(m.mps_max_clients == 48 for m in MODELS.values())


@given(st.sampled_from(sorted(k for k, m in MODELS.items() if m.mig_capable)))
def test_no_mig_slice_is_much_larger_than_its_share_of_the_gpu(key):
    model = MODELS[key]
    for profile in model.mig_profiles:
        share = model.memory_bytes * profile.memory_slices / model.memory_slices
        assert profile.memory_bytes <= 1.01 * share, profile.name  # NVIDIA's tables: up to 0.3 % over
        assert 0 < profile.sm_count <= model.sm_count, profile.name


@given(st.sampled_from(sorted(MODELS)))
def test_every_model_has_the_numbers_rightsizing_needs(key):
    model = MODELS[key]
    assert model.sm_count > 0 and model.memory_bytes > 0
    assert model.memory_bandwidth_bytes_per_second > 0 and model.max_sm_clock_mhz > 0
    assert 0 < model.idle_power_watts < model.power_limit_watts


def test_a_node_of_a_new_model_simulates_and_gets_advice(tmp_path):
    """End to end on an L4 node: the simulator serves it and the analyzer sizes its jobs."""
    from gpulens.analyzer.history import read_history
    from gpulens.analyzer.pipeline import analyze_history
    from gpulens.analyzer.thresholds import load_thresholds
    from gpulens.sim.history import simulate
    from gpulens.sim.scenariofile import BUILTIN_DIR

    text = (BUILTIN_DIR / "seed-case.yaml").read_text()
    scenario = tmp_path / "l4.yaml"
    scenario.write_text(text.replace("A100-SXM4-40GB", "L4").replace("name: seed-case", "name: l4-node"))
    simulate(str(scenario), duration_s=1800, out=tmp_path / "h", step_s=120, seed=0)
    analysis = analyze_history(read_history(tmp_path / "h"), load_thresholds(), with_archetypes=False)
    assert set(analysis.recs["gpu_model"]) == {"L4-24GB"}
    assert "insufficient-data" not in set(analysis.recs["recommendation"])
    assert "Type=nvidia_l4 " in analysis.emitted.files["gres.conf"]
