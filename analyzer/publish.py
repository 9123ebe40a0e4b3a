"""Publish the latest recommendations as Prometheus text (node_exporter textfile collector).

Written atomically (temp file + rename) so the collector never reads half a file. Dashboards can
then show "what the analyzer recommends" next to live usage.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpulens import atomicfile
from gpulens.analyzer import frames
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import format_value
from gpulens.analyzer.pipeline import Analysis


def _labels(**pairs: object) -> str:
    def esc(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in pairs.items() if v not in (None, "")) + "}"


def render(analysis: Analysis, now: float | None = None) -> str:
    """Prometheus text exposition of the recommendations and the plan."""
    lines = [
        "# HELP gpulens_recommendation_info Latest rightsizing recommendation per job (value 1).",
        "# TYPE gpulens_recommendation_info gauge",
    ]
    recs = analysis.recs
    for row in frames.rows(recs):
        mig = getattr(row, "mig_profile", None)
        lines.append(
            "gpulens_recommendation_info"
            + _labels(
                job_id=row.job_id,
                gpu_model=row.gpu_model,
                recommendation=row.recommendation,
                mig_profile=mig if isinstance(mig, str) else "",
                confidence_level=row.confidence_level,
            )
            + " 1"
        )
    lines += [
        "# HELP gpulens_recommendation_confidence Confidence of the recommendation (0..1).",
        "# TYPE gpulens_recommendation_confidence gauge",
    ]
    lines += [
        f"gpulens_recommendation_confidence{_labels(job_id=r.job_id)} {format_value(float(r.confidence))}"
        for r in frames.rows(recs)
    ]
    if "gpu_hours_idle" in recs:
        lines += [
            "# HELP gpulens_job_gpu_idle_seconds GPU-seconds allocated but not used in the analysed window.",
            "# TYPE gpulens_job_gpu_idle_seconds gauge",
        ]
        lines += [
            f"gpulens_job_gpu_idle_seconds{_labels(job_id=r.job_id, job_namespace=r.job_namespace)} "
            f"{format_value(round(float(r.gpu_hours_idle) * 3600, 3))}"
            for r in frames.rows(recs)
        ]
    lines += [
        "# HELP gpulens_plan_gpus GPUs per model before and after the consolidation plan, and freed.",
        "# TYPE gpulens_plan_gpus gauge",
    ]
    for model, counts in analysis.plan.by_model.items():
        for state in ("before", "after", "freed"):
            lines.append(
                f"gpulens_plan_gpus{_labels(gpu_model=model, state=state)} {counts[f'gpus_{state}']:g}"
            )
    lines += [
        "# HELP gpulens_plan_utilization_ratio Fleet GPU utilisation before and projected after the plan.",
        "# TYPE gpulens_plan_utilization_ratio gauge",
        f'gpulens_plan_utilization_ratio{{state="before"}} {format_value(analysis.plan.utilization_before)}',
        f'gpulens_plan_utilization_ratio{{state="after"}} {format_value(analysis.plan.utilization_after)}',
        "# HELP gpulens_analysis_timestamp_seconds When this analysis was written.",
        "# TYPE gpulens_analysis_timestamp_seconds gauge",
        f"gpulens_analysis_timestamp_seconds {format_value(round(now or time.time(), 3))}",
    ]
    return "\n".join(lines) + "\n"


def write_textfile(analysis: Analysis, path: str | Path) -> Path:
    """Replace `path` atomically: the textfile collector reads the previous file or this one.

    The temporary name starts with a dot and does not end in `.prom`, so the collector skips it.
    """
    target = Path(path)
    try:
        atomicfile.write_text(target, render(analysis))
    except atomicfile.WriteFailed as exc:
        raise AnalyzerError(str(exc)) from None
    return target
