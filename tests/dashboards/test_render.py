"""Every shipped dashboard, drawn by a real browser against a real Prometheus.

The Perses version of each dashboard (dashboards/perses/, converted from the Grafana JSON) is
mounted by Perses' own React packages (tools/dashboard-render/, bundled with esbuild) in Debian's
Chromium, driven by Playwright, against a Prometheus that scrapes simulated exporters with the
shipped rules loaded. Per dashboard: every panel mounts, no panel shows an error, and "No data" only
on the panels listed below with the reason. A second test breaks one query and sees the check
name that panel. Screenshots go to the test's artifact directory (`GPULENS_UPDATE_SCREENSHOTS=1`
also refreshes the ones in docs/img/).

Grafana itself (AGPL) is not used: the PromQL is the same, and tests/dashboards/
test_queries_e2e.py proves every Grafana target against Prometheus 2 and 3.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import http.server
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.dashboards import live
from tests.dashboards.model import REPO
from tests.support.procs import PromAPI, find_binary, unavailable

RENDER_DIR = REPO / "tools" / "dashboard-render"
DIST = RENDER_DIR / "dist"
PERSES_DIR = REPO / "dashboards" / "perses"
DOCS_IMG = REPO / "docs" / "img"
VIEWPORT = {"width": 1600, "height": 6000}  # Perses mounts a panel only once it is in view
SETTLE_DEADLINE_S = 90.0  # a dashboard whose queries never all answer fails after this

HEALTHY = "dgx-h100"
# (dashboard, panel title) -> why it shows "No data" in this stack (every other panel must show data)
EXPECTED_EMPTY: dict[tuple[str, str], str] = {
    ("gpulens-fleet", "MTTR (last 7 days)"): "fed by `gpulens remediate`, which this stack does not run",
    ("gpulens-fleet", "Isolated nodes now"): "fed by `gpulens remediate`, not run here",
    ("gpulens-fleet", "Episodes by outcome (time range)"): "fed by `gpulens remediate`, not run here",
    ("gpulens-node", "Xid events (per 10 min)"): "the dgx-h100 node shown has no Xid (faults node has)",
    ("gpulens-node", "Last Xid per GPU and code"): "the dgx-h100 node shown has no Xid",
}
# the node each dashboard is opened on (single-node dashboards), and documentation screenshots
SCREENSHOTS_FOR_DOCS = {"gpulens-fleet": "dashboard-fleet.png", "gpulens-node": "dashboard-node.png"}
DOCS_CLIP = {"x": 0, "y": 0, "width": 1600, "height": 1000}


def shipped() -> dict[str, dict[str, Any]]:
    return {
        path.stem: json.loads(path.read_text(encoding="utf-8")) for path in sorted(PERSES_DIR.glob("*.json"))
    }


@dataclass(frozen=True)
class PanelState:
    """One panel as the page reports it (tools/dashboard-render/src/main.tsx: PanelState)."""

    key: str
    title: str
    mounted: bool
    pending: bool
    errors: tuple[str, ...]
    series: int
    no_data: bool


def problems(uid: str, states: list[PanelState]) -> list[str]:
    """What is wrong with a rendered dashboard: one line per panel that did not mount, shows an
    error, or shows "No data" without being listed in EXPECTED_EMPTY."""
    out = []
    for state in states:
        name = f"{uid} / {state.title}"
        if not state.mounted:
            out.append(f"{name}: did not mount")
        if state.errors:
            out.append(f"{name}: error: {' | '.join(state.errors)[:300]}")
        if state.no_data and (uid, state.title) not in EXPECTED_EMPTY:
            out.append(f"{name}: No data")
    return out


# --- the bundle, the stack, the browser -------------------------------------------------------------


def _bundle_is_fresh() -> bool:
    bundle = DIST / "main.js"
    if not bundle.exists():
        return False
    sources = [RENDER_DIR / "build.mjs", RENDER_DIR / "package-lock.json", *RENDER_DIR.glob("src/*")]
    return all(bundle.stat().st_mtime >= source.stat().st_mtime for source in sources)


@pytest.fixture(scope="module")
def bundle() -> Path:
    """tools/dashboard-render/dist, rebuilt when a source is newer (about 10 s)."""
    if not (RENDER_DIR / "node_modules" / "@perses-dev" / "dashboards").is_dir():
        unavailable(
            "the render app's packages are not installed (make render: npm ci in tools/dashboard-render)"
        )
    if not _bundle_is_fresh():
        node = find_binary("node")
        result = subprocess.run(
            [node, "build.mjs"], cwd=RENDER_DIR, capture_output=True, text=True, timeout=300, check=False
        )
        if result.returncode != 0:
            pytest.fail(f"bundling tools/dashboard-render failed: {result.stderr[-2000:]}")
    return DIST


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    handler = functools.partial(QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@dataclass(frozen=True)
class Stack:
    prom: PromAPI
    nodes: dict[str, str]  # scenario -> instance
    app: str  # base URL of the bundle


@pytest.fixture(scope="module")
def stack(live_stacks: dict[str, live.Stack | BaseException], bundle: Path) -> Iterator[Stack]:
    """The simulated nodes of the PromQL test and Debian's Prometheus with the analyzer's output
    (tests/dashboards/live.py, started once for both tests), and the app."""
    found = live.engine_stack(live_stacks, "prometheus-2")
    with serve(bundle) as app:
        yield Stack(found.prom, found.nodes, app)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = find_binary("chromium", "chromium-browser")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard-screenshots")


def render(browser: Any, stack: Stack, dashboard: dict[str, Any], screenshot: Path) -> list[PanelState]:
    """Open `dashboard` (on the healthy node where it shows one node, on all of them otherwise),
    wait until every query answered, and return each panel's state."""
    variables = {"node": stack.nodes[HEALTHY], "cluster": live.CLUSTER, "job": "gpulens"}
    chosen = {v["spec"]["name"] for v in dashboard["spec"]["variables"] if not v["spec"]["allowMultiple"]}
    chosen |= {"cluster", "job"}
    query = "&".join(f"var-{k}={v}" for k, v in sorted(variables.items()) if k in chosen)
    page = browser.new_page(viewport=VIEWPORT)
    console: list[str] = []
    page.on("pageerror", lambda exc: console.append(str(exc)))
    try:
        inject = {"dashboard": dashboard, "prometheus": stack.prom.base_url}
        page.add_init_script(f"window.gpulensRender = {json.dumps(inject)};")
        # absolute times: Perses snaps a relative range's end down to its step (a minute here),
        # which would hide the stack's first minute; an end past now evaluates at the last samples
        end_s = int(time.time()) + 60
        window = f"start={(end_s - 360) * 1000}&end={end_s * 1000}"
        page.goto(f"{stack.app}/index.html?{window}&{query}")
        deadline = time.monotonic() + SETTLE_DEADLINE_S
        states = _states(page)
        while any(s.pending or not s.mounted for s in states) and time.monotonic() < deadline:
            page.wait_for_timeout(500)
            states = _states(page)
        page.wait_for_timeout(1000)  # charts finish their first animation before the picture
        states = _states(page)
        page.screenshot(path=str(screenshot), full_page=False)
        uid = dashboard["metadata"]["name"]
        if uid in SCREENSHOTS_FOR_DOCS and os.environ.get("GPULENS_UPDATE_SCREENSHOTS"):
            page.screenshot(path=str(DOCS_IMG / SCREENSHOTS_FOR_DOCS[uid]), clip=DOCS_CLIP)
    finally:
        page.close()
    assert not console, f"the page threw: {console}"
    return states


def _states(page: Any) -> list[PanelState]:
    raw = page.evaluate("() => window.gpulensPanels ? window.gpulensPanels() : []")
    return [
        PanelState(
            key=s["key"],
            title=s["title"],
            mounted=s["mounted"],
            pending=s["pending"],
            errors=tuple(s["errors"]),
            series=s["series"],
            no_data=s["noData"],
        )
        for s in raw
    ]


# --- the tests ---------------------------------------------------------------------------------------


def test_expected_empty_panels_exist() -> None:
    titles = {
        (uid, p["spec"]["display"]["name"])
        for uid, d in shipped().items()
        for p in d["spec"]["panels"].values()
    }
    assert set(EXPECTED_EMPTY) <= titles, sorted(set(EXPECTED_EMPTY) - titles)


def test_panel_titles_are_unique_within_a_dashboard() -> None:
    """The page reports panels by title: two equal titles would hide one of them."""
    for uid, dashboard in shipped().items():
        titles = [p["spec"]["display"]["name"] for p in dashboard["spec"]["panels"].values()]
        assert len(titles) == len(set(titles)), uid


@pytest.mark.slow
@pytest.mark.parametrize("uid", sorted(shipped()))
def test_every_panel_mounts_without_error_and_shows_data(
    browser: Any, stack: Stack, artifacts: Path, uid: str
) -> None:
    dashboard = shipped()[uid]
    states = render(browser, stack, dashboard, artifacts / f"{uid}.png")
    assert len(states) == len(dashboard["spec"]["panels"])
    assert not problems(uid, states), "\n".join(problems(uid, states))


@pytest.mark.slow
def test_a_broken_query_fails_the_check_naming_its_panel(browser: Any, stack: Stack, artifacts: Path) -> None:
    dashboard = copy.deepcopy(shipped()["gpulens-exporter"])
    panel = next(iter(dashboard["spec"]["panels"].values()))
    panel["spec"]["queries"][0]["spec"]["plugin"]["spec"]["query"] = "sum(rate(gpulens_gpus[$__rate_interval]"
    states = render(browser, stack, dashboard, artifacts / "broken-query.png")
    found = problems("gpulens-exporter", states)
    title = panel["spec"]["display"]["name"]
    assert [line for line in found if line.startswith(f"gpulens-exporter / {title}: error")], found
    assert all(title in line for line in found), found  # and no other panel suffers
