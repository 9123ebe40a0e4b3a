"""Current -> proposed per job, what the SRE is asked to do, and the actions ranked by GPU-hours.

After the plan, every job carries what it runs on now (`current_*`: mode, MIG profile, model,
node, GPU) and what it should run on (`proposed_*`, the same plus MPS limits), an `action`
(`kinds.Action`: keep, change, reclaim, fix, review), the `gpu_hours_recovered` if it is done
and, for jobs that stay but waste memory, a `finding` (memory leak, false saturation, memory hog) with what
to do. A job whose proposal equals what it has is `keep`, never an action; so is a change that
recovers no GPU-hours and fixes no named risk (`risk_fixed`: throttling of a job that needs more
than it has now, contention on an MPS GPU whose jobs' caps sum past 100 %). A move that empties a
GPU the plan frees is always a `change`: the freed GPU has no action behind it otherwise.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from typing import Any

import pandas as pd

from gpulens.analyzer import frames, serving
from gpulens.analyzer.hosts import model_key
from gpulens.analyzer.kinds import ACTIONS, WHOLE, Action, Kind
from gpulens.analyzer.plan import Plan
from gpulens.analyzer.recommend import LEAK_HINT, capability
from gpulens.analyzer.thresholds import Thresholds
from gpulens.analyzer.topoadvice import advise, occupancy
from gpulens.analyzer.topology import Topology
from gpulens.catalog import GIB, model_for_nvml_name

# plan bookkeeping keys that are not recommendation columns
_PLAN_KEYS = ("note", "kept")
MPS_COLUMNS = ["mps_active_thread_percentage", "mps_pinned_memory_limit_bytes"]


def _text(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def apply_moves(recs: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """Jobs the plan changed (lone sharers, no room on a model, held GPUs) say so and how.

    Every job's new values are worked out first and each column is written once: a `.loc` write
    per job and column rebuilds a whole Arrow-backed column, which made this quadratic in the jobs
    (minutes for 10,000 jobs with a few thousand moved)."""
    recs = recs.assign(kept_by_plan=False)
    rows: dict[str, list[Hashable]] = {}
    for label, job in zip(recs.index, recs["job_id"].tolist(), strict=True):
        rows.setdefault(job, []).append(label)
    reasons = dict(zip(recs.index, recs["reason"].tolist(), strict=True))
    updates: dict[
        str, dict[Hashable, object]
    ] = {}  # column -> {row label: value}, in the order the columns appear

    def put(column: str, labels: list[Hashable], value: object) -> None:
        target = updates.setdefault(column, {})
        for label in labels:
            target[label] = value

    for job, change in plan.moved.items():
        at = rows.get(job)
        if not at:
            continue
        kind = change["recommendation"]
        detail = change.get("mig_profile") or kind
        note = change.get("note") or (
            "it stays as it runs now"
            if change.get("kept")
            else f"{detail} beside other jobs (a GPU shared by it alone would save nothing)"
        )
        reason = updates.setdefault("reason", {})
        for label in at:
            reason[label] = f"{reasons[label]}; plan: {note}"
        if kind != Kind.MPS:
            for column in MPS_COLUMNS:
                put(column, at, None)
        if kind != Kind.MIG:
            put("mig_profile", at, None)
        for key, value in change.items():
            if key not in _PLAN_KEYS:
                put(key, at, value)
        put("kept_by_plan", at, bool(change.get("kept")))
    for column, values in updates.items():
        if column == "reason":  # one text per job: written as a list (all strings)
            recs.loc[list(values), column] = list(values.values())
            continue
        # a scalar write per distinct value, as before (a list holding None cannot go into a float
        # column; a scalar None becomes NaN there); keyed by type too, since True == 1 == 1.0
        groups: dict[tuple[str, object], list[Hashable]] = {}
        for label, value in values.items():
            try:
                groups.setdefault((type(value).__name__, value), []).append(label)
            except TypeError:  # unhashable: written on its own
                recs.loc[[label], column] = value
        for (_, value), labels in groups.items():
            recs.loc[labels, column] = value
    return recs


def _placement(plan: Plan) -> dict[str, tuple[str, str]]:
    """job_id -> (node, GPU uuid) of the first GPU the plan puts it on."""
    out: dict[str, tuple[str, str]] = {}
    for entry in plan.layout:
        for job in entry["jobs"]:
            out.setdefault(job, (str(entry.get("node", "")), str(entry.get("uuid", ""))))
    return out


def fewer_gpus(row: Any, th: Thresholds) -> int:
    """GPUs a multi-GPU job's demand and memory fit (its own count when it needs them all).

    Its activity is the mean over its GPUs and its memory the peak per GPU (profile.py), so its
    whole demand is that many GPUs' worth of the sizing percentile plus headroom, and its memory
    at most that many per-GPU needs: both summed and packed onto whole GPUs."""
    gpus = int(row.gpus) if _text(row.gpus) else 1
    if gpus <= 1:
        return gpus
    demand = float(row.sm_fraction) if _text(getattr(row, "sm_fraction", None)) else math.nan
    need, device = float(row.memory_need_bytes), float(row.device_memory_bytes)
    if math.isnan(demand) or math.isnan(need) or not device > 0:
        return gpus
    compute = math.ceil(gpus * demand * (1 + th.headroom.compute_ratio) - 1e-9)
    memory = math.ceil(gpus * need / device - 1e-9)
    return min(gpus, max(1, compute, memory))


def finding(row: Any, th: Thresholds) -> str:
    """Memory a job holds without using it (a leak, false saturation, a memory hog) or GPUs a
    multi-GPU job does not need ("" when none)."""
    gpus = int(row.gpus) if _text(getattr(row, "gpus", None)) else 1
    if gpus > 1 and gpus - (fit := fewer_gpus(row, th)) >= th.multi_gpu.min_gpus_saved:
        return (
            f"multi-GPU job on {gpus} GPUs needs {fit}: {float(row.sm_fraction):.0%} SM activity "
            f"({row.sizing_percentile}) and {float(row.memory_need_bytes) / GIB:.1f} GiB per GPU fit "
            f"{fit} GPU(s) with headroom; run it with {fit} (a data-parallel job needs its world size "
            "and batch size changed, a model-parallel one its sharding)"
        )
    leak = _text(getattr(row, "memory_leak", ""))
    if leak:
        return f"memory leak: {leak}; {LEAK_HINT}"
    if bool(getattr(row, "false_saturation", False)):
        return "false saturation: " + _text(row.false_saturation_hint)
    peak, device = float(row.memory_peak_bytes), float(row.device_memory_bytes)
    mean = float(row.sm_active_mean)
    fields = row._asdict()
    if serving.needs_its_pool(fields, th):  # an inference server's full KV cache is memory in use
        return ""
    if _text(getattr(row, "sharing", "")) == Kind.MIG:
        return ""  # its slice is its device: sized to hold its peak, it already shares the GPU
    if device > 0 and peak / device >= 0.5 and mean < th.false_saturation.max_mean_activity:
        held = (
            f"memory hog: holds {peak / GIB:.1f} GiB ({peak / device:.0%} of the GPU) at {mean:.0%} mean "
            "activity"
        )
        server = serving.preallocation_hint(fields)
        return f"{held}; {server}" if server else f"{held}; cap the framework's memory pool so it can share"
    return ""


def describe(mode: str, mig: str, threads: object, limit: object, model: str, node: str, gpu: str) -> str:
    """One side of "current -> proposed", e.g. "mps 25 % threads / 11.0 GiB, A100-40GB on n1/GPU-1"
    (without a model: "mps 25 % threads on GPU-1")."""
    what = mode
    if mode == Kind.MIG and mig:
        what = f"mig {mig}"
    if mode == Kind.MPS and _text(threads):
        what = f"mps {int(float(str(threads)))} % threads"
        if _text(limit):
            what += f" / {float(str(limit)) / GIB:.1f} GiB"
    place = "/".join(x for x in (node, gpu) if x)
    if not model:  # the proposed side of a job that stays on its model: "mps 25 % threads on GPU-2"
        return f"{what} on {place}" if place else what
    return f"{what}, {model} on {place}" if place else f"{what}, {model}"


def _proposed_text(
    row: Any,
    kind: str,
    action: Action,
    found: str,
    model: str,
    node: str,
    gpu: str,
    local: tuple[int, ...] | None = None,
) -> str:
    """The proposed side of "current -> proposed", naming only what differs from the current side
    (the model and node when they change, the GPU when the job moves)."""
    if kind == Kind.RECLAIM:
        return "released (give the GPU back)"
    if kind == Kind.INSUFFICIENT_DATA:
        return "stays as it is (too little data to size it)"
    if action == Action.FIX:
        issue = found.split(":")[0]
        if issue == "topology":  # the fix is a move within its node, not a smaller share
            where = f" (GPUs {', '.join(map(str, local))})" if local else ""
            return f"stays as it is until it is placed topology-local{where}"
        if _text(getattr(row, "sharing", "")) in ("mps", "time_slicing", "time-slicing"):
            return f"stays as it is (it shares its GPU already; fixing its {issue} would free more)"
        return f"stays as it is until its {issue} is fixed (then it can share)"
    moves = bool(gpu) and gpu not in _text(row.uuids).split(",")
    other_node = node if node and node != _text(row.instance) else ""
    other_model = model if model != str(row.gpu_model) else ""
    what = describe(
        kind,
        _text(row.mig_profile),
        row.mps_active_thread_percentage,
        row.mps_pinned_memory_limit_bytes,
        other_model,
        other_node if moves else "",
        gpu if moves else "",
    )
    return what if moves or other_model else f"{what}, same GPU"


def annotate(
    recs: pd.DataFrame, plan: Plan, th: Thresholds, topology: Topology | None = None
) -> pd.DataFrame:
    """The plan's moves applied, then current/proposed, action, finding and GPU-hours recovered;
    with a `topology`, a multi-GPU job the plan leaves on a split placement gets the topology
    finding (`topoadvice`), ranked by the GPU-hours it puts at stake."""
    recs = apply_moves(recs, plan)
    running = dict(zip(recs["job_id"].astype(str), recs["sharing"].astype(str), strict=True))
    occupied = occupancy(plan, running) if topology is not None and topology.nodes else None
    placed = _placement(plan)
    crowded = crowded_mps_gpus(recs)
    # GPUs the plan empties by moving their jobs: each move off one is part of freeing it
    emptied = {
        str(g.get("uuid")) for g in plan.freed if g.get("uuid") and g.get("why") != "no job in the window"
    }
    # models whose packing frees GPUs: a move there is part of the packing that frees them
    consolidated = Counter(
        model_key(str(g.get("model"))) for g in plan.freed if g.get("why") == "freed by consolidation"
    )
    rows = []
    for row in frames.rows(recs):
        kind = str(row.recommendation)
        now_mode = _text(row.sharing) or Kind.EXCLUSIVE.value
        now_mig = _text(row.mig_profile_now)
        now_gpu = _text(row.uuids)
        node, gpu = placed.get(str(row.job_id), ("", ""))
        proposed_model = _text(row.target_gpu_model) or str(row.gpu_model)
        found = finding(row, th) if kind not in (Kind.RECLAIM, Kind.INSUFFICIENT_DATA) else ""
        same = (
            kind == now_mode
            and proposed_model == str(row.gpu_model)
            and (kind != Kind.MIG or _text(row.mig_profile) == now_mig)
            and (not gpu or gpu in now_gpu.split(","))
        )
        kept = bool(row.kept_by_plan)
        risk = risk_fixed(now_mode, now_mig, kind, _text(row.mig_profile))
        moves = bool(gpu) and gpu not in now_gpu.split(",")
        if not risk and moves and now_mode == Kind.MPS and crowded & set(now_gpu.split(",")):
            risk = "contention: the MPS caps the jobs on its GPU need now sum past 100 %"
        if kind == Kind.INSUFFICIENT_DATA:
            action = Action.REVIEW
        elif kind == Kind.RECLAIM:
            action = Action.RECLAIM
        elif same or kept:
            action = Action.FIX if found else Action.KEEP
        else:
            action = Action.CHANGE
        recovered = _recovered(row, action, kind)
        frees = moves and bool(now_gpu) and set(now_gpu.split(",")) <= emptied
        if action == Action.CHANGE and recovered <= 0 and frees:
            risk = "its move empties its GPU, which the plan frees"
        freed_here = consolidated[model_key(str(row.gpu_model))]
        if action == Action.CHANGE and recovered <= 0 and not risk and moves and freed_here:
            # the packing moves it to free GPUs elsewhere: "keep" would leave the move unapplied
            risk = f"its move is part of the packing that frees {freed_here} {row.gpu_model} GPU(s)"
        if action == Action.CHANGE and recovered <= 0 and not risk:
            # recovers nothing and fixes nothing: not worth anyone's time (e.g. a slice moved
            # between GPUs, a whole GPU traded for another)
            action = Action.FIX if found else Action.KEEP
            recovered = _recovered(row, action, kind)
        if action == Action.FIX and found.startswith("multi-GPU"):  # the GPUs it does not need
            gpus = int(row.gpus)
            recovered = _allocated(row) * (gpus - fewer_gpus(row, th)) / gpus
        advice = None
        if occupied is not None and topology is not None and action in (Action.KEEP, Action.FIX):
            advice = advise(row, topology, occupied, th)
        if advice is not None:  # its placement, not its size: told beside any other finding
            recovered = (
                max(recovered, advice.loss_gpu_hours) if action == Action.FIX else advice.loss_gpu_hours
            )
            found = f"{found}; {advice.text}" if found else advice.text
            action = Action.FIX
        rows.append(
            {
                "current_mode": now_mode,
                "current_mig_profile": now_mig or None,
                "current_model": str(row.gpu_model),
                "current_node": _text(row.instance),
                "current_gpu": now_gpu,
                "proposed_mode": "released" if kind == Kind.RECLAIM else kind,
                "proposed_mig_profile": _text(row.mig_profile) or None,
                "proposed_mps_active_thread_percentage": row.mps_active_thread_percentage,
                "proposed_mps_pinned_memory_limit_bytes": row.mps_pinned_memory_limit_bytes,
                "proposed_model": proposed_model,
                "proposed_node": node,
                "proposed_gpu": gpu,
                "action": action.value,
                "finding": found,
                "risk_fixed": risk if action == Action.CHANGE else "",
                "change": describe(
                    now_mode, now_mig, None, None, str(row.gpu_model), _text(row.instance), now_gpu
                )
                + " -> "
                + _proposed_text(
                    row,
                    kind,
                    action,
                    found,
                    proposed_model,
                    node,
                    gpu,
                    tuple(advice.alternative) if advice and advice.alternative else None,
                ),
                "gpu_hours_recovered": round(recovered, 3),
                "topology_link": advice.link.value if advice else None,
                "topology_local_gpus": list(advice.alternative) if advice and advice.alternative else None,
            }
        )
    extra = pd.DataFrame(rows, index=recs.index)
    return pd.concat(
        [recs.drop(columns=[c for c in extra if c in recs] + ["kept_by_plan"], errors="ignore"), extra],
        axis=1,
    )


def _compute_slices(mig: str) -> int:
    """Compute slices of a MIG profile name ("3g.40gb" -> 3; 0 when it does not say)."""
    head = mig.split(".", 1)[0].split("+")[-1].removesuffix("g")
    return int(head) if head.isdigit() else 0


def crowded_mps_gpus(recs: pd.DataFrame) -> set[str]:
    """GPUs shared under MPS now whose jobs' proposed thread caps sum past 100 % (a job that
    leaves for a whole GPU counts 100): they cannot all stay, and moving one off fixes that."""
    need: dict[str, float] = {}
    for row in frames.rows(recs[recs["sharing"] == Kind.MPS]):
        if row.recommendation == Kind.MPS:
            pct = float(row.mps_active_thread_percentage) if _text(row.mps_active_thread_percentage) else 0.0
        else:
            pct = 100.0 if row.recommendation in WHOLE else 0.0
        for uuid in _text(row.uuids).split(","):
            need[uuid] = need.get(uuid, 0.0) + pct
    return {uuid for uuid, total in need.items() if uuid and total > 100}


def risk_fixed(now_mode: str, now_mig: str, kind: str, new_mig: str) -> str:
    """The risk a change removes even when it recovers no GPU-hours ("" when none): a job that
    shares a GPU now but needs a whole one, or a MIG slice smaller than its demand."""
    if now_mode in (Kind.MPS, Kind.TIME_SLICING, Kind.MIG) and kind in WHOLE:
        return f"throttling: it shares a GPU ({now_mode}) but its demand needs a whole one"
    if now_mode == Kind.MIG and kind == Kind.MIG and _compute_slices(new_mig) > _compute_slices(now_mig):
        return f"throttling: {now_mig} has fewer compute slices than its demand needs ({new_mig})"
    return ""


def _allocated(row: Any) -> float:
    return float(row.gpu_hours_allocated) if not math.isnan(row.gpu_hours_allocated) else 0.0


def _recovered(row: Any, action: Action, kind: str) -> float:
    """GPU-hours the action gives back: all of an idle allocation, the unused share of a move, the
    idle hours of a job that wastes memory (what fixing it makes shareable)."""
    allocated = float(row.gpu_hours_allocated) if not math.isnan(row.gpu_hours_allocated) else 0.0
    idle = float(row.gpu_hours_idle) if not math.isnan(row.gpu_hours_idle) else 0.0
    if action == Action.RECLAIM:
        return allocated
    if action == Action.FIX:
        return idle
    if action != Action.CHANGE:
        return 0.0
    if kind == Kind.DOWNSIZE:
        now, target = model_for_nvml_name(str(row.gpu_model)), model_for_nvml_name(str(row.target_gpu_model))
        if now is None or target is None:
            return 0.0
        return allocated * max(0.0, 1 - capability(target) / capability(now))
    fraction = (
        row.gpu_fraction if row.gpu_fraction == row.gpu_fraction and row.gpu_fraction is not None else 1.0
    )
    share = float(row.gpu_share) if row.gpu_share == row.gpu_share else 1.0
    return max(0.0, allocated * (1 - min(1.0, float(fraction)) / max(share, 1e-9)))


def ranked_actions(recs: pd.DataFrame, n: int | None = None) -> list[dict[str, Any]]:
    """Actions (change, reclaim, fix) by GPU-hours recovered, largest first, with what to do."""
    act = recs[recs["action"].isin([a.value for a in ACTIONS])]
    act = act.sort_values(["gpu_hours_recovered", "job_id"], ascending=[False, True])
    if n is not None:
        act = act.head(n)
    out = []
    for row in frames.rows(act):
        todo = row.finding if row.action == Action.FIX else (row.risk_fixed or row.change)
        if row.action == Action.CHANGE and row.finding:
            todo += f"; {row.finding}"  # a job that moves still has its leak or hog to fix
        out.append(
            {
                "job_id": row.job_id,
                "team": row.team,
                "action": row.action,
                "recommendation": row.recommendation,
                "detail": next(
                    (v for v in (row.mig_profile, row.target_gpu_model) if isinstance(v, str)), ""
                ),
                "change": row.change,
                "what_to_do": todo,
                "gpu_hours_recovered": round(float(row.gpu_hours_recovered), 2),
                "gpu_hours_idle": round(float(row.gpu_hours_idle), 2),
                "risk_fixed": row.risk_fixed,
                "reason": row.reason,
            }
        )
    return out
