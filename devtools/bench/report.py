"""Turn benchmark results into docs/benchmarks.md and the closing ratio lines."""

from __future__ import annotations

from typing import Any

from gpulens.devtools.bench.analyzer_report import analyzer_markdown

# DESIGN §8 targets
TARGET_CPU_RATIO = 5.0
TARGET_SCRAPE_RATIO = 10.0
TARGET_SCRAPE_MEDIAN_MS = 2.0
TARGET_SCRAPE_P99_MS = 10.0
TARGET_CYCLE_CPU_MS = 20.0
TARGET_RSS_MB = 60.0
TARGET_CORE_PERCENT = 1.0


def _latency(exporter: dict[str, Any], concurrency: int) -> dict[str, Any] | None:
    """The load result at `concurrency`; None when none was run or no scrape completed in it."""
    found = next((r for r in exporter["latency"] if r["concurrency"] == concurrency), None)
    return found if found is not None and found.get("requests", 1) > 0 else None


def _latency_cell(exporter: dict[str, Any], concurrency: int) -> str:
    ran = next((r for r in exporter["latency"] if r["concurrency"] == concurrency), None)
    if ran is None:
        return "-"
    if ran.get("requests", 1) == 0:
        return f"no scrape completed in {ran['wall_s']:g} s"
    return f"{ran['median_ms']:.2f} / {ran['p99_ms']:.2f}"


def _paced(exporter: dict[str, Any]) -> dict[str, Any] | None:
    """The paced load's result (`measure.paced_load`); None when none ran or nothing completed."""
    found = next(iter(exporter.get("paced") or []), None)
    return found if found is not None and found.get("requests", 1) > 0 else None


def _paced_label(exporters: list[dict[str, Any]]) -> str:
    ran = next((p for e in exporters if (p := _paced(e))), None)
    every = next((e["paced_every_s"] for e in exporters if "paced_every_s" in e), 0.1)
    scrapers = ran["concurrency"] if ran else 20
    return f"{scrapers} scrapers each every {every:g} s (paced)"


def _mb(value: int) -> str:
    return f"{value / 1024**2:.1f}"


def ratio_lines(data: dict[str, Any]) -> list[str]:
    exporters = {e["name"]: e for e in data["exporters"]}
    ours = exporters.get("gpulens-exporter")
    peer = exporters.get("nvitop-exporter")
    if not ours or not peer:
        return ["no peer measured: no ratios"]
    lines = []
    cpu = peer["cpu_per_cycle_ms"] / max(ours["cpu_per_cycle_ms"], 1e-9)
    lines.append(
        f"CPU per sampling cycle: nvitop-exporter / gpulens = {cpu:.1f}x (target >= {TARGET_CPU_RATIO:g}x)"
    )
    for concurrency in (1, 20):
        o, p = _latency(ours, concurrency), _latency(peer, concurrency)
        if o and p:
            ratio = p["median_ms"] / max(o["median_ms"], 1e-9)
            lines.append(
                f"scrape median with {concurrency} scraper(s): nvitop-exporter / gpulens = {ratio:.1f}x "
                f"(target >= {TARGET_SCRAPE_RATIO:g}x)"
            )
        elif o and any(r["concurrency"] == concurrency for r in peer["latency"]):
            lines.append(
                f"scrape median with {concurrency} scraper(s): nvitop-exporter completed no scrape in the "
                f"window, gpulens {o['median_ms']:.2f} ms (target >= {TARGET_SCRAPE_RATIO:g}x): no ratio"
            )
    size = peer["response_bytes"] / max(ours["response_bytes"], 1)
    lines.append(f"response size: nvitop-exporter / gpulens = {size:.1f}x")
    return lines


def _row(label: str, values: list[str]) -> str:
    return f"| {label} | " + " | ".join(values) + " |"


def render_markdown(data: dict[str, Any]) -> str:
    exporters = data["exporters"]
    machine = data["machine"]
    analyzer = analyzer_markdown(data["analyzer"]) if "analyzer" in data else []
    head = [
        "| measure | " + " | ".join(f"{e['name']} {e['version']}" for e in exporters) + " |",
        "|---|" + "---|" * len(exporters),
    ]
    rows = [
        _row("start-up to first /metrics (s)", [f"{e['startup_s']:.2f}" for e in exporters]),
        _row(
            "CPU per sampling cycle (ms)",
            [f"{e['cpu_per_cycle_ms']:.1f}" + (" (saturated)" if e["saturated"] else "") for e in exporters],
        ),
        _row(
            "share of one core at a 5 s interval (%)", [f"{e['core_percent_at_5s']:.2f}" for e in exporters]
        ),
    ]
    for concurrency in (1, 20):
        rows.append(
            _row(
                f"scrape median / p99, {concurrency} scraper(s), closed loop (ms)",
                [_latency_cell(e, concurrency) for e in exporters],
            )
        )
        rows.append(
            _row(
                f"scrape errors, {concurrency} scraper(s)",
                [str(lat["errors"]) if (lat := _latency(e, concurrency)) else "-" for e in exporters],
            )
        )
    if any(_paced(e) for e in exporters):
        rows.append(
            _row(
                f"scrape median / p99, {_paced_label(exporters)} (ms)",
                [
                    f"{lat['median_ms']:.2f} / {lat['p99_ms']:.2f}" if (lat := _paced(e)) else "-"
                    for e in exporters
                ],
            )
        )
        rows.append(
            _row(
                f"scrape errors, {_paced_label(exporters)}",
                [str(lat["errors"]) if (lat := _paced(e)) else "-" for e in exporters],
            )
        )
    rows += [
        _row("response size (bytes)", [str(e["response_bytes"]) for e in exporters]),
        _row("RSS after warm-up (MiB)", [_mb(e["rss_warm_bytes"]) for e in exporters]),
        _row("RSS after the scrapes (MiB)", [_mb(e["rss_after_bytes"]) for e in exporters]),
        _row("scrapes served", [str(e["scrapes_total"]) for e in exporters]),
        _row("load generator", [e.get("load_generator", "") for e in exporters]),
        _row(
            "threads after warm-up / after",
            [f"{e['threads_warm']} / {e['threads_after']}" for e in exporters],
        ),
        _row("load average (1 min) at start", [f"{e.get('load_average', 0.0):.2f}" for e in exporters]),
    ]
    exporter_part = [
        "## Method",
        "",
        "Both exporters run as their own process under `gpulens sim run` on the same scenario, so both",
        "call the native simulated NVML library (`libnvidia-ml.so.1` in C, loaded through",
        "`LD_LIBRARY_PATH` as on a GPU node; see docs/simulator.md) while the scenario engine and the",
        "publisher that feeds the library run in the launcher, whose CPU is not counted. CPU is user +",
        "system time of the exporter's process from /proc over an idle window with no scrapes, divided",
        "by the sampling cycles in that window (both sample at a fixed rate). Scrape load comes from",
        "`wrk` (keep-alive, `Accept-Encoding: gzip`, like Prometheus) when installed, else from Python",
        "threads with a fresh connection per request. That load is a closed loop: each of the N",
        "connections asks again the moment it is answered, so with 20 the latency is mostly the queue",
        "in front of the server and measures its throughput. The paced load asks at a fixed rate",
        "instead: 20 kept-alive scrapers, each every 0.1 s, phases spread over the interval, a scrape",
        "that outlasts it skipping ticks as Prometheus does (a Python asyncio client in the bench's",
        "process). RSS from /proc. The exporters are measured one",
        "after the other in the same run; the machine is shared, so the load average at the start of",
        "each measurement is listed.",
        "",
        "## Exporter",
        "",
        *head,
        *rows,
        "",
        "## Ratios (same run)",
        "",
        *[f"- {line}" for line in ratio_lines(data)],
        "",
        "## Targets (DESIGN §8, issue 20)",
        "",
        *[f"- {line}" for line in target_lines(data)],
        "",
        *breakdown_markdown(data.get("breakdown")),
    ]
    return "\n".join(
        [
            "# Benchmarks",
            "",
            "Generated by `make bench` (`gpulens bench`); every number below comes from one run of that",
            "command on the machine listed. Absolute numbers vary between machines: compare the ratios,",
            "which are measured in the same run.",
            "",
            f"- command: `{data['command']}`",
            f"- scenario: `{data['scenario']}` (the `large` node: 8 GPUs, 56 MIG instances, ~200 processes)",
            f"- machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}, "
            f"kernel {machine['kernel']}, {machine['date']}",
            "",
            *(exporter_part if exporters else []),
            *(
                analyzer
                or (
                    [f"The analyzer run failed: {data['analyzer_error']}", ""]
                    if data.get("analyzer_error")
                    else [
                        "The analyzer was not measured in this run (`--no-analyzer`); `make bench` "
                        "measures it too.",
                        "",
                    ]
                )
            ),
        ]
    )


def breakdown_markdown(breakdown: dict[str, Any] | None) -> list[str]:
    """Where one cycle's CPU goes on the native driver, and the functions that cost most."""
    if not breakdown:
        return []
    cycle = breakdown["cycle_cpu_ms"]

    def share(key: str) -> str:
        return f"{breakdown[key] * 100:.0f} % ({breakdown[key] * cycle:.1f} ms)"

    lines = [
        "## Where a sampling cycle's CPU goes",
        "",
        f"One `{breakdown['scenario']}` cycle of gpulens-exporter in-process on the "
        f"{breakdown.get('driver', 'native')} simulated driver (sample + render, all threads; the node "
        f"is published between cycles, outside the timed part): {cycle:.1f} ms of CPU (median of "
        f"{breakdown['cycles']}"
        + (
            f"; load average {breakdown['load_average_1m']:.2f} at start"
            if breakdown.get("load_average_1m") is not None
            else ""
        )
        + "). Split by where the code lives (cProfile over the same cycles with "
        "the per-GPU reads run on one thread; approximate, cProfile inflates small calls):",
        "",
        "| part | share of the cycle |",
        "|---|---|",
        "| NVML calls: pynvml wrappers and ctypes, with the native library's C time inside them | "
        f"{share('nvml_binding_share')} |",
        "| gpulens exporter code (backend, sampler, collectors, render, attribution) | "
        f"{share('gpulens_share')} |",
        f"| stdlib, prometheus_client and builtins, called by either side | {share('other_share')} |",
        f"| simulator Python code run inside the cycle (its clock) | {share('simulated_driver_share')} |",
        "",
    ]
    spots = breakdown.get("hotspots") or []
    if spots:
        lines += [
            "Where the remaining time goes: the functions with the most own time under the profiler,",
            "as a share of the profiled cycles and that share of the measured cycle (`other` is library",
            "code: prometheus_client, dataclasses, builtins).",
            "",
            "| function | where | part | share | ≈ ms of the cycle | calls per cycle |",
            "|---|---|---|---|---|---|",
            *[
                f"| `{spot['function']}` | {spot['where']} | {spot['part']} | {spot['share'] * 100:.1f} % | "
                f"{spot['share'] * cycle:.1f} | {spot['calls_per_cycle']:.0f} |"
                for spot in spots
            ],
            "",
        ]
    return lines


def target_lines(data: dict[str, Any]) -> list[str]:
    """One line per exporter target (DESIGN §8 / issue 20): value, target, met or NOT met; a met
    target within 10 % of its bound says so (the same run on a busier machine can miss it)."""
    ours = next((e for e in data["exporters"] if e["name"] == "gpulens-exporter"), None)
    if ours is None:
        return []
    peer = next((e for e in data["exporters"] if e["name"] == "nvitop-exporter"), None)
    lines = []

    def check(label: str, value: float, target: float, unit: str, lower_is_better: bool = True) -> None:
        met = value <= target if lower_is_better else value >= target
        margin = (target - value) / target if lower_is_better else (value - target) / target
        verdict = "NOT met" if not met else ("met" if margin >= 0.1 else f"met, within {margin * 100:.0f} %")
        lines.append(
            f"{label}: {value:.2f} {unit} (target {'<=' if lower_is_better else '>='} {target:g}): {verdict}"
        )

    lat20 = _latency(ours, 20)
    if lat20:
        check(
            "scrape median under 20 scrapers, closed loop", lat20["median_ms"], TARGET_SCRAPE_MEDIAN_MS, "ms"
        )
        check("scrape p99 under 20 scrapers, closed loop", lat20["p99_ms"], TARGET_SCRAPE_P99_MS, "ms")
    paced = _paced(ours)
    if paced:
        label = _paced_label([ours])
        check(f"scrape median under {label}", paced["median_ms"], TARGET_SCRAPE_MEDIAN_MS, "ms")
        check(f"scrape p99 under {label}", paced["p99_ms"], TARGET_SCRAPE_P99_MS, "ms")
    check("CPU per sampling cycle", ours["cpu_per_cycle_ms"], TARGET_CYCLE_CPU_MS, "ms")
    if peer is not None:
        ratio = peer["cpu_per_cycle_ms"] / max(ours["cpu_per_cycle_ms"], 1e-9)
        check("CPU per cycle, nvitop-exporter / gpulens", ratio, TARGET_CPU_RATIO, "x", lower_is_better=False)
    check("RSS after the scrapes", ours["rss_after_bytes"] / 1024**2, TARGET_RSS_MB, "MiB")
    check("share of a core at 5 s", ours["core_percent_at_5s"], TARGET_CORE_PERCENT, "%")
    return lines
