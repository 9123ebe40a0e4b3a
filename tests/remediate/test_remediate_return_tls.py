"""`gpulens remediate return` talks to a receiver served over TLS (`--web.config.file`) whose
certificate a private CA signed (`--ca-file`), and to one that asks for client certificates
(`--cert-file`, `--key-file`).

Each receiver runs as its own process with the tests' throwaway CA (tests/exporter/tls_material.py);
the node asked for has no open episode, so an answer proves the request got through TLS and the
credentials: `rejected: node ... has no open episode`.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.exporter.tls_material import TlsFiles, make_tls_files
from tests.support.procs import free_port, running

TOKEN = "return-tls-token"
NODE = "gpu-9"
ANSWERED = f"rejected: node {NODE} has no open episode\n"


@dataclass(frozen=True)
class TlsReceiver:
    url: str
    tls: TlsFiles
    token: Path


def _receiver(directory: Path, client_certs: bool) -> Iterator[TlsReceiver]:
    """`gpulens remediate` over TLS on 127.0.0.1 (slurm backend over a no-op scontrol, dry run)."""
    tls = make_tls_files(directory)
    server: dict[str, str] = {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key)}
    if client_certs:
        server |= {"client_ca_file": str(tls.ca_cert), "client_auth_type": "RequireAndVerifyClientCert"}
    web = directory / "web.yml"
    web.write_text(json.dumps({"tls_server_config": server}))
    token = directory / "token"
    token.write_text(TOKEN)
    scontrol = directory / "scontrol"
    scontrol.write_text("#!/bin/sh\nexit 0\n")
    scontrol.chmod(0o755)
    port = free_port()
    cmd = [sys.executable, "-m", "gpulens.cli", "remediate", "--backend", "slurm"]
    cmd += ["--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web)]
    cmd += ["--scontrol", str(scontrol), "--token-file", str(token)]
    ready = ssl.create_default_context(cafile=str(tls.ca_cert))
    if client_certs:
        ready.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    url = f"https://127.0.0.1:{port}"
    with running(cmd, f"{url}/-/healthy", directory / "receiver.log", 60, context=ready):
        yield TlsReceiver(url, tls, token)


@pytest.fixture(scope="module")
def tls_receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsReceiver]:
    yield from _receiver(tmp_path_factory.mktemp("tls"), client_certs=False)


@pytest.fixture(scope="module")
def mtls_receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsReceiver]:
    yield from _receiver(tmp_path_factory.mktemp("mtls"), client_certs=True)


def back(receiver: TlsReceiver, *extra: str) -> subprocess.CompletedProcess[str]:
    """`gpulens remediate return NODE` against `receiver` with its token and `extra` flags."""
    cmd = [sys.executable, "-m", "gpulens.cli", "remediate", "return", NODE, "--url", receiver.url]
    cmd += ["--token-file", str(receiver.token), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_return_reaches_a_tls_receiver_through_the_ca_that_signed_its_certificate(
    tls_receiver: TlsReceiver,
) -> None:
    done = back(tls_receiver, "--ca-file", str(tls_receiver.tls.ca_cert))
    assert (done.returncode, done.stdout, done.stderr) == (1, ANSWERED, "")


def test_without_the_ca_return_refuses_the_receivers_certificate_in_one_line(
    tls_receiver: TlsReceiver,
) -> None:
    done = back(tls_receiver)
    (line,) = done.stderr.splitlines()
    assert done.returncode == 2 and done.stdout == ""
    assert line.startswith(f"gpulens: error: POST {tls_receiver.url}/-/return: ")
    assert "CERTIFICATE_VERIFY_FAILED" in line


def test_return_presents_a_client_certificate_to_a_receiver_that_asks_for_one(
    mtls_receiver: TlsReceiver,
) -> None:
    tls = mtls_receiver.tls
    done = back(
        mtls_receiver,
        *(
            "--ca-file",
            str(tls.ca_cert),
            "--cert-file",
            str(tls.client_cert),
            "--key-file",
            str(tls.client_key),
        ),
    )
    assert (done.returncode, done.stdout, done.stderr) == (1, ANSWERED, "")


def test_without_a_client_certificate_the_receiver_that_asks_for_one_is_not_reached(
    mtls_receiver: TlsReceiver,
) -> None:
    done = back(mtls_receiver, "--ca-file", str(mtls_receiver.tls.ca_cert))
    (line,) = done.stderr.splitlines()
    assert done.returncode == 2 and done.stdout == ""
    assert line.startswith(f"gpulens: error: POST {mtls_receiver.url}/-/return: ")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ca-file", "/nonexistent/ca.crt"], "--ca-file /nonexistent/ca.crt: cannot load: "),
        (["--cert-file", __file__], f"--cert-file {__file__}: cannot load: "),
        (["--key-file", "/etc/key.pem"], "--key-file needs --cert-file"),
    ],
    ids=["missing-ca", "not-a-certificate", "key-alone"],
)
def test_bad_tls_client_files_are_one_line_naming_the_flag(
    flags: list[str], message: str, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    cmd = [sys.executable, "-m", "gpulens.cli", "remediate", "return", NODE, "--url", "https://127.0.0.1:1"]
    done = subprocess.run(
        [*cmd, "--token-file", str(token), *flags], capture_output=True, text=True, timeout=60
    )
    (line,) = done.stderr.splitlines()
    assert done.returncode == 2
    assert line.startswith(f"gpulens: error: {message}")
