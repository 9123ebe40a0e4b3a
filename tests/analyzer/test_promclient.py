"""Queries asked ahead (`PromClient.ask`): sent once, answered to the call that takes them, at most
`in_flight` at a time, and importable before pandas."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.sources.promclient import PromClient, PromConfig
from tests.analyzer.fakeprom import fake_prometheus


def _matrix(value: str) -> bytes:
    result = [{"metric": {"job_id": "a"}, "values": [[0, value], [300, value]]}]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


def _vector(value: str) -> bytes:
    result = [{"metric": {"job_id": "a"}, "value": [0, value]}]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


class Server:
    """Answers each query with its own text as the value after `delay_s`; PromQL `bad` fails."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.queries: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.lock = threading.Lock()

    def answer(self, body: bytes, _: int) -> tuple[int, bytes]:
        query = urllib.parse.parse_qs(body.decode())["query"][0]
        with self.lock:
            self.queries.append(query)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(self.delay_s)
        with self.lock:
            self.in_flight -= 1
        if query == "bad":
            return 400, json.dumps(
                {"status": "error", "errorType": "bad_data", "error": "parse error"}
            ).encode()
        return 200, _matrix(query) if query.endswith("]") else _vector(query)


@contextmanager
def serving(delay_s: float = 0.0) -> Iterator[tuple[str, Server]]:
    state = Server(delay_s)
    with fake_prometheus(state.answer) as (url, _):
        yield url, state


def test_an_asked_query_is_sent_once_and_answers_the_call_that_takes_it():
    with serving() as (url, server):
        client = PromClient(PromConfig(url))
        client.ask("up", 100.0)
        client.ask("up", 100.0)  # asking again before the answer is taken sends nothing more
        assert client.query("up", 100.0)[0]["value"][1] == "up"
    assert server.queries == ["up"]


def test_a_range_query_asked_ahead_is_sent_once_and_taken_by_the_range_call():
    with serving() as (url, server):
        client = PromClient(PromConfig(url))
        client.ask("up[5m:5m]", 100.0, matrix=True)
        assert client.query_matrix("up[5m:5m]", 100.0)[0]["values"][1][1] == "up[5m:5m]"
        client.query_matrix("up[5m:5m]", 100.0)  # taken once: a second call asks again
    assert server.queries == ["up[5m:5m]", "up[5m:5m]"]


def test_a_query_at_another_time_is_not_the_asked_one():
    with serving() as (url, server):
        client = PromClient(PromConfig(url))
        client.ask("up", 100.0)
        client.query("up", 200.0)
        client.query("up", 100.0)
    assert server.queries.count("up") == 2


def test_an_asked_querys_error_is_raised_by_the_call_that_takes_it():
    with serving() as (url, _):
        client = PromClient(PromConfig(url, retries=0))
        client.ask("bad", 100.0)
        with pytest.raises(AnalyzerError, match=r"query failed \(bad_data\): parse error"):
            client.query("bad", 100.0)


def test_asked_queries_run_at_most_in_flight_at_a_time():
    with serving(delay_s=0.2) as (url, server):
        client = PromClient(PromConfig(url, in_flight=2))
        exprs = [f"q{n}" for n in range(6)]
        for expr in exprs:
            client.ask(expr, 100.0)
        assert [client.query(e, 100.0)[0]["value"][1] for e in exprs] == exprs
    assert server.most_in_flight == 2  # overlapped, never past the limit


def test_the_client_and_the_first_queries_load_without_pandas():
    # the CLI asks the first queries before it imports the analysis: that needs both modules light
    code = (
        "import sys; import gpulens.analyzer.sources.promqueries, gpulens.analyzer.sources.promclient; "
        "print(sorted(m for m in ('pandas', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
