"""The Helm chart in deploy/helm/gpulens/: real `helm lint` and `helm template`, every object validated.

helm is the real one, built from its Go module by `make tools` (`make test` passes its path as
GPULENS_HELM; otherwise the same cache path, then PATH). Without it these tests skip, except under
CI (CI=true), where a missing helm is a failure: CI builds it.

Three value sets are rendered: the chart's defaults, `ci/kube-prometheus-stack-values.yaml` (release
label, ServiceMonitor, TLS + basic auth, remediation receiver and report CronJob on) and
`ci/mixin-values.yaml` (a mixin config of its own: the rules and dashboards must be what `gpulens
mixin build --config` writes for it). Every object they render is validated against its schema:

- built-in kinds with kubernetes-validate (the upstream Kubernetes OpenAPI schemas it bundles),
  strictly: a field Kubernetes does not know fails;
- ServiceMonitor, PodMonitor and PrometheusRule against the prometheus-operator CRDs' OpenAPI
  schemas, as generated into the pydantic models of PyPI's `cloudcoil-models-prometheus-operator`
  (Apache-2.0; nothing is vendored). A model drops fields its CRD does not define, as the API server
  prunes them, so an object must parse (types, enums, duration patterns) and survive the round trip
  unchanged;
- the PrometheusRules' groups with `promtool check rules`;
- the exporter's arguments, web config and the receiver's arguments with gpulens' own parsers.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from gpulens.mixin import build as mixin_build
from gpulens.promscope.config import DEFAULT, MixinConfig, from_mapping
from tests.support.procs import unavailable

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpulens"
KPS_VALUES = CHART / "ci" / "kube-prometheus-stack-values.yaml"
MIXIN_VALUES = CHART / "ci" / "mixin-values.yaml"
KDIR = REPO / "deploy" / "kubernetes"
RELEASE = "gpulens"
NAMESPACE = "gpulens"
KPS_RELEASE_LABEL = {"release": "kube-prometheus-stack"}
SCRAPE_PASSWORD = "scrape-secret"  # the password of the bcrypt hash in ci/kube-prometheus-stack-values.yaml
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
MONITORING_GROUP = "monitoring.coreos.com/"


def helm_binary() -> str | None:
    candidates = [os.environ.get("GPULENS_HELM"), str(Path.home() / ".cache/gpulens-tools/bin/helm")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("helm")


@pytest.fixture(scope="module")
def helm() -> str:
    binary = helm_binary()
    if binary is None:
        unavailable(
            "helm not installed: `make tools` builds it from its Go module",
            in_ci="helm is missing under CI: `make tools` builds it (make test runs it first)",
        )
    return binary


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)


def template(helm: str, *args: str, release: str = RELEASE) -> list[dict[str, Any]]:
    result = run_helm(helm, "template", release, str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def template_error(helm: str, *args: str) -> str:
    result = run_helm(helm, "template", RELEASE, str(CHART), *args)
    assert result.returncode != 0, "expected helm template to refuse these values"
    return result.stderr


VALUE_FILES = {"default": None, "kube-prometheus-stack": KPS_VALUES, "mixin": MIXIN_VALUES}
VALUE_SETS = list(VALUE_FILES)


@functools.cache
def _rendered(helm: str, values: str) -> tuple[dict[str, Any], ...]:
    path = VALUE_FILES[values]
    return tuple(template(helm, *(() if path is None else ("-f", str(path)))))


# where the chart points runbook links when mixin.runbookURLPattern is "" (release gpulens)
RECEIVER_RUNBOOKS = f"http://gpulens-remediate.{NAMESPACE}.svc:9843/runbooks/%s"
EXPORTER_RUNBOOKS = f"http://gpulens-exporter.{NAMESPACE}.svc:9842/runbooks/%s"


def mixin_config(values: str) -> MixinConfig:
    """The mixin config a value set gives: the chart's defaults under the file's `mixin` keys, an
    empty runbook pattern being the release's own service (the receiver's when it is enabled)."""
    merged = dict(yaml.safe_load((CHART / "values.yaml").read_text())["mixin"])
    path = VALUE_FILES[values]
    overrides = yaml.safe_load(path.read_text()) if path is not None else {}
    merged.update(overrides.get("mixin") or {})
    if not merged["runbookURLPattern"]:
        receiver = (overrides.get("remediate") or {}).get("enabled", False)
        merged["runbookURLPattern"] = RECEIVER_RUNBOOKS if receiver else EXPORTER_RUNBOOKS
    return from_mapping(merged, values)


@pytest.fixture(params=VALUE_SETS)
def value_set(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def rendered(helm: str, values: str) -> list[dict[str, Any]]:
    return list(_rendered(helm, values))


def only(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def pod_spec_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] in {"DaemonSet", "Deployment"}:
        spec: dict[str, Any] = obj["spec"]["template"]["spec"]
        return spec
    if obj["kind"] == "CronJob":
        spec = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        return spec
    return None


def exporter_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    (container,) = containers
    return container


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# --- helm's own checks --------------------------------------------------------------------------


def test_helm_lint_passes_strictly_with_the_default_values(helm):
    result = run_helm(helm, "lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


def test_helm_lint_passes_strictly_with_kube_prometheus_stack_values(helm):
    result = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(KPS_VALUES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_values_schema_rejects_a_misspelt_key_naming_it(helm):
    error = template_error(helm, "--set", "serviceMonitor.additonalLabels.release=x")
    assert "additonalLabels" in error


def test_values_schema_rejects_a_duration_prometheus_would_not_parse(helm):
    error = template_error(helm, "--set", "podMonitor.interval=15 seconds")
    assert "/podMonitor/interval" in error


def test_both_monitors_on_is_refused_because_every_gpu_would_be_scraped_twice(helm):
    error = template_error(helm, "--set", "serviceMonitor.enabled=true")
    assert "scraped twice" in error


def test_basic_auth_without_users_is_refused(helm):
    error = template_error(helm, "--set", "web.basicAuth.enabled=true")
    assert "web.basicAuth.users" in error


def test_tls_without_a_certificate_secret_is_refused(helm):
    error = template_error(helm, "--set", "web.tls.enabled=true")
    assert "web.tls.secretName" in error


def test_a_chart_created_remediation_token_needs_its_value(helm):
    error = template_error(helm, "--set", "remediate.enabled=true,remediate.token.create=true")
    assert "remediate.token.value" in error


# --- schemas ------------------------------------------------------------------------------------


def test_every_built_in_object_passes_the_kubernetes_schema_strictly(helm, value_set):
    validator = pytest.importorskip("kubernetes_validate")
    version = validator.latest_version()
    objects = [o for o in rendered(helm, value_set) if not o["apiVersion"].startswith(MONITORING_GROUP)]
    assert {o["kind"] for o in objects} >= {"DaemonSet", "Service", "ServiceAccount", "ConfigMap"}
    for obj in objects:
        try:
            validator.validate(obj, version, strict=True)
        except validator.ValidationError as exc:
            pytest.fail(f"{value_set}: {obj['kind']}/{obj['metadata']['name']}: {str(exc).splitlines()[0]}")


@functools.cache
def crd_models() -> ModuleType:
    try:
        from cloudcoil.models.prometheus_operator import v1
    except ImportError:
        pytest.skip("cloudcoil-models-prometheus-operator not installed (a test dependency)")
    return v1


def crd_violation(obj: dict[str, Any]) -> str | None:
    """None when `obj` is valid under its prometheus-operator CRD schema, else the first problem."""
    import pydantic

    model = getattr(crd_models(), obj["kind"])
    try:
        parsed = model.model_validate(obj)
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        return f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
    kept = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    if kept != obj:
        return f"fields the CRD does not define: {_first_difference(obj, kept)}"
    return None


def _first_difference(given: Any, kept: Any, path: str = "") -> str:
    if isinstance(given, dict) and isinstance(kept, dict):
        for key in given:
            if key not in kept:
                return f"{path}.{key}".lstrip(".")
            if given[key] != kept[key]:
                return _first_difference(given[key], kept[key], f"{path}.{key}")
    if isinstance(given, list) and isinstance(kept, list):
        for index, (a, b) in enumerate(zip(given, kept, strict=False)):
            if a != b:
                return _first_difference(a, b, f"{path}[{index}]")
    return path.lstrip(".") or "(value)"


def test_every_prometheus_operator_object_passes_its_crd_schema(helm, value_set):
    objects = [o for o in rendered(helm, value_set) if o["apiVersion"].startswith(MONITORING_GROUP)]
    kinds = {o["kind"] for o in objects}
    assert "PrometheusRule" in kinds and kinds & {"PodMonitor", "ServiceMonitor"}
    for obj in objects:
        problem = crd_violation(obj)
        assert problem is None, f"{value_set}: {obj['kind']}/{obj['metadata']['name']}: {problem}"


@pytest.mark.parametrize(
    ("endpoint", "problem"),
    [
        ({"port": "metrics", "intervall": "15s"}, "spec.endpoints[0].intervall"),
        ({"port": "metrics", "interval": "15 s"}, "spec.endpoints.0.interval"),
        ({"port": "metrics", "scheme": "httpx"}, "spec.endpoints.0.scheme"),
    ],
)
def test_the_crd_check_catches_unknown_fields_bad_durations_and_bad_enums(endpoint, problem):
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "endpoints": [endpoint]},
    }
    violation = crd_violation(monitor)
    assert violation is not None and problem in violation


@functools.cache
def _mixin_built(config: MixinConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """What `gpulens mixin build --config` writes for `config`: the PrometheusRule specs
    deploy/kubernetes/generate.py makes of its rule files (by object name), and its dashboards."""
    import tempfile

    generator = load_generator("gpulens_k8s_generate", KDIR / "generate.py")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        mixin_build.build_to(config, out)
        rules = {o["metadata"]["name"]: o["spec"] for o in generator.prometheus_rules(out / "rules")}
        boards = {p.name: json.loads(p.read_text()) for p in (out / "dashboards").glob("*.json")}
    return rules, boards


def chart_rules(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "PrometheusRule"}


def chart_dashboards(objects: list[dict[str, Any]]) -> dict[str, Any]:
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    return {name: json.loads(text) for m in maps for name, text in m["data"].items()}


def test_prometheusrules_pass_promtool_and_hold_exactly_the_groups_of_alerts(helm, value_set, tmp_path):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (make system-deps)")
    generator = load_generator("gpulens_k8s_generate", KDIR / "generate.py")
    committed = {o["metadata"]["name"]: o["spec"] for o in generator.prometheus_rules(REPO / "alerts")}
    assert _mixin_built(DEFAULT)[0] == committed
    expected, _ = _mixin_built(mixin_config(value_set))
    rules = chart_rules(rendered(helm, value_set))
    assert set(rules) == set(committed)  # release "gpulens": the kustomization's names
    for name, spec in rules.items():
        assert spec == expected[name], f"{value_set}: {name} differs from gpulens mixin build"
        plain = tmp_path / f"{name}.yml"
        plain.write_text(yaml.safe_dump(spec))
        result = subprocess.run([promtool, "check", "rules", str(plain)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_dashboards_are_what_the_mixin_builds_for_the_values_config(helm, value_set):
    _, expected = _mixin_built(mixin_config(value_set))
    assert chart_dashboards(rendered(helm, value_set)) == expected


def test_the_chart_s_default_mixin_values_are_the_mixin_s_defaults_but_for_the_runbooks_it_serves():
    assert (
        dataclasses.replace(mixin_config("default"), runbook_url_pattern=DEFAULT.runbook_url_pattern)
        == DEFAULT
    )
    assert mixin_config("default").runbook_url_pattern == EXPORTER_RUNBOOKS
    assert mixin_config("kube-prometheus-stack").runbook_url_pattern == RECEIVER_RUNBOOKS


def test_the_kube_prometheus_stack_preset_labels_every_monitor_and_rule_for_its_prometheus(helm):
    preset = CHART / "values-kube-prometheus-stack.yaml"
    for extra in ((), ("--set", "podMonitor.enabled=false", "--set", "serviceMonitor.enabled=true")):
        objects = template(
            helm,
            "-f",
            str(preset),
            "--set",
            "remediate.enabled=true",
            "--set",
            "remediate.token.create=true",
            "--set",
            "remediate.token.value=x",
            *extra,
        )
        selected = [o for o in objects if o["kind"] in {"PodMonitor", "ServiceMonitor", "PrometheusRule"}]
        kinds = {o["kind"] for o in selected}
        assert "PrometheusRule" in kinds and kinds & {"PodMonitor", "ServiceMonitor"}
        monitors = [o for o in selected if o["kind"] != "PrometheusRule"]
        assert len(monitors) == 2  # the exporter's and the receiver's
        for obj in selected:
            assert obj["metadata"]["labels"].get("release") == "kube-prometheus-stack", obj["metadata"][
                "name"
            ]
        exporter = next(o for o in monitors if "exporter" in o["metadata"]["name"])
        endpoints = exporter["spec"].get("podMetricsEndpoints") or exporter["spec"]["endpoints"]
        assert all(e.get("honorLabels") is True for e in endpoints)


def test_the_kube_prometheus_stack_preset_passes_lint_and_the_schema(helm):
    result = run_helm(
        helm, "lint", "--strict", str(CHART), "-f", str(CHART / "values-kube-prometheus-stack.yaml")
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_mixin_values_reach_every_rule_and_dashboard(helm):
    objects = rendered(helm, "mixin")
    text = json.dumps([chart_rules(objects), chart_dashboards(objects)])
    assert "gpulens_chart" not in text and "gpulens-chart" not in text and ".*gpulens.*" not in text
    lost = next(
        r
        for spec in chart_rules(objects).values()
        for g in spec["groups"]
        for r in g["rules"]
        if r.get("alert") == "GPULost"
    )
    assert lost["expr"] == 'gpu_up{job="gpulens-exporter", namespace="gpulens"} == 0'
    assert lost["annotations"]["runbook_url"] == "https://wiki.example/gpu/runbooks/GPULost"


def test_an_empty_selector_gives_the_mixin_s_unscoped_rules_and_dashboards(helm, tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump({"mixin": {"selector": "", "runbookURLPattern": "https://x.example/$1/%s"}})
    )
    objects = template(helm, "-f", str(values))
    config = MixinConfig(selector="", runbook_url_pattern="https://x.example/$1/%s")
    rules, boards = _mixin_built(config)
    assert chart_rules(objects) == rules
    assert chart_dashboards(objects) == boards


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("mixin.selector=job", "/mixin/selector"),
        ("mixin.clusterLabel=__name__", "/mixin/clusterLabel"),
        ("mixin.runbookURLPattern=https://wiki/no-placeholder", "/mixin/runbookURLPattern"),
        ("mixin.runbookURLPattern=https://wiki/%s/%s", "exactly one %s"),
    ],
)
def test_a_mixin_value_the_mixin_would_refuse_is_refused_naming_it(helm, setting, message):
    assert message in template_error(helm, "--set-string", setting)


# --- the generated chart files ------------------------------------------------------------------


def load_generator(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def helm_generator() -> ModuleType:
    return load_generator("gpulens_helm_generate", REPO / "deploy" / "helm" / "generate.py")


def test_chart_files_are_exactly_what_the_generator_makes_from_alerts_and_dashboards():
    generator = helm_generator()
    outcome = generator.sync(CHART / "files", generator.render(), check=True)
    # alerts/ or the dashboards changed without regenerating: run `python deploy/helm/generate.py`
    assert outcome.changed == [] and outcome.removed == [], "run `python deploy/helm/generate.py`"


def test_generator_check_mode_reports_a_stale_and_a_leftover_file_and_a_run_fixes_both(tmp_path):
    generator = helm_generator()
    files = tmp_path / "files"
    wanted = generator.render()
    generator.sync(files, wanted, check=False)
    (files / "rules" / "gpu-alerts.yml").write_text("# old\n")
    (files / "dashboards" / "gone.json").write_text("{}\n")
    assert generator.main(["--check", "--files", str(files)]) == 1
    assert generator.main(["--files", str(files)]) == 0
    assert generator.main(["--check", "--files", str(files)]) == 0
    assert not (files / "dashboards" / "gone.json").exists()


def test_generator_names_a_rule_file_the_mixin_does_not_make(tmp_path):
    generator = helm_generator()
    for path in (REPO / "alerts").glob("*.yml"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "extra_rules.yml").write_text("groups: [{name: extra, rules: []}]\n")
    with pytest.raises(
        generator.SourceError, match=r"extra_rules\.yml.*not those `gpulens mixin build` makes"
    ):
        generator.rule_files(tmp_path)


def test_one_dashboard_configmap_per_committed_dashboard_holding_its_json(helm):
    # the committed JSON is the mixin's default build: its runbook address, not the release's own
    objects = template(helm, "--set", f"mixin.runbookURLPattern={DEFAULT.runbook_url_pattern}")
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    committed = {p.name: json.loads(p.read_text()) for p in (REPO / "dashboards" / "json").glob("*.json")}
    shipped = {}
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "gpulens"}
        ((filename, text),) = config_map["data"].items()
        shipped[filename] = json.loads(text)
    assert shipped == committed


def test_dashboard_sidecar_label_and_namespace_are_configurable(helm):
    objects = template(
        helm, "--set", "dashboards.label=my_dashboards,dashboards.labelValue=yes,dashboards.namespace=grafana"
    )
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    assert maps
    for config_map in maps:
        assert config_map["metadata"]["labels"]["my_dashboards"] == "yes"
        assert "grafana_dashboard" not in config_map["metadata"]["labels"]
        assert config_map["metadata"]["namespace"] == "grafana"


# --- the exporter DaemonSet ---------------------------------------------------------------------


def kustomize_daemonset() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((KDIR / "exporter-daemonset.yaml").read_text())
    return doc


def test_default_exporter_pod_is_the_kustomization_s_apart_from_labels_and_names(helm):
    chart = only(rendered(helm, "default"), "DaemonSet")["spec"]["template"]["spec"]
    kustomize = kustomize_daemonset()["spec"]["template"]["spec"]
    for key in ("runtimeClassName", "priorityClassName", "hostPID", "nodeSelector", "tolerations"):
        assert chart[key] == kustomize[key], key
    (chart_container,) = chart["containers"]
    (kustomize_container,) = kustomize["containers"]
    for key in ("args", "env", "ports", "resources", "securityContext", "livenessProbe", "readinessProbe"):
        assert chart_container[key] == kustomize_container[key], key
    assert chart["volumes"] == kustomize["volumes"]
    assert chart_container["volumeMounts"] == kustomize_container["volumeMounts"]


def test_exporter_arguments_are_flags_the_exporter_accepts(helm, value_set, tmp_path):
    from gpulens.exporter.cli import parse_config

    args = exporter_container(rendered(helm, value_set))["args"]
    # paths that exist only in the pod (host /proc, the mounted web config) point at stand-ins
    web_config = tmp_path / "web-config.yml"
    web_config.write_text("")
    stand_ins = {"--path.procfs=": str(tmp_path), "--web.config.file=": str(web_config)}
    for flag, path in stand_ins.items():
        args = [flag + path if a.startswith(flag) else a for a in args]
    config = parse_config(args, env={})
    assert config.listen == ":9842"
    assert config.simulate is None


def test_kube_prometheus_stack_values_reach_the_exporter_pod(helm):
    objects = rendered(helm, "kube-prometheus-stack")
    spec = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    container = exporter_container(objects)
    assert container["args"][-2:] == ["--compat=dcgm", "--collector.processes"]
    assert {"name": "GPULENS_LOG_LEVEL", "value": "info"} in container["env"]
    assert spec["nodeSelector"]["node-role.example.com/gpu"] == ""
    assert "nodeAffinity" in spec["affinity"]
    annotations = only(objects, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["example.com/team"] == "ml-platform"


def test_kubelet_path_is_the_host_side_of_the_pod_resources_socket_the_exporter_reads(helm):
    from gpulens.exporter.config import ExporterConfig

    objects = rendered(helm, "kube-prometheus-stack")
    spec = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "pod-resources")
    assert volume["hostPath"]["path"] == "/var/lib/k0s/kubelet/pod-resources"
    mount = next(m for m in exporter_container(objects)["volumeMounts"] if m["name"] == "pod-resources")
    assert mount["readOnly"] is True
    # the exporter's default socket lies in the mounted directory, so no flag is needed
    assert ExporterConfig().pod_resources_socket.parent == Path(mount["mountPath"])


def test_without_pod_resources_the_socket_is_not_mounted_and_attribution_says_so(helm):
    objects = template(
        helm,
        "--set",
        "exporter.podResources=false,exporter.securityContext.runAsUser=10001,"
        "exporter.securityContext.runAsNonRoot=true",
    )
    spec = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert "pod-resources" not in {v["name"] for v in spec["volumes"]}
    container = exporter_container(objects)
    assert "--no-attribution.kubernetes" in container["args"]
    assert container["securityContext"]["runAsUser"] == 10001


def mps_root_volume_and_mount(objects: list[dict[str, Any]]) -> tuple[Any, Any]:
    """The exporter's `mps-root` hostPath volume and its mount (None where not rendered)."""
    spec = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    volume = next((v for v in spec["volumes"] if v["name"] == "mps-root"), None)
    mount = next((m for m in exporter_container(objects)["volumeMounts"] if m["name"] == "mps-root"), None)
    return volume, mount


def test_the_device_plugins_mps_root_is_mounted_read_only_at_its_host_path(helm):
    volume, mount = mps_root_volume_and_mount(rendered(helm, "default"))
    # the device plugin's own MPS control daemon DaemonSet declares its root this way
    assert volume["hostPath"] == {"path": "/run/nvidia/mps", "type": "DirectoryOrCreate"}
    assert mount == {"name": "mps-root", "mountPath": "/run/nvidia/mps", "readOnly": True}


def test_the_exporter_is_given_the_device_plugins_mps_pipe_directory_under_that_mount(helm):
    from gpulens.exporter.cli import parse_config

    objects = rendered(helm, "default")
    _, mount = mps_root_volume_and_mount(objects)
    [flag] = [a for a in exporter_container(objects)["args"] if a.startswith("--mps-pipe-dir=")]
    config = parse_config([flag], env={})
    assert config.mps_pipe_dir == f"{mount['mountPath']}/nvidia.com/gpu/pipe"


def test_the_mps_root_and_resource_values_reach_the_mount_and_the_flag(helm):
    objects = template(
        helm, "--set", "exporter.mps.root=/var/run/mps/,exporter.mps.resource=nvidia.com/gpu.shared"
    )
    volume, mount = mps_root_volume_and_mount(objects)
    assert volume["hostPath"]["path"] == mount["mountPath"] == "/var/run/mps/"
    assert "--mps-pipe-dir=/var/run/mps/nvidia.com/gpu.shared/pipe" in exporter_container(objects)["args"]


def test_with_mps_off_neither_the_mps_root_nor_the_flag_is_rendered(helm):
    objects = template(helm, "--set", "exporter.mps.enabled=false")
    assert mps_root_volume_and_mount(objects) == (None, None)
    assert not [a for a in exporter_container(objects)["args"] if a.startswith("--mps-pipe-dir")]


def test_values_schema_rejects_a_relative_mps_root(helm):
    error = template_error(helm, "--set", "exporter.mps.root=run/nvidia/mps")
    assert "/exporter/mps/root" in error


def test_runtime_class_can_be_left_to_the_node_default(helm):
    objects = template(helm, "--set", "exporter.runtimeClassName=")
    assert "runtimeClassName" not in only(objects, "DaemonSet")["spec"]["template"]["spec"]


def test_probes_are_http_health_checks_without_web_config(helm):
    container = exporter_container(rendered(helm, "default"))
    assert container["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "metrics"}


@pytest.mark.parametrize(
    "setting",
    [
        "web.basicAuth.enabled=true,web.basicAuth.users.prometheus=$2b$10$abcdefghijklmnopqrstuv",
        "web.tls.enabled=true,web.tls.secretName=exporter-tls",
        "web.existingSecret=my-web-config",
    ],
)
def test_probes_switch_to_tcp_when_metrics_need_credentials_or_tls(helm, setting):
    # an HTTP probe would get 401 (basic auth) or speak plain HTTP to a TLS port
    container = exporter_container(template(helm, "--set", setting))
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["tcpSocket"] == {"port": "metrics"}
        assert "httpGet" not in container[probe]
    assert "--web.config.file=/etc/gpulens/web/web-config.yml" in container["args"]


def test_rendered_web_config_is_one_the_exporter_loads_and_its_password_works(helm, tmp_path):
    from gpulens.httpd.webconfig import load_web_config

    objects = rendered(helm, "kube-prometheus-stack")
    secret = only(objects, "Secret", "gpulens-web-config")
    text = secret["stringData"]["web-config.yml"]
    # the TLS Secret is mounted at /etc/gpulens/tls: stand a real certificate in for it
    tls_dir = tmp_path / "tls"
    write_self_signed_certificate(tls_dir)
    path = tmp_path / "web-config.yml"
    path.write_text(text.replace("/etc/gpulens/tls/", f"{tls_dir}/"))
    config = load_web_config(path)
    assert config.tls is not None and config.basic_auth is not None
    import base64

    good = "Basic " + base64.b64encode(f"prometheus:{SCRAPE_PASSWORD}".encode()).decode()
    assert config.basic_auth.check(good)
    assert not config.basic_auth.check("Basic " + base64.b64encode(b"prometheus:wrong").decode())
    # the pod mounts that Secret where --web.config-file points
    spec = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "web-config")
    assert volume["secret"]["secretName"] == "gpulens-web-config"
    tls_volume = next(v for v in spec["volumes"] if v["name"] == "tls")
    assert tls_volume["secret"]["secretName"] == "gpulens-exporter-tls"


def write_self_signed_certificate(directory: Path) -> None:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpulens-exporter")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    directory.mkdir()
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def test_a_changed_web_config_rolls_the_exporter_pods(helm):
    def checksum(password_hash: str) -> str:
        objects = template(helm, "--set", f"web.basicAuth.enabled=true,web.basicAuth.users.p={password_hash}")
        annotations: dict[str, str] = only(objects, "DaemonSet")["spec"]["template"]["metadata"][
            "annotations"
        ]
        return annotations["checksum/web-config"]

    assert checksum("$2b$10$aaaaaaaaaaaaaaaaaaaaaa") != checksum("$2b$10$bbbbbbbbbbbbbbbbbbbbbb")


# --- scraping -----------------------------------------------------------------------------------


def test_default_podmonitor_selects_the_exporter_pods_and_names_instances_by_node(helm):
    objects = rendered(helm, "default")
    monitor = only(objects, "PodMonitor")
    pod_labels = only(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert selects(monitor["spec"]["selector"]["matchLabels"], pod_labels)
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in exporter_container(objects)["ports"]}
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"} in endpoint[
        "relabelings"
    ]
    assert not [o for o in objects if o["kind"] == "ServiceMonitor"]


def test_kube_prometheus_stack_servicemonitor_carries_the_release_label_and_scrape_settings(helm):
    objects = rendered(helm, "kube-prometheus-stack")
    monitor = only(objects, "ServiceMonitor", "gpulens-exporter")
    assert selects(KPS_RELEASE_LABEL, monitor["metadata"]["labels"])
    service = only(objects, "Service", "gpulens-exporter")
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["interval"] == "30s" and endpoint["scrapeTimeout"] == "20s"
    assert endpoint["scheme"] == "https"
    assert endpoint["basicAuth"]["password"] == {"name": "gpulens-scrape", "key": "password"}
    assert {"targetLabel": "cluster", "replacement": "gpu-prod"} in endpoint["relabelings"]
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    assert not [o for o in objects if o["kind"] == "PodMonitor"]
    for rule in (o for o in objects if o["kind"] == "PrometheusRule"):
        assert selects(KPS_RELEASE_LABEL, rule["metadata"]["labels"])


def test_service_selects_the_exporter_pods_and_targets_the_named_port(helm, value_set):
    objects = rendered(helm, value_set)
    service = only(objects, "Service", "gpulens-exporter")
    pod_labels = only(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert selects(service["spec"]["selector"], pod_labels)
    (port,) = service["spec"]["ports"]
    assert port["port"] == 9842 and port["targetPort"] == "metrics"


def test_scrape_job_names_match_the_exporter_alerts_job_selector_under_another_release_name(helm):
    # alerts/gpu_alerts.yml watches up{job=~".*gpulens.*"}; the job is the Service (ServiceMonitor)
    # or <namespace>/<PodMonitor> name
    objects = template(helm, "--set", "podMonitor.enabled=false,serviceMonitor.enabled=true", release="prod")
    assert "gpulens" in only(objects, "ServiceMonitor")["metadata"]["name"]
    assert "gpulens" in only(objects, "Service")["metadata"]["name"]


# --- cross-references and namespaces ------------------------------------------------------------


def test_every_namespaced_object_is_in_the_release_namespace(helm, value_set):
    for obj in rendered(helm, value_set):
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"]
        elif obj["kind"] == "ConfigMap" and obj["metadata"]["name"].endswith("-dashboard"):
            continue  # dashboards.namespace may put them beside Grafana
        else:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]


def test_referenced_service_accounts_config_maps_claims_and_chart_secrets_are_rendered(helm, value_set):
    objects = rendered(helm, value_set)
    shipped = {(o["kind"], o["metadata"]["name"]) for o in objects}
    user_secrets = {"gpulens-exporter-tls"}  # cert-manager's, named in the values
    for obj in objects:
        spec = pod_spec_of(obj)
        if spec is None:
            continue
        assert ("ServiceAccount", spec["serviceAccountName"]) in shipped
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in shipped
            if "secret" in volume and volume["secret"]["secretName"] not in user_secrets:
                assert ("Secret", volume["secret"]["secretName"]) in shipped
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                assert ("ConfigMap", source["configMapRef"]["name"]) in shipped
            assert {m["name"] for m in container.get("volumeMounts", [])} <= {
                v["name"] for v in spec["volumes"]
            }


def test_only_the_remediation_receiver_gets_an_api_token(helm, value_set):
    for obj in rendered(helm, value_set):
        spec = pod_spec_of(obj)
        if spec is not None:
            expected = obj["kind"] == "Deployment" and obj["metadata"]["name"] == "gpulens-remediate"
            assert spec["automountServiceAccountToken"] is expected, obj["metadata"]["name"]


def test_defaults_ship_neither_rbac_nor_the_optional_parts(helm):
    kinds = {o["kind"] for o in rendered(helm, "default")}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "Deployment", "CronJob"}


# --- the remediation receiver -------------------------------------------------------------------


def remediate_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = only(objects, "Deployment", "gpulens-remediate")["spec"]["template"][
        "spec"
    ]["containers"]
    (container,) = containers
    return container


def receiver_config(container: dict[str, Any], tmp_path: Path) -> Any:
    """The receiver's settings from the container's args, as `gpulens remediate` reads and checks
    them (the state directory, which exists only in the pod, points at a stand-in)."""
    from gpulens.cli import build_parser
    from gpulens.remediate.config import config_of

    args = [f"--state-dir={tmp_path}" if a.startswith("--state-dir=") else a for a in container["args"]]
    return config_of(build_parser("remediate").parse_args(args), env={})


def test_remediation_receiver_is_dry_run_with_arguments_gpulens_accepts(helm, tmp_path):
    container = remediate_container(template(helm, "--set", "remediate.enabled=true"))
    assert container["command"] == ["gpulens"]
    config = receiver_config(container, tmp_path)
    assert config.backend == "kubernetes" and not config.apply and not config.drain
    assert config.listen == ("0.0.0.0", 9843)
    assert str(config.token_file) == "/etc/gpulens/token/token"


def test_the_return_diagnostic_is_on_and_runs_the_receivers_own_image_by_default(helm, tmp_path):
    from gpulens.remediate.kubernetes import DEFAULT_DIAG_IMAGE

    container = remediate_container(template(helm, "--set", "remediate.enabled=true"))
    config = receiver_config(container, tmp_path)
    assert (config.diag, config.diag_level) == (True, 2)
    assert config.diag_image == container["image"] == DEFAULT_DIAG_IMAGE


def test_the_return_diagnostic_image_follows_the_receivers_image_and_tag(helm, tmp_path):
    settings = (
        "remediate.enabled=true,remediate.image.repository=registry.example/gpulens,remediate.image.tag=9.9"
    )
    container = remediate_container(template(helm, "--set", settings))
    assert receiver_config(container, tmp_path).diag_image == "registry.example/gpulens:9.9"


def test_the_return_diagnostic_level_image_and_off_switch_come_from_values(helm, tmp_path):
    settings = (
        "remediate.enabled=true,remediate.diagnostic.level=3,remediate.diagnostic.image=site/gpulens-dcgm:1"
    )
    config = receiver_config(remediate_container(template(helm, "--set", settings)), tmp_path)
    assert (config.diag, config.diag_level, config.diag_image) == (True, 3, "site/gpulens-dcgm:1")
    off = template(helm, "--set", "remediate.enabled=true,remediate.diagnostic.enabled=false")
    assert receiver_config(remediate_container(off), tmp_path).diag is False
    assert "level" in template_error(helm, "--set", "remediate.enabled=true,remediate.diagnostic.level=5")


def test_remediation_receiver_args_use_the_exporters_flag_names_and_no_deprecated_one(helm, tmp_path):
    container = remediate_container(rendered(helm, "kube-prometheus-stack"))
    assert any(a.startswith("--web.listen-address=") for a in container["args"])
    assert receiver_config(container, tmp_path).deprecated == ()


@pytest.mark.parametrize(
    ("setting", "kind", "endpoints"),
    [
        ("podMonitor.enabled=true,serviceMonitor.enabled=false", "PodMonitor", "podMetricsEndpoints"),
        ("podMonitor.enabled=false,serviceMonitor.enabled=true", "ServiceMonitor", "endpoints"),
    ],
)
def test_the_receiver_is_scraped_like_the_exporter_under_a_job_only_the_remediate_selector_reads(
    helm, setting: str, kind: str, endpoints: str
):
    objects = template(helm, "--set", f"remediate.enabled=true,{setting}")
    monitor = only(objects, kind, "gpulens-remediate")
    if kind == "PodMonitor":
        scraped = only(objects, "Deployment", "gpulens-remediate")["spec"]["template"]["metadata"]["labels"]
    else:
        scraped = only(objects, "Service", "gpulens-remediate")["metadata"]["labels"]
    assert selects(monitor["spec"]["selector"]["matchLabels"], scraped)
    (endpoint,) = monitor["spec"][endpoints]
    assert endpoint["port"] in {p["name"] for p in remediate_container(objects)["ports"]}
    assert endpoint["path"] == "/metrics"
    (job,) = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    # the mixin's defaults: remediateSelector job=~".*remediate.*", selector job=~".*gpulens.*"
    assert "remediate" in job and "gpulens" not in job


def test_remediation_apply_and_drain_are_values(helm, tmp_path):
    assert receiver_config(remediate_container(rendered(helm, "kube-prometheus-stack")), tmp_path).drain
    applied = template(helm, "--set", "remediate.enabled=true,remediate.apply=true")
    assert receiver_config(remediate_container(applied), tmp_path).apply


def test_remediation_rbac_grants_only_cordon_taint_eviction_and_gpu_fencing_to_its_own_account(helm):
    objects = rendered(helm, "kube-prometheus-stack")
    role = only(objects, "ClusterRole")
    grants = {(tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]}
    assert grants == {
        (("nodes",), ("get", "list", "patch")),
        (("pods",), ("list",)),
        (("pods/eviction",), ("create",)),
        # DRA: find a faulty GPU's device and fence it alone (docs/alerts.md, per-GPU fencing)
        (("resourceslices",), ("list",)),
        (("devicetaintrules",), ("create", "get", "delete")),
    }
    binding = only(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    spec = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert subject == {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": NAMESPACE}
    # in the release namespace only: the recovery Jobs and the breaker's ConfigMap
    local = only(objects, "Role")
    assert local["metadata"]["namespace"] == NAMESPACE
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in local["rules"]} == {
        (("jobs",), ("create", "get")),
        (("configmaps",), ("get", "patch")),  # resourceNames: the breaker's ConfigMap only
        (("configmaps",), ("create",)),
    }
    (named,) = [r for r in local["rules"] if r.get("resourceNames")]
    assert named["resourceNames"] == [f"{only(objects, 'Deployment')['metadata']['name']}-breaker"]
    assert only(objects, "RoleBinding")["subjects"] == [subject]


def test_remediation_service_and_token_secret_line_up(helm):
    objects = rendered(helm, "kube-prometheus-stack")
    deployment = only(objects, "Deployment")
    service = only(objects, "Service", "gpulens-remediate")
    assert selects(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    (port,) = service["spec"]["ports"]
    assert port["port"] == 9843 and port["targetPort"] == "http"
    secret = only(objects, "Secret", "gpulens-remediate-token")
    assert secret["stringData"]["token"] == "0123456789abcdef0123456789abcdef"


def test_remediation_taint_is_tolerated_by_the_exporter(helm):
    from gpulens.remediate.kubernetes import TAINT_KEY

    spec = only(rendered(helm, "default"), "DaemonSet")["spec"]["template"]["spec"]
    assert TAINT_KEY in {t["key"] for t in spec["tolerations"]}


# --- the report CronJob -------------------------------------------------------------------------


def test_report_cronjob_runs_gpulens_report_weekly_into_its_claim(helm):
    from gpulens.cli import build_parser

    objects = rendered(helm, "kube-prometheus-stack")
    cronjob = only(objects, "CronJob")
    assert cronjob["spec"]["schedule"] == "0 6 * * 1" and cronjob["spec"]["timeZone"] == "Etc/UTC"
    spec = pod_spec_of(cronjob)
    assert spec is not None
    (container,) = spec["containers"]
    assert container["command"] == ["/bin/sh", "-c"]
    settings = only(objects, "ConfigMap", "gpulens-report")["data"]
    script = (
        container["args"][0]
        .replace("$GPULENS_PROMETHEUS_URL", settings["GPULENS_PROMETHEUS_URL"])
        .replace("$GPULENS_REPORT_WINDOW", settings["GPULENS_REPORT_WINDOW"])
        .replace("$(date -u +%Y-%m-%d)", "2026-01-05")
    )
    argv = shlex.split(script)
    assert argv[:3] == ["exec", "gpulens", "report"]
    args = build_parser("report").parse_args(argv[2:])
    assert args.prometheus == "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
    assert args.window == "14d"
    assert str(args.out) == "/reports/2026-01-05"
    claim = only(objects, "PersistentVolumeClaim", "gpulens-report")
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["storageClassName"] == "standard"
    volume = next(v for v in spec["volumes"] if v["name"] == "reports")
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_report_uses_an_existing_claim_instead_of_making_one(helm):
    objects = template(helm, "--set", "report.enabled=true,report.persistence.existingClaim=reports")
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    spec = pod_spec_of(only(objects, "CronJob"))
    assert spec is not None
    volume = next(v for v in spec["volumes"] if v["name"] == "reports")
    assert volume["persistentVolumeClaim"]["claimName"] == "reports"


def _remediate_state(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = only(objects, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    doc: dict[str, Any] = volumes["state"]
    return doc


REMEDIATE_ON = "remediate.enabled=true,remediate.token.create=true,remediate.token.value=x"


def test_remediation_state_is_on_a_claim_unless_an_empty_dir_is_asked_for(helm):
    objects = template(helm, "--set", f"{REMEDIATE_ON},remediate.persistence.enabled=false")
    assert _remediate_state(objects) == {"name": "state", "emptyDir": {}}
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    (claim,) = [o for o in template(helm, "--set", REMEDIATE_ON) if o["kind"] == "PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "gpulens-remediate-state"


def test_remediation_persistence_puts_the_audit_log_on_a_claim_the_chart_creates(helm):
    objects = template(helm, "--set", f"{REMEDIATE_ON},remediate.persistence.enabled=true")
    (claim,) = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    assert _remediate_state(objects) == {
        "name": "state",
        "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]},
    }
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    validator = pytest.importorskip("kubernetes_validate")
    validator.validate(claim, validator.latest_version(), strict=True)


def test_remediation_persistence_can_use_an_existing_claim(helm):
    setting = f"{REMEDIATE_ON},remediate.persistence.enabled=true,remediate.persistence.existingClaim=mine"
    objects = template(helm, "--set", setting)
    assert _remediate_state(objects) == {"name": "state", "persistentVolumeClaim": {"claimName": "mine"}}
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
