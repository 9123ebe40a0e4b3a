"""docker-compose.yml, deploy/docker/Dockerfile and deploy/docker/prometheus.yml.

There is no Docker engine on CI. `docker compose config` (or Debian's `docker-compose`) runs where
installed; everywhere these tests check what it would not catch anyway: every mounted file exists in the
repository, Prometheus scrapes services and ports that exist, the gpu profile really is the GPU
variant, nothing listens beyond loopback, and the image is non-root and exporter-only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
PROMETHEUS = REPO / "deploy" / "docker" / "prometheus.yml"


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def services() -> dict[str, dict[str, Any]]:
    doc: dict[str, dict[str, Any]] = compose()["services"]
    return doc


def bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    """(host path in the repo, container path) of every `./...` volume of a service."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts.append((REPO / source[2:], target))
    return mounts


def container_path_to_repo(service: dict[str, Any], container_path: str) -> Path | None:
    """The repository file a path inside the container comes from, through the bind mounts."""
    for host, target in bind_mounts(service):
        if container_path == target:
            return host
        if container_path.startswith(target.rstrip("/") + "/"):
            return host / container_path[len(target.rstrip("/")) + 1 :]
    return None


def interpolate(text: str) -> str:
    """Compose's `${VAR:-default}` with nothing set in the environment: the default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def args_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return [interpolate(a) for a in (command.split() if isinstance(command, str) else command)]


def test_the_stack_has_every_service():
    assert set(services()) == {
        "exporter",
        "exporter-gpu",
        "prometheus",
        "alertmanager",
        "grafana",
        "remediate",
        "remediate-token",
    }


def test_every_service_has_an_image_or_a_build_of_a_real_dockerfile_stage():
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE))
    for name, service in services().items():
        assert service.get("image") or service.get("build"), name
        build = service.get("build")
        if build:
            assert (REPO / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
            assert build["target"] in stages, f"{name}: no stage {build['target']!r} in the Dockerfile"


def test_every_bind_mounted_path_exists_in_the_repository():
    for name, service in services().items():
        for host, _target in bind_mounts(service):
            assert host.exists(), f"{name} mounts {host.relative_to(REPO)}, which does not exist"
            assert ":ro" in next(v for v in service["volumes"] if v.startswith("./")), name


def test_published_ports_are_loopback_only_and_unique():
    published = []
    for name, service in services().items():
        for port in service.get("ports", []):
            host_ip, host_port, _container_port = str(port).split(":")
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            published.append(host_port)
    assert len(published) == len(set(published))


def test_default_exporter_is_simulated_and_needs_no_gpu():
    exporter = services()["exporter"]
    assert "profiles" not in exporter
    assert any(arg.startswith("--simulate=") for arg in args_of(exporter))
    assert "runtime" not in exporter and "deploy" not in exporter


def test_gpu_profile_runs_the_exporter_on_real_gpus_through_the_nvidia_runtime():
    gpu = services()["exporter-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["runtime"] == "nvidia"
    assert gpu["pid"] == "host"
    # utility mounts NVML; compute also nvidia-cuda-mps-control (MPS clients' thread caps), as in
    # the Kubernetes DaemonSet
    assert gpu["environment"] == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }
    assert not any(arg.startswith("--simulate") for arg in args_of(gpu))


def test_only_the_gpu_exporter_is_behind_a_profile():
    profiled = {name for name, service in services().items() if service.get("profiles")}
    assert profiled == {"exporter-gpu"}


def test_remediation_receiver_runs_in_dry_run_with_flags_it_accepts():
    from gpulens.cli import build_parser
    from gpulens.remediate.config import config_of

    remediate = services()["remediate"]
    config = config_of(build_parser("remediate").parse_args(args_of(remediate)), env={})
    assert not config.apply and config.backend == "slurm"
    # all addresses of Alertmanager's namespace: Alertmanager posts to loopback, Prometheus scrapes it
    assert config.listen == ("0.0.0.0", 9843)
    assert remediate["entrypoint"] == ["gpulens"]
    assert args_of(remediate)[0] == "remediate"
    assert "--apply" not in args_of(remediate)  # dry-run unless --apply


def test_alertmanager_reaches_the_webhook_at_the_shipped_url_with_the_shipped_token_file():
    config = yaml.safe_load((REPO / "alerts" / "alertmanager.yml").read_text())
    (receiver,) = [r for r in config["receivers"] if r["name"] == "gpulens-remediate"]
    (webhook,) = receiver["webhook_configs"]
    host_port = webhook["url"].split("//")[1].split("/")[0]
    remediate = services()["remediate"]
    # a loopback URL only reaches the webhook if it shares Alertmanager's network namespace
    assert host_port == f"127.0.0.1:{listen_port(remediate)}"
    assert remediate["network_mode"] == "service:alertmanager"
    token = webhook["http_config"]["authorization"]["credentials_file"]
    assert f"--token-file={token}" in args_of(remediate)
    # both see the token through the same named volume, which the one-shot service fills
    token_dir = str(Path(token).parent)
    for name in ("alertmanager", "remediate", "remediate-token"):
        mounts = {v.split(":")[1]: v.split(":")[0] for v in services()[name]["volumes"]}
        assert mounts[token_dir] == "gpulens-secrets", name
    assert services()["alertmanager"]["depends_on"]["remediate-token"] == {
        "condition": "service_completed_successfully"
    }


def test_prometheus_loads_the_mounted_rule_files_and_the_compose_config():
    prometheus = services()["prometheus"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in args_of(prometheus)
    assert container_path_to_repo(prometheus, "/etc/prometheus/prometheus.yml") == PROMETHEUS
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert config["rule_files"]
    for rule_file in config["rule_files"]:
        source = container_path_to_repo(prometheus, rule_file)
        assert source is not None and source.is_file(), f"{rule_file} is not mounted from the repository"
    assert {p.name for p in map(lambda r: container_path_to_repo(prometheus, r), config["rule_files"])} == {
        "recording_rules.yml",
        "analyzer_rules.yml",
        "gpu_alerts.yml",
    }


def listen_port(service: dict[str, Any]) -> int:
    for arg in args_of(service):
        if arg.startswith("--web.listen-address="):
            return int(arg.rsplit(":", 1)[1])
    raise AssertionError(f"no --web.listen-address in {args_of(service)}")


def test_prometheus_scrapes_the_services_on_the_ports_they_listen_on():
    config = yaml.safe_load(PROMETHEUS.read_text())
    # the provisioned datasource tells Grafana the exporter's 5 s cadence ($__rate_interval)
    assert config["global"]["scrape_interval"] == "5s"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    (dns,) = jobs["gpulens"]["dns_sd_configs"]
    assert set(dns["names"]) == {"exporter", "exporter-gpu"}
    assert dns["port"] == listen_port(services()["exporter"]) == listen_port(services()["exporter-gpu"])
    (static,) = jobs["remediate"]["static_configs"]
    remediate = services()["remediate"]
    host = remediate.get("network_mode", "service:remediate").removeprefix("service:")
    assert static["targets"] == [f"{host}:{listen_port(remediate)}"]
    (am,) = config["alerting"]["alertmanagers"]
    assert am["static_configs"][0]["targets"] == ["alertmanager:9093"]
    for job_name in jobs:
        # GPUExporterDown treats any scrape job named *gpulens* as an exporter
        assert job_name == "gpulens" or "gpulens" not in job_name


def test_prometheus_config_passes_promtool_with_the_repository_rules(tmp_path):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed")
    text = PROMETHEUS.read_text().replace("/etc/prometheus/alerts/", f"{REPO / 'alerts'}/")
    (tmp_path / "prometheus.yml").write_text(text)
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_uses_the_shipped_config():
    alertmanager = services()["alertmanager"]
    target = next(a.split("=", 1)[1] for a in args_of(alertmanager) if a.startswith("--config.file="))
    assert container_path_to_repo(alertmanager, target) == REPO / "alerts" / "alertmanager.yml"


def test_grafana_provisions_a_prometheus_datasource_and_the_dashboard_directory():
    grafana = services()["grafana"]
    provisioning = container_path_to_repo(grafana, "/etc/grafana/provisioning")
    assert provisioning is not None and provisioning.is_dir()
    datasources = [
        ds
        for path in sorted((provisioning / "datasources").glob("*.y*ml"))
        for ds in yaml.safe_load(path.read_text()).get("datasources", [])
    ]
    assert any(ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090" for ds in datasources)
    providers = [
        provider
        for path in sorted((provisioning / "dashboards").glob("*.y*ml"))
        for provider in yaml.safe_load(path.read_text()).get("providers", [])
    ]
    assert providers
    for provider in providers:
        source = container_path_to_repo(grafana, provider["options"]["path"])
        assert source is not None and list(source.glob("*.json")), provider["options"]["path"]


def test_dockerfile_is_python_slim_non_root_and_the_exporter_stage_has_no_analyzer_deps():
    text = DOCKERFILE.read_text()
    images = [line.split()[1] for line in text.splitlines() if line.startswith("FROM ")]
    assert [image for image in images if ":" in image] == ["python:3.11-slim"] * 2  # wheel, base
    stages = re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]
    assert stages[0].startswith("python:3.11-slim AS wheel") and "pip wheel --no-deps" in stages[0]
    final = stages[-1]
    assert final.startswith("base AS exporter"), "the exporter must be the default (last) stage"
    assert re.search(r"^USER 10001:10001$", final, flags=re.MULTILINE)
    install = final.split("RUN", 1)[1].split("\n")[0]
    # the image installs the built wheel, never the source tree
    assert "/dist/gpulens-*.whl)[web,kubernetes]" in install and "analyzer" not in install
    assert 'ENTRYPOINT ["gpulens-exporter"]' in final


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) or `docker-compose` (v1, Debian's package), whichever runs."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_config_validates_when_compose_is_available():
    command = compose_command()
    if command is None:
        pytest.skip("neither the docker compose plugin nor docker-compose is installed")
    for profile in ([], ["--profile", "gpu"]):
        result = subprocess.run(
            [*command, "-f", str(COMPOSE), *profile, "config", "--quiet"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr


def test_read_only_gpulens_containers_get_a_writable_tmp():
    # the simulated node renders its procfs under the temp dir; Python needs one too
    for name, service in services().items():
        if service.get("read_only") and service.get("image", "").startswith("gpulens"):
            assert "/tmp" in service.get("tmpfs", []), name


def installed_closure(requirement_names: list[str]) -> set[str]:
    """Names of every installed distribution these requirements pull in (extras followed)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [Requirement(r) for r in requirement_names]
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in (req.extras or {""})):
                todo.append(sub)
    return {k.split("[")[0] for k in seen}


def test_the_exporter_image_installs_no_analyzer_dependency():
    install = next(line for line in DOCKERFILE.read_text().splitlines() if "[web,kubernetes]" in line)
    extras = re.search(r"\.whl\)\[([a-z,]+)\]", install).group(1).split(",")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]
    closure = installed_closure(wanted)
    assert {"prometheus-client", "nvidia-ml-py", "pyyaml", "grpcio"} <= closure
    assert not closure & {"pandas", "numpy", "scikit-learn", "matplotlib", "pyarrow", "scipy"}, closure


def test_the_image_build_context_holds_every_package_root_setup_py_maps():
    # setup.py maps gpulens.* onto top-level directories; the image must copy (and not ignore) each
    roots = re.search(r"ROOTS = \{(.*?)\}", (REPO / "setup.py").read_text(), flags=re.DOTALL).group(1)
    paths = {p.split("/")[0] for p in re.findall(r'"gpulens[\w.]*": "([^"]+)"', roots)}
    assert paths >= {"src", "exporter", "analyzer", "dashboards", "sim", "remediate", "mixin", "devtools"}
    copied = set(re.findall(r"^COPY (\S+) ", DOCKERFILE.read_text(), flags=re.MULTILINE))
    ignore = (REPO / "deploy" / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    for path in paths:
        assert path in copied, f"{path}/ is a package root but the Dockerfile does not COPY it"
        assert f"!{path}/**" in ignore, f"{path}/ is excluded from the build context"
    for name in ("pyproject.toml", "setup.py", "README.md"):
        assert f"!{name}" in ignore
