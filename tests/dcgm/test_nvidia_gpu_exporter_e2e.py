"""End to end: nvidia_gpu_exporter's Grafana dashboard 14574 works on `--compat nvidia_gpu_exporter`.

A real Prometheus scrapes two `gpulens-exporter --simulate <node> --compat nvidia_gpu_exporter` (an
HGX H100 node: GPU 0 in MIG mode, GPU 1 whole, with an Xid; a workstation with an actively cooled
RTX 6000 Ada); the dashboard's template variables are resolved as Grafana resolves them
(`label_values` for job and node, the `query_result` regex for the GPU), and every panel query,
verbatim, must return data: on each whole GPU every panel but the MIG ones (the fan only where the
board has one), and the MIG ones on the MIG GPU.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.procs import PROMETHEUS_ENGINES, PromAPI, exporter, prometheus, use_prometheus

# utkuozdemir/nvidia_gpu_exporter docs/grafana/dashboard.json (grafana.com 14574) at commit
# e656cd81a180e7e0e7862b53c9acd4c2fb0f590b: every target's expr, verbatim, in panel order
DASHBOARD_EXPRESSIONS = (
    'nvidia_smi_gpu_recovery_action{uuid="$gpu", instance="$node", job="$job"}',
    '(sum by(uuid) (nvidia_smi_clocks_event_reasons_sw_power_cap{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_clocks_throttle_reasons_sw_power_cap{uuid="$gpu", instance="$node", job="$job"}) or (sum by(uuid) (nvidia_smi_gpu_info{uuid="$gpu", instance="$node", job="$job"}) * 0)) + (sum by(uuid) (nvidia_smi_clocks_event_reasons_sw_thermal_slowdown{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_clocks_throttle_reasons_sw_thermal_slowdown{uuid="$gpu", instance="$node", job="$job"}) or (sum by(uuid) (nvidia_smi_gpu_info{uuid="$gpu", instance="$node", job="$job"}) * 0)) + (sum by(uuid) (nvidia_smi_clocks_event_reasons_hw_thermal_slowdown{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_clocks_throttle_reasons_hw_thermal_slowdown{uuid="$gpu", instance="$node", job="$job"}) or (sum by(uuid) (nvidia_smi_gpu_info{uuid="$gpu", instance="$node", job="$job"}) * 0)) + (sum by(uuid) (nvidia_smi_clocks_event_reasons_hw_power_brake_slowdown{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_clocks_throttle_reasons_hw_power_brake_slowdown{uuid="$gpu", instance="$node", job="$job"}) or (sum by(uuid) (nvidia_smi_gpu_info{uuid="$gpu", instance="$node", job="$job"}) * 0))',  # noqa: E501
    'sum by(uuid) (nvidia_smi_ecc_errors_uncorrected_aggregate_total{uuid="$gpu", instance="$node", job="$job"}) or sum by(uuid) ({__name__=~"nvidia_smi_ecc_errors_uncorrected_aggregate_.+", uuid="$gpu", instance="$node", job="$job"})',  # noqa: E501
    'nvidia_smi_pstate{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_gpu_info{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_compute_mode{uuid="$gpu", instance="$node", job="$job"}',
    'sum(nvidia_smi_utilization_gpu_ratio{uuid="$gpu", instance="$node", job="$job"}) or sum(nvidia_smi_gpu_info{uuid="$gpu", instance="$node", job="$job"}) * 0 - 1',  # noqa: E501
    'nvidia_smi_power_draw_watts{uuid="$gpu", instance="$node", job="$job"} / (nvidia_smi_enforced_power_limit_watts{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_power_limit_watts{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_power_default_limit_watts{uuid="$gpu", instance="$node", job="$job"})',  # noqa: E501
    'sum(nvidia_smi_fan_speed_ratio{uuid="$gpu", instance="$node", job="$job"}) or sum(nvidia_smi_gpu_info{uuid="$gpu", instance="$node", job="$job"}) * 0 - 1',  # noqa: E501
    'nvidia_smi_temperature_gpu{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_clocks_current_graphics_clock_hz{uuid="$gpu", instance="$node", job="$job"} / nvidia_smi_clocks_max_graphics_clock_hz{uuid="$gpu", instance="$node", job="$job"}',  # noqa: E501
    'nvidia_smi_clocks_current_memory_clock_hz{uuid="$gpu", instance="$node", job="$job"} / nvidia_smi_clocks_max_memory_clock_hz{uuid="$gpu", instance="$node", job="$job"}',  # noqa: E501
    'nvidia_smi_memory_used_bytes{uuid="$gpu", instance="$node", job="$job"} / nvidia_smi_memory_total_bytes{uuid="$gpu", instance="$node", job="$job"}',  # noqa: E501
    'sum(nvidia_smi_utilization_memory_ratio{uuid="$gpu", instance="$node", job="$job"}) or sum(nvidia_smi_gpu_info{uuid="$gpu", instance="$node", job="$job"}) * 0 - 1',  # noqa: E501
    'nvidia_smi_utilization_memory_ratio{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_utilization_gpu_ratio{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_clocks_event_reasons_gpu_idle{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_clocks_throttle_reasons_gpu_idle{uuid="$gpu", instance="$node", job="$job"}',  # noqa: E501
    'nvidia_smi_clocks_event_reasons_sw_power_cap{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_clocks_throttle_reasons_sw_power_cap{uuid="$gpu", instance="$node", job="$job"}',  # noqa: E501
    'nvidia_smi_clocks_event_reasons_sw_thermal_slowdown{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_clocks_throttle_reasons_sw_thermal_slowdown{uuid="$gpu", instance="$node", job="$job"}',  # noqa: E501
    'nvidia_smi_clocks_event_reasons_hw_thermal_slowdown{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_clocks_throttle_reasons_hw_thermal_slowdown{uuid="$gpu", instance="$node", job="$job"}',  # noqa: E501
    'nvidia_smi_clocks_event_reasons_hw_power_brake_slowdown{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_clocks_throttle_reasons_hw_power_brake_slowdown{uuid="$gpu", instance="$node", job="$job"}',  # noqa: E501
    'nvidia_smi_clocks_event_reasons_applications_clocks_setting{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_clocks_throttle_reasons_applications_clocks_setting{uuid="$gpu", instance="$node", job="$job"}',  # noqa: E501
    'nvidia_smi_clocks_event_reasons_sync_boost{uuid="$gpu", instance="$node", job="$job"} or nvidia_smi_clocks_throttle_reasons_sync_boost{uuid="$gpu", instance="$node", job="$job"}',  # noqa: E501
    'nvidia_smi_pstate{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_memory_used_bytes{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_temperature_gpu{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_power_draw_watts{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_fan_speed_ratio{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_clocks_current_graphics_clock_hz{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_clocks_current_video_clock_hz{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_clocks_current_sm_clock_hz{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_clocks_current_memory_clock_hz{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_compute_app_used_memory_bytes{uuid="$gpu", instance="$node", job="$job"} or (nvidia_smi_compute_app_info{uuid="$gpu", instance="$node", job="$job"} * 0)',  # noqa: E501
    '(nvidia_smi_compute_app_used_memory_bytes{uuid="$gpu", instance="$node", job="$job"} or (nvidia_smi_compute_app_info{uuid="$gpu", instance="$node", job="$job"} * 0)) / on(uuid) group_left() nvidia_smi_memory_total_bytes{uuid="$gpu", instance="$node", job="$job"}',  # noqa: E501
    'nvidia_smi_compute_app_used_memory_bytes{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_compute_apps_last_collect_success{instance="$node", job="$job"}',
    'nvidia_smi_fabric_state{uuid="$gpu", instance="$node", job="$job"}',
    'label_replace({__name__=~"nvidia_smi_ecc_errors_uncorrected_.+", uuid="$gpu", instance="$node", job="$job"}, "kind", "$1", "__name__", "nvidia_smi_ecc_errors_uncorrected_(.+)")',  # noqa: E501
    'sum(nvidia_smi_xid_errors_total{uuid="$gpu", instance="$node", job="$job"}) or sum(nvidia_smi_gpu_info{uuid="$gpu", instance="$node", job="$job"}) * 0',  # noqa: E501
    'time() - max(nvidia_smi_xid_last_timestamp_seconds{uuid="$gpu", instance="$node", job="$job"}) or (sum(nvidia_smi_gpu_info{uuid="$gpu", instance="$node", job="$job"}) * 0 - 1)',  # noqa: E501
    'nvidia_smi_xid_errors_total{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_pcie_throughput_tx_bytes_per_second{uuid="$gpu", instance="$node", job="$job"}',
    'nvidia_smi_pcie_throughput_rx_bytes_per_second{uuid="$gpu", instance="$node", job="$job"}',
    'rate(nvidia_smi_energy_joules_total{uuid="$gpu", instance="$node", job="$job"}[$__rate_interval])',
    'nvidia_smi_power_draw_watts{uuid="$gpu", instance="$node", job="$job"}',
    'sum(increase(nvidia_smi_energy_joules_total{uuid="$gpu", instance="$node", job="$job"}[24h])) / 3.6e6',
    '(nvidia_smi_mig_memory_used_bytes{uuid="$gpu", instance="$node", job="$job"}) * on(uuid, gpu_instance_id) group_left(profile) (max by (uuid, gpu_instance_id, profile) (label_replace(nvidia_smi_mig_info{uuid="$gpu", instance="$node", job="$job"}, "profile", "$1", "profile", "^[0-9]+c\\\\.(.*)$")))',  # noqa: E501
    '(nvidia_smi_mig_sm_activity_ratio{uuid="$gpu", instance="$node", job="$job"}) * on(uuid, gpu_instance_id) group_left(profile) (max by (uuid, gpu_instance_id, profile) (label_replace(nvidia_smi_mig_info{uuid="$gpu", instance="$node", job="$job"}, "profile", "$1", "profile", "^[0-9]+c\\\\.(.*)$")))',  # noqa: E501
    '(nvidia_smi_mig_tensor_activity_ratio{uuid="$gpu", instance="$node", job="$job"}) * on(uuid, gpu_instance_id) group_left(profile) (max by (uuid, gpu_instance_id, profile) (label_replace(nvidia_smi_mig_info{uuid="$gpu", instance="$node", job="$job"}, "profile", "$1", "profile", "^[0-9]+c\\\\.(.*)$")))',  # noqa: E501
)
# the same file's templating: job and node by label_values, gpu by query_result and a regex whose
# `value` group is the uuid (Grafana's named-group syntax; `?P` is Python's)
JOB_QUERY = "label_values(nvidia_smi_index,job)"
NODE_QUERY = 'label_values(nvidia_smi_index{job="$job"},instance)'
GPU_QUERY = 'query_result(label_join(label_replace(label_join(nvidia_smi_gpu_info{instance="$node", job="$job"}, "ni", " #", "name", "index"), "us", "($1)", "uuid", "^(........).*"), "gpu_label", " ", "ni", "us"))'  # noqa: E501
GPU_REGEX = r'gpu_label="(?P<text>[^"]+)|uuid="(?P<value>[^"]+)'
# the "Fan Speed %" time series: the HGX's boards are passively cooled (SXM), where nvidia-smi prints
# [N/A] and the peer, like gpulens, serves no series (the "Fan" stat panel shows its -1 "N/A"
# fallback); the workstation's actively cooled board serves it
FAN_SERIES = 'nvidia_smi_fan_speed_ratio{uuid="$gpu", instance="$node", job="$job"}'
RATE_INTERVAL = "1m"  # Grafana's $__rate_interval for a 1 s scrape is at least 4 scrapes: any window >= 4s

SCENARIO = """
name: nvidia-gpu-exporter-e2e
description: an HGX H100 pair, one GPU in MIG mode, an Xid on the other
seed: 3
node: {hostname: hgx-01}
users: {ana: 1301}
gpus:
  - model: H100-80GB
    mig:
      - {profile: 3g.40gb, start: 4}
      - {profile: 2g.20gb, start: 0}
  - model: H100-80GB
processes:
  - {pid: 61001, gpu: 0, instance: 2, name: python, job: {slurm: {id: 7001, user: ana}}, start: -1h,
     workload: {pattern: training, memory: 20GiB, sm: 0.6, duty: 0.8}}
  - {pid: 61101, gpu: 1, name: gpu_burn, job: {slurm: {id: 7002, user: ana}}, start: -1h,
     workload: {pattern: training, memory: 30GiB, sm: 0.7, duty: 0.9}}
faults:
  repeat: 20s
  timeline:
    - {at: 1s, gpu: 1, xid: 13}
"""


WORKSTATION = """
name: nvidia-gpu-exporter-e2e-workstation
description: a workstation with one actively cooled RTX 6000 Ada
seed: 3
node: {hostname: ws-01}
users: {ana: 1301}
gpus:
  - model: RTX6000-ADA-48GB
processes:
  - {pid: 62001, gpu: 0, name: python, job: {slurm: {id: 7101, user: ana}}, start: -1h,
     workload: {pattern: training, memory: 10GiB, sm: 0.5, duty: 0.8}}
"""


def label_values(prom: PromAPI, query: str) -> list[str]:
    """Grafana's `label_values(<series selector>, <label>)`: the label's values on matching series."""
    match = re.fullmatch(r"label_values\((.+?),\s*(\w+)\)", query)
    assert match, query
    selector, label = match.groups()
    return sorted(prom.get(f"/api/v1/label/{label}/values", **{"match[]": selector}))


def query_result(prom: PromAPI, query: str, regex: str) -> list[str]:
    """Grafana's `query_result(<expr>)` variable: each result as `name{labels} value`, and the regex's
    `value` group per match."""
    match = re.fullmatch(r"query_result\((.+)\)", query)
    assert match, query
    values = []
    for result in prom.query(match.group(1)):
        text = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(result["metric"].items())) + "}"
        values += [m.group("value") for m in re.finditer(regex, text) if m.group("value")]
    return sorted(set(values))


def substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        expr = expr.replace(f"${name}", value)
    return expr.replace("$__rate_interval", RATE_INTERVAL)


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
def test_every_panel_of_dashboard_14574_returns_data(
    tmp_path: Path, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_prometheus(engine, monkeypatch)
    (tmp_path / "ws").mkdir()
    hgx, workstation = tmp_path / "hgx.yaml", tmp_path / "ws" / "ws.yaml"
    hgx.write_text(SCENARIO)
    workstation.write_text(WORKSTATION)
    compat = ["--compat", "nvidia_gpu_exporter", "--interval", "1"]
    with (
        exporter(tmp_path, "--simulate", str(hgx), *compat) as target,
        exporter(tmp_path / "ws", "--simulate", str(workstation), *compat) as ws_target,
        prometheus(tmp_path, [target, ws_target]) as prom,
    ):
        prom.wait_for("nvidia_smi_xid_errors_total", timeout=60)
        prom.wait_for("count_over_time(nvidia_smi_energy_joules_total[1m]) > 2", timeout=60)
        prom.wait_for("nvidia_smi_fan_speed_ratio", timeout=60)
        (job,) = label_values(prom, JOB_QUERY)
        assert label_values(prom, NODE_QUERY.replace("$job", job)) == sorted([target, ws_target])
        empty: dict[tuple[str, str], list[str]] = {}
        for node in (target, ws_target):
            gpus = query_result(prom, substitute(GPU_QUERY, {"job": job, "node": node}), GPU_REGEX)
            assert len(gpus) == (2 if node == target else 1)
            assert all(re.fullmatch(r"[0-9a-f-]{36}", g) for g in gpus)
            for gpu in gpus:
                values = {"job": job, "node": node, "gpu": gpu}
                empty[(node, gpu)] = [
                    e for e in DASHBOARD_EXPRESSIONS if not prom.query(substitute(e, values))
                ]
        info = {
            r["metric"]["uuid"]: r["metric"]["index"]
            for r in prom.query(f'nvidia_smi_gpu_info{{instance="{target}"}}')
        }
        mig_gpu, whole_gpu = sorted(info, key=lambda uuid: info[uuid])
        (ws_gpu,) = [gpu for node, gpu in empty if node == ws_target]
        assert [e for e in empty[(target, whole_gpu)] if not e.startswith("(nvidia_smi_mig_")] == [FAN_SERIES]
        assert [e for e in empty[(target, mig_gpu)] if e.startswith("(nvidia_smi_mig_")] == []
        assert FAN_SERIES not in empty[(ws_target, ws_gpu)]  # its fan, where the HGX has none
        never = [e for e in DASHBOARD_EXPRESSIONS if all(e in found for found in empty.values())]
        assert never == []  # every panel of the dashboard, unedited, shows data for some GPU
        fan_stat = substitute(DASHBOARD_EXPRESSIONS[8], {"job": job, "node": target, "gpu": whole_gpu})
        assert float(prom.query(fan_stat)[0]["value"][1]) == -1  # the stat panel's "N/A"
