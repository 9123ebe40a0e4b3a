"""Hysteresis: a setting that runs now is kept while the newly sized one differs from it by noise.

Sizing reads high percentiles, and an MPS client's per-step share of its GPU is noisy (NVML splits
the GPU's SM activity among the clients by per-process kernel time): its mean holds from week to
week but its p95 / p99 move a few points, and with them the sized thread cap. A planner that
re-sets every cap to the newly sized value never settles: Slurm's per-GPU MPS shares then sum past
100 % and the plan reshuffles clients it placed a week before. So a running setting is kept
(a dead band, as a thermostat has) unless one of these says it must change:

- **thread cap** (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, Slurm's `mps` share): kept when the newly
  sized cap is within `compute.cap_deadband_points` of it and the job does not bind it (`at_cap`:
  the rule week over week judges a moved job by, its demand at its sizing percentile under 95 % of
  the cap; where the job's per-step series is at hand, also above the cap in at most
  `compute.max_bind_fraction` of its bins). A binding cap is raised, whatever the dead band. A
  latency-sensitive client's cap (sized at its p99 or max for its bursts) is never lowered from
  data measured under it: within a step the cap clips its bursts (a client held to its cap uses
  at most cap x busy time), so its step figures read short of what it needs, and re-sized from
  them it would be clipped harder each week. The plan then takes its demand as what its cap was
  sized from (`CENSORED`: its demand and series scaled up to that);
- **pinned memory limit**: kept while it holds the newly sized need (peak + headroom, so never
  below the peak) and is at most `headroom.memory_limit_deadband_ratio` above it; a need above it
  raises it, a need far below it lowers it.

What a job runs under now (`Running`) is the thread cap the exporter measured
(`gpu_job_mps_active_thread_ratio`, the profile's `mps_thread_cap_now_pct`) where it publishes one,
else what last week's report gave it (`Told`, read from its `jobs.json`), followed by id and, after
a rollout or a resubmission, by its workload. The plan is what was asked, the measured cap what
runs: on Kubernetes the device plugin's MPS control daemon gives every client 100/replicas, so a
client told 20 % runs at 33 % beside two others, and its dead band and "at its cap" (`weekly.py`)
are judged against 33 %. Where they differ the job's reason says so (`cap_note`). The pinned
memory limit is not measured: it is last week's. So the dead band applies on the file and the
PromQL paths alike wherever the cap is measured or `gpulens report` is given `--previous`, and the
plan packs, sums Slurm's per-GPU shares and emits with the kept values. A client recommended MIG or
time-slicing (an idle-dominated notebook) may still be planned under MPS, as it runs now: that MPS
mode takes the settings kept by the same rules (`KEPT_*`, read by `modes.modes_of`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gpulens.analyzer import demand, frames
from gpulens.analyzer.hosts import Orchestrator
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.recommend import mps_settings
from gpulens.analyzer.thresholds import Thresholds
from gpulens.analyzer.workload import workload_of
from gpulens.catalog import GIB, MIB

AT_CAP = 0.95  # demand at its sizing percentile at 95 % of its cap or more: the cap binds
MEASURED = "mps_thread_cap_now_pct"  # the profile's column: the cap the exporter measured (percent)
MAX_REPLICAS = 48  # MPS clients per GPU (Volta and later): the most a device plugin shares it by


@dataclass(frozen=True)
class Told:
    """What last week's report gave one MPS client (its `jobs.json` row)."""

    job_id: str
    workload: str
    thread_percentage: int
    pinned_memory_limit_bytes: int | None


@dataclass(frozen=True)
class Running:
    """What one MPS client runs under now: the thread cap measured where the exporter publishes
    it, else the one last week's report gave it (`told`); the pinned limit is always last week's."""

    job_id: str
    told: Told | None  # last week's settings of the job or its workload (None: none given)
    measured_percentage: float | None = None  # `mps_thread_cap_now_pct` (None: not measured)

    @property
    def thread_percentage(self) -> float:
        """The cap in force, in percent: the measured one first."""
        if self.measured_percentage is not None:
            return self.measured_percentage
        return float(self.told.thread_percentage) if self.told is not None else 100.0

    @property
    def pinned_memory_limit_bytes(self) -> int | None:
        return self.told.pinned_memory_limit_bytes if self.told is not None else None

    def note(self, kubernetes: bool) -> str:
        """ "runs at 33 % (...), the plan asked 20 %" where the measured cap is not the one asked."""
        asked = self.told.thread_percentage if self.told is not None else None
        return cap_note(self.measured_percentage, asked, kubernetes)


def measured_cap(row: Mapping[str, Any]) -> float | None:
    """The thread cap (percent) a job's profile row measured it running under; None where the
    exporter published none (older exporters, a client without a cap, not an MPS client)."""
    pct = _number(row.get(MEASURED))
    return pct if pct is not None and 0 < pct <= 100 else None


def cap_note(measured: float | None, asked: float | None, kubernetes: bool = False) -> str:
    """Where the cap measured is not the one last week's plan asked for, a sentence that says so;
    on Kubernetes it names the device plugin's 100/replicas where the measured cap is one (its
    control daemon's default reaches every client; a per-client cap the plan asked for does
    not). Else ""."""
    if measured is None or asked is None or abs(measured - asked) < 0.5:
        return ""
    replicas = min(range(2, MAX_REPLICAS + 1), key=lambda n: abs(100.0 / n - measured))
    why = ""
    if kubernetes and abs(100.0 / replicas - measured) < 0.5:
        why = f" (the device plugin's 100/{replicas})"
    return f"runs at {measured:.0f} %{why}, the plan asked {asked:.0f} %"


@dataclass(frozen=True)
class AtCap:
    """Whether a job's demand reaches the cap it runs under, at the percentile it is sized at."""

    binds: bool
    percentile: str  # "p95", "p99" or "max"
    demand: float  # share of the GPU at that percentile
    cap: float  # share of the GPU
    over_share: float | None = None  # share of its bins above the cap (None: no series)

    def text(self) -> str:
        """ "p95 demand 13 % < 95 % of its 19 % cap, above it in 0 % of samples"."""
        sign = ">=" if self.demand >= AT_CAP * self.cap else "<"
        out = (
            f"{self.percentile} demand {_pct(self.demand)} {sign} {_pct(AT_CAP)} of its {_pct(self.cap)} cap"
        )
        if self.over_share is not None:
            out += f", above it in {_pct(self.over_share)} of samples"
        return out


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _number(value: object) -> float | None:
    if value is None or (isinstance(value, str) and not value):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def at_cap(row: Mapping[str, Any], cap: float, th: Thresholds, series: demand.Series | None = None) -> AtCap:
    """The cap binds when the job's demand at its sizing percentile (`sizing_percentile`, p95 by
    `compute.max_bind_fraction`) is at `AT_CAP` of it or more, or, with its per-bin `series`,
    when it is above the cap in more than `compute.max_bind_fraction` of its bins."""
    percentile = str(row.get("sizing_percentile") or "p95")
    found = _number(row.get(f"sm_active_{percentile}"))
    if found is None:
        found = _number(row.get("sm_active_p95")) or 0.0
    over = None
    if series is not None and len(series.values):
        over = demand.colocated([series], cap).over_share
    binds = found >= AT_CAP * cap or (over is not None and over > th.compute.max_bind_fraction + 1e-12)
    return AtCap(binds, percentile, found, cap, over)


@dataclass(frozen=True)
class Kept:
    """A decision on one setting: the value it gets and, when that is not simply the newly sized
    one, why (the running value kept, or a binding cap raised; "" otherwise)."""

    value: int
    why: str = ""


def thread_cap(sized: int, running: int, binding: AtCap, th: Thresholds, bursty: bool = False) -> Kept:
    """The thread cap (percent) of a client that runs under `running` and is now sized `sized`;
    a latency-sensitive (`bursty`) client's cap is raised where it binds and never lowered."""
    band = th.compute.cap_deadband_points
    if binding.binds:
        return Kept(max(sized, running), f"its {running} % cap binds ({binding.text()}): raised")
    if bursty and sized < running:
        why = (
            f"keeps its {running} % cap: sized {sized} % from data measured under it, and it is "
            f"latency-sensitive (sized at its {binding.percentile} for its bursts): within a step the "
            "cap clips its bursts, so step figures measured under it cannot show that it needs less "
            f"({binding.text()}); measured whole or time-sliced, it may be lowered"
        )
        return Kept(running, why)
    if abs(sized - running) > band or sized == running:
        return Kept(sized)
    why = (
        f"keeps its {running} % cap: sized {sized} %, within the {band}-point dead band "
        f"(compute.cap_deadband_points), {binding.text()}"
    )
    return Kept(running, why)


def memory_limit(need: float, sized: int, running: int | None, th: Thresholds) -> Kept:
    """The pinned memory limit (bytes) of a client that runs under `running` (None: not known) and
    now needs `need` (peak + headroom; `sized`: that rounded up to a MiB)."""
    if running is None or running < need or running == sized:
        return Kept(sized)  # a need above the running limit raises it
    ratio = th.headroom.memory_limit_deadband_ratio
    if running > sized * (1 + ratio):
        return Kept(sized)  # far more than it needs: the memory goes back
    why = (
        f"keeps its {running / GIB:.1f} GiB pinned limit: it holds the need of {need / GIB:.1f} GiB and is "
        f"within {ratio:.0%} of it (headroom.memory_limit_deadband_ratio)"
    )
    return Kept(running, why)


def told_of(jobs: Iterable[Mapping[str, Any]]) -> tuple[Told, ...]:
    """Last week's MPS clients and what they were given (rows of a report's `jobs.json`; a row
    without a thread cap, or with one out of 1..100, gives nothing)."""
    out = []
    for job in jobs:
        if str(job.get("recommendation") or "") != Kind.MPS:
            continue
        threads = _number(job.get("mps_active_thread_percentage"))
        if threads is None or not 0 < threads <= 100:
            continue
        limit = _number(job.get("mps_pinned_memory_limit_bytes"))
        out.append(
            Told(
                str(job.get("job_id", "")),
                str(job.get("workload") or workload_of(job)),
                int(threads),
                int(limit) if limit is not None and limit > 0 else None,
            )
        )
    return tuple(out)


def running_settings(recs: pd.DataFrame, told: Sequence[Told]) -> dict[str, Running]:
    """This week's job id -> what it runs under, for each job that shares its GPU under MPS now:
    the cap measured (`measured_cap`) where there is one, with last week's settings of the same job
    id, else of a job of its workload (each once); a job with neither is left out."""
    by_id = {t.job_id: t for t in told}
    by_workload: dict[str, list[Told]] = {}
    for t in told:
        by_workload.setdefault(t.workload, []).append(t)
    columns = [
        c
        for c in (
            "job_id",
            "sharing",
            "job_source",
            "job_namespace",
            "job_pod",
            "job_user",
            "job_name",
            MEASURED,
        )
        if c in recs
    ]
    rows = frames.records(recs[columns])
    out: dict[str, Running] = {}
    taken = {str(r["job_id"]) for r in rows if str(r["job_id"]) in by_id}
    for row in rows:
        job = str(row["job_id"])
        if str(row.get("sharing") or "") != Kind.MPS:
            continue
        found = by_id.get(job)
        if found is None:
            free = [t for t in by_workload.get(workload_of(row), []) if t.job_id not in taken]
            if free:
                found = free[0]
                taken.add(found.job_id)
        measured = measured_cap(row)
        if found is not None or measured is not None:
            out[job] = Running(job, found, measured)
    return out


# where a job that runs under MPS now is recommended another sharing mode, the MPS mode the plan
# may still choose for it (`modes.modes_of`) takes these settings, kept by the same rules
KEPT_THREADS = "mps_kept_thread_percentage"
KEPT_LIMIT = "mps_kept_pinned_memory_limit_bytes"
KEPT_NOTE = "mps_kept_note"
ALTERNATIVES = frozenset({Kind.MIG, Kind.TIME_SLICING})  # modes.FLEXIBLE less MPS
# a latency-sensitive client whose cap clips its bursts: the factor by which its demand measured
# under the cap is short of the demand its kept cap was sized from (> 1; the plan scales its
# demand and series by it, `planinput.items_of`), absent elsewhere
CENSORED = "sm_demand_censored_scale"


def censored_scale(row: Mapping[str, Any], now: Running, th: Thresholds) -> float:
    """How far a bursty client's demand measured under its cap falls short of the demand its cap
    was sized from (the cap last week's plan asked for, else the one it runs under, less the
    headroom `mps_settings` adds): at least 1."""
    asked = now.told.thread_percentage if now.told is not None else now.thread_percentage
    sized_from = min(asked, now.thread_percentage) / 100.0 / (1 + th.headroom.compute_ratio)
    measured = _number(row.get("sm_fraction"))
    return sized_from / measured if measured and measured > 0 and sized_from > measured else 1.0


def apply(recs: pd.DataFrame, told: Sequence[Told], th: Thresholds) -> pd.DataFrame:
    """Recommendations with the running MPS settings kept where the dead band says (module
    docstring); the reason says which were kept and why, and where the cap measured is not the
    one asked. A client recommended MIG or time-slicing keeps them for the MPS mode the plan may
    choose for it instead (`KEPT_*`, read by `modes.modes_of`; the note joins its plan reason).
    Jobs that are not MPS clients now, or whose running cap is neither measured nor given by
    last week's report, are left as they are."""
    running = running_settings(recs, told)
    if not running:
        return recs
    series = demand.of(recs)
    recs = recs.copy()
    kept: dict[str, dict[Any, object]] = {KEPT_THREADS: {}, KEPT_LIMIT: {}, KEPT_NOTE: {}, CENSORED: {}}
    for label, row in zip(recs.index, frames.records(recs), strict=True):
        now = running.get(str(row["job_id"]))
        if now is None:
            continue
        kind = row.get("recommendation")
        sized = _number(row.get("mps_active_thread_percentage"))
        need = _number(row.get("memory_need_bytes")) or 0.0
        if kind == Kind.MPS and sized is not None:
            sized_limit = int(
                _number(row.get("mps_pinned_memory_limit_bytes")) or math.ceil(need / MIB) * MIB
            )
        elif kind in ALTERNATIVES and (demand_now := _number(row.get("sm_fraction"))) is not None:
            settings = mps_settings(demand_now, need, th)
            sized, sized_limit = float(settings.thread_percentage), settings.pinned_memory_limit_bytes
        else:
            continue
        binding = at_cap(
            row, now.thread_percentage / 100.0, th, series.sm.get(str(row["job_id"])) if series else None
        )
        # the plan's caps are whole percents; whether the cap binds is judged on the measured one
        bursty = bool(row.get("latency_sensitive"))
        threads = thread_cap(int(sized), round(now.thread_percentage), binding, th, bursty)
        limit = memory_limit(need, sized_limit, now.pinned_memory_limit_bytes, th)
        whys = [k.why for k in (threads, limit) if k.why]
        note = now.note(str(row.get("job_source") or "") == Orchestrator.KUBERNETES)
        whys = [note, *whys] if note and whys else whys
        if bursty and not binding.binds and sized < threads.value:  # its demand read short under the cap
            scale = censored_scale(row, now, th)
            if scale > 1.0:
                kept[CENSORED][label] = scale
                if (fraction := _number(row.get("sm_fraction"))) is not None:
                    recs.at[label, "sm_fraction"] = min(1.0, fraction * scale)
                if (sms := _number(row.get("sm_demand_sms"))) is not None:
                    recs.at[label, "sm_demand_sms"] = sms * scale
        if kind != Kind.MPS:
            if whys:
                kept[KEPT_THREADS][label] = threads.value
                kept[KEPT_LIMIT][label] = limit.value
                kept[KEPT_NOTE][label] = "; ".join(whys)
            continue
        if not whys:  # the newly sized values stand
            if note:
                recs.at[label, "reason"] = f"{row['reason']}; {note}"
            continue
        mem_fraction = _number((row.get("numbers") or {}).get("mem_fraction")) or 0.0
        recs.at[label, "mps_active_thread_percentage"] = threads.value
        recs.at[label, "mps_pinned_memory_limit_bytes"] = limit.value
        recs.at[label, "gpu_fraction"] = max(mem_fraction, threads.value / 100.0)
        recs.at[label, "reason"] = f"{row['reason']}; {'; '.join(whys)}"
    for column, values in kept.items():  # columns only where some job has one
        if values:
            recs[column] = pd.Series(values, dtype=object if column == KEPT_NOTE else float)
    return recs
