"""The Kubernetes manifests in deploy/kubernetes/: structure and cross-references.

No cluster here, so the checks are the mistakes that make `kubectl apply -k` succeed but the
exporter never get scraped: selectors that match nothing, port names that differ, ConfigMaps, PVCs
and service accounts referenced but not shipped, a PrometheusRule that drifted from alerts/.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KDIR = REPO / "deploy" / "kubernetes"
EXPORTER_PORT = 9842


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpulens_k8s_generate", KDIR / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def kustomization() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((KDIR / "kustomization.yaml").read_text())
    return doc


@functools.cache
def parsed(path: Path) -> tuple[dict[str, Any], ...]:
    """The documents of one manifest file, parsed once per run (the generated files are large)."""
    return tuple(d for d in yaml.safe_load_all(path.read_text()) if d)


def objects(files: list[str] | None = None) -> list[dict[str, Any]]:
    """Every object of the kustomization's resources (or of the named files)."""
    names = files if files is not None else kustomization()["resources"]
    return [document for name in names for document in parsed(KDIR / name)]


def one(kind: str, files: list[str] | None = None) -> dict[str, Any]:
    matches = [o for o in objects(files) if o["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, found {len(matches)}"
    return matches[0]


def daemonset() -> dict[str, Any]:
    return one("DaemonSet")


def exporter_container() -> dict[str, Any]:
    containers = daemonset()["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    doc: dict[str, Any] = containers[0]
    return doc


def selects(selector: dict[str, Any], labels: dict[str, Any]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_every_manifest_is_listed_in_the_kustomization_or_documented_as_an_alternative():
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in KDIR.glob("*.yaml")} - {"kustomization.yaml"}
    alternatives = {"exporter-servicemonitor.yaml"}
    assert listed <= on_disk, f"kustomization lists missing files: {sorted(listed - on_disk)}"
    assert on_disk - listed == alternatives


def test_every_object_has_api_version_kind_and_name():
    for obj in objects():
        assert obj.get("apiVersion") and obj.get("kind"), obj
        assert obj["metadata"].get("name"), obj


def test_daemonset_selector_matches_its_pod_template():
    ds = daemonset()
    assert selects(ds["spec"]["selector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"])


def test_daemonset_runs_only_on_gpu_nodes_and_tolerates_the_gpu_taint():
    spec = daemonset()["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" for t in spec["tolerations"])


def test_daemonset_sees_host_processes_through_the_nvidia_runtime_without_requesting_a_gpu():
    spec = daemonset()["spec"]["template"]["spec"]
    container = exporter_container()
    assert spec["hostPID"] is True
    assert spec["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    # utility mounts NVML; compute also nvidia-cuda-mps-control (MPS clients' thread caps)
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    for section in ("requests", "limits"):
        assert not any("nvidia.com" in key for key in container["resources"][section])
        assert {"cpu", "memory"} <= set(container["resources"][section])


def test_daemonset_mounts_procfs_pod_resources_pod_logs_and_the_mps_root_read_only():
    spec = daemonset()["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in exporter_container()["volumeMounts"]}
    wanted = {"/proc", "/var/lib/kubelet/pod-resources", "/var/log/pods", "/run/nvidia/mps"}
    assert set(host_paths.values()) == wanted
    for name in host_paths:
        assert mounts[name]["readOnly"] is True, f"hostPath {host_paths[name]} must be mounted read-only"
    proc_mount = next(m["mountPath"] for n, m in mounts.items() if host_paths.get(n) == "/proc")
    assert f"--path.procfs={proc_mount}" in exporter_container()["args"]


def test_daemonset_asks_the_device_plugins_mps_daemon_under_the_mps_root_it_mounts():
    spec = daemonset()["spec"]["template"]["spec"]
    root = next(v["hostPath"]["path"] for v in spec["volumes"] if v["name"] == "mps-root")
    mount = next(m for m in exporter_container()["volumeMounts"] if m["name"] == "mps-root")
    assert mount["mountPath"] == root  # the same path as on the host
    assert f"--mps-pipe-dir={root}/nvidia.com/gpu/pipe" in exporter_container()["args"]


def test_exporter_container_is_locked_down_and_says_why_it_runs_as_root():
    container = exporter_container()
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "add" not in security["capabilities"]
    text = (KDIR / "exporter-daemonset.yaml").read_text()
    if security.get("runAsUser") == 0:
        assert "pod-resources socket is owned by" in text  # the reason is written next to it


def test_probes_use_the_exporters_process_health_endpoints_on_the_metrics_port():
    container = exporter_container()
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port_names == {"metrics": EXPORTER_PORT}
    assert container["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "metrics"}
    assert f"--web.listen-address=:{EXPORTER_PORT}" in container["args"]


def test_service_selects_the_exporter_pods_and_targets_the_named_port():
    service = one("Service")
    pod_labels = daemonset()["spec"]["template"]["metadata"]["labels"]
    assert selects(service["spec"]["selector"], pod_labels)
    (port,) = service["spec"]["ports"]
    assert port["port"] == EXPORTER_PORT
    assert port["targetPort"] in {p["name"] for p in exporter_container()["ports"]}


def test_podmonitor_selects_the_exporter_pods_by_port_name():
    monitor = one("PodMonitor")
    pod_labels = daemonset()["spec"]["template"]["metadata"]["labels"]
    assert selects(monitor["spec"]["selector"]["matchLabels"], pod_labels)
    port_names = {p["name"] for p in exporter_container()["ports"]}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"


def test_servicemonitor_alternative_selects_the_service_by_port_name():
    monitor = one("ServiceMonitor", ["exporter-servicemonitor.yaml"])
    service = one("Service")
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports


def test_referenced_configmaps_pvcs_and_service_accounts_are_shipped():
    shipped = {(o["kind"], o["metadata"]["name"]) for o in objects()}
    for obj in objects():
        pod_spec = pod_spec_of(obj)
        if pod_spec is None:
            continue
        account = pod_spec.get("serviceAccountName")
        if account:
            assert ("ServiceAccount", account) in shipped
        for volume in pod_spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in shipped
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in shipped
        for container in pod_spec["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert ("ConfigMap", source["configMapRef"]["name"]) in shipped
            mounted = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounted <= {v["name"] for v in pod_spec.get("volumes", [])}


def pod_spec_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] in {"DaemonSet", "Deployment", "StatefulSet", "Job"}:
        spec: dict[str, Any] = obj["spec"]["template"]["spec"]
        return spec
    if obj["kind"] == "CronJob":
        spec = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        return spec
    return None


def test_report_cronjob_runs_weekly_and_writes_to_the_volume():
    cronjob = one("CronJob")
    _minute, _hour, day, month, weekday = cronjob["spec"]["schedule"].split()
    assert day == "*" and month == "*" and weekday != "*", "weekly: one weekday"
    spec = pod_spec_of(cronjob)
    (container,) = spec["containers"]
    command = " ".join(container.get("command", []) + container.get("args", []))
    assert "gpulens report" in command and "--out" in command
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/reports" in mounts and '--out "/reports/' in command
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_images_are_the_ones_the_kustomization_retags():
    names = {image["name"] for image in kustomization()["images"]}
    used = set()
    for obj in objects():
        spec = pod_spec_of(obj)
        if spec:
            used |= {c["image"].split(":")[0] for c in spec["containers"]}
    assert used == names


def test_no_rbac_beyond_what_is_needed():
    # neither the exporter nor the report talks to the API server: no roles, no token
    kinds = {o["kind"] for o in objects()}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    for obj in objects():
        spec = pod_spec_of(obj)
        if spec:
            assert spec.get("automountServiceAccountToken") is False, obj["metadata"]["name"]


def test_prometheusrule_is_exactly_what_the_generator_makes_from_alerts():
    generator = load_generator()
    # alerts/ changed without regenerating: run `python deploy/kubernetes/generate.py` and commit
    assert (KDIR / "prometheusrule.yaml").read_text() == generator.render(REPO / "alerts"), (
        "deploy/kubernetes/prometheusrule.yaml is stale: run `python deploy/kubernetes/generate.py`"
    )


def test_one_prometheusrule_per_rule_file_holds_its_groups_in_order():
    generator = load_generator()
    files = generator.rule_files(REPO / "alerts")
    assert {p.name for p in files} >= {"recording_rules.yml", "gpu_alerts.yml"}
    rules = {o["metadata"]["name"]: o for o in objects() if o["kind"] == "PrometheusRule"}
    assert set(rules) == {generator.resource_name(p) for p in files}
    for path in files:
        groups = rules[generator.resource_name(path)]["spec"]["groups"]
        source = yaml.safe_load(path.read_text())["groups"]
        for group in source:  # but for the runbook links, which point at the exporter's Service
            for rule in group["rules"]:
                if "runbook_url" in rule.get("annotations", {}):
                    rule["annotations"]["runbook_url"] = generator.RUNBOOK_URL_PATTERN % rule["alert"]
        assert groups == source


def test_generator_rejects_a_group_name_defined_twice_in_one_file(tmp_path):
    generator = load_generator()
    (tmp_path / "a.yml").write_text("groups:\n  - name: g\n    rules: []\n  - name: g\n    rules: []\n")
    with pytest.raises(generator.RuleSourceError, match=r"a\.yml: group 'g' is defined twice"):
        generator.prometheus_rules(tmp_path)


def test_generator_names_a_broken_rule_file(tmp_path):
    generator = load_generator()
    (tmp_path / "a.yml").write_text("groups: [\n")
    with pytest.raises(generator.RuleSourceError, match=r"a\.yml: not valid YAML"):
        generator.prometheus_rules(tmp_path)


def test_generator_check_mode_fails_on_a_stale_file(tmp_path):
    generator = load_generator()
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text("# old\n")
    assert generator.main(["--check", "--output", str(stale)]) == 1
    assert generator.main(["--output", str(stale)]) == 0
    assert generator.main(["--check", "--output", str(stale)]) == 0


def test_generated_rules_pass_promtool(tmp_path):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed")
    for rule in (o for o in objects() if o["kind"] == "PrometheusRule"):
        plain = tmp_path / f"{rule['metadata']['name']}.yml"
        plain.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        result = subprocess.run([promtool, "check", "rules", str(plain)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_kustomize_builds_when_kubectl_is_available():
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed")
    result = subprocess.run([kubectl, "kustomize", str(KDIR)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    built = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert {d["metadata"].get("namespace") for d in built if d["kind"] != "Namespace"} == {"gpulens"}


def test_daemonset_args_are_flags_the_exporter_accepts(tmp_path):
    from gpulens.exporter.cli import parse_config

    args = exporter_container()["args"]
    # --procfs must exist where it is checked: the host's /proc is mounted in the pod only
    args = [f"--path.procfs={tmp_path}" if a.startswith("--path.procfs=") else a for a in args]
    config = parse_config(args, env={})
    assert config.listen == f":{EXPORTER_PORT}"
    assert config.simulate is None


# --- the optional remediation webhook (deploy/kubernetes/remediate/) --------------------------

RDIR = KDIR / "remediate"


def remediate_objects() -> list[dict[str, Any]]:
    names = yaml.safe_load((RDIR / "kustomization.yaml").read_text())["resources"]
    return [d for name in names for d in yaml.safe_load_all((RDIR / name).read_text()) if d]


def remediate_one(kind: str) -> dict[str, Any]:
    (obj,) = [o for o in remediate_objects() if o["kind"] == kind]
    return obj


def test_remediate_kustomization_lists_every_file_beside_it():
    listed = set(yaml.safe_load((RDIR / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in RDIR.glob("*.yaml")} - {"kustomization.yaml"}


def remediate_config(tmp_path: Path):
    """The Deployment's receiver settings, read and checked as `gpulens remediate` does (the state
    directory, which exists only in the pod, points at a stand-in)."""
    from gpulens.cli import build_parser
    from gpulens.remediate.config import config_of

    (container,) = remediate_one("Deployment")["spec"]["template"]["spec"]["containers"]
    args = [f"--state-dir={tmp_path}" if a.startswith("--state-dir=") else a for a in container["args"]]
    return config_of(build_parser("remediate").parse_args(args), env={})


def test_remediate_runs_dry_run_against_the_kubernetes_backend_with_flags_it_accepts(tmp_path):
    (container,) = remediate_one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["gpulens"]
    config = remediate_config(tmp_path)
    assert config.backend == "kubernetes"
    assert not config.apply, "the shipped receiver must stay in dry-run until someone adds --apply"
    assert str(config.token_file) == "/etc/gpulens/token/token"
    # an empty host means loopback to `gpulens remediate`: Alertmanager in another pod needs all addresses
    assert config.listen == ("0.0.0.0", 9843)


def test_remediate_runs_the_return_diagnostic_in_its_own_image_which_the_policy_admits(tmp_path):
    from gpulens.remediate.kubernetes import DEFAULT_DIAG_IMAGE

    (container,) = remediate_one("Deployment")["spec"]["template"]["spec"]["containers"]
    config = remediate_config(tmp_path)
    assert (config.diag, config.diag_level) == (True, 2)
    assert config.diag_image == container["image"] == DEFAULT_DIAG_IMAGE
    policy = remediate_one("ValidatingAdmissionPolicy")
    assert any(f"c.image == '{config.diag_image}'" in v["expression"] for v in policy["spec"]["validations"])


def test_remediate_args_use_the_exporters_flag_names_and_no_deprecated_one(tmp_path):
    assert remediate_config(tmp_path).deprecated == ()


def test_remediate_podmonitor_scrapes_the_receiver_under_a_job_only_the_remediate_selector_reads():
    monitor = remediate_one("PodMonitor")
    deployment = remediate_one("Deployment")
    assert selects(
        monitor["spec"]["selector"]["matchLabels"], deployment["spec"]["template"]["metadata"]["labels"]
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in container["ports"]} and endpoint["path"] == "/metrics"
    (job,) = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    # the mixin's defaults: remediateSelector job=~".*remediate.*", selector job=~".*gpulens.*"
    assert "remediate" in job and "gpulens" not in job


def test_remediate_token_comes_from_the_secret_the_instructions_create():
    spec = remediate_one("Deployment")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    (volume,) = [v for v in spec["volumes"] if "secret" in v]
    secret = volume["secret"]["secretName"]
    assert (
        f"create secret generic {secret} --from-literal=token=" in (RDIR / "kustomization.yaml").read_text()
    )
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert "--token-file=" + mount["mountPath"] + "/token" in container["args"]


def test_remediate_service_and_probes_use_the_named_port():
    deployment = remediate_one("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    service = remediate_one("Service")
    assert selects(service["spec"]["selector"], pod_labels)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    names = {p["name"]: p["containerPort"] for p in container["ports"]}
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in names and port["port"] == names[port["targetPort"]] == 9843
    assert container["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "http"}


def test_remediate_rbac_grants_only_cordon_taint_eviction_and_gpu_fencing_to_its_own_account():
    role = remediate_one("ClusterRole")
    grants = {(tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]}
    assert grants == {
        (("nodes",), ("get", "list", "patch")),
        (("pods",), ("list",)),
        (("pods/eviction",), ("create",)),
        # DRA: find a faulty GPU's device and fence it alone (docs/alerts.md, per-GPU fencing)
        (("resourceslices",), ("list",)),
        (("devicetaintrules",), ("create", "get", "delete")),
    }
    binding = remediate_one("ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    (subject,) = binding["subjects"]
    account = remediate_one("ServiceAccount")["metadata"]["name"]
    assert subject == {"kind": "ServiceAccount", "name": account, "namespace": "gpulens"}
    assert remediate_one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account
    # in its own namespace only: the recovery Jobs and the breaker's ConfigMap
    local = remediate_one("Role")
    assert local["metadata"]["namespace"] == "gpulens"
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in local["rules"]} == {
        (("jobs",), ("create", "get")),
        (("configmaps",), ("get", "patch")),  # resourceNames: the breaker's ConfigMap only
        (("configmaps",), ("create",)),
    }
    (named,) = [r for r in local["rules"] if r.get("resourceNames")]
    assert named["resourceNames"] == ["gpulens-remediate-breaker"]
    role_binding = remediate_one("RoleBinding")
    assert role_binding["roleRef"]["name"] == local["metadata"]["name"]
    assert role_binding["subjects"] == [subject]


def test_remediate_keeps_its_breaker_in_a_configmap_and_its_audit_log_in_a_volume():
    from gpulens.cli import build_parser

    spec = remediate_one("Deployment")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = build_parser("remediate").parse_args(container["args"])
    assert args.breaker_state_configmap.startswith("gpulens/")
    assert args.job_namespace == remediate_one("Role")["metadata"]["namespace"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(args.state_dir)]
    assert not mount.get("readOnly")
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert (
        volume["persistentVolumeClaim"]["claimName"]
        == remediate_one("PersistentVolumeClaim")["metadata"]["name"]
    )
    assert args.breaker_state_configmap.split("/")[1] in str(remediate_one("Role")["rules"])


def test_remediation_taint_is_tolerated_by_the_exporter():
    from gpulens.remediate.kubernetes import TAINT_KEY

    tolerated = {t["key"] for t in daemonset()["spec"]["template"]["spec"]["tolerations"]}
    assert TAINT_KEY in tolerated, "an isolated node must stay monitored"


# --- schema validation (kubernetes-validate bundles the Kubernetes OpenAPI schemas offline) ----


def core_objects() -> list[tuple[str, dict[str, Any]]]:
    """(file, object) of every built-in Kubernetes kind shipped; CRDs (monitoring.coreos.com) have
    no bundled schema and are checked structurally above."""
    files = sorted(KDIR.glob("*.yaml")) + sorted(RDIR.glob("*.yaml"))
    found = []
    for path in files:
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if document and not document["apiVersion"].startswith("monitoring.coreos.com/"):
                found.append((str(path.relative_to(REPO)), document))
    return found


def test_every_core_object_passes_the_kubernetes_schema_strictly():
    validator = pytest.importorskip("kubernetes_validate")
    version = validator.latest_version()
    objects_checked = core_objects()
    assert {o["kind"] for _f, o in objects_checked} >= {
        "DaemonSet",
        "Service",
        "CronJob",
        "Deployment",
        "ClusterRole",
        "PersistentVolumeClaim",
    }
    for path, obj in objects_checked:
        try:
            validator.validate(obj, version, strict=True)
        except validator.ValidationError as exc:
            pytest.fail(f"{path}: {obj['kind']}/{obj['metadata']['name']}: {str(exc).splitlines()[0]}")


def test_the_ephemeral_state_overlay_puts_the_audit_log_on_an_empty_dir():
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed")
    overlay = KDIR / "remediate-ephemeral-state"
    result = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"] == {"name": "state", "emptyDir": {}}
    assert deployment["metadata"]["namespace"] == "gpulens"
