"""The deployment guides name only files, flags and ports that exist.

docs/quickstart.md, docs/kubernetes.md, docs/slurm.md and deploy/slurm/README.md are what people
copy commands from; a renamed manifest or flag must fail here, not on someone's cluster.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpulens.devtools import demo

REPO = Path(__file__).resolve().parents[2]
GUIDES = [
    REPO / "docs" / "quickstart.md",
    REPO / "docs" / "kubernetes.md",
    REPO / "docs" / "slurm.md",
    REPO / "deploy" / "slurm" / "README.md",
]
# `deploy/<kind>/...` (not kubectl's `deploy/<name>` resource syntax), alerts/, dashboards/, docs/
REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:deploy/(?:docker|kubernetes|slurm|systemd)|alerts|dashboards|docs)(?:/[\w.*-]*[\w*])*/?)"
)


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_guide_names_exists(guide):
    text = guide.read_text()
    for path in sorted(set(REPO_PATH.findall(text))):
        if "<" in path:
            continue
        if "*" in path:
            assert list(REPO.glob(path)), f"{guide.name} names {path}, which matches nothing"
        else:
            assert (REPO / path).exists(), f"{guide.name} names {path}, which does not exist"


def test_the_kubernetes_guide_lists_every_shipped_manifest():
    text = (REPO / "docs" / "kubernetes.md").read_text()
    for path in sorted((REPO / "deploy" / "kubernetes").glob("*")):
        if path.name in {"kustomization.yaml", "__pycache__"}:
            continue
        name = f"{path.name}/" if path.is_dir() else path.name
        assert f"`{name}`" in text, f"docs/kubernetes.md does not describe {name}"


def test_the_quickstart_shows_the_demos_default_ports_and_options():
    text = (REPO / "docs" / "quickstart.md").read_text()
    for name in ("prometheus", "alertmanager", "exporter", "remediate"):
        assert f"127.0.0.1:{demo.PREFERRED_PORTS[name]}" in text, name
    options = {a for action in demo.build_parser()._actions for a in action.option_strings}
    for flag in set(re.findall(r"`(--[a-z-]+)", text)) & {
        "--history",
        "--step",
        "--scenario",
        "--dir",
        "--stop",
    }:
        assert flag in options
    assert "--live-scenario" in text and "--live-scenario" in options


def test_the_slurm_guide_uses_the_systemd_files_and_mapping_directory_shipped():
    text = (REPO / "docs" / "slurm.md").read_text()
    env = (REPO / "deploy" / "systemd" / "gpulens-exporter.env").read_text()
    mapping_dir = re.search(r"^GPULENS_JOB_MAPPING_DIR=(\S+)$", env, flags=re.MULTILINE).group(1)
    assert mapping_dir in text
    prolog = (REPO / "deploy" / "slurm" / "prolog.sh").read_text()
    assert f"GPULENS_JOB_MAPPING_DIR:-{mapping_dir}" in prolog, (
        "prolog and exporter must agree on the directory"
    )
    timer = (REPO / "deploy" / "systemd" / "gpulens-report.timer").read_text()
    assert "OnCalendar=Mon *-*-* 06:00:00" in timer and "Monday at 06:00" in text
