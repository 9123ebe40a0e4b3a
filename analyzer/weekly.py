"""Week over week: last week's report (its `jobs.json` and `plan.json`) against this week's analysis.

For each action last week recommended, on a job that still runs this week:
- *applied* when the job now runs the way it was told to (its sharing mode, and the MIG profile
  or model it was given); then what it realised: a job at its cap (p95 activity >= 95 % of its
  slice or share) may be slower than before, a job whose peak memory reaches 98 % of what it now
  has risks out-of-memory errors, a job that restarts more often than before (its memory drops to
  a fraction between two steps, `memory_restarts`: what an out-of-memory kill and its restart look
  like) is likely outgrowing its new limit, and an inference server whose p95 e2e request latency
  or time to first token (its own histograms, `serving.py`) rose by more than
  `serving.max_latency_increase` is slower for its users where it now runs;
  such a regression makes the action *roll back*, with the command that undoes it on the job's
  node (last week's `rollback-<node>.sh`);
- *not applied* when it still runs as it did, and this week's plan proposes the same again;
- *superseded* when it was not applied and this week's plan proposes something else for the job
  (its demand moved): last week's action is void, this week's stands.
A job at its cap is judged against the cap it runs under: the one the exporter measured
(`mps_thread_cap_now_pct`) where it publishes one, else the one last week's plan gave it; where the
two differ (a Kubernetes client gets the device plugin's 100/replicas, not the cap it was told),
its line says so. It is judged at the percentile it is sized at (`sizing_percentile`, from
`compute.max_bind_fraction`): its demand there at 95 % of the cap or more means the cap binds more
often than that fraction allows.
A job is followed by its id and, when that id is gone, by its workload (`analyzer/workload.py`):
applying a recommendation rolls a Kubernetes pod, and its successor under the same Deployment,
StatefulSet, Job or CronJob is the same job applied, not a job that ended; where one workload
renamed several (a Deployment's replicas, one user's jobs of one name), each is paired with the
successor that runs where and how the plan told it (`pair_successors`). Jobs that ended are
counted apart. Fleet level: GPUs in use (that ran a job in the window) then and now, the GPUs
that ran no job all this window by node and model (released) next to what last week's plan
promised to free, and utilisation then and now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from gpulens.analyzer import frames
from gpulens.analyzer.applyplan import rollback_name
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.hosts import Orchestrator, host_of
from gpulens.analyzer.hysteresis import at_cap, cap_note, measured_cap
from gpulens.analyzer.pipeline import Analysis
from gpulens.analyzer.thresholds import Thresholds, load_thresholds
from gpulens.analyzer.workload import workload_of
from gpulens.catalog import model_for_nvml_name
from gpulens.safeload import load_json_file

MEMORY_FULL = 0.98
RESTARTS_MORE = 1.5  # a moved job restarting half again as often as before (and at all) regressed
UNCHANGED = frozenset({"insufficient-data", "keep"})


@dataclass(frozen=True)
class Outcome:
    job_id: str
    was: str  # how it ran last week
    told: str  # what last week's report proposed
    now: str  # how it runs this week
    warning: str = ""  # a regression since the change: then roll it back
    rollback: str = ""  # the command that undoes the change on the job's node last week
    p95_then: float | None = None  # its sizing signal last week and now, on the same scale
    p95_now: float | None = None
    superseded_by: str = ""  # not applied: what this week's plan proposes instead
    cap_now_pct: float | None = None  # the MPS thread cap it runs under, as measured
    cap_asked_pct: float | None = None  # ... and the one last week's plan asked for

    @property
    def status(self) -> str:
        return "roll back" if self.warning else "applied"

    def as_dict(self, applied: bool) -> dict[str, Any]:
        unapplied = f"superseded by {self.superseded_by}" if self.superseded_by else "not applied"
        return {
            "job_id": self.job_id,
            "status": self.status if applied else unapplied,
            "superseded_by": self.superseded_by,
            "was": self.was,
            "proposed": self.told,
            "now": self.now,
            "regression": self.warning,
            "rollback": self.rollback,
            "sm_active_p95_then": self.p95_then,
            "sm_active_p95_now": self.p95_now,
            "mps_thread_cap_now_pct": self.cap_now_pct,
            "mps_thread_cap_asked_pct": self.cap_asked_pct,
        }


@dataclass
class WeekOverWeek:
    previous_source: str
    gpus_then: int  # GPUs that ran a job in last week's window
    gpus_now: int  # ... in this window
    utilization_then: float
    utilization_now: float
    applied: list[Outcome] = field(default_factory=list)
    not_applied: list[Outcome] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    idle_now: dict[str, int] = field(default_factory=dict)  # "host model" -> GPUs that ran no job
    promised: int = 0  # GPUs last week's plan said could be freed

    @property
    def gpus_released(self) -> int:
        """GPUs of the fleet that ran no job all this window: what applying the plan gave back."""
        return sum(self.idle_now.values())

    def as_dict(self) -> dict[str, Any]:
        """What the report's week.json holds: the fleet figures and every previous action's outcome."""
        return {
            "previous_report": self.previous_source,
            "gpus_that_ran_a_job": {"then": self.gpus_then, "now": self.gpus_now},
            "gpus_released": self.gpus_released,
            "gpus_released_by_node_and_model": self.idle_now,
            "gpus_promised": self.promised,
            "utilization": {"then": self.utilization_then, "now": self.utilization_now},
            "actions": [o.as_dict(True) for o in self.applied] + [o.as_dict(False) for o in self.not_applied],
            "ended": list(self.ended),
        }


def _gpus_used(rows: list[dict[str, Any]]) -> set[str]:
    return {u for r in rows for u in str(r.get("uuids") or "").split(",") if u}


def _idle_now(analysis: Analysis, used: set[str]) -> dict[str, int]:
    """ "host model" -> GPUs of this week's inventory no job ran on all window."""
    emitted = analysis.emitted
    if emitted is None or emitted.placement is None:
        return {}
    idle: dict[str, int] = {}
    for slot in emitted.placement.inventory.gpus:
        if slot.uuid not in used:
            key = f"{slot.host} {slot.model}"
            idle[key] = idle.get(key, 0) + 1
    return dict(sorted(idle.items()))


def _text(value: object) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _how(mode: str, mig: str, model: str) -> str:
    return " ".join(p for p in (mode, mig, f"on {model}" if model else "") if p)


def load_previous(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(jobs, plan) of a previous report directory; one clear error when it is not one."""
    root = Path(path)
    try:
        jobs = load_json_file(root / "jobs.json")["jobs"]
        plan = load_json_file(root / "plan.json")
    except FileNotFoundError as exc:
        raise AnalyzerError(
            f"--previous {root}: no {Path(str(exc.filename)).name} (a report directory?)"
        ) from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise AnalyzerError(f"--previous {root}: not a gpulens report: {str(exc).splitlines()[0]}") from exc
    if not isinstance(jobs, list) or not isinstance(plan, dict):
        raise AnalyzerError(f"--previous {root}: jobs.json or plan.json has an unexpected shape")
    return jobs, plan


def _cap(row: Any, told: dict[str, Any]) -> float:
    """The share of the GPU a job may use now: the MPS thread cap the exporter measured it running
    under, else the one last week's plan gave it (what it runs under once applied; this week's
    proposal is not in force yet), else all of its GPU or slice."""
    measured = measured_cap(row)
    if measured is not None:
        return measured / 100.0
    if _text(row.get("sharing")) == "mps":
        threads = _float(told.get("mps_active_thread_percentage"))
        if threads:
            return threads / 100.0
    return 1.0


def on_whole_gpu(row: Any) -> float | None:
    """A job's p95 SM activity as a share of its whole GPU. On a MIG slice the figure is of the
    slice's own SMs (a job busy on 20 % of a 3g slice's 42 SMs holds 8.6 % of a 98-SM A100; on a 1g
    slice of 14 SMs the same work reads 60 %), so a job moved between slices, or between a slice and
    a whole GPU, is compared before and after on one scale, not on each slice's."""
    p95 = _float(row.get("sm_active_p95"))
    sms = _float(row.get("device_sms"))
    model = model_for_nvml_name(_text(row.get("gpu_model")))
    if p95 is None or not _text(row.get("mig_profile_now")) or not sms or model is None:
        return p95
    return p95 * sms / model.sm_count


def _float(value: object) -> float | None:
    text = _text(value)
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _warning(row: Any, told: dict[str, Any], th: Thresholds) -> str:
    """A regression since the change (empty when none): its cap binds, its memory is full, it
    restarts more often, or it serves slower."""
    warnings = []
    cap = _cap(row, told)
    found = at_cap(row, cap, th)  # the rule the dead band keeps a cap by (hysteresis.py)
    if found.binds:  # at its cap more often than compute.max_bind_fraction allows
        where = "its cap" if cap < 1.0 else "its GPU's limit"
        warnings.append(
            f"at {where} ({found.percentile} activity {found.demand:.0%} of {cap:.0%}, "
            "compute.max_bind_fraction): may be slower than before"
        )
    peak = float(row.get("memory_peak_bytes") or 0.0)
    limit = (
        _float(told.get("mps_pinned_memory_limit_bytes")) if _text(row.get("sharing")) == "mps" else None
    ) or float(row.get("device_memory_bytes") or 0.0)
    if limit and peak >= MEMORY_FULL * limit:
        warnings.append(f"peak memory {peak / limit:.0%} of what it has: out-of-memory risk")
    then, now = _restarts_per_day(told), _restarts_per_day(row)
    if now is not None and now > 0 and now > (then or 0.0) * RESTARTS_MORE:
        # a memory limit it outgrows kills it (OOM) and its controller restarts it: each restart
        # shows as its memory dropping to a fraction of the step before (profile.memory_restarts)
        was = f"{then:.1f}" if then is not None else "none measured"
        warnings.append(f"restarts more often: {now:.1f} a day, was {was} (out-of-memory kills?)")
    warnings.extend(_slower(row, told, th))
    return "; ".join(warnings)


LATENCY = (
    ("serving_e2e_p95_s", "p95 e2e request latency"),
    ("serving_ttft_p95_s", "p95 time to first token"),
    # Triton publishes no latency histogram by default: its counters give a mean (serving.py)
    ("serving_e2e_mean_s", "mean request time (Triton's counters, not a p95)"),
)


def _slower(row: Any, told: dict[str, Any], th: Thresholds) -> list[str]:
    """A server's latencies that rose by more than `serving.max_latency_increase` since last week
    (both weeks measured from its own series; nothing where either week has none)."""
    limit = th.serving.max_latency_increase
    out = []
    for column, what in LATENCY:
        then, now = _float(told.get(column)), _float(row.get(column))
        if then is None or now is None or not then > 0 or math.isnan(now):
            continue
        if now > then * (1 + limit):
            out.append(
                f"serves slower: {what} {now:.2f} s, was {then:.2f} s "
                f"(+{now / then - 1:.0%} > serving.max_latency_increase {limit:.0%})"
            )
    return out


def _restarts_per_day(row: Any) -> float | None:
    """Memory restarts per day of the job's run in the window (None: not measured)."""
    restarts, duration = _float(row.get("memory_restarts")), _float(row.get("duration_s"))
    if restarts is None or not duration:
        return None
    return restarts * 86400.0 / duration


def _rollback(source: str, job: dict[str, Any]) -> str:
    """The command that undoes last week's change on the job's node, when that report has one."""
    node = host_of(_text(job.get("instance")))
    script = Path(source) / "config" / rollback_name(node)
    return f"sh {script}" if script.is_file() else ""


def _acted(job: dict[str, Any]) -> bool:
    """Whether last week's report asked this job to change (the jobs `compare` follows)."""
    told = _text(job.get("recommendation"))
    if not told or told in UNCHANGED or _text(job.get("action")) == "keep":
        return False
    model = _text(job.get("gpu_model"))
    same_model = (_text(job.get("target_gpu_model")) or model) == model
    same_mig = _text(job.get("mig_profile")) == _text(job.get("mig_profile_now"))
    # last week's report asked for no change where it told the job to run as it did
    return not (told == (_text(job.get("sharing")) or "exclusive") and same_mig and same_model)


def _likeness(job: dict[str, Any], row: dict[str, Any]) -> float:
    """How well this week's `row` looks like `job` (last week's row) run as it was told: on the
    GPU and in the mode, slice and cap the plan gave it, holding about the memory it held."""
    score = 0.0
    node, gpu = _text(job.get("proposed_node")), _text(job.get("proposed_gpu"))
    if node and node == _text(row.get("current_node")):
        score += 1.0 + (2.0 if gpu and gpu == _text(row.get("current_gpu")) else 0.0)
    if _text(job.get("proposed_mode") or job.get("recommendation")) == _text(row.get("sharing")):
        score += 2.0
    mig = _text(job.get("proposed_mig_profile") or job.get("mig_profile"))
    if mig and mig == _text(row.get("mig_profile_now")):
        score += 1.0
    then, now = _float(job.get("memory_peak_bytes")), _float(row.get("memory_peak_bytes"))
    if then is not None and now is not None and then > 0 and now > 0:  # NaN compares False
        score += 1.0 - min(1.0, abs(math.log(now / then)))
    asked = _float(
        job.get("proposed_mps_active_thread_percentage") or job.get("mps_active_thread_percentage")
    )
    measured = measured_cap(row)
    if asked is not None and math.isfinite(asked) and measured is not None:
        score += 1.0 - min(1.0, abs(asked - measured) / 100.0)
    return score


def pair_successors(
    gone: list[dict[str, Any]], successors: dict[str, list[str]], now: dict[str, dict[str, Any]]
) -> dict[str, str]:
    """Last week's job id -> this week's job that is the same job renamed (a rollout, a
    resubmission): among this week's new jobs of its workload, the pairing that best matches
    where and how the plan told each to run (`_likeness`), each taken once. One workload may hold
    several jobs (a Deployment's replicas, one user's jobs of one name): in id order, a 5 GiB job
    told 10 % was paired with its 30 GiB sibling told 37 %, and rolled back for its memory.
    scipy's assignment solver (Hungarian method) finds the best pairing in one call."""
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for job in gone:
        by_workload.setdefault(_text(job.get("workload")) or workload_of(job), []).append(job)
    out: dict[str, str] = {}
    for workload, jobs in by_workload.items():
        new = successors.get(workload, [])
        if not new:
            continue
        score = np.array([[_likeness(job, now[n]) for n in new] for job in jobs])
        for i, k in zip(*linear_sum_assignment(score, maximize=True), strict=True):
            out[str(jobs[i].get("job_id", ""))] = new[k]
    return out


def compare(
    analysis: Analysis,
    jobs: list[dict[str, Any]],
    plan: dict[str, Any],
    source: str,
    th: Thresholds | None = None,
) -> WeekOverWeek:
    """Last week's actions against this week's analysis (module docstring); `th`: the thresholds
    of this run (the defaults without)."""
    th = th if th is not None else load_thresholds()
    now = {str(r["job_id"]): r for r in frames.records(analysis.recs)}
    seen = {str(job.get("job_id", "")) for job in jobs}
    successors: dict[str, list[str]] = {}  # workload -> this week's jobs no previous job has the id of
    for job_id, current in sorted(now.items()):
        if job_id not in seen:
            successors.setdefault(str(current.get("workload") or workload_of(current)), []).append(job_id)
    successor_of = pair_successors(
        [j for j in jobs if _acted(j) and str(j.get("job_id", "")) not in now], successors, now
    )
    used_now = _gpus_used(list(now.values()))
    out = WeekOverWeek(
        previous_source=source,
        gpus_then=len(_gpus_used(jobs)) or int(plan.get("gpus_before") or 0),
        gpus_now=len(used_now),
        utilization_then=float(plan.get("utilization_before") or 0.0),
        utilization_now=float(analysis.plan.utilization_before),
        idle_now=_idle_now(analysis, used_now),
        promised=int(plan.get("gpus_freed") or 0),
    )
    for job in jobs:
        job_id = str(job.get("job_id", ""))
        told_mode = _text(job.get("recommendation"))
        was_mode = _text(job.get("sharing")) or "exclusive"
        told_mig, was_mig = _text(job.get("mig_profile")), _text(job.get("mig_profile_now"))
        told_model = _text(job.get("target_gpu_model")) or _text(job.get("gpu_model"))
        if not _acted(job):
            continue
        row = now.get(job_id)
        followed = ""
        if row is None and job_id in successor_of:  # a rollout renamed it: its workload's successor
            followed = successor_of[job_id]
            row = now[followed]
        if row is None and told_mode == "reclaim":
            was = _how(was_mode, was_mig, _text(job.get("gpu_model")))
            out.applied.append(Outcome(job_id, was, "released", "released (no longer holds a GPU)"))
            continue
        if row is None:
            out.ended.append(job_id)
            continue
        is_mode = _text(row.get("sharing")) or "exclusive"
        is_mig, is_model = _text(row.get("mig_profile_now")), _text(row.get("gpu_model"))
        cap_now = measured_cap(row)
        cap_asked = _float(job.get("mps_active_thread_percentage")) if told_mode == "mps" else None
        note = cap_note(cap_now, cap_asked, _text(row.get("job_source")) == Orchestrator.KUBERNETES)
        outcome_args = (
            job_id,
            _how(was_mode, was_mig, _text(job.get("gpu_model"))),
            _how(told_mode, told_mig, told_model),
            _how(is_mode, is_mig, is_model)
            + (f" (now {followed})" if followed else "")
            + (f"; {note}" if note else ""),
        )
        reclaimed = told_mode == "reclaim"
        applied = (
            not reclaimed
            and is_mode == ("exclusive" if told_mode == "downsize-model" else told_mode)
            and (told_mode != "mig" or is_mig == told_mig)
            and is_model == told_model
        )
        if applied:
            warning = _warning(row, job, th)
            out.applied.append(
                Outcome(
                    *outcome_args,
                    warning=warning,
                    rollback=_rollback(source, job) if warning else "",
                    p95_then=on_whole_gpu(job),
                    p95_now=on_whole_gpu(row),
                    cap_now_pct=cap_now,
                    cap_asked_pct=cap_asked,
                )
            )
        else:
            out.not_applied.append(
                Outcome(
                    *outcome_args,
                    superseded_by=_proposal_if_new(row, told_mode, told_mig),
                    cap_now_pct=cap_now,
                    cap_asked_pct=cap_asked,
                )
            )
    return out


def _proposal_if_new(row: dict[str, Any], told_mode: str, told_mig: str) -> str:
    """This week's proposal for a job whose last action was not applied, when it differs from
    last week's (else empty: the same action stands)."""
    mode, action = _text(row.get("recommendation")), _text(row.get("action"))
    if not mode or mode in UNCHANGED or action == "keep":
        return "keep" if mode and action == "keep" else ""
    mig = _text(row.get("mig_profile"))
    model = _text(row.get("target_gpu_model")) or _text(row.get("gpu_model"))
    if mode == told_mode and (mode != "mig" or mig == told_mig):
        return ""
    return _how(mode, mig if mode == "mig" else "", model)
