"""The weekly report: one self-contained HTML file, a Markdown summary, CSV and JSON of every job.

Header numbers come first (GPU-hours allocated / used / idle, GPUs that could be freed, top
actions) because that is what a reader acts on; plots (PNG, base64-embedded so the HTML travels
as one file) and the per-job table follow.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.pipeline import Analysis, jsonable

TABLE_COLUMNS = (
    "job_id",
    "team",
    "gpu_model",
    "gpus",
    "sharing",
    "sm_active_mean",
    "sm_active_p95",
    "idle_fraction",
    "memory_peak_bytes",
    "gpu_hours_allocated",
    "gpu_hours_idle",
    "recommendation",
    "mig_profile",
    "confidence",
    "reason",
)


def _png(fig: plt.Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def plot_utilization(recs: pd.DataFrame) -> str:
    fig, ax = plt.subplots(figsize=(6, 3.2))
    data = recs["sm_active_mean"].dropna() * 100
    ax.hist(data, bins=20, range=(0, 100), color="#4c72b0", label="mean")
    ax.hist(
        recs["sm_active_p95"].dropna() * 100,
        bins=20,
        range=(0, 100),
        histtype="step",
        color="#dd8452",
        label="p95",
    )
    ax.set_xlabel("SM activity per job (%)")
    ax.set_ylabel("jobs")
    ax.set_title("Utilisation distribution")
    ax.legend()
    return _png(fig)


def plot_waste(recs: pd.DataFrame) -> str:
    by_team = recs.groupby("team")["gpu_hours_idle"].sum().sort_values().tail(15)
    fig, ax = plt.subplots(figsize=(6, 0.35 * max(3, len(by_team)) + 1))
    ax.barh(by_team.index.astype(str), by_team.to_numpy(), color="#c44e52")
    ax.set_xlabel("GPU-hours allocated but idle")
    ax.set_title("GPU-hours wasted by team / user")
    return _png(fig)


def plot_packing(analysis: Analysis) -> str:
    models = list(analysis.plan.by_model)
    before = [analysis.plan.by_model[m]["gpus_before"] for m in models]
    after = [analysis.plan.by_model[m]["gpus_after"] for m in models]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = range(len(models))
    ax.bar([i - 0.2 for i in x], before, width=0.4, label="before", color="#8c8c8c")
    ax.bar([i + 0.2 for i in x], after, width=0.4, label="after", color="#55a868")
    ax.set_xticks(list(x), models, rotation=15)
    ax.set_ylabel("GPUs")
    ax.set_title("GPUs before / after packing")
    ax.legend()
    return _png(fig)


def plot_archetypes(analysis: Analysis) -> str | None:
    arch = analysis.archetypes
    if arch is None or not len(arch.labels):
        return None
    recs = analysis.recs.set_index("job_id")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name in sorted(set(arch.labels)):
        jobs = arch.labels[arch.labels == name].index
        sub = recs.loc[jobs]
        ax.scatter(
            sub["sm_active_mean"] * 100,
            sub["memory_peak_bytes"] / sub["device_memory_bytes"] * 100,
            s=14,
            label=name,
        )
    ax.set_xlabel("mean SM activity (%)")
    ax.set_ylabel("peak memory (% of device)")
    ax.set_title("Workload archetypes")
    ax.legend(fontsize=7)
    return _png(fig)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value != value:
            return ""
        return f"{value:.3g}" if abs(value) < 1e6 else f"{value:.3e}"
    return "" if value is None else str(value)


def markdown(analysis: Analysis) -> str:
    h = analysis.headline()
    lines = [f"# GPU rightsizing report ({analysis.kind})", "", f"Source: `{analysis.source}`", ""]
    if analysis.kind == "usage":
        lines += [
            f"- **GPU-hours**: {h['gpu_hours_allocated']:.1f} allocated, {h['gpu_hours_used']:.1f} used, "
            f"**{h['gpu_hours_idle']:.1f} idle**",
            (
                f"- **GPUs that could be freed**: {h['gpus_freed']} ({h['gpus_before']} -> {h['gpus_after']})"
                if h["gpus_freed"] >= 0
                else f"- **More GPUs needed**: {-h['gpus_freed']} ({h['gpus_before']} -> {h['gpus_after']}): "
                "slices or GPUs are too small for the observed demand"
            ),
            f"- Utilisation: {100 * h['utilization_before']:.1f} % now, "
            f"{100 * h['utilization_after']:.1f} % projected after consolidation",
        ]
    else:
        lines += [
            f"- Requests only: {h['jobs']} pods asking for {h['gpus_requested']:.1f} GPUs",
            f"- **GPUs that could be freed** by packing fractional requests: {h['gpus_freed']} "
            f"({h['gpus_before']} -> {h['gpus_after']})",
        ]
    counts = analysis.recs["recommendation"].value_counts()
    lines += ["", "## Recommendations", ""] + [f"- {k}: {v}" for k, v in counts.items()]
    actions = analysis.top_actions()
    if actions:
        lines += [
            "",
            "## Top actions",
            "",
            "| job | team | action | idle GPU-h | why |",
            "|---|---|---|---|---|",
        ]
        for a in actions:
            action = a["recommendation"] + (f" {a['detail']}" if a["detail"] else "")
            lines.append(
                f"| {a['job_id']} | {a['team']} | {action} | {a['gpu_hours_idle']:.1f} | {a['reason']} |"
            )
    if analysis.archetypes is not None:
        lines += ["", "## Archetypes", ""]
        if analysis.archetypes.skipped_reason:
            lines.append(analysis.archetypes.skipped_reason)
        for row in analysis.archetypes.summary.itertuples(index=False):
            lines.append(f"- {row.archetype}: {row.jobs} jobs, {row.gpu_hours:.1f} GPU-hours")
    if analysis.plan.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in analysis.plan.notes]
    if analysis.emitted and analysis.emitted.notes:
        lines += [f"- {n}" for n in analysis.emitted.notes]
    return "\n".join(lines) + "\n"


def html_report(analysis: Analysis) -> str:
    h = analysis.headline()
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>gpulens rightsizing report</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
        ".kpi{display:inline-block;margin:0 1.5em 1em 0}.kpi b{font-size:1.6em;display:block}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 5px}"
        "img{max-width:100%}</style></head><body>",
        f"<h1>GPU rightsizing report</h1><p>Source: <code>{html.escape(analysis.source)}</code></p>",
        "<div>",
    ]
    for key, value in h.items():
        shown = f"{100 * value:.1f} %" if key.startswith("utilization") else f"{value:g}"
        parts.append(
            f"<div class='kpi'><b>{html.escape(shown)}</b>{html.escape(key.replace('_', ' '))}</div>"
        )
    parts.append("</div>")
    actions = analysis.top_actions()
    if actions:
        parts.append(
            "<h2>Top actions</h2><table><tr><th>job</th><th>team</th><th>action</th>"
            "<th>idle GPU-h</th><th>why</th></tr>"
        )
        for a in actions:
            action = a["recommendation"] + (f" {a['detail']}" if a["detail"] else "")
            cells = [a["job_id"], a["team"], action, f"{a['gpu_hours_idle']:.1f}", a["reason"]]
            parts.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    plots = []
    if analysis.kind == "usage":
        plots += [
            ("Utilisation distribution", plot_utilization(analysis.recs)),
            ("GPU-hours wasted by team / user", plot_waste(analysis.recs)),
        ]
    plots.append(("Before / after packing", plot_packing(analysis)))
    arch = plot_archetypes(analysis)
    if arch:
        plots.append(("Archetypes", arch))
    for title, png in plots:
        parts.append(
            f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='data:image/png;base64,{png}'>"
        )
    if analysis.archetypes is not None and analysis.archetypes.skipped_reason:
        parts.append(f"<p>{html.escape(analysis.archetypes.skipped_reason)}</p>")
    if analysis.archetypes is not None and len(analysis.archetypes.summary):
        parts.append(
            "<h2>Archetype sizes</h2>" + analysis.archetypes.summary.to_html(index=False, float_format="%.3g")
        )
    columns = [c for c in TABLE_COLUMNS if c in analysis.recs]
    table = analysis.recs[columns].sort_values(columns[0])
    parts.append(
        f"<h2>All jobs ({len(table)})</h2><table><tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"
    )
    for row in table.itertuples(index=False):
        parts.append("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def write_report(analysis: Analysis, out: str | Path) -> dict[str, Path]:
    """report.html, summary.md, jobs.csv, jobs.json, plan.json and config/* under `out`."""
    root = Path(out)
    try:
        root.mkdir(parents=True, exist_ok=True)
        written = {
            "html": root / "report.html",
            "markdown": root / "summary.md",
            "csv": root / "jobs.csv",
            "json": root / "jobs.json",
            "plan": root / "plan.json",
        }
        written["html"].write_text(html_report(analysis))
        written["markdown"].write_text(markdown(analysis))
        frame = analysis.recs.drop(columns=["numbers"], errors="ignore")
        frame.to_csv(written["csv"], index=False)
        written["json"].write_text(json.dumps({"jobs": analysis.job_records()}, indent=1, default=str))
        written["plan"].write_text(json.dumps(jsonable(analysis.plan.as_dict()), indent=1))
        if analysis.emitted is not None:
            config = root / "config"
            config.mkdir(exist_ok=True)
            for name, text in analysis.emitted.files.items():
                (config / name).write_text(text)
                written[f"config/{name}"] = config / name
    except OSError as exc:
        raise AnalyzerError(f"{root}: cannot write report: {exc.strerror}") from exc
    return written
