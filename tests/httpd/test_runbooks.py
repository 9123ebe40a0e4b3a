"""/runbooks/<Alert>: every alert's runbook, served from the package by the exporter (and the
receiver: tests/stack/test_runbook_links.py), nothing else ever read from disk by a request."""

from __future__ import annotations

import base64
from pathlib import Path

import bcrypt
import pytest
import yaml

from gpulens.exporter.config import ExporterConfig
from gpulens.httpd.runbooks import Runbooks
from gpulens.httpd.webconfig import load_web_config
from tests.exporter.test_server import get, serving

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.stem for p in (REPO / "alerts" / "runbooks").glob("*.md"))


@pytest.fixture(scope="module")
def runbooks() -> Runbooks:
    return Runbooks()


def alert_names() -> set[str]:
    doc = yaml.safe_load((REPO / "alerts" / "gpu_alerts.yml").read_text())
    return {rule["alert"] for group in doc["groups"] for rule in group["rules"] if "alert" in rule}


def test_the_package_holds_every_runbook_of_the_source_tree(runbooks: Runbooks) -> None:
    assert sorted(runbooks.books) == SHIPPED


def test_every_alert_has_a_served_runbook(runbooks: Runbooks) -> None:
    assert alert_names() <= set(runbooks.books)


@pytest.mark.parametrize("name", SHIPPED)
def test_a_runbook_is_an_html_page_titled_with_its_alert(runbooks: Runbooks, name: str) -> None:
    answer = runbooks.answer(f"/runbooks/{name}")
    assert answer is not None and answer.status == 200
    assert answer.content_type == "text/html; charset=utf-8"
    assert f"<title>{name}</title>".encode() in answer.body and f"<h1>{name}</h1>".encode() in answer.body


def test_the_markdown_source_is_served_beside_the_page(runbooks: Runbooks) -> None:
    answer = runbooks.answer("/runbooks/GPULost.md")
    assert answer is not None and answer.status == 200
    assert answer.content_type == "text/markdown; charset=utf-8"
    assert answer.body == (REPO / "alerts" / "runbooks" / "GPULost.md").read_bytes()


@pytest.mark.parametrize("path", ["/runbooks", "/runbooks/"])
def test_the_index_links_every_runbook(runbooks: Runbooks, path: str) -> None:
    answer = runbooks.answer(path)
    assert answer is not None and answer.status == 200
    for name in SHIPPED:
        assert f'<a href="/runbooks/{name}">'.encode() in answer.body


def test_an_unknown_alert_is_404_naming_it(runbooks: Runbooks) -> None:
    answer = runbooks.answer("/runbooks/GPUOnFire")
    assert answer is not None and answer.status == 404
    assert b"GPUOnFire" in answer.body and b"/runbooks/" in answer.body


@pytest.mark.parametrize(
    "path",
    [
        "/runbooks/../alerts/gpu_alerts.yml",
        "/runbooks/..%2f..%2fetc%2fpasswd",
        "/runbooks/GPULost/",
        "/runbooks/GPU_Lost",
        "/runbooks//etc/passwd",
        "/runbooks/GPULost.md.md",
        "/runbooks/.md",
    ],
)
def test_a_name_other_than_letters_and_digits_is_404(runbooks: Runbooks, path: str) -> None:
    answer = runbooks.answer(path)
    assert answer is not None and answer.status == 404


def test_only_letter_and_digit_named_markdown_files_are_loaded(tmp_path: Path) -> None:
    (tmp_path / "GPUOk.md").write_text("# GPUOk\n")
    (tmp_path / "bad-name.md").write_text("# bad\n")
    (tmp_path / "notes.txt").write_text("x")
    assert sorted(Runbooks(tmp_path).books) == ["GPUOk"]


def test_other_paths_are_left_to_the_server_s_other_routes(runbooks: Runbooks) -> None:
    assert runbooks.answer("/metrics") is None
    assert runbooks.answer("/runbooksX") is None


def test_the_exporter_serves_the_runbooks_and_its_landing_page_links_them() -> None:
    with serving() as (server, _):
        base = f"http://127.0.0.1:{server.port}"
        status, headers, body = get(f"{base}/runbooks/GPUXidFallenOffBus")
        missing = get(f"{base}/runbooks/GPUOnFire")[0]
        landing = get(f"{base}/")[2]
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b"<h1>GPUXidFallenOffBus</h1>" in body
    assert missing == 404
    assert b'href="/runbooks/"' in landing


def test_the_exporter_s_telemetry_path_is_still_its_own() -> None:
    with serving(config=ExporterConfig(telemetry_path="/runbooks/metrics")) as (server, _):
        status, _, body = get(f"http://127.0.0.1:{server.port}/runbooks/metrics")
    assert status == 200 and b"gpu_up" in body


def test_with_basic_auth_the_exporter_s_runbooks_need_the_credentials_too(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    credentials = {"Authorization": "Basic " + base64.b64encode(b"prometheus:s3cret").decode()}
    with serving(load_web_config(config)) as (server, _):
        url = f"http://127.0.0.1:{server.port}/runbooks/GPULost"
        anonymous = get(url)[0]
        allowed = get(url, credentials)[0]
    assert anonymous == 401 and allowed == 200
