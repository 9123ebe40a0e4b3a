"""The weekly report: one self-contained HTML file an SRE reads in two minutes, a Markdown summary,
CSV and JSON of every job, the plan and the emitted configuration.

Order is what a reader acts on (`report_model`): the first screen holds the window, GPUs
reclaimable now and where, GPU-hours and cost recovered, energy per team and the ranked actions
(current -> proposed); then what emit changed for the tools, the layout per host now and
proposed, how to apply each file, plots labelled with the signal they show, and every job in
a collapsible table. Human units throughout (`units`): GiB, %, hours, never 3.3e+10.
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from gpulens import atomicfile
from gpulens.analyzer import jsonout, units
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.pipeline import Analysis, jsonable
from gpulens.analyzer.report_model import Prices, ReportModel, build
from gpulens.analyzer.signals import DUTY_CYCLE
from gpulens.analyzer.weekly import WeekOverWeek

CSS = """
body{font-family:system-ui,sans-serif;max-width:1180px;margin:1.2em auto;padding:0 1em;color:#1d2330}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.15em;margin:1.4em 0 .4em;border-bottom:1px solid #dde}
.sub{color:#556;margin:0 0 .8em}
.kpis{display:grid;grid-template-columns:repeat(auto-fit,minmax(200px,1fr));gap:.6em}
.kpi{background:#f3f5fa;border-radius:6px;padding:.5em .8em}.kpi b{font-size:1.5em;display:block}
.kpi small{color:#556}
table{border-collapse:collapse;width:100%;font-size:13px;table-layout:auto}
td,th{border:1px solid #d5d9e2;padding:3px 6px;vertical-align:top;text-align:left}
th{background:#eef1f7}td.num{text-align:right;white-space:nowrap}
td.wrap{white-space:normal;overflow-wrap:anywhere;min-width:14em}
table.jobs{table-layout:fixed;font-size:11.5px}
table.jobs .flag{white-space:normal;display:inline-block;overflow-wrap:normal}
table.jobs td{overflow-wrap:anywhere;min-width:0}
table.jobs td.num{white-space:normal}
.flag{background:#ffe7c2;border-radius:3px;padding:0 4px;font-size:12px;white-space:nowrap}
.free{color:#2e7d32;font-weight:600}
code{background:#f3f5fa;padding:1px 4px;border-radius:3px;overflow-wrap:anywhere}
details summary{cursor:pointer;font-weight:600;margin:.6em 0}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:.6em}
img{max-width:100%}
"""

SM_ACTIVITY = "SM activity (DCGM / NVML GPM)"
DUTY = "duty cycle (GPU-Util: share of time a kernel ran)"


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _png(fig: plt.Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def signal_label(recs: pd.DataFrame) -> str:
    """What the activity numbers are: SM activity, or the coarser duty cycle (`signals.DUTY_CYCLE`)."""
    found = {str(s) for s in recs.get("activity_signal", pd.Series(dtype=str)).dropna()} - {"none"}
    if not found:
        return "activity"
    duty = {s for s in found if s in DUTY_CYCLE}
    if not duty:
        return SM_ACTIVITY
    if duty == found:
        return DUTY
    return "SM activity or duty cycle (per job: see the signal column)"


def plot_utilization(recs: pd.DataFrame) -> str:
    label = signal_label(recs)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.hist(recs["sm_active_mean"].dropna() * 100, bins=20, range=(0, 100), color="#4c72b0", label="mean")
    ax.hist(
        recs["sm_active_p95"].dropna() * 100,
        bins=20,
        range=(0, 100),
        histtype="step",
        color="#dd8452",
        label="p95",
    )
    ax.set_xlabel(f"{label} per job (%)")
    ax.set_ylabel("jobs")
    ax.set_title(f"Jobs by {label}")
    ax.legend()
    return _png(fig)


def plot_waste(recs: pd.DataFrame) -> str:
    by_team = recs.groupby("team")["gpu_hours_idle"].sum().sort_values().tail(15)
    fig, ax = plt.subplots(figsize=(6, 0.35 * max(3, len(by_team)) + 1))
    ax.barh(by_team.index.astype(str), by_team.to_numpy(), color="#c44e52")
    ax.set_xlabel("GPU-hours allocated but idle")
    ax.set_title("Idle GPU-hours by team / user")
    return _png(fig)


def plot_packing(analysis: Analysis) -> str:
    models = list(analysis.plan.by_model)
    before = [analysis.plan.by_model[m]["gpus_before"] for m in models]
    after = [analysis.plan.by_model[m]["gpus_after"] for m in models]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = range(len(models))
    ax.bar([i - 0.2 for i in x], before, width=0.4, label="now", color="#8c8c8c")
    ax.bar([i + 0.2 for i in x], after, width=0.4, label="proposed", color="#55a868")
    ax.set_xticks(list(x), models, rotation=15)
    ax.set_ylabel("GPUs")
    ax.set_title("GPUs per model, now and proposed")
    ax.legend()
    return _png(fig)


def plot_archetypes(analysis: Analysis) -> str | None:
    arch = analysis.archetypes
    if arch is None or not len(arch.labels):
        return None
    recs = analysis.recs.set_index("job_id")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name in sorted(set(arch.labels)):
        jobs = [j for j in arch.labels[arch.labels == name].index if j in recs.index]
        sub = recs.loc[jobs]
        ax.scatter(
            sub["sm_active_mean"] * 100,
            sub["memory_peak_bytes"] / sub["device_memory_bytes"] * 100,
            s=14,
            label=name,
        )
    ax.set_xlabel(f"mean {signal_label(analysis.recs)} (%)")
    ax.set_ylabel("peak memory (% of the GPU)")
    ax.set_title("Workload archetypes")
    ax.legend(fontsize=7)
    return _png(fig)


def _reconciled(model: ReportModel) -> str:
    """The actions' own GPU-hours beside the headline, and why they differ, on the same line."""
    actions = model.gpu_hours_of_actions
    if not model.all_actions or abs(actions - model.gpu_hours_recovered) < 0.05:
        return ""
    diff = actions - model.gpu_hours_recovered
    why = (
        "shares of GPUs that do not add up to a whole GPU free none"
        if diff > 0
        else "GPUs that ran no job all window are freed without an action"
    )
    return (
        f"; the change and reclaim actions below add up to {units.hours(actions)} "
        f"({units.hours(abs(diff))} {'more' if diff > 0 else 'less'}: {why})"
    )


def _if_fixed(model: ReportModel) -> str:
    """What fixing the flagged jobs would add: not in the plan, so never in the headline figure."""
    if model.gpu_hours_if_fixed <= 0:
        return ""
    return f"; up to {units.hours(model.gpu_hours_if_fixed)} more once the jobs to fix are fixed"


def _room(model: ReportModel) -> str:
    """Room for new requests now -> after the plan, by size (free GPUs of one node)."""
    if not model.room_now:
        return ""
    sizes = ", ".join(
        f"{k}-GPU {model.room_now.get(k, 0)} → {model.room_after.get(k, 0)}" for k in sorted(model.room_now)
    )
    return f"Room for new requests (free GPUs of one node), now → after the plan: {sizes}"


def _where(model: ReportModel, previous: WeekOverWeek | None = None) -> str:
    parts = [
        f"{host}: GPU {', '.join(str(i) for i in idx)}" for host, idx in sorted(model.reclaimable.items())
    ]
    where = "; ".join(parts) if parts else "none"
    if previous is not None and previous.gpus_released and model.gpus_reclaimable:
        # GPUs last week's plan freed stay reclaimable while they are in the fleet: said, so that
        # a week after applying the plan the headline does not read as new savings
        idle = min(previous.gpus_released, model.gpus_reclaimable)
        where += f"; {idle} of them ran no job all window (Since last week)"
    return where


_UUID = re.compile(r"(?:GPU|MIG)-[0-9a-fA-F-]{8,}")
_UUID_LIST = re.compile(rf"{_UUID.pattern}(?:,{_UUID.pattern})*")


def _short(text: str, names: dict[str, str]) -> str:
    """GPU UUIDs in a sentence as the GPU index a person looks for ("dgx-1/GPU 3"); a list of
    them (a multi-GPU job's) in index order ("GPU 2,GPU 3")."""

    def listed(match: re.Match[str]) -> str:
        shown = [names.get(u, u) for u in match.group(0).split(",")]
        return ",".join(sorted(shown, key=_gpu_order))

    return _UUID_LIST.sub(listed, text)


def _gpu_order(name: str) -> tuple[int, str]:
    """Index order ("GPU 10" after "GPU 9"); an unnamed UUID after the named GPUs."""
    index = name.removeprefix("GPU ")
    return (int(index), "") if index.isdigit() else (1 << 30, name)


def _action_text(action: dict[str, Any], names: dict[str, str] | None = None) -> str:
    if action.get("change"):
        # an arrow that a narrow column cannot break in two, as "-" and ">" can
        return _short(str(action["change"]).replace(" -> ", " → "), names or {})
    detail = f" {action['detail']}" if action.get("detail") else ""
    return f"{action.get('recommendation', '')}{detail}"


def _table(headers: Iterable[str], rows: Iterable[Iterable[tuple[str, str]]], css: str = "") -> str:
    """rows of (css class, already-escaped html) cells."""
    opening = f"<table class='{css}'>" if css else "<table>"
    out = [opening + "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr>"]
    for row in rows:
        out.append(
            "<tr>" + "".join(f"<td class='{c}'>{v}</td>" if c else f"<td>{v}</td>" for c, v in row) + "</tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _limits(row: pd.Series) -> str:
    parts = []
    if isinstance(row.get("mig_profile"), str) and row.get("mig_profile"):
        parts.append(f"MIG {row['mig_profile']}")
    threads = row.get("mps_active_thread_percentage")
    if threads is not None and threads == threads:
        parts.append(f"MPS {int(threads)} % threads")
    limit = row.get("mps_pinned_memory_limit_bytes")
    if limit is not None and limit == limit:
        parts.append(f"{units.gib(limit)} pinned")
    return ", ".join(parts)


def _flags(row: pd.Series) -> str:
    flags = []
    if bool(row.get("false_saturation", False)):
        flags.append("<span class='flag' title='memory held, compute idle'>false saturation</span>")
    finding = row.get("finding")
    if isinstance(finding, str) and finding and not finding.startswith("false saturation"):
        flags.append(f"<span class='flag'>{_e(finding.split(':', 1)[0])}</span>")
    return " ".join(flags)


def _gpu_names(analysis: Analysis) -> dict[str, str]:
    """UUID -> "GPU <index>" for the inventory (the host is already in the sentence)."""
    placement = analysis.emitted.placement if analysis.emitted is not None else None
    if placement is None:
        return {}
    return {g.uuid: f"GPU {g.index}" for g in placement.inventory.gpus}


def _why(action: dict[str, Any], names: dict[str, str]) -> str:
    """What to do when it says more than the change itself, else why."""
    todo, change = str(action.get("what_to_do") or ""), str(action.get("change") or "")
    why = str(action.get("reason", ""))
    if change and todo.startswith(change):
        # a change that also has a finding: the change is in its own column; say why, then the finding
        extra = todo[len(change) :].lstrip("; ")
        return _short(f"{why}; {extra}" if extra else why, names)
    return _short(todo or why, names)


def _first_screen(analysis: Analysis, model: ReportModel, previous: WeekOverWeek | None = None) -> list[str]:
    h = analysis.headline()
    price = (
        f"at {model.prices.default:.2f} {model.prices.currency} per GPU-hour "
        "(assumed; set --gpu-price MODEL=PRICE)"
        if model.prices.assumed
        else "at the --gpu-price prices"
    )
    teams = list(model.energy_kwh_by_team.items())
    energy = ", ".join(f"{_e(t)} {units.kwh(v)}" for t, v in teams[:4]) + (" …" if len(teams) > 4 else "")
    parts = [
        "<h1>GPU rightsizing report</h1>",
        f"<p class='sub'>{_e(units.when(model.window_start))} → {_e(units.when(model.window_end))} "
        f"({units.hours(model.window_hours).removesuffix(' h')} hours) · {model.gpus_total} GPUs · "
        f"{h.get('jobs', 0)} jobs · source <code>{_e(analysis.source)}</code></p>",
        "<div class='kpis'>",
    ]
    if analysis.kind == "requests":
        parts += [
            f"<div class='kpi'><b>{model.gpus_reclaimable} of {model.gpus_total} GPUs</b>saved by packing "
            "fractional requests<br><small>requests only, not measured use: the value of fractional "
            "requests, not savings seen on the GPUs</small></div></div>",
            "<h2>Actions</h2><p>A requests-only trace carries no usage: there are no per-job actions.</p>",
        ]
        return parts
    parts += [
        f"<div class='kpi'><b>{model.gpus_reclaimable} of {model.gpus_total} GPUs</b>reclaimable now"
        f"<br><small>{_e(_where(model, previous))}</small></div>",
        f"<div class='kpi'><b>{units.hours(model.gpu_hours_recovered)}</b>GPU-hours recovered this window"
        f"<br><small>{_e(units.money(model.cost_recovered, model.prices.currency))} "
        f"{_e(price)}{_e(_if_fixed(model))}{_e(_reconciled(model))}</small></div>",
    ]
    if analysis.kind == "usage":
        parts.append(
            f"<div class='kpi'><b>{units.pct(h['utilization_before'])} → "
            f"{units.pct(h['utilization_after'])}</b>"
            f"GPU utilisation now → proposed<br><small>{units.hours(h['gpu_hours_idle'])} of "
            f"{units.hours(h['gpu_hours_allocated'])} allocated were idle</small></div>"
        )
        parts.append(
            f"<div class='kpi'><b>{units.kwh(sum(model.energy_kwh_by_team.values()))}</b>energy by team "
            f"(estimated)<br><small>{energy}</small></div>"
        )
    parts.append("</div>")
    if _room(model):
        parts.append(f"<p>{_e(_room(model))}</p>")
    names = _gpu_names(analysis)
    parts.append("<h2>Actions, largest GPU-hours recovered first</h2>")
    if model.actions:
        rows = [
            [
                ("num", str(i)),
                ("", _e(a["job_id"])),
                ("", _e(a.get("team", ""))),
                ("", _e(a.get("action", a.get("recommendation", "")))),
                ("wrap", _e(_action_text(a, names))),
                ("num", _e(units.hours(a.get("gpu_hours_recovered", a.get("gpu_hours_idle"))))),
                ("wrap", _e(_why(a, names))),
            ]
            for i, a in enumerate(model.actions, start=1)
        ]
        parts.append(
            # a non-breaking hyphen: the narrow column wrapped the header as "GPU-" / "h"
            _table(
                ["#", "job", "team", "action", "current → proposed", "GPU\u2011h", "why / what to do"], rows
            )
        )
        more = len(model.all_actions) - len(model.actions)
        if more > 0:
            parts.append(
                f"<p>{more} more action(s), with fewer GPU-hours each: all of them are in "
                "<a href='summary.md'>summary.md</a> and <a href='jobs.csv'>jobs.csv</a>.</p>"
            )
    else:
        parts.append("<p>No change to make: every job is already placed well.</p>")
    return parts


def _released(week: WeekOverWeek) -> str:
    """GPUs that ran no job all window, by node and model, beside what last week's plan promised."""
    where = ", ".join(f"{n} on {key}" for key, n in week.idle_now.items())
    released = f"{week.gpus_released} GPU(s) ran no job all window" + (f" ({where})" if where else "")
    return f"{released}; last week's plan promised {week.promised}"


def _since_last_week(week: WeekOverWeek | None) -> list[str]:
    if week is None:
        return []
    parts = [
        "<h2>Since last week</h2>",
        f"<p>GPUs that ran a job {week.gpus_then} → {week.gpus_now} · {_released(week)} · utilisation "
        f"{units.pct(week.utilization_then)} → {units.pct(week.utilization_now)} · last week's report: "
        f"<code>{_e(week.previous_source)}</code></p>",
    ]
    rows = [
        [
            ("", _e(o.job_id)),
            ("", f"<b class='flag'>{_e(o.status)}</b>" if o.warning else _e(o.status)),
            ("wrap", _e(f"{o.was} → {o.told}")),
            ("wrap", _e(o.now)),
            (
                "wrap",
                f"<span class='flag'>{_e(o.warning)}</span>"
                + (f"<br><code>{_e(o.rollback)}</code>" if o.rollback else "")
                if o.warning
                else "",
            ),
        ]
        for o in week.applied
    ] + [
        [
            ("", _e(o.job_id)),
            ("", _e(f"superseded by {o.superseded_by}" if o.superseded_by else "not applied")),
            ("wrap", _e(f"{o.was} → {o.told}")),
            ("wrap", _e(o.now)),
            ("", ""),
        ]
        for o in week.not_applied
    ]
    if rows:
        parts.append(_table(["job", "status", "last week: was → proposed", "now", "watch"], rows))
    if week.ended:
        parts.append(
            f"<p>{len(week.ended)} job(s) with a recommendation have ended: "
            f"{_e(', '.join(week.ended[:10]))}</p>"
        )
    if not rows and not week.ended:
        parts.append("<p>Last week's report recommended no change.</p>")
    return parts


def _layout(model: ReportModel) -> list[str]:
    if not model.layout:
        return []
    parts = ["<h2>Layout per host: now and proposed</h2>"]
    for host, rows in sorted(model.layout.items()):
        parts.append(f"<h3>{_e(host)}</h3>")
        parts.append(
            _table(
                ["GPU", "model", "now", "proposed"],
                [
                    [
                        ("num", str(r.index)),
                        ("", _e(r.model)),
                        ("wrap", _e(r.current)),
                        ("wrap free" if r.free else "wrap", _e(r.proposed)),
                    ]
                    for r in rows
                ],
            )
        )
    return parts


def _changes(model: ReportModel) -> list[str]:
    """Every GPU the emitted files change, by node: what an SRE checks before applying them."""
    if not model.changes:
        return []
    rows = [
        [
            ("", _e(c.host)),
            ("num", str(c.index)),
            ("wrap", _e(c.before)),
            ("wrap", _e(c.after)),
        ]
        for c in model.changes
    ]
    nodes = len({c.host for c in model.changes})
    intro = (
        f"<p>The files change {len(model.changes)} GPU(s) on {nodes} node(s); every other node and GPU "
        "keeps its mode, MIG instances and advertised resources and is in no file.</p>"
    )
    return ["<h2>Changes per node</h2>", intro, _table(["node", "GPU", "now", "after the plan"], rows)]


def _apply(model: ReportModel) -> list[str]:
    if not model.apply:
        return []
    rows = [
        [
            ("", f"<a href='config/{_e(s.file)}'>{_e(s.file)}</a>"),
            ("wrap", f"<code>{_e(s.command)}</code>"),
            ("wrap", _e(s.purpose)),
        ]
        for s in model.apply
    ]
    return ["<h2>How to apply</h2>", _table(["file", "command", "what it does"], rows)]


def _adjustments(model: ReportModel) -> list[str]:
    if not model.adjustments and not model.notes:
        return []
    parts = ["<h2>What the tools cannot express, and what changed</h2><ul>"]
    parts += [f"<li><b>{_e(a.what)}</b> ({_e(a.where)}): {_e(a.message)}</li>" for a in model.adjustments]
    parts += [f"<li>{_e(n)}</li>" for n in model.notes]
    parts.append("</ul>")
    return parts


JOB_COLUMNS = (  # (header, width %): flags hold "memory hog" on two lines, never split mid-word
    ("job", 5),
    ("team", 6),
    ("model", 7),
    ("GPUs", 4),
    ("now", 6),
    ("signal", 7),
    ("activity mean / p95 / idle", 10),
    ("peak memory", 6),
    ("GPU-h allocated / idle", 8),
    ("proposed", 6),
    ("limits", 8),
    ("flags", 7),
    ("confi\u00addence", 6),  # a soft hyphen: the word is wider than its column
    ("reason", 14),
)


def _cell(value: object, fmt: Callable[[object], str]) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else fmt(value)


def _jobs(analysis: Analysis) -> list[str]:
    recs = analysis.recs.sort_values("job_id")
    rows = []
    for _, row in recs.iterrows():
        activity = " / ".join(
            _cell(row.get(c), units.pct) for c in ("sm_active_mean", "sm_active_p95", "idle_fraction")
        )
        hours = " / ".join(_cell(row.get(c), units.hours) for c in ("gpu_hours_allocated", "gpu_hours_idle"))
        rows.append(
            [
                ("", _e(row.get("job_id"))),
                ("", _e(row.get("team"))),
                ("", _e(row.get("gpu_model"))),
                ("num", _e(_cell(row.get("gpus"), units.number))),
                ("", _e(row.get("sharing"))),
                ("", _e(row.get("activity_signal"))),
                ("num", _e(activity)),
                ("num", _e(_cell(row.get("memory_peak_bytes"), units.gib))),
                ("num", _e(hours)),
                ("", _e(row.get("recommendation"))),
                ("", _e(_limits(row))),
                ("", _flags(row)),
                ("", _e(row.get("confidence", ""))),
                ("wrap", _e(row.get("reason", ""))),
            ]
        )
    widths = "".join(f"<col style='width:{w}%'>" for _, w in JOB_COLUMNS)
    table = _table([h for h, _ in JOB_COLUMNS], rows, "jobs").replace(
        "<tr>", f"<colgroup>{widths}</colgroup><tr>", 1
    )
    return [
        f"<details><summary>Every job ({len(recs)}), with the figures behind each decision</summary>",
        table,
        "</details>",
    ]


def html_report(
    analysis: Analysis, prices: Prices | None = None, previous: WeekOverWeek | None = None
) -> str:
    model = build(analysis, prices)
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>gpulens rightsizing report</title><style>{CSS}</style></head><body>",
    ]
    parts += _first_screen(analysis, model, previous)
    parts += _since_last_week(previous)
    parts += _adjustments(model)
    parts += _layout(model)
    parts += _changes(model)
    parts += _apply(model)
    plots = []
    if analysis.kind == "usage":
        plots += [(f"Jobs by {signal_label(analysis.recs)}", plot_utilization(analysis.recs))]
        plots += [("Idle GPU-hours by team", plot_waste(analysis.recs))]
    plots.append(("GPUs per model, now and proposed", plot_packing(analysis)))
    arch = plot_archetypes(analysis)
    if arch:
        plots.append(("Workload archetypes", arch))
    parts.append("<h2>Plots</h2><div class='plots'>")
    parts += [f"<img alt='{_e(t)}' title='{_e(t)}' src='data:image/png;base64,{png}'>" for t, png in plots]
    parts.append("</div>")
    if analysis.archetypes is not None and analysis.archetypes.skipped_reason:
        parts.append(f"<p>{_e(analysis.archetypes.skipped_reason)}</p>")
    if analysis.kind == "usage":
        parts += _jobs(analysis)
    parts.append("</body></html>")
    return "\n".join(parts)


def markdown(analysis: Analysis, prices: Prices | None = None, previous: WeekOverWeek | None = None) -> str:
    model = build(analysis, prices)
    h = analysis.headline()
    lines = [
        f"# GPU rightsizing report ({analysis.kind})",
        "",
        f"{units.when(model.window_start)} → {units.when(model.window_end)} · source `{analysis.source}`",
        "",
    ]
    if analysis.kind == "requests":
        lines.append(
            f"- **GPUs saved by packing fractional requests**: {model.gpus_reclaimable} of "
            f"{model.gpus_total} (requests only, not measured use)"
        )
    else:
        lines.append(
            f"- **GPUs reclaimable now**: {model.gpus_reclaimable} of {model.gpus_total} "
            f"({_where(model, previous)})"
        )
    if analysis.kind == "usage":
        lines += [
            f"- **GPU-hours recovered**: {units.hours(model.gpu_hours_recovered)} "
            f"({units.money(model.cost_recovered, model.prices.currency)}"
            + (f" at an assumed {model.prices.default:.2f} per GPU-hour)" if model.prices.assumed else ")")
            + _if_fixed(model)
            + _reconciled(model),
            f"- GPU-hours: {units.hours(h['gpu_hours_allocated'])} allocated, "
            f"{units.hours(h['gpu_hours_used'])} used, **{units.hours(h['gpu_hours_idle'])} idle**",
            f"- Utilisation: {units.pct(h['utilization_before'], 1)} now, "
            f"{units.pct(h['utilization_after'], 1)} proposed",
            "- Energy by team (estimated): "
            + ", ".join(f"{t} {units.kwh(v)}" for t, v in model.energy_kwh_by_team.items()),
        ]
        if _room(model):
            lines.append(f"- {_room(model)}")
    else:
        lines += [f"- Requests only: {h['jobs']} pods asking for {h['gpus_requested']:.1f} GPUs"]
    if model.all_actions or model.actions:
        lines += [
            "",
            "## Actions",
            "",
            "| # | job | team | current → proposed | GPU-h | why |",
            "|---|---|---|---|---|---|",
        ]
        names = _gpu_names(analysis)  # GPU indices, and why rather than the change again, as in the HTML
        for i, a in enumerate(model.all_actions or model.actions, start=1):  # all of them, not folded
            why = _why(a, names).replace("|", "/")
            hours = units.hours(a.get("gpu_hours_recovered", a.get("gpu_hours_idle")))
            lines.append(
                f"| {i} | {a['job_id']} | {a.get('team', '')} | {_action_text(a, names)} | {hours} | {why} |"
            )
    if previous is not None:
        lines += [
            "",
            "## Since last week",
            "",
            f"- GPUs that ran a job {previous.gpus_then} → {previous.gpus_now}; {_released(previous)}; "
            f"utilisation {units.pct(previous.utilization_then)} → {units.pct(previous.utilization_now)}",
        ]
        lines += [
            f"- {o.status}: {o.job_id}: {o.was} → {o.now}"
            + (f" ({o.warning})" if o.warning else "")
            + (f": `{o.rollback}`" if o.rollback else "")
            for o in previous.applied
        ]
        lines += [
            f"- superseded: {o.job_id}: still {o.now}; proposed {o.told} last week, {o.superseded_by} now"
            if o.superseded_by
            else f"- not applied: {o.job_id}: still {o.now} (proposed {o.told})"
            for o in previous.not_applied
        ]
    if model.adjustments or model.notes:
        lines += ["", "## Changed for the tools, and notes", ""]
        lines += [f"- {a.what} ({a.where}): {a.message}" for a in model.adjustments]
        lines += [f"- {n}" for n in model.notes]
    if model.changes:
        lines += ["", "## Changes per node", "", "| node | GPU | now | after the plan |", "|---|---|---|---|"]
        lines += [
            f"| {c.host} | {c.index} | {c.before.replace('|', '/')} | {c.after.replace('|', '/')} |"
            for c in model.changes
        ]
    if model.apply:
        lines += ["", "## How to apply", ""] + [f"- `{s.file}`: `{s.command}`" for s in model.apply]
    return "\n".join(lines) + "\n"


def write_report(
    analysis: Analysis, out: str | Path, prices: Prices | None = None, previous: WeekOverWeek | None = None
) -> dict[str, Path]:
    """report.html, summary.md, jobs.csv, jobs.json, plan.json and config/* under `out`.

    Swapped in as a whole (`gpulens.atomicfile.write_set`): the files are written into a fresh
    version directory (`out/.report-<random>`) and made current by one rename of the symlink
    `out/.report-current`, through which each path (`out/report.html`, ...) leads. A full disk, any
    failure or a kill at any step leaves the previous week's report whole (the next week's
    `--previous` reads its jobs.json and plan.json together) and nothing temporary behind; the
    next run removes what a killed one left. Other files in `out` are left alone.
    """
    root = Path(out)
    written = {
        "html": root / "report.html",
        "markdown": root / "summary.md",
        "csv": root / "jobs.csv",
        "json": root / "jobs.json",
        "plan": root / "plan.json",
    }
    # render everything before touching the disk: a rendering bug cannot cost the old report
    frame = analysis.recs.drop(columns=["numbers"], errors="ignore")
    texts = {
        "html": html_report(analysis, prices, previous),
        "markdown": markdown(analysis, prices, previous),
        "csv": frame.to_csv(index=False),
        # the same writer as `recommend --format json` (orjson; NaN as null, so always valid JSON)
        "json": jsonout.dumps({"jobs": analysis.job_records()}),
        "plan": jsonout.dumps(jsonable(analysis.plan.as_dict())),
    }
    if previous is not None:  # every previous action's status and realized figures, for tools
        written["week"] = root / "week.json"
        texts["week"] = jsonout.dumps(jsonable(previous.as_dict()))
    if analysis.emitted is not None:
        for name, text in analysis.emitted.files.items():
            written[f"config/{name}"] = root / "config" / name
            texts[f"config/{name}"] = text
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnalyzerError(f"{root}: cannot write report: {exc.strerror or exc}") from None
    try:
        atomicfile.write_set(root, {str(written[key].relative_to(root)): text for key, text in texts.items()})
    except atomicfile.WriteFailed as exc:
        raise AnalyzerError(str(exc)) from None
    return written
