"""Requests-only histories (the v2023 trace): the value of fractional requests, not usage savings.

Without measured use, the only question is how many GPUs the requested shares need. Every pod
that held GPUs counts, whatever its final phase (a `Failed` pod held them until it failed); pods
never scheduled (`Pending`) are left out. Pods hold their request from scheduling to deletion
(the importer's timestamp and lifetime), so the figure is taken at the instant of peak
concurrency (the most whole GPUs the live pods would need if each got whole GPUs): GPUs needed
then without sharing versus with the
fractional requests packed best-fit decreasing onto shared GPUs (whole-GPU pods keep whole GPUs).
That is the value of fractional requests at peak concurrency, not a usage-based saving, and the
plan's notes say so. A history that records which shared GPU a fractional pod runs on (`uuid` on
its request samples: a fleet already packed) counts those pods on the GPUs they share now, so a
fleet running its plan is told it frees nothing. Recommendations restate the requests with low
confidence: `mps` for fractional requests (space sharing with a thread share), `exclusive` for
whole GPUs.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np
import pandas as pd

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import History
from gpulens.analyzer.plan import Plan

CONFIDENCE = 0.2
# pod phases that held no GPU: never scheduled (a Failed pod was scheduled and held its GPUs)
EXCLUDED_PHASES = frozenset({"Pending"})


def request_table(history: History) -> pd.DataFrame:
    """One row per pod: job_id, group (GPU spec or "any"), requested GPUs, start, end."""
    s = history.samples
    req = s[s["metric"] == "gpulens_trace_job_requested_gpus"]
    life = s[s["metric"] == "gpulens_trace_job_lifetime_seconds"]
    if req.empty:
        raise AnalyzerError(
            f"{history.path}: requests history without gpulens_trace_job_requested_gpus samples"
        )
    life_by_job = dict(zip(life["job_id"], life["value"], strict=False))
    table = pd.DataFrame(
        {
            "job_id": req["job_id"].to_numpy(),
            "gpu_model": req["gpu_spec"].map(lambda v: v.split("|")[0] if v else "any").to_numpy(),
            "requested_gpus": req["value"].to_numpy(),
            "start": req["timestamp"].to_numpy(),
            "qos": req["qos"].to_numpy(),
            "phase": req["phase"].to_numpy(),
            # the shared GPU a pod runs on where the history records one (a fleet already packed:
            # `gpulens sim apply-plan --history`), else "" (the trace itself places no pod)
            "placed_gpu": req["uuid"].astype(str).to_numpy() if "uuid" in req else "",
        }
    )
    table["duration_s"] = table["job_id"].map(life_by_job).fillna(0.0)
    table["end"] = table["start"] + table["duration_s"]
    return table[~table["phase"].isin(EXCLUDED_PHASES)].reset_index(drop=True)


def peak_concurrency(table: pd.DataFrame) -> tuple[float, int]:
    """(instant, whole GPUs) where the live pods' requests, each rounded up to whole GPUs, peak.

    A pod is live on [start, end); at equal times a deletion comes before a creation.
    """
    if table.empty:
        return 0.0, 0
    whole = np.ceil(table["requested_gpus"].to_numpy(dtype=float))
    times = np.concatenate([table["start"].to_numpy(dtype=float), table["end"].to_numpy(dtype=float)])
    deltas = np.concatenate([whole, -whole])
    order = np.lexsort((deltas, times))  # by time, deletions (negative) first
    running = np.cumsum(deltas[order])
    best = int(np.argmax(running))
    return float(times[order][best]), round(float(running[best]))


def cluster_gpus(history: History) -> int:
    """GPUs of the trace's node list (0 when the history has none)."""
    s = history.samples
    nodes = s[s["metric"] == "gpulens_trace_node_gpus"]
    return int(nodes["value"].sum()) if len(nodes) else 0


def recommend_requests(table: pd.DataFrame) -> pd.DataFrame:
    """Low-confidence recommendations that only restate the requests."""
    shared = table["requested_gpus"] < 1
    out = table.copy()
    out["gpus"] = np.ceil(out["requested_gpus"]).astype(int)
    out["recommendation"] = np.where(shared, "mps", "exclusive")
    out["mps_active_thread_percentage"] = [
        math.ceil(r * 100) if s else None for r, s in zip(out["requested_gpus"], shared, strict=True)
    ]
    out["reason"] = [
        f"requests only: {r:.2f} GPU requested ({q}); no usage measured"
        for r, q in zip(out["requested_gpus"], out["qos"], strict=True)
    ]
    for column in (
        "samples",
        "sm_active_p95",
        "memory_peak_bytes",
        "mig_profile",
        "mps_pinned_memory_limit_bytes",
    ):
        out[column] = None  # not measured: requests only
    out["confidence"] = CONFIDENCE
    out["confidence_level"] = "low"
    return out


def plan_requests(recs: pd.DataFrame, at: float | None = None, cluster: int = 0) -> Plan:
    """Whole GPUs needed without sharing vs with fractional requests packed, at `at` (by default
    the instant of peak concurrency); `cluster` = GPUs of the trace's node list, for the notes."""
    if at is None:
        at, _ = peak_concurrency(recs)
    live = recs[(recs["start"] <= at) & (recs["end"] > at)]
    by_model: dict[str, dict[str, float]] = {}
    layout: list[dict[str, Any]] = []
    placed = 0  # fractional pods the history places on shared GPUs
    for model, group in live.groupby("gpu_model", sort=True):
        whole = int(group.loc[group["requested_gpus"] >= 1, "requested_gpus"].apply(math.ceil).sum())
        fractional = group[group["requested_gpus"] < 1]
        on = fractional["placed_gpu"] if "placed_gpu" in fractional else pd.Series("", index=fractional.index)
        # now: whole pods on whole GPUs, a fractional pod placed on a shared GPU where the history
        # says so (the GPUs they share), any other on a GPU of its own
        before = (
            whole + int(np.ceil(fractional.loc[on == "", "requested_gpus"]).sum()) + on[on != ""].nunique()
        )
        placed += int((on != "").sum())
        bins: list[list[tuple[str, float]]] = []
        loads: list[float] = []
        free: list[tuple[float, int]] = []  # (remaining share, bin index), sorted: best fit by bisect
        pairs = sorted(
            zip(group["job_id"], group["requested_gpus"], strict=True), key=lambda x: (-x[1], x[0])
        )
        for job, req in pairs:
            if req >= 1:
                continue
            pos = bisect.bisect_left(free, (req - 1e-9, -1))
            if pos < len(free):
                remaining, index = free.pop(pos)
                loads[index] += req
                bins[index].append((job, req))
                bisect.insort(free, (remaining - req, index))
            else:
                loads.append(req)
                bins.append([(job, req)])
                bisect.insort(free, (1.0 - req, len(bins) - 1))
        after = whole + len(bins)
        by_model[str(model)] = {"gpus_before": before, "gpus_after": after, "gpus_freed": before - after}
        for i, members in enumerate(bins):
            layout.append(
                {
                    "gpu": f"{model}#shared{i + 1}",
                    "model": str(model),
                    "sharing": "mps",
                    "jobs": [j for j, _ in members],
                    "requested_share": round(loads[i], 3),
                }
            )
    before = int(sum(v["gpus_before"] for v in by_model.values()))
    after = int(sum(v["gpus_after"] for v in by_model.values()))
    requested = float(live["requested_gpus"].sum())
    notes = [
        f"value of fractional requests at peak concurrency: {len(live)} pods alive at t={at:.0f} s "
        f"(Failed pods counted while they held GPUs, Pending ones never held any) need {before} "
        + (
            f"GPUs as they run now ({placed} fractional pods on the shared GPUs the history places them on)"
            if placed
            else "whole GPUs"
        )
        + f", {after} with fractional requests packed; these are requests, not measured use, so this "
        "is not a usage-based saving"
    ]
    if cluster:
        notes.append(
            f"the cluster has {cluster} GPUs; {max(0, cluster - before)} were not requested at that instant"
        )
    return Plan(
        gpus_before=before,
        gpus_after=after,
        gpus_freed=before - after,
        by_model=by_model,
        utilization_before=round(requested / before, 4) if before else 0.0,
        utilization_after=round(requested / after, 4) if after else 0.0,
        window_hours=0.0,
        layout=layout,
        node_groups={},
        notes=notes,
    )
