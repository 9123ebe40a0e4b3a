"""The built wheel: it holds every file the commands read, and the commands work from it.

An editable install reads data files straight from the source tree, so a file missing from the
wheel only shows in a real install (the report CronJob, the container image, the systemd timer).
These tests build the wheel from a copy of the package sources (a stale build/ directory in the
checkout cannot leak into it), install it with its dependencies into a fresh virtual environment
(no system site-packages, no source tree on the path; dependencies come through pip and its
cache), and run the exporter, `simulate`, `recommend`, `report` and `dashboards build` from an empty
directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.support.procs import free_port, running

REPO = Path(__file__).resolve().parents[2]
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md")
SKIPPED_SUFFIXES = (".py", ".pyc")


def package_roots() -> dict[str, Path]:
    """setup.py's ROOTS: installed package name -> source directory."""
    text = re.search(r"ROOTS = \{(.*?)\}", (REPO / "setup.py").read_text(), flags=re.DOTALL)
    assert text, "setup.py has no ROOTS mapping"
    return {name: REPO / path for name, path in re.findall(r'"(gpulens[\w.]*)": "([^"]+)"', text.group(1))}


def data_files() -> dict[str, Path]:
    """Every non-Python file inside the package directories, by its path in the wheel."""
    found: dict[str, Path] = {}
    roots = package_roots()
    for name, root in roots.items():
        nested = [other for other in roots.values() if other != root and other.is_relative_to(root)]
        for path in root.rglob("*"):
            if not path.is_file() or path.suffix in SKIPPED_SUFFIXES or "__pycache__" in path.parts:
                continue
            if any(path.is_relative_to(other) for other in nested):
                continue  # mapped by its own root
            found["/".join([*name.split("."), *path.relative_to(root).parts])] = path
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        shutil.copy2(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for root in {path.relative_to(REPO).parts[0] for path in package_roots().values()}:
        shutil.copytree(REPO / root, source / root, ignore=ignore)
    dist = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (built,) = dist.glob("gpulens-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_holds_every_data_file_of_the_package_directories(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    wanted = data_files()
    assert "gpulens/analyzer/thresholds.yaml" in wanted  # the one the report used to miss
    missing = sorted(set(wanted) - names)
    assert not missing, f"not in the wheel (add them to [tool.setuptools.package-data]): {missing}"


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel and its analyzer and dashboards extras."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[analyzer,dashboards]"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return venv / "bin"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty current directory, far from the source tree."""
    path = tmp_path / "work"
    path.mkdir()
    return path


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env["MPLCONFIGDIR"] = str(Path(env.get("TMPDIR", "/tmp")) / "gpulens-wheel-mpl")
    return env


def run(bin_dir: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    command = [str(bin_dir / argv[0]), *argv[1:]]
    result = subprocess.run(command, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(argv)}: {result.stderr[-3000:]}"
    return result


@pytest.mark.slow
def test_the_installed_package_is_the_wheel_not_the_source_tree(installed, workdir):
    result = run(installed, workdir, "python", "-c", "import gpulens, sys; print(gpulens.__file__, sys.path)")
    location = Path(result.stdout.split()[0]).resolve()
    assert location.is_relative_to(installed.parent.resolve()), location
    assert str(REPO) not in result.stdout


@pytest.mark.slow
def test_exporter_from_the_wheel_serves_a_simulated_node(installed, workdir):
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    command = [
        str(installed / "gpulens-exporter"),
        "--simulate",
        "seed-case",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    ready = f"http://127.0.0.1:{port}/-/ready"
    with (
        running(command, ready, workdir / "exporter.log", timeout=120),
        urllib.request.urlopen(url, timeout=30) as response,
    ):
        text = response.read().decode()
    assert re.search(r"^gpu_up\{.*\} 1(\.0)?$", text, flags=re.MULTILINE), text[:2000]


@pytest.mark.slow
def test_simulate_recommend_and_report_from_the_wheel(installed, workdir):
    simulate = ("simulate", "seed-case", "--duration", "6h", "--step", "5m", "--out", "h")
    run(installed, workdir, "gpulens", *simulate)
    recommend = run(installed, workdir, "gpulens", "recommend", "--history", "h", "--format", "json")
    assert json.loads(recommend.stdout)
    run(installed, workdir, "gpulens", "report", "--history", "h", "--out", "report")
    written = {p.name for p in (workdir / "report").rglob("*") if p.is_file()}
    assert {"jobs.json"} <= written and any(name.endswith(".html") for name in written), written


@pytest.mark.slow
def test_dashboards_build_from_the_wheel_writes_into_the_current_directory(installed, workdir):
    result = run(installed, workdir, "gpulens", "dashboards", "build")
    out = workdir / "gpulens-dashboards"
    committed = {p.name: json.loads(p.read_text()) for p in (REPO / "dashboards" / "json").glob("*.json")}
    built = {p.name: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert built == committed, result.stdout
    assert "kind: ConfigMap" in (out / "dashboards-configmap.yaml").read_text()


@pytest.mark.slow
def test_the_wheel_holds_every_runbook_the_servers_serve(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    shipped = {f"gpulens/runbooks/{p.name}" for p in (REPO / "alerts" / "runbooks").glob("*.md")}
    assert shipped and not shipped - names, sorted(shipped - names)


@pytest.fixture(scope="module")
def lean(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel and its analyzer extra (the mixin builds the
    analyzer's recording rules, whose module needs pandas), not the dashboards extra: no grafanalib."""
    venv = tmp_path_factory.mktemp("lean-venv")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[analyzer]"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    probe = run(
        venv / "bin", venv, "python", "-c", "import importlib.util as u; print(u.find_spec('grafanalib'))"
    )
    assert probe.stdout.strip() == "None"
    return venv / "bin"


@pytest.mark.slow
def test_mixin_build_from_the_wheel_without_grafanalib_writes_rules_runbooks_and_shipped_dashboards(
    lean, workdir
):
    run(lean, workdir, "gpulens", "mixin", "build")
    out = workdir / "gpulens-mixin"
    assert (out / "rules" / "gpu_alerts.yml").read_text() == (REPO / "alerts" / "gpu_alerts.yml").read_text()
    assert {p.name for p in (out / "runbooks").glob("*.md")} >= {"GPULost.md", "GPUXidFallenOffBus.md"}
    committed = {p.name: json.loads(p.read_text()) for p in (REPO / "dashboards" / "json").glob("*.json")}
    assert {p.name: json.loads(p.read_text()) for p in (out / "dashboards").glob("*.json")} == committed


@pytest.mark.slow
def test_mixin_build_from_the_wheel_of_another_config_without_grafanalib_says_so_in_one_line(lean, workdir):
    (workdir / "my.yaml").write_text("clusterLabel: k8s_cluster\n")
    command = [str(lean / "gpulens"), "mixin", "build", "--config", "my.yaml", "--out", "out"]
    result = subprocess.run(
        command, cwd=workdir, env=clean_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "pip install 'gpulens[dashboards]'" in result.stderr
    assert "k8s_cluster" in (workdir / "out" / "rules" / "gpu_alerts.yml").read_text()


@pytest.mark.slow
def test_the_exporter_from_the_wheel_serves_the_runbooks(lean, workdir):
    port = free_port()
    command = [
        str(lean / "gpulens-exporter"),
        "--simulate",
        "seed-case",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with (
        running(command, f"http://127.0.0.1:{port}/-/ready", workdir / "exporter.log", timeout=120),
        urllib.request.urlopen(f"http://127.0.0.1:{port}/runbooks/GPULost", timeout=30) as response,
    ):
        page = response.read().decode()
    assert "<h1>GPULost</h1>" in page
