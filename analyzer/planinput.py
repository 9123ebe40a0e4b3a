"""The plan's input: the recommendation table's rows as the packer's items, and the GPUs the jobs
used when no inventory is given."""

from __future__ import annotations

import math
from typing import SupportsInt, cast

import pandas as pd

from gpulens.analyzer import demand, frames, modes
from gpulens.analyzer.bins import Item
from gpulens.analyzer.hosts import Orchestrator, orchestrator_of, uuids_of
from gpulens.analyzer.hysteresis import CENSORED
from gpulens.analyzer.kinds import WHOLE, Kind
from gpulens.analyzer.profile import FleetGpu
from gpulens.analyzer.recommend import capability, memory_need
from gpulens.analyzer.thresholds import Thresholds
from gpulens.catalog import GpuModel, model_for_nvml_name


def fleet_from_recs(recs: pd.DataFrame) -> list[FleetGpu]:
    """The GPUs the jobs used, when no inventory is given (idle GPUs are then unknown)."""
    seen: dict[str, FleetGpu] = {}
    for row in frames.rows(recs):
        for uuid in uuids_of(row.uuids):
            seen.setdefault(uuid, FleetGpu(uuid, str(row.gpu_model), str(getattr(row, "instance", "") or "")))
    return list(seen.values())


def node_orchestrators(recs: pd.DataFrame, fleet: list[FleetGpu]) -> dict[str, Orchestrator]:
    """Each node's orchestrator, as the emitted files' inventory decides it
    (`hosts.inventory_from_rows`): the `job_source` most jobs on its GPUs have; a node no job of
    known source ran on is absent (unknown)."""
    node_of = {g.uuid: g.node for g in fleet}
    sources: dict[str, list[str]] = {}
    for row in frames.rows(recs):
        for uuid in uuids_of(row.uuids):
            if uuid in node_of:
                sources.setdefault(node_of[uuid], []).append(str(getattr(row, "job_source", "") or ""))
    found = {node: orchestrator_of(s) for node, s in sources.items()}
    return {node: o for node, o in found.items() if o is not Orchestrator.UNKNOWN}


def _int_or_none(value: object) -> int | None:
    """Integer settings from a DataFrame column that may hold NaN/None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(cast(SupportsInt, value))  # a number (numpy's included) once NaN/None are out


def num(value: object) -> float:
    """A float from a column that may hold None/NaN (as 0)."""
    if value is None:
        return 0.0
    number = float(value)  # type: ignore[arg-type]
    return 0.0 if math.isnan(number) else number


def lifetime(row: object, margin: float) -> tuple[float, float]:
    """When a job holds its GPU: from its first sample to one step after its last (`duration_s`
    counts that step), then `plan.lifetime_margin_s` more (teardown, and the next job's scheduling
    before its first sample): a job uses a GPU after another only when it starts at least that
    long after the other's last step."""
    start, end = float(row.start), float(row.end)  # type: ignore[attr-defined]
    end = max(end, start + num(getattr(row, "duration_s", 0.0)))
    return start, end + margin


def known_lifetime(row: object) -> bool:
    return math.isfinite(num(getattr(row, "start", math.nan))) and math.isfinite(
        num(getattr(row, "end", math.nan))
    )


def _unsized(row: object, margin: float) -> Item:
    """A job with too little data to size: a whole GPU of its model per GPU it has, over its lifetime
    only (before and after, the GPU is free for others; a job seen for minutes no longer holds a
    GPU for the whole window)."""
    start, end = lifetime(row, margin)
    gpus = max(1, int(num(getattr(row, "gpus", 1)) or 1))
    return Item(
        job_id=str(row.job_id),  # type: ignore[attr-defined]
        kind=Kind.EXCLUSIVE.value,
        unsized=True,
        model=str(row.gpu_model),  # type: ignore[attr-defined]
        start=start,
        end=end,
        gpus=gpus,
        memory=num(getattr(row, "device_memory_bytes", 0.0)),
        sm=1.0,
        load=1.0,
        used_hours=num(getattr(row, "gpu_hours_used", 0.0)),
        source=str(getattr(row, "job_source", "") or ""),
        origin_model=str(row.gpu_model),  # type: ignore[attr-defined]
        origin_mode=str(getattr(row, "sharing", "") or ""),
        origin_uuids=tuple(uuids_of(getattr(row, "uuids", ""))),
        device_memory=num(getattr(row, "device_memory_bytes", 0.0)) or math.inf,
    )


def _downsized(origin: GpuModel | None, target: str | None) -> float:
    """How much busier a job moved to the smaller model `target` keeps a GPU for the same work:
    the ratio of SMs x clock (`recommend.capability`); 1 where it does not move or a model is
    not in the catalog."""
    moved = model_for_nvml_name(target) if target else None
    if origin is None or moved is None:
        return 1.0
    return capability(origin) / capability(moved)


def items_of(recs: pd.DataFrame, th: Thresholds, time_sliced: frozenset[str] = frozenset()) -> list[Item]:
    """The packer's items; the jobs in `time_sliced` (on Kubernetes nodes whose device plugin
    cannot run MPS, `planasrun.plan_as_run`) are packed time-sliced wherever MPS was one of their
    modes, so the time-slicing limits judge them, not MPS's."""
    items = []
    series = demand.of(recs) or demand.Demand(1.0)
    margin = float(th.plan.lifetime_margin_s)
    for row in frames.rows(recs):
        kind = row.recommendation
        if kind == Kind.INSUFFICIENT_DATA:
            items.append(_unsized(row, margin))  # `hold` kept those without a known lifetime
            continue
        if kind == Kind.RECLAIM:
            continue
        no_mps = str(row.job_id) in time_sliced
        if no_mps and kind == Kind.MPS:
            kind = Kind.TIME_SLICING
        start, end = lifetime(row, margin)
        model = row.target_gpu_model if kind == Kind.DOWNSIZE else row.gpu_model
        whole = kind in WHOLE
        gpus = int(row.gpus) if whole else 1
        known = model_for_nvml_name(str(row.gpu_model))
        used = num(row.gpu_hours_used) * _downsized(known, str(model) if kind == Kind.DOWNSIZE else None)
        if row.duration_s:
            used = min(used, row.duration_s / 3600.0 * max(gpus, 1))
        load = used / (row.duration_s / 3600.0) / max(gpus, 1) if row.duration_s else 0.0
        scale = num(row.device_sms) / known.sm_count if known and num(row.device_sms) else 1.0
        # a bursty client's figures measured under a cap that clips its bursts, on the scale of the
        # demand its cap was sized from (`sm_fraction` is already, hysteresis.censored_scale)
        censored = num(getattr(row, CENSORED, 1.0)) or 1.0
        memory = num(row.memory_need_bytes)
        held = num(getattr(row, "memory_peak_bytes", math.nan))
        if kind == Kind.TIME_SLICING and not math.isnan(held):
            # nothing enforces memory between time-sliced jobs: a server sized from its KV use
            # (whose advice lowers --gpu-memory-utilization) is packed at what it holds now, so the
            # GPU stays safe until, and unless, someone applies that advice
            memory = max(memory, memory_need(held, th))
        items.append(
            Item(
                job_id=row.job_id,
                kind=Kind.EXCLUSIVE.value if kind == Kind.DOWNSIZE else str(kind),
                model=str(model),
                start=start,
                end=end,
                gpus=gpus,
                memory=memory,
                sm=min(num(row.sm_fraction), 1.0),
                load=0.0 if math.isnan(load) else float(load),
                used_hours=used,
                p95=min(1.0, num(row.sm_active_p95) * scale * censored),
                dram=min(1.0, num(getattr(row, "dram_active_p95", 0.0)) * scale),
                source=str(getattr(row, "job_source", "") or ""),
                origin_model=str(row.gpu_model),
                origin_mode=str(row.sharing),
                origin_uuids=tuple(uuids_of(row.uuids)),
                mig_profile=row.mig_profile if kind == Kind.MIG else None,
                mig_alternative=row.mig_alternative if isinstance(row.mig_alternative, str) else None,
                thread_pct=None if no_mps else _int_or_none(row.mps_active_thread_percentage),
                memory_limit=None if no_mps else _int_or_none(row.mps_pinned_memory_limit_bytes),
                device_memory=num(row.device_memory_bytes) or math.inf,
                sm_series=_scaled(series.sm.get(str(row.job_id)), scale * censored),
                dram_series=_scaled(series.dram.get(str(row.job_id)), scale),
                busy_series=series.busy.get(str(row.job_id)),
                serving=isinstance(getattr(row, "serving_server", None), str) and bool(row.serving_server),
                modes=_time_sliced(modes.modes_of(row, th)) if no_mps else modes.modes_of(row, th),
            )
        )
    return items


def _time_sliced(options: tuple[modes.Mode, ...]) -> tuple[modes.Mode, ...]:
    """A job's modes with MPS replaced by time-slicing (its recommended mode still first)."""
    out: list[modes.Mode] = []
    for mode in options:
        mode = modes.Mode(Kind.TIME_SLICING) if mode.kind == Kind.MPS else mode
        if mode not in out:
            out.append(mode)
    return tuple(out) if len(out) > 1 else ()


def time_sliced_fraction(row: object) -> float | None:
    """The share of its GPU a time-sliced job takes, as recommend counts it: its memory need over
    the whole GPU's memory (a job on a MIG slice now is time-sliced on the whole GPU)."""
    need = num(getattr(row, "memory_need_bytes", math.nan))
    known = model_for_nvml_name(str(getattr(row, "gpu_model", "")))
    total = known.memory_bytes if known else num(getattr(row, "device_memory_bytes", math.nan))
    return need / total if need > 0 and total > 0 else None


def _scaled(series: demand.Series | None, scale: float) -> demand.Series | None:
    return None if series is None else series.scaled(scale)
