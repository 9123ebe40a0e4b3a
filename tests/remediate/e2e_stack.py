"""The set-up the fault loop's end-to-end tests share: simulated nodes -> exporters -> a real
Prometheus (recording rules and the shipped alert rules, scaled) -> a real Alertmanager (the
shipped config, webhook URL, token and group_wait adjusted) -> `gpulens remediate` processes.

Scaled for tests that run in minutes: the alert rules' 10-minute Xid window and 30-minute
keep_firing_for become 20 s and 5 s in a copy, so an alert resolves about 5 s after the GPU is back.
Routing, inhibition and the rules' logic are the shipped ones. The faults come early too (the
first scrape need not precede them: a new Xid series fires the rules' `unless ... offset` arm),
since until then the tests only wait.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpulens.sim.scenariofile import BUILTIN_DIR
from tests.alerts import rulefiles
from tests.alerts.test_alertmanager import shipped_config_copy
from tests.support.procs import PromAPI, alertmanager, exporter, prometheus

NODE = "gpu-faulty-01"  # the `faults` scenario's hostname; Prometheus relabels the instance to it
TOKEN = "e2e-loop-token"


def _json(url: str) -> Any:  # a JSON document: its shape is what the tests check
    """GET with the webhook's bearer token: /-/state is behind the same credentials as /alerts."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
        return text


def _wait(what: str, probe, timeout: float):
    """The first truthy `probe()`; the timeout only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f}s")


# When the scaled scenarios' fault comes (the shipped `faults` has it at 15 s) and, for Xid 79, how
# long the GPU stays lost after it (40 s there): shorter than the scaled Xid window, so the alert
# resolves 25 s after the Xid instead of 46 s after it. Only the order of events is asserted; the
# one test whose order rests on a receiver timeout sets its own length (HUNG_LOST_FOR_S).
FAULT_AT_S = 5
LOST_FOR_S = 10


def xid79_only_scenario(tmp_path: Path, lost_for_s: int = LOST_FOR_S) -> Path:
    """The `faults` node with only its Xid 79 on GPU 2 (and the GPU lost after it), at FAULT_AT_S
    and for `lost_for_s`: its other faults never clear in the simulator (nothing resets a simulated
    GPU), so that node would rightly never return."""
    doc = yaml.safe_load((BUILTIN_DIR / "faults.yaml").read_text())
    timeline = doc["faults"]["timeline"]
    kept = [e for e in timeline if e.get("xid") == 79 or (e.get("gpu") == 2 and "lost" in e)]
    assert [e["at"] for e in kept] == ["15s", "16s"], "the faults scenario's Xid 79 and lost GPU 2"
    xid, lost = kept
    xid["at"], lost["at"], lost["lost"] = f"{FAULT_AT_S}s", f"{FAULT_AT_S + 1}s", f"{lost_for_s}s"
    doc["faults"] = {"timeline": kept}
    doc["name"] = "faults-xid79"
    path = tmp_path / "faults-xid79.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def scaled_alert_rules(tmp_path: Path) -> Path:
    text = rulefiles.ALERT_RULES.read_text()
    assert "[10m]" in text and "keep_firing_for: 30m" in text
    text = text.replace("[10m]", "[20s]").replace("offset 10m", "offset 20s")
    text = text.replace("keep_firing_for: 30m", "keep_firing_for: 5s")
    path = tmp_path / "gpu_alerts.yml"
    path.write_text(text)
    return path


def tokens(tmp_path: Path) -> tuple[Path, Path]:
    """The webhook's token file (Alertmanager and the receivers) and a service-account token file."""
    token, kube_token = tmp_path / "webhook.token", tmp_path / "kube.token"
    token.write_text(TOKEN + "\n")
    kube_token.write_text("sa-token\n")
    return token, kube_token


def webhooks(config: Path, *urls: str) -> None:
    """Point the gpulens-remediate receiver of an Alertmanager config at each of `urls`."""
    doc = yaml.safe_load(config.read_text())
    (receiver,) = [r for r in doc["receivers"] if r["name"] == "gpulens-remediate"]
    webhook = receiver["webhook_configs"][0]
    receiver["webhook_configs"] = [{**webhook, "url": url} for url in urls]
    config.write_text(yaml.safe_dump(doc))


def receiver_cmd(port: int, token: Path, state: Path, prom: str, *backend: str) -> list[str]:
    """`gpulens remediate --apply --return-to-service` on 127.0.0.1:`port`, a 5 s hold-down, a 1 s
    reconcile interval, health from `prom`; its audit log in `state`."""
    state.mkdir()
    return [
        sys.executable,
        "-m",
        "gpulens.cli",
        "remediate",
        *backend,
        "--apply",
        "--return-to-service",
        "--listen",
        f"127.0.0.1:{port}",
        "--token-file",
        str(token),
        "--state-dir",
        str(state),
        "--hold-down",
        "5s",
        "--reconcile-interval",
        "1s",
        "--prometheus",
        prom,
        "--log-level",
        "debug",
    ]


def audit(state: Path) -> list[dict[str, Any]]:
    path = state / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def events(state: Path, node: str = NODE) -> list[str]:
    """The audit log's events of `node`'s episodes, in order."""
    return [e["event"] for e in audit(state) if e["episode"]["node"] == node]


@contextlib.contextmanager
def monitoring(tmp_path: Path, nodes: dict[str, Path], *webhook_urls: str) -> Iterator[PromAPI]:
    """One exporter per node simulating its scenario (instance relabelled to the node's name), the
    shipped rules (scaled) in Prometheus, the shipped Alertmanager config sending to every webhook;
    yields the Prometheus."""
    token = tmp_path / "webhook.token"
    if not token.exists():
        tokens(tmp_path)
    am_config = shipped_config_copy(tmp_path, webhook_url=webhook_urls[0], token_file=token, group_wait="1s")
    webhooks(am_config, *webhook_urls)
    with contextlib.ExitStack() as stack:
        am = stack.enter_context(alertmanager(tmp_path, am_config))
        relabel, targets = [], []
        for name, scenario in nodes.items():
            home = tmp_path / f"exporter-{name}"
            home.mkdir()
            target = stack.enter_context(exporter(home, "--simulate", str(scenario), "--interval", "1"))
            targets.append(target)
            port = target.rsplit(":", 1)[1]
            relabel.append(
                {
                    "source_labels": ["__address__"],
                    "regex": rf"127\.0\.0\.1:({port})",
                    "target_label": "instance",
                    "replacement": f"{name}:$1",
                }
            )
        rules = [rulefiles.RECORDING_RULES, scaled_alert_rules(tmp_path)]
        yield stack.enter_context(
            prometheus(
                tmp_path,
                targets,
                rule_files=rules,
                alertmanager_url=am,
                scrape_config={"relabel_configs": relabel},
            )
        )
