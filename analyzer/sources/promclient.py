"""The analyzer's Prometheus HTTP API client: instant queries, with answers asked ahead.

Works with Prometheus, Thanos, Mimir and VictoriaMetrics (plain `/api/v1/query`, POST form).
Transient failures (connection errors, 429, 5xx) are retried with backoff; anything else is one
clear `AnalyzerError` line. Requests go through `gpulens.httpclient`: each attempt has a total
deadline (`timeout_s`, not a per-read timeout), answers are bounded (`max_response_bytes`), and a
redirect to another origin is refused, so the bearer token or basic auth never leaves for it.

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
from pathlib import Path

from gpulens import httpclient
from gpulens.analyzer.errors import AnalyzerError
from gpulens.safeload import load_json

RETRY_STATUS = {429, 500, 502, 503, 504}


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
    max_response_bytes: int = 256 << 20
    in_flight: int = 4  # queries asked ahead (`PromClient.ask`) that run at once


class PromClient:
    """Instant queries with auth, TLS options, retries and strict response checking."""

    def __init__(self, config: PromConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._asked: dict[tuple[str, str], Future[list[dict]]] = {}
        self._slots = threading.BoundedSemaphore(max(1, config.in_flight))
        self.base = config.url.rstrip("/")
        parsed = urllib.parse.urlparse(self.base)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise AnalyzerError(f"--prometheus: {config.url!r} is not an http(s) URL")
        self.headers = {"Accept": "application/json", "User-Agent": "gpulens-analyzer"}
        token = config.bearer_token
        if config.bearer_token_file:
            try:
                token = Path(config.bearer_token_file).read_text().strip()
            except OSError as exc:
                raise AnalyzerError(
                    f"{config.bearer_token_file}: cannot read bearer token: {exc.strerror}"
                ) from exc
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

    def _post(self, path: str, params: dict[str, str]) -> bytes:
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
            except (httpclient.TooLarge, httpclient.RedirectRefused) as exc:
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

    def ask(self, expr: str, at: float) -> None:
        """Start `query(expr, at)` now, in the background: the call that asks it later takes its
        answer (or its error) instead of sending it again. Asking twice sends it once.

        So a run overlaps what it knows it will ask with what it does before that (imports,
        other queries): at most `config.in_flight` asked queries run at once, each on a daemon
        thread, so an error or an interrupt in the caller never waits for them to finish.
        """
        key = (expr, _time(at))
        with self._lock:
            if key in self._asked:
                return
            answer: Future[list[dict]] = Future()
            self._asked[key] = answer

        def run() -> None:
            with self._slots:
                if not answer.set_running_or_notify_cancel():
                    return
                try:
                    answer.set_result(self._send(expr, at))
                except BaseException as exc:  # handed to the caller, who raises it
                    answer.set_exception(exc)

        threading.Thread(target=run, name="gpulens-prom-ask", daemon=True).start()

    def query(self, expr: str, at: float) -> list[dict]:
        """Instant vector query; returns the `result` list (labels in `metric`, `[ts, "v"]`)."""
        with self._lock:
            asked = self._asked.pop((expr, _time(at)), None)
        return asked.result() if asked is not None else self._send(expr, at)

    def _send(self, expr: str, at: float) -> list[dict]:
        body = self._post("/api/v1/query", {"query": expr, "time": _time(at)})
        where = f"{self.base}/api/v1/query"
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
        if data.get("resultType") not in ("vector", None):
            raise AnalyzerError(f"{where}: expected an instant vector, got {data.get('resultType')!r}")
        for item in data["result"]:
            if not isinstance(item, dict) or "metric" not in item or not _is_sample(item.get("value")):
                raise AnalyzerError(f"{where}: malformed response: a result lacks metric/value")
        return data["result"]


def _time(at: float) -> str:
    """The `time` parameter as sent, and so the key an asked answer is kept under."""
    return f"{at:.3f}"


def _is_sample(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)


def sample_value(item: dict) -> float:
    """The value of one result item; NaN where it is not a number."""
    try:
        return float(item["value"][1])
    except (TypeError, ValueError):
        return math.nan
