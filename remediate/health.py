"""Is the faulty GPU (or node) healthy through the hold-down? Asked of Prometheus before a return.

Healthy means, over the whole hold-down window, on the episode's GPU (all GPUs of the node for a
node-wide fault without a `gpu` label): `gpu_up` was 1 in every sample and present, no Xid was
counted, and no row remap is pending. Without `--prometheus` the receiver has only the alert to go
by (it resolved and did not fire again during the hold-down), which it says in the episode.
Queries go through gpulens.httpclient (total deadline, bounded answer, same-origin redirects only).
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any, Protocol

from gpulens import httpclient
from gpulens.httpclient import Deadline
from gpulens.remediate.episodes import Episode

MAX_ANSWER = 4 << 20


class Health(Protocol):
    def check(self, episode: Episode, window_s: float, deadline: Deadline) -> tuple[bool, str]:
        """(healthy, why) for the episode's GPU or node over the last `window_s` seconds."""
        ...


@dataclass
class AlertOnlyHealth:
    def check(self, episode: Episode, window_s: float, deadline: Deadline) -> tuple[bool, str]:
        return True, f"alert resolved and quiet for {window_s:g}s (no --prometheus to check the GPU)"


def _quote(value: str) -> str:
    """A PromQL string literal (label values come from the alert)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass
class PrometheusHealth:
    url: str
    bearer_token: str | None = None
    timeout_s: float = 10.0

    def _query(self, expr: str, deadline: Deadline) -> list[dict[str, Any]]:
        headers = {"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded"}
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        call = Deadline(min(self.timeout_s, deadline.remaining()))
        answer = httpclient.request(
            "POST",
            f"{self.url.rstrip('/')}/api/v1/query",
            deadline=call,
            headers=headers,
            body=urllib.parse.urlencode({"query": expr}).encode(),
            max_bytes=MAX_ANSWER,
        )
        if answer.status != 200:
            raise httpclient.HttpError(f"{self.url}: query {expr!r}: HTTP {answer.status}")
        try:
            doc = json.loads(answer.body)
            result = doc["data"]["result"]
        except (ValueError, KeyError, TypeError):
            raise httpclient.HttpError(f"{self.url}: query {expr!r}: malformed answer") from None
        if not isinstance(result, list):
            raise httpclient.HttpError(f"{self.url}: query {expr!r}: malformed answer")
        return result

    def check(self, episode: Episode, window_s: float, deadline: Deadline) -> tuple[bool, str]:
        matchers = f"instance={_quote(episode.instance)}"
        if episode.gpu:
            matchers += f",gpu={_quote(episode.gpu)}"
        window = f"{max(int(window_s), 1)}s"
        xids = f"gpu_xid_errors_total{{{matchers}}}"
        checks = [
            (f"min_over_time(gpu_up{{{matchers}}}[{window}]) < 1", "gpu_up was 0"),
            (
                f"(increase({xids}[{window}]) > 0) or ({xids} unless {xids} offset {window})",
                "a new Xid was counted",
            ),
            (f"max_over_time(gpu_row_remap_pending{{{matchers}}}[{window}]) > 0", "a row remap is pending"),
        ]
        where = f"{episode.instance} gpu {episode.gpu}" if episode.gpu else episode.instance
        try:
            if not self._query(f"count_over_time(gpu_up{{{matchers}}}[{window}])", deadline):
                return False, f"no gpu_up samples for {where} in the last {window}"
            for expr, problem in checks:
                if self._query(expr, deadline):
                    return False, f"{problem} on {where} in the last {window}"
        except httpclient.HttpError as exc:
            return False, f"health unknown: {exc}"
        return True, f"{where}: gpu_up 1, no Xid, no pending row remap for {window}"
