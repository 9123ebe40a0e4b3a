"""Bad input over the wire and in traces: HTTP requests to the exporter, Prometheus answers to the
analyzer, corrupt trace files for `gpulens import-trace` (issue 11, "Bad input").

The exporter must keep serving after every request (checked with a real scrape after each case);
the analyzer and importer must exit non-zero with one `gpulens: error:` line naming the input. A
line saying "unexpected <Exception>" is the CLI's last-resort guard, not a clear error: it fails.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import logging
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens.cli import main as gpulens_main
from tests.reliability.harness import LiveExporter, live_exporter

Count = Callable[..., None]
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def clear_error(err: str, *names: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got {lines}"
    assert lines[0].startswith("gpulens: error: "), lines[0]
    assert not lines[0].startswith("gpulens: error: unexpected ") and "Traceback" not in err, lines[0]
    for name in names:
        assert name in lines[0], f"{lines[0]!r} does not name {name!r}"


# ---- HTTP requests to the exporter ---------------------------------------------------------------
@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveExporter]:
    with live_exporter(tmp_path_factory.mktemp("http"), interval=0.5) as running:
        yield running


def raw_request(port: int, payload: bytes, timeout: float = 3.0) -> bytes:
    """Send `payload`, half-close, read the answer until the server closes (bounded)."""
    chunks: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + timeout
        with contextlib.suppress(OSError):
            while time.monotonic() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    return b"".join(chunks)


def status_of(response: bytes) -> int | None:
    if not response.startswith(b"HTTP/1."):
        return None
    return int(response.split(b" ", 2)[1])


def still_serving(live: LiveExporter) -> None:
    scrape = live.scrape()
    assert scrape.status == 200 and b"gpu_up" in scrape.body


REQUESTS: dict[str, tuple[bytes, set[int | None]]] = {
    "post": (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", {501}),
    "put": (b"PUT /metrics HTTP/1.1\r\nHost: x\r\n\r\n", {501}),
    "delete": (b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n", {501}),
    "options": (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", {501}),
    "trace": (b"TRACE /metrics HTTP/1.1\r\nHost: x\r\nCookie: secret\r\n\r\n", {501}),
    "connect": (b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n", {501}),
    "made-up-method": (b"BREW /metrics HTTP/1.1\r\n\r\n", {501}),
    "dot-dot": (b"GET /../../etc/passwd HTTP/1.1\r\n\r\n", {404}),
    "encoded-dot-dot": (b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\n\r\n", {404}),
    "double-slash": (b"GET //metrics HTTP/1.1\r\n\r\n", {200, 404}),  # http.server folds //
    "nul-in-path": (b"GET /metrics%00.txt HTTP/1.1\r\n\r\n", {404}),
    "asterisk": (b"GET * HTTP/1.1\r\n\r\n", {404}),
    "absolute-uri": (b"GET http://evil.example/metrics HTTP/1.1\r\n\r\n", {404}),
    "long-path": (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", {414}),
    "long-query": (b"GET /metrics?" + b"q=1&" * 2000 + b" HTTP/1.1\r\n\r\n", {200}),
    "too-many-headers": (b"GET /metrics HTTP/1.1\r\n" + b"X-A: b\r\n" * 150 + b"\r\n", {431}),
    "huge-header": (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"x" * 70000 + b"\r\n\r\n", {400, 431}),
    "header-without-colon": (b"GET /metrics HTTP/1.1\r\nthis is not a header\r\n\r\n", {200, 400}),
    "bad-accept": (
        b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;q=x;version=\xff\r\n\r\n",
        {200},
    ),
    "bad-accept-encoding": (b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip;q=nope, *;q=-1\r\n\r\n", {200}),
    "http-9": (b"GET /metrics HTTP/9.9\r\n\r\n", {505, None}),
    "no-version": (b"GET /metrics\r\n\r\n", {None, 200, 400}),
    "garbage": (b"\x00\xff\xfe garbage \r\n\r\n", {400, None}),  # an HTTP/0.9-style error page
    "tls-hello-on-plain-http": (bytes.fromhex("160301020001000200") + b"\x00" * 200, {400, None}),
    "empty": (b"", {None}),
    "only-newlines": (b"\r\n" * 50, {None, 400}),
    "huge-declared-body": (
        b"POST /metrics HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n" + b"x" * 65536,
        {501},
    ),
    "get-with-1mb-body": (
        b"GET /-/healthy HTTP/1.1\r\nContent-Length: 1048576\r\n\r\n" + b"y" * 1048576,
        {200},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(REQUESTS))
def test_odd_http_requests_get_an_error_or_nothing_and_the_exporter_keeps_serving(
    live: LiveExporter, bad_input: Count, case: str
) -> None:
    bad_input("HTTP request")
    payload, expected = REQUESTS[case]
    response = raw_request(live.server.port, payload)
    assert status_of(response) in expected, response[:200]
    if status_of(response) not in (200, None) or b"Error code" in response:
        assert b"gpu_up" not in response  # an error answer carries no metrics
    assert b"secret" not in response  # TRACE is not echoed
    still_serving(live)


@pytest.mark.slow
@FUZZ
@given(
    method=st.sampled_from(["GET", "HEAD", "get", "G ET", "GET\x00"]) | st.text(max_size=8),
    path=st.sampled_from(["/metrics", "/", "/-/ready"]) | st.text(max_size=40),
    headers=st.lists(st.tuples(st.text(max_size=20), st.text(max_size=40)), max_size=5),
)
def test_fuzzed_requests_never_break_the_exporter(
    live: LiveExporter, bad_input: Count, method: str, path: str, headers: list[tuple[str, str]]
) -> None:
    bad_input("HTTP request (fuzzed)")
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers), "", ""]
    response = raw_request(live.server.port, "\r\n".join(lines).encode("utf-8", "surrogateescape"), timeout=2)
    assert status_of(response) in (None, 200, 400, 404, 414, 431, 501, 505), response[:120]
    still_serving(live)


@pytest.mark.slow
def test_slowloris_connections_do_not_block_scrapes(live: LiveExporter, bad_input: Count) -> None:
    bad_input("HTTP request (slowloris)", 100)
    baseline = threading.active_count()
    slow: list[socket.socket] = []
    try:
        for i in range(100):
            sock = socket.create_connection(("127.0.0.1", live.server.port), timeout=2)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow-" + str(i).encode() + b": ")
            slow.append(sock)
        for _ in range(20):  # answered while every trickled head is still open
            scrape = live.scrape()
            assert scrape.status == 200
            for sock in slow[:10]:
                sock.sendall(b"a")  # keep trickling
    finally:
        for sock in slow:
            sock.close()
    deadline = time.monotonic() + 5
    while threading.active_count() > baseline + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= baseline + 2, "connection threads outlived their connections"


@pytest.mark.slow
def test_bad_mapping_files_in_the_live_directory_keep_jobs_exported(
    live: LiveExporter, bad_input: Count
) -> None:
    bad_input("job-mapping file (live exporter)", 3)
    directory = live.exporter.config.job_mapping_dir
    assert directory is not None
    (directory / "7").write_bytes(b"\x00\x01binary\xff" * 100)  # GPU 7 is idle in dgx-h100
    (directory / "7.1").write_bytes(b"1\n" * 40000)
    (directory / "7.2").symlink_to("/etc/passwd")
    mark = live.logs.mark()
    time.sleep(1.2)  # two samples
    body = live.scrape().body
    assert b'job_id="5101"' in body
    assert b'gpulens_collector_success{collector="jobs"} 1.0' in body
    skipped = live.logs.matching("skipping job mapping file", since=mark)
    assert len(skipped) == 3, skipped


# ---- Prometheus answers to the analyzer ----------------------------------------------------------
@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    delay: float = 0.0
    close: bool = False


@dataclass
class FakePrometheus:
    """A tiny HTTP API server: `answer(query)` decides each response."""

    answer: Callable[[str], Answer] = field(default=lambda _q: Answer())
    queries: list[str] = field(default_factory=list)

    @contextlib.contextmanager
    def serve(self) -> Iterator[str]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = self.rfile.read(length).decode()
                from urllib.parse import parse_qs

                query = parse_qs(form).get("query", [""])[0]
                outer.queries.append(query)
                answer = outer.answer(query)
                if answer.delay:
                    time.sleep(answer.delay)
                if answer.close:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

        class QuietServer(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up (the timeout case) must not print into a later test's stderr

        server = QuietServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()


def vector(*items: dict[str, Any]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": list(items)}}).encode()


JOB: dict[str, Any] = {
    "metric": {
        "job_id": "5101",
        "uuid": "GPU-1",
        "gpu_instance": "",
        "job_source": "slurm",
        "sharing": "exclusive",
    },
    "value": [1750000000, "1"],
}
ANSWERS: dict[str, Callable[[str], Answer]] = {
    "http-500": lambda q: Answer(500, b"boom"),
    "http-503-html": lambda q: Answer(503, b"<html>maintenance</html>"),
    "http-401": lambda q: Answer(401, b"unauthorized"),
    "http-404": lambda q: Answer(404, b"404 page not found"),
    "not-json": lambda q: Answer(200, b"<html>proxy login</html>"),
    "truncated-json": lambda q: Answer(200, vector(JOB)[:25]),
    "json-list": lambda q: Answer(200, b"[1, 2, 3]"),
    "no-status": lambda q: Answer(200, b'{"data": {}}'),
    "status-error": lambda q: Answer(
        400, b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}'
    ),
    "result-not-list": lambda q: Answer(
        200, b'{"status":"success","data":{"resultType":"vector","result":{}}}'
    ),
    "matrix": lambda q: Answer(200, b'{"status":"success","data":{"resultType":"matrix","result":[]}}'),
    "sample-without-value": lambda q: Answer(
        200, b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}'
    ),
    "empty": lambda q: Answer(200, vector()),
    "connection-closed": lambda q: Answer(close=True),
    "gzip-garbage": lambda q: Answer(200, gzip.compress(b"not json")),
    "partial-data": lambda q: Answer(
        200, vector(JOB) if "gpu_job_info" in q and "last_over_time" in q else vector()
    ),
    "nan-values": lambda q: Answer(
        200,
        vector(
            {**JOB, "value": [1750000000, "NaN"]},
            {**JOB, "metric": {**JOB["metric"], "stat": "p95"}, "value": [1750000000, "+Inf"]},
        ),
    ),
}


@pytest.fixture(scope="module")
def prometheus() -> Iterator[tuple[FakePrometheus, str]]:
    """One fake API server for the module; each test sets its `answer`."""
    fake = FakePrometheus()
    with fake.serve() as url:
        yield fake, url


def recommend(url: str, *extra: str) -> int:
    return gpulens_main(
        ["recommend", "--prometheus", url, "--window", "1h", "--end", "1750000000", "--retries", "0", *extra]
    )


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_bad_prometheus_answers_end_in_one_line(
    prometheus: tuple[FakePrometheus, str], capsys: pytest.CaptureFixture[str], bad_input: Count, case: str
) -> None:
    bad_input("Prometheus answer")
    fake, url = prometheus
    fake.answer = ANSWERS[case]
    code = recommend(url)
    # the one notice a good answer may add first: which query path (recording rules or raw series)
    notice = "gpulens: prometheus: joining raw series"
    err = "".join(line for line in capsys.readouterr().err.splitlines(True) if not line.startswith(notice))
    if case in ("partial-data", "nan-values") and code == 0:
        return  # analysing what is there is a valid answer to partial data
    assert code != 0
    if case in ("partial-data", "nan-values"):
        clear_error(err, "no job")  # what is missing, rather than where
    else:
        clear_error(err, url)


@FUZZ
@given(
    body=st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=10),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(["status", "data", "result", "resultType", "metric", "value", "error", "x"]),
                inner,
                max_size=4,
            )
        ),
        max_leaves=10,
    )
)
def test_fuzzed_prometheus_json_ends_in_one_line(
    prometheus: tuple[FakePrometheus, str], capsys: pytest.CaptureFixture[str], bad_input: Count, body: Any
) -> None:
    bad_input("Prometheus answer (fuzzed)")
    fake, url = prometheus
    fake.answer = lambda _q: Answer(200, json.dumps(body).encode())
    code = recommend(url)
    err = capsys.readouterr().err
    assert code != 0
    clear_error(err)


def test_a_prometheus_that_never_answers_times_out_with_one_line(bad_input: Count) -> None:
    from gpulens.analyzer.errors import AnalyzerError
    from gpulens.analyzer.sources.promclient import PromClient, PromConfig

    bad_input("Prometheus answer (timeout)")
    fake = FakePrometheus(lambda _q: Answer(200, vector(), delay=3.0))
    with fake.serve() as url:
        client = PromClient(PromConfig(url=url, timeout_s=0.3, retries=1, backoff_s=0.05))
        # the answer comes after 3 s: an error instead of it means each attempt was cut at 0.3 s
        with pytest.raises(AnalyzerError) as info:
            client.query("up", 1750000000)
    message = str(info.value)
    assert "\n" not in message and url in message and "2 attempts" in message, message


# ---- corrupt trace files -------------------------------------------------------------------------
POD_HEADER = "name,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time\n"
NODES = "sn,cpu_milli,memory_mib,gpu,model\nnode-1,96000,786432,8,V100M32\n"


def tarball(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


TRACES: dict[str, tuple[str, bytes]] = {
    "random-bytes": ("openb_pod_list_default.csv", bytes(range(256)) * 8),
    "empty": ("openb_pod_list_default.csv", b""),
    "header-only": ("openb_pod_list_default.csv", POD_HEADER.encode()),
    "missing-columns": ("openb_pod_list_default.csv", b"name,num_gpu\npod-1,1\n"),
    "wrong-types": (
        "openb_pod_list_default.csv",
        (POD_HEADER + "pod-1,one,1000,V100M32,LS,Running,abc,def\n").encode(),
    ),
    "ragged-rows": (
        "openb_pod_list_default.csv",
        (POD_HEADER + "pod-1,1,1000\npod-2,1,1000,V100M32,LS,Running,0,10,extra,extra\n").encode(),
    ),
    "utf16": (
        "openb_pod_list_default.csv",
        (POD_HEADER + "pod-1,1,1000,V100M32,LS,Running,0,10\n").encode("utf-16"),
    ),
    "truncated-tarball": (
        "openb_pod_list_default.tar.gz",
        tarball({"openb_pod_list_default.csv": (POD_HEADER * 50).encode()})[:60],
    ),
    "tarball-without-csv": ("openb_pod_list_default.tar.gz", tarball({"README": b"nothing here"})),
    "not-a-tarball": ("openb_pod_list_default.tar.gz", b"PK\x03\x04 this is a zip"),
    "negative-gpus": (
        "openb_pod_list_default.csv",
        (POD_HEADER + "pod-1,-4,1000,V100M32,LS,Running,0,10\n").encode(),
    ),
}


@pytest.mark.parametrize("case", sorted(TRACES))
def test_corrupt_traces_end_in_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_input: Count, case: str
) -> None:
    bad_input("trace file")
    name, data = TRACES[case]
    src = tmp_path / "trace"
    src.mkdir()
    (src / name).write_bytes(data)
    (src / "openb_node_list_gpu_node.csv").write_text(NODES)
    code = gpulens_main(["import-trace", "alibaba-gpu-v2023", str(src), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    if case == "negative-gpus" and code == 0:
        return  # a pod without GPUs is skipped, not an error
    assert code != 0
    clear_error(err, name if "tar" in name or case != "missing-columns" else "openb_pod_list_default")


@FUZZ
@given(data=st.binary(max_size=400) | st.text(max_size=300).map(lambda t: (POD_HEADER + t).encode()))
def test_fuzzed_trace_files_end_in_one_line(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    bad_input: Count,
    data: bytes,
) -> None:
    bad_input("trace file (fuzzed)")
    src = tmp_path_factory.mktemp("trace")
    (src / "openb_pod_list_default.csv").write_bytes(data)
    (src / "openb_node_list_gpu_node.csv").write_text(NODES)
    code = gpulens_main(["import-trace", "alibaba-gpu-v2023", str(src), "--out", str(src / "out")])
    err = capsys.readouterr().err
    if code != 0:
        clear_error(err)


GENAI_MEMORY_OK = b"timestamp_anon,value,container_ip\n0,1073741824,10.0.0.1\n60,1073741824,10.0.0.1\n"
GENAI_UTIL_OK = b"value,timestamp_anon,container_ip\n50,0,10.0.0.1\n40,60,10.0.0.1\n"
GENAI: dict[str, tuple[bytes, bytes]] = {
    "util-random-bytes": (bytes(range(255, 0, -1)) * 4, GENAI_MEMORY_OK),
    "util-missing-columns": (b"value\n50\n", GENAI_MEMORY_OK),
    "memory-not-numeric": (GENAI_UTIL_OK, b"timestamp_anon,value,container_ip\n0,lots,10.0.0.1\n"),
    "timestamps-not-numeric": (
        b"value,timestamp_anon,container_ip\n50,yesterday,10.0.0.1\n",
        GENAI_MEMORY_OK,
    ),
    "no-rows": (b"value,timestamp_anon,container_ip\n", b"timestamp_anon,value,container_ip\n"),
}


@pytest.mark.parametrize("case", sorted(GENAI))
def test_corrupt_genai_traces_end_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_input: Count, case: str
) -> None:
    bad_input("trace file")
    util, memory = GENAI[case]
    src = tmp_path / "genai"
    src.mkdir()
    (src / "pod_gpu_duty_cycle_anon.csv").write_bytes(util)
    (src / "pod_gpu_memory_used_bytes_anon.csv").write_bytes(memory)
    argv = [
        "import-trace",
        "alibaba-genai-2026",
        str(src),
        "--out",
        str(tmp_path / "out"),
        "--gpu-model",
        "H100-80GB",
    ]
    code = gpulens_main(argv)
    assert code != 0
    clear_error(capsys.readouterr().err, str(src))


@pytest.mark.slow
def test_a_procfs_root_that_does_not_exist_is_named_once(tmp_path: Path, bad_input: Count) -> None:
    bad_input("exporter flags (--procfs)")
    missing = tmp_path / "no-such-proc"
    with live_exporter(tmp_path, interval=0.4, procfs=missing, job_mapping_dir=None) as live:
        live.wait_for(lambda b: b'job_id="unknown"' in b, what="unknown jobs")
        time.sleep(1.2)
        still_serving(live)
        lines = live.logs.matching(str(missing), min_level=logging.WARNING)
        assert len(lines) == 1, lines


ANALYZER_ARGS: dict[str, tuple[list[str], str]] = {
    "ftp-url": (["--prometheus", "ftp://prom:9090", "--window", "1h"], "ftp://prom:9090"),
    "no-host": (["--prometheus", "http://", "--window", "1h"], "--prometheus"),
    "bad-window": (["--prometheus", "http://127.0.0.1:9", "--window", "7x"], "7x"),
    "missing-token-file": (
        ["--prometheus", "http://127.0.0.1:9", "--window", "1h", "--bearer-token-file", "/nonexistent/token"],
        "/nonexistent/token",
    ),
    "bad-end": (
        ["--prometheus", "http://127.0.0.1:9", "--window", "1h", "--end", "yesterday-ish"],
        "yesterday-ish",
    ),
    "missing-history": (["--history", "/nonexistent/history"], "/nonexistent/history"),
}


@pytest.mark.parametrize("case", sorted(ANALYZER_ARGS))
def test_bad_analyzer_arguments_end_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_input: Count, case: str
) -> None:
    bad_input("analyzer command line")
    args, name = ANALYZER_ARGS[case]
    assert gpulens_main(["recommend", *args, "--retries", "0"]) != 0
    clear_error(capsys.readouterr().err, name)
