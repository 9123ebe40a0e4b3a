"""What the report says, computed once from an analysis: the facts an SRE acts on, in order.

- the window (dates) and the fleet size;
- GPUs reclaimable now and where (host and GPU index from emit's placement: inventory GPUs no
  planned GPU uses), GPU-hours recovered (the GPUs the plan frees, for the whole window; the
  jobs to fix counted apart) and what that is worth at a price per GPU model (`Prices`:
  per-model prices and a default, all configurable);
- energy per team, estimated from each job's measured activity and the catalog's idle and board
  power (histories carry no power samples, so this is an estimate and says so);
- the ranked action list (current -> proposed), what emit had to change for the tools;
- current and proposed layout per host, and how to apply each emitted file.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulens.analyzer import frames
from gpulens.analyzer.hosts import Family
from gpulens.analyzer.nodestate import GpuChange
from gpulens.analyzer.pipeline import Analysis
from gpulens.catalog import model_for_nvml_name

DEFAULT_PRICE = 2.0  # USD per GPU-hour when no price is given: an assumption the report states


@dataclass(frozen=True)
class Prices:
    """Price per GPU-hour by model (catalog key, alias or NVML name) and a default for the rest."""

    per_model: Mapping[str, float] = field(default_factory=dict)
    default: float = DEFAULT_PRICE
    currency: str = "USD"
    assumed: bool = True  # no price was given: the default is an assumption

    def of(self, model: str) -> float:
        known = model_for_nvml_name(model)
        for name, price in self.per_model.items():
            candidate = model_for_nvml_name(name)
            if name == model or (candidate is not None and candidate is known):
                return price
        return self.default


def parse_prices(items: list[str] | None) -> Prices:
    """`--gpu-price MODEL=PRICE` (repeatable; MODEL `default` sets the default)."""
    if not items:
        return Prices()
    per_model: dict[str, float] = {}
    default = DEFAULT_PRICE
    for item in items:
        name, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or not name or price < 0 or math.isinf(price) or math.isnan(price):
            raise ValueError(f"--gpu-price {item!r}: expected MODEL=PRICE per GPU-hour, e.g. H100-80GB=3.50")
        if name == "default":
            default = price
        else:
            per_model[name] = price
    return Prices(per_model, default, assumed=False)


@dataclass(frozen=True)
class GpuRow:
    """One physical GPU of a host: what runs on it now and what the plan puts there."""

    index: int
    model: str
    current: str
    proposed: str
    free: bool


@dataclass
class ReportModel:
    window_start: float
    window_end: float
    gpus_total: int
    gpus_reclaimable: int
    reclaimable: dict[str, list[int]]  # host -> GPU indices free after the plan
    gpu_hours_recovered: float  # GPUs the plan frees x the window's hours
    gpu_hours_if_fixed: float  # more, once the jobs flagged `fix` are fixed (not in the plan)
    cost_recovered: float
    prices: Prices
    energy_kwh_by_team: dict[str, float]
    actions: list[dict[str, Any]]
    adjustments: list[Any]
    layout: dict[str, list[GpuRow]]
    apply: list[Any]
    notes: list[str]
    changes: list[GpuChange] = field(default_factory=list)  # per GPU: node, before -> after, jobs
    all_actions: list[dict[str, Any]] = field(default_factory=list)  # every action, ranked (summary.md)
    gpu_hours_of_actions: float = 0.0  # the change and reclaim actions' own GPU-hours, summed
    # k -> how many k-GPU requests the free GPUs hold (k GPUs of one node each), now and after
    room_now: dict[int, int] = field(default_factory=dict)
    room_after: dict[int, int] = field(default_factory=dict)

    @property
    def window_hours(self) -> float:
        return max(0.0, (self.window_end - self.window_start) / 3600.0)


def _float(value: object) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if math.isnan(number) else number


def energy_by_team(recs: Any) -> dict[str, float]:
    """kWh per team: allocated hours x (idle + mean activity x (board - idle power)) per job."""
    out: dict[str, float] = defaultdict(float)
    for row in frames.rows(recs):
        model = model_for_nvml_name(str(row.gpu_model))
        if model is None:
            continue
        activity = min(1.0, max(0.0, _float(row.sm_active_mean)))
        watts = model.idle_power_watts + activity * (model.power_limit_watts - model.idle_power_watts)
        out[str(row.team)] += _float(row.gpu_hours_allocated) * watts / 1000.0
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _action_hours(action: Mapping[str, Any]) -> float:
    return _float(action.get("gpu_hours_recovered", action.get("gpu_hours_idle", 0.0)))


REQUEST_SIZES = (1, 2, 4, 8)


def room(free_per_host: Mapping[str, int]) -> dict[int, int]:
    """How many k-GPU requests fit the free GPUs, k of one node each (a multi-GPU job stays on one
    node): the fragmentation a plan leaves, which a GPU count alone hides."""
    return {k: sum(n // k for n in free_per_host.values()) for k in REQUEST_SIZES}


def _current_by_slot(analysis: Analysis) -> dict[tuple[str, int], list[str]]:
    """(host, index) -> "job (sharing)" of the jobs running there now."""
    emitted = analysis.emitted
    if emitted is None or emitted.placement is None:
        return {}
    slots = emitted.placement.inventory.by_uuid()
    out: dict[tuple[str, int], list[str]] = defaultdict(list)
    for row in frames.rows(analysis.recs):
        mig = str(getattr(row, "mig_profile_now", "") or "")
        how = f"mig {mig}" if mig else str(row.sharing)
        for uuid in str(row.uuids).split(","):
            if uuid in slots:
                out[(slots[uuid].host, slots[uuid].index)].append(f"{row.job_id} ({how})")
    return out


def _proposed(gpu: Any) -> str:
    entry = gpu.entry
    if gpu.family is Family.UNCHANGED:
        return "unchanged: " + ", ".join(entry.get("jobs", []))
    if entry.get("sharing") == "mig" and entry.get("mig_layout"):
        return "MIG " + ", ".join(f"{s['job_id']} {s['profile']}" for s in entry["mig_layout"])
    if gpu.family is Family.MPS:
        clients = entry.get("mps_clients", [])
        return "MPS " + ", ".join(
            f"{c['job_id']} {c['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE']} % threads" for c in clients
        )
    if gpu.family is Family.TIME_SLICING:
        return "time-sliced " + ", ".join(entry.get("jobs", []))
    return "whole GPU " + ", ".join(entry.get("jobs", []))


def _text(value: object) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def ranked(analysis: Analysis, n: int | None) -> list[dict[str, Any]]:
    """The analysis's ranked actions; for an analysis without current -> proposed columns, jobs
    whose recommendation differs from how they run now, by idle GPU-hours, with that change."""
    if analysis.kind != "usage":
        return []
    recs = analysis.recs
    if "action" in recs:
        return analysis.top_actions(len(recs) if n is None else n)
    out = []
    for row in recs.sort_values(["gpu_hours_idle", "job_id"], ascending=[False, True]).itertuples(
        index=False
    ):
        kind, now = str(row.recommendation), _text(row.sharing) or "exclusive"
        now_mig, new_mig = _text(getattr(row, "mig_profile_now", "")), _text(row.mig_profile)
        target = _text(getattr(row, "target_gpu_model", ""))
        if kind == "insufficient-data" or (kind == now and now_mig == new_mig and not target):
            continue
        before = f"{now} {now_mig}".strip() + f", {row.gpu_model}"
        after = "released" if kind == "reclaim" else f"{kind} {new_mig or target}".strip()
        out.append(
            {
                "job_id": row.job_id,
                "team": row.team,
                "action": "reclaim" if kind == "reclaim" else "change",
                "change": f"{before} → {after}",
                "gpu_hours_idle": _float(row.gpu_hours_idle),
                "reason": row.reason,
            }
        )
    return out if n is None else out[:n]


def build(analysis: Analysis, prices: Prices | None = None, actions: int = 10) -> ReportModel:
    prices = prices or Prices()
    recs = analysis.recs
    start = _float(analysis.meta.get("start")) or (float(recs["start"].min()) if len(recs) else 0.0)
    end = _float(analysis.meta.get("end")) or (float(recs["end"].max()) if len(recs) else 0.0)
    everything = ranked(analysis, None)
    top = everything[:actions]
    # The headline is what the plan gives back: every GPU it frees, for the whole window. The
    # actions' own GPU-hours are a per-job attribution for ranking; summed they can exceed what
    # packing frees (a partial share frees no GPU) and they count fixes the plan does not assume.
    hours = max(0.0, (end - start) / 3600.0)
    if_fixed = sum(_action_hours(a) for a in everything if a.get("action") == "fix")
    # the model of every GPU the plan frees: the placement's free inventory GPUs, else (no
    # placement) the plan's count per model
    freed_models = [
        model for model, row in analysis.plan.by_model.items() for _ in range(max(0, int(row["gpus_freed"])))
    ]
    emitted = analysis.emitted
    room_now: dict[int, int] = {}
    room_after: dict[int, int] = {}
    layout: dict[str, list[GpuRow]] = {}
    reclaimable: dict[str, list[int]] = {}
    total = analysis.plan.gpus_before
    if emitted is not None and emitted.placement is not None:
        placement = emitted.placement
        current = _current_by_slot(analysis)
        placed = {(g.host, g.index): g for g in placement.gpus}
        total = max(total, len(placement.inventory.gpus))
        for host in placement.inventory.hosts():
            rows = []
            for slot in placement.inventory.on(host):
                gpu = placed.get((host, slot.index))
                now = ", ".join(current.get((host, slot.index), [])) or "no job"
                rows.append(
                    GpuRow(
                        slot.index, slot.model, now, _proposed(gpu) if gpu else "free: reclaim", gpu is None
                    )
                )
            layout[host] = rows
        free = placement.free()
        for slot in free:
            reclaimable.setdefault(slot.host, []).append(slot.index)
        idle_now: dict[str, int] = {}
        for slot in placement.inventory.gpus:
            if slot.uuid not in emitted.now:
                idle_now[slot.host] = idle_now.get(slot.host, 0) + 1
        room_now = room(idle_now) if emitted.now else {}
        room_after = room({h: len(v) for h, v in reclaimable.items()}) if emitted.now else {}
        freed_models = [slot.model for slot in free]
    if not room_now and analysis.plan.room:  # no node state: the plan's count over the inventory
        room_now = {int(r["gpus"]): int(r["now"]) for r in analysis.plan.room}
        room_after = {int(r["gpus"]): int(r["after"]) for r in analysis.plan.room}
    recovered = len(freed_models) * hours if analysis.kind == "usage" else 0.0
    cost = sum(prices.of(m) for m in freed_models) * hours if analysis.kind == "usage" else 0.0
    freed = max(0, analysis.plan.gpus_freed)
    return ReportModel(
        window_start=start,
        window_end=end,
        gpus_total=total,
        gpus_reclaimable=sum(len(v) for v in reclaimable.values()) if layout else freed,
        reclaimable=reclaimable,
        gpu_hours_recovered=recovered,
        gpu_hours_if_fixed=if_fixed,
        cost_recovered=cost,
        prices=prices,
        energy_kwh_by_team=energy_by_team(recs) if analysis.kind == "usage" else {},
        actions=top,
        adjustments=list(emitted.adjustments) if emitted else [],
        layout=layout,
        apply=list(emitted.apply) if emitted else [],
        notes=list(analysis.plan.notes) + (list(emitted.notes) if emitted else []),
        changes=list(emitted.changes) if emitted else [],
        all_actions=everything,
        room_now=room_now,
        room_after=room_after,
        gpu_hours_of_actions=sum(_action_hours(a) for a in everything if a.get("action") != "fix"),
    )
