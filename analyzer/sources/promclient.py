"""The analyzer's Prometheus HTTP API client: instant queries, with answers asked ahead.

Works with Prometheus, Thanos, Mimir and VictoriaMetrics (plain `/api/v1/query`, POST form).
Transient failures (connection errors, 429, 5xx) are retried with backoff; anything else is one
clear `AnalyzerError` line. Requests go through `gpulens.httpclient`: each attempt has a total
deadline (`timeout_s`, not a per-read timeout), answers are bounded (`max_response_bytes`), and a
redirect to another origin is refused, so the bearer token or basic auth never leaves for it.

An answer is bounded in what it becomes as well as in bytes: decoded, a JSON answer of small
series takes about 15 times its size (a 100 MB answer peaked at 1.5 GiB), most of it one dict,
list and float per series. Before decoding, the answer's objects and arrays are counted (two
`bytes.count` passes, ~20 ms per 100 MB) and an answer that can hold more than `max_series`
series is refused with one line naming the query. `answer_limits` sizes both bounds from the
memory the run may use (`--max-memory`, by default half of the machine's or the cgroup's), shared
by the answers decoded at once (`--concurrency`).

Standard library only (no pandas): the CLI builds it and asks a run's first queries
(`promqueries.first`) before it imports the analysis, so Prometheus works while Python imports
(~0.7 s of a ~10 s run over 10,000 jobs).
"""

from __future__ import annotations

import base64
import math
import ssl
import threading
import time
import urllib.parse
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from gpulens import httpclient
from gpulens.analyzer.errors import AnalyzerError
from gpulens.safeload import InputError, load_json, read_text

RETRY_STATUS = {429, 500, 502, 503, 504}
MAX_SECRET_BYTES = 64 << 10  # a bearer token or password file
MAX_RESPONSE_BYTES = 256 << 20
MAX_SERIES = 2_000_000
DECODED_PER_BYTE = 16  # what a decoded answer of small series costs per byte of JSON, rounded up
DECODED_PER_SERIES = 1024  # bytes of a decoded series (metric dict, item dict, sample list, strings)
CONTAINERS_PER_SERIES = 3  # an instant-vector item is {"metric": {...}, "value": [t, "v"]}


def answer_limits(budget_bytes: int, in_flight: int = 1) -> tuple[int, int]:
    """(max_response_bytes, max_series) for a run that may use `budget_bytes` of memory with
    `in_flight` answers decoded at once: together they must fit in it whatever their shape (each
    at most 256 MiB and 2,000,000 series, at least 4 MiB and 10,000 series)."""
    share = budget_bytes // max(1, in_flight)
    size = max(4 << 20, min(MAX_RESPONSE_BYTES, share // DECODED_PER_BYTE))
    series = max(10_000, min(MAX_SERIES, share // DECODED_PER_SERIES))
    return size, series


def read_secret(path: str, what: str) -> str:
    """A bearer token or password file's text, stripped, for `--bearer-token-file` and
    `--basic-auth-password-file` alike; a one-line error naming the file when it cannot be read."""
    try:
        return read_text(path, MAX_SECRET_BYTES).strip()
    except OSError as exc:
        raise AnalyzerError(f"{path}: cannot read {what}: {exc.strerror}") from exc
    except InputError as exc:  # not UTF-8, or too large to be a secret
        raise AnalyzerError(str(exc)) from exc


def _shown(expr: str) -> str:
    """A query as named in one error line: whitespace folded, at most 100 characters."""
    text = " ".join(expr.split())
    return repr(text if len(text) <= 100 else text[:97] + "...")


@dataclass
class PromConfig:
    """How to reach the API."""

    url: str
    bearer_token: str | None = None
    bearer_token_file: str | None = None
    basic_auth: tuple[str, str] | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    timeout_s: float = 120.0  # per attempt, in total; Prometheus' own --query.timeout is 2m
    retries: int = 3
    backoff_s: float = 0.5
    max_response_bytes: int = MAX_RESPONSE_BYTES
    max_series: int = MAX_SERIES  # series (result items) one answer may hold
    in_flight: int = 4  # queries asked ahead (`PromClient.ask`) that run at once


class PromClient:
    """Instant queries with auth, TLS options, retries and strict response checking."""

    def __init__(self, config: PromConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        # (expr, time, range vector?) -> its answer, asked ahead
        self._asked: dict[tuple[str, str, bool], Future[list[dict[str, Any]]]] = {}
        self._slots = threading.BoundedSemaphore(max(1, config.in_flight))
        self.base = config.url.rstrip("/")
        parsed = urllib.parse.urlparse(self.base)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise AnalyzerError(f"--prometheus: {config.url!r} is not an http(s) URL")
        self.headers = {"Accept": "application/json", "User-Agent": "gpulens-analyzer"}
        token = config.bearer_token
        if config.bearer_token_file:
            token = read_secret(config.bearer_token_file, "bearer token")
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        elif config.basic_auth:
            user, password = config.basic_auth
            encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {encoded}"
        self.context: ssl.SSLContext | None = None
        if parsed.scheme == "https":
            try:
                self.context = ssl.create_default_context(cafile=config.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise AnalyzerError(f"{config.ca_file}: cannot load CA file: {exc}") from exc
            if config.insecure_skip_verify:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE

    def _post(self, path: str, params: dict[str, str], expr: str) -> bytes:
        data = urllib.parse.urlencode(params).encode()
        url = f"{self.base}{path}"
        headers = {**self.headers, "Content-Type": "application/x-www-form-urlencoded"}
        last = ""
        for attempt in range(self.config.retries + 1):
            if attempt:
                time.sleep(self.config.backoff_s * 2 ** (attempt - 1))
            try:
                answer = httpclient.request(
                    "POST",
                    url,
                    deadline=self.config.timeout_s,
                    headers=headers,
                    body=data,
                    max_bytes=self.config.max_response_bytes,
                    context=self.context,
                )
            except httpclient.TooLarge:  # retrying cannot help
                raise AnalyzerError(
                    f"{url}: the answer to {_shown(expr)} is over the {self.config.max_response_bytes:,}"
                    "-byte limit (sized from --max-memory); narrow the query or lower --chunk-size"
                ) from None
            except httpclient.RedirectRefused as exc:
                raise AnalyzerError(str(exc)) from None  # retrying cannot help
            except httpclient.HttpError as exc:
                last = str(exc).removeprefix(f"POST {url}: ")
                continue
            if 200 <= answer.status < 300:
                return answer.body
            if answer.status in RETRY_STATUS:
                last = f"HTTP {answer.status}"
                continue
            if answer.status in (400, 422):
                return answer.body  # PromQL errors come back as JSON with status "error"
            if answer.status in (401, 403):
                raise AnalyzerError(f"{url}: HTTP {answer.status}: check the bearer token / basic auth")
            raise AnalyzerError(f"{url}: HTTP {answer.status}")
        raise AnalyzerError(
            f"{url}: cannot reach Prometheus after {self.config.retries + 1} attempts: {last}"
        )

    def ask(self, expr: str, at: float, matrix: bool = False) -> None:
        """Start `query(expr, at)` (with `matrix`, `query_matrix`) now, in the background: the call
        that asks it later takes its answer (or its error) instead of sending it again. Asking twice
        sends it once.

        So a run overlaps what it knows it will ask with what it does before that (imports,
        other queries): at most `config.in_flight` asked queries run at once, each on a daemon
        thread, so an error or an interrupt in the caller never waits for them to finish.
        """
        key = (expr, _time(at), matrix)
        with self._lock:
            if key in self._asked:
                return
            answer: Future[list[dict[str, Any]]] = Future()
            self._asked[key] = answer

        def run() -> None:
            with self._slots:
                if not answer.set_running_or_notify_cancel():
                    return
                try:
                    answer.set_result(self._send(expr, at, matrix))
                except BaseException as exc:  # handed to the caller, who raises it
                    answer.set_exception(exc)

        threading.Thread(target=run, name="gpulens-prom-ask", daemon=True).start()

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """Instant vector query; returns the `result` list (labels in `metric`, `[ts, "v"]`)."""
        with self._lock:
            asked = self._asked.pop((expr, _time(at), False), None)
        return asked.result() if asked is not None else self._send(expr, at)

    def query_matrix(self, expr: str, at: float) -> list[dict[str, Any]]:
        """Instant query of a range vector (a subquery at the top): the `result` list, each item's
        points in `values` (`[[ts, "v"], ...]`); asked ahead with `ask(..., matrix=True)` or now."""
        with self._lock:
            asked = self._asked.pop((expr, _time(at), True), None)
        return asked.result() if asked is not None else self._send(expr, at, matrix=True)

    def _send(self, expr: str, at: float, matrix: bool = False) -> list[dict[str, Any]]:
        body = self._post("/api/v1/query", {"query": expr, "time": _time(at)}, expr)
        where = f"{self.base}/api/v1/query"
        self._check_series(body, where, expr, matrix)
        try:
            payload = load_json(body)
        except ValueError as exc:
            raise AnalyzerError(f"{where}: malformed response (not JSON): {body[:60]!r}") from exc
        if not isinstance(payload, dict) or "status" not in payload:
            raise AnalyzerError(f'{where}: malformed response: no "status" field')
        if payload["status"] != "success":
            kind, error = payload.get("errorType", "error"), payload.get("error", "unknown error")
            raise AnalyzerError(f"{where}: query failed ({kind}): {error}")
        data = payload.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise AnalyzerError(f"{where}: malformed response: data.result is not a list")
        if matrix:
            if data.get("resultType") not in ("matrix", None):
                raise AnalyzerError(f"{where}: expected a range vector, got {data.get('resultType')!r}")
            for item in data["result"]:
                values = item.get("values") if isinstance(item, dict) else None
                if not isinstance(values, list) or "metric" not in item or not all(map(_is_sample, values)):
                    raise AnalyzerError(f"{where}: malformed response: a result lacks metric/values")
            matrix_result: list[dict[str, Any]] = data["result"]
            return matrix_result
        if data.get("resultType") not in ("vector", None):
            raise AnalyzerError(f"{where}: expected an instant vector, got {data.get('resultType')!r}")
        for item in data["result"]:
            if not isinstance(item, dict) or "metric" not in item or not _is_sample(item.get("value")):
                raise AnalyzerError(f"{where}: malformed response: a result lacks metric/value")
        vector_result: list[dict[str, Any]] = data["result"]
        return vector_result

    def _check_series(self, body: bytes, where: str, expr: str, matrix: bool = False) -> None:
        """Refuse, before decoding, an answer that can hold more than `max_series` series.

        Every series of an instant vector is two objects and an array; braces and brackets inside
        label values count too, so the bound errs on the side of refusing (by a few per series).
        A range vector's series are two objects each and its points arrays: only objects count.
        """
        limit = self.config.max_series
        containers = body.count(b"{") * 3 // 2 if matrix else body.count(b"{") + body.count(b"[")
        if containers > CONTAINERS_PER_SERIES * (limit + 1):
            raise AnalyzerError(
                f"{where}: the answer to {_shown(expr)} holds more than {limit:,} series "
                f"({containers:,} JSON objects and arrays); narrow the query, lower --chunk-size "
                "or raise --max-series"
            )


def _time(at: float) -> str:
    """The `time` parameter as sent, and so the key an asked answer is kept under."""
    return f"{at:.3f}"


def _is_sample(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)


def sample_value(item: dict[str, Any]) -> float:
    """The value of one result item; NaN where it is not a number."""
    try:
        return float(item["value"][1])
    except (TypeError, ValueError):
        return math.nan
