"""Basic auth and web config like exporter-toolkit (issue 17 item 3): no user enumeration by timing,
a 401 for any password, and every contradiction or unknown key refused when the file is loaded."""

from __future__ import annotations

import base64
import contextlib
import http.client
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from gpulens.exporter.config import ConfigError, ExporterConfig
from gpulens.exporter.server import HttpServer
from gpulens.httpd.webconfig import WebConfig, load_web_config
from tests.exporter.test_server import StubExporter, _published
from tests.exporter.tls_material import TlsFiles, make_tls_files

COST = 5


def basic(user: str, password: str | bytes) -> str:
    raw = password if isinstance(password, bytes) else password.encode()
    return "Basic " + base64.b64encode(user.encode() + b":" + raw).decode()


def hashed(password: bytes) -> str:
    return bcrypt.hashpw(password, bcrypt.gensalt(rounds=COST)).decode()


def web_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@contextlib.contextmanager
def serving(web: WebConfig) -> Iterator[int]:
    server = HttpServer(StubExporter(current=_published(True), config=ExporterConfig()), "127.0.0.1", 0, web)
    server.start()
    try:
        yield server.port
    finally:
        server.stop()


def get(port: int, path: str, authorization: str | None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers={"Authorization": authorization} if authorization else {})
    answer = conn.getresponse()
    body = answer.read()
    conn.close()
    return answer.status, dict(answer.getheaders()), body


# ---- timing: counted bcrypt work instead of wall time ---------------------------------------------
def test_an_unknown_user_costs_the_same_bcrypt_work_as_a_wrong_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = load_web_config(
        web_file(tmp_path, f"basic_auth_users:\n  alice: '{hashed(b'right')}'\n")
    ).basic_auth
    assert auth is not None
    costs: list[int] = []
    real = bcrypt.checkpw

    def counted(password: bytes, hashed_password: bytes) -> bool:
        costs.append(int(hashed_password.split(b"$")[2]))  # bcrypt work is 2**cost
        return real(password, hashed_password)

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    assert not auth.check(basic("alice", "wrong"))
    wrong_password = list(costs)
    costs.clear()
    assert not auth.check(basic("mallory", "wrong"))
    unknown_user = list(costs)
    assert wrong_password == unknown_user == [COST]


@pytest.mark.parametrize("length", [73, 100, 1000, 20000])
def test_a_password_longer_than_bcrypt_reads_is_a_401_not_a_dropped_connection(
    tmp_path: Path, length: int
) -> None:
    web = load_web_config(web_file(tmp_path, f"basic_auth_users:\n  alice: '{hashed(b'right')}'\n"))
    with serving(web) as port:
        status, headers, body = get(port, "/metrics", basic("alice", "x" * length))
        ok = get(port, "/metrics", basic("alice", "right"))[0]
    assert status == 401 and body == b"Unauthorized\n"
    assert headers["WWW-Authenticate"].startswith("Basic ")
    assert ok == 200


def test_a_long_password_is_checked_by_its_first_72_bytes_like_go_bcrypt(tmp_path: Path) -> None:
    password = b"p" * 72
    web = load_web_config(web_file(tmp_path, f"basic_auth_users:\n  alice: '{hashed(password)}'\n"))
    assert web.basic_auth is not None
    assert web.basic_auth.check(basic("alice", password + b"anything after byte 72"))


# ---- refused when loaded ----------------------------------------------------------------------------
GOOD_HASH = "$2y$10$" + "a" * 53
BAD_FILES = {
    "a truncated bcrypt hash": ("basic_auth_users:\n  alice: $2y$10$abc\n", "basic_auth_users.alice"),
    "a bcrypt cost over 31": (f"basic_auth_users:\n  alice: {GOOD_HASH.replace('$10$', '$32$')}\n", "alice"),
    "a bcrypt hash with a foreign character": (
        f"basic_auth_users:\n  alice: '{GOOD_HASH[:-1]}!'\n",
        "basic_auth_users.alice",
    ),
    "http2 on": ("http_server_config:\n  http2: true\n", "http_server_config.http2"),
    "an unknown http_server_config key": ("http_server_config:\n  timeout: 5s\n", "timeout"),
    "a header exporter-toolkit does not allow": (
        "http_server_config:\n  headers:\n    X-Powered-By: me\n",
        "X-Powered-By",
    ),
    "a header value exporter-toolkit does not allow": (
        "http_server_config:\n  headers:\n    X-Frame-Options: allow-from x\n",
        "X-Frame-Options",
    ),
    "YAML nested 1000 deep": (
        "basic_auth_users: " + "[" * 1000,
        "nested deeper than 64 levels at basic_auth_users",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_web_config_is_one_line_naming_the_field(tmp_path: Path, case: str) -> None:
    text, needle = BAD_FILES[case]
    with pytest.raises(ConfigError) as info:
        load_web_config(web_file(tmp_path, text))
    message = str(info.value)
    assert "\n" not in message and needle in message, message
    assert "$2y$10$abc" not in message  # a hash (or a pasted password) is never echoed


@pytest.mark.parametrize(
    ("tls_extra", "needle"),
    [
        ("  min_version: TLS13\n  max_version: TLS12\n", "min_version"),
        ("  client_ca_file: ca.crt\n", "client_ca_file"),
    ],
)
def test_contradictory_tls_settings_are_refused_when_loaded(
    tls_files: TlsFiles, tls_extra: str, needle: str
) -> None:
    path = tls_files.ca_cert.parent / "contradiction.yml"
    path.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n" + tls_extra)
    with pytest.raises(ConfigError, match=needle) as info:
        load_web_config(path)
    assert "\n" not in str(info.value)


def test_configured_headers_are_sent_with_every_answer(tmp_path: Path) -> None:
    text = (
        "http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n"
        "    X-Content-Type-Options: nosniff\n"
        f"basic_auth_users:\n  alice: '{hashed(b'right')}'\n"
    )
    with serving(load_web_config(web_file(tmp_path, text))) as port:
        answers = [
            get(port, "/metrics", basic("alice", "right")),
            get(port, "/nope", basic("alice", "right")),
            get(port, "/metrics", None),
        ]
    assert [a[0] for a in answers] == [200, 404, 401]
    for _, headers, _ in answers:
        assert headers["X-Frame-Options"] == "deny"
        assert headers["X-Content-Type-Options"] == "nosniff"
