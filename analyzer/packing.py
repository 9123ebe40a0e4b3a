"""Packing (the plan's step 2, `plan.py`): first-fit decreasing per GPU model and sharing mode,
time-aware, with the fit tests of `bins.fits`; then lone sharers settled (`settle_lone_sharers`);
the packing done from scratch and in place, and jointly over each job's modes where a lower bound
says that can save a GPU (`pack_joint`); per model the fewest GPUs, then the fewest moves, win
(`fewest_moves`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from gpulens.analyzer import forked, modes
from gpulens.analyzer.bins import (
    ORCHESTRATORS,
    GpuBin,
    Item,
    first_fit,
    fits,
    is_resident,
    size_of,
    sliced_bounds,
)
from gpulens.analyzer.freetime import Capacity, FreeTime, set_bits
from gpulens.analyzer.instantload import COLUMNS, InstantLoad
from gpulens.analyzer.kinds import SHARED, WHOLE, Kind
from gpulens.analyzer.modes import Mode
from gpulens.analyzer.recommend import mps_settings
from gpulens.analyzer.thresholds import Thresholds
from gpulens.catalog import CatalogError, GpuModel, model_for_nvml_name
from gpulens.migplacement import place_mig_layout


def _own(item: Item, bounds: tuple[tuple[str, float], ...]) -> list[float]:
    """`item`'s own part of each bounded sum (as `GpuBin.within` counts it)."""
    return [1 if attr == "count" else (getattr(item, attr) or 0) for attr, _ in bounds]


def _over(load: InstantLoad | None, item: Item, model: GpuModel | None, th: Thresholds) -> list[bool]:
    """The time-sliced GPUs that certainly refuse `item` at its start (none without an index)."""
    if load is None:
        return []
    # only the bounds every GPU holds it to: where it has series, a GPU whose jobs all have
    # theirs judges by the co-located sums, which an instant's percentile sum cannot rule out
    bounds = sliced_bounds(
        item, model, th, item.sm_series is not None, item.dram_series is not None or not item.dram
    )
    return load.over(item.start, _own(item, bounds), bounds)


def _place(load: InstantLoad | None, slot: int, item: Item) -> None:
    if load is not None:
        load.add(slot, id(item), item.start, item.end, [getattr(item, c) or 0 for c in COLUMNS])


def _mark(masks: dict[str, int], gpu: GpuBin, bit: int) -> None:
    """Record `gpu`'s orchestrator at its slot's `bit` of a pool's per-orchestrator masks (after a
    job joins or leaves it): the exclusive pools find free GPUs through `FreeTime`, not `fits`."""
    for orchestrator in ORCHESTRATORS:
        mine = bit if gpu.orchestrator == orchestrator else 0
        masks[orchestrator] = masks.get(orchestrator, 0) & ~bit | mine


def _foreign(masks: dict[str, int], item: Item) -> int:
    """The slots of a pool's GPUs that hold jobs of another orchestrator than `item`'s (`bins.fits`
    refuses those; none for a job of unknown source)."""
    if item.source not in ORCHESTRATORS:
        return 0
    return sum(mask for orchestrator, mask in masks.items() if orchestrator != item.source)


def _free_time(items: Iterable[Item]) -> FreeTime | None:
    """The interval index of an exclusive pool, or None when a job's times cannot be ordered (NaN:
    the plain scan then decides, as `fits` does)."""
    try:
        return FreeTime(t for i in items for t in (i.start, i.end))
    except ValueError:
        return None


def pack(items: list[Item], th: Thresholds, in_place: bool = False, by_share: bool = False) -> list[GpuBin]:
    """First-fit decreasing among the GPUs an item can join at all (same mode and model).

    Decreasing by `size_of` (the largest of memory, compute and load), or with `by_share` by the
    MPS thread share first (`share_of`): on Slurm, where every client's share counts against its
    GPU's 100 %, the shares are what fill an MPS GPU, and decreasing by another dimension can
    leave a GPU's last few points unused where decreasing shares fill it (37+31+31 and 30+25+20+19
    on two GPUs, where memory first took three).

    `in_place`: jobs that already run this way (`is_resident`) are packed first and onto the GPU
    they share now (a GPU's residents stay together, never on another resident group's GPU);
    the others first-fit; then GPUs whose jobs all fit elsewhere are emptied (`_merge`). The
    same GPU count with fewer moves: no swap of two MIG slices between GPUs for nothing.

    Exclusive pools find their first free GPU through a `FreeTime` index (the same GPU the scan
    with `fits` picks: without it first fit is quadratic in the jobs, ~1 M fits calls for
    10,000 jobs); MPS pools call `fits` only on GPUs a `Capacity` tree says have room for the
    job's share; time-sliced and MIG pools scan with `fits`.
    """
    bins: list[GpuBin] = []
    counters: dict[str, int] = {}
    size = share_of if by_share else size_of
    order = sorted(items, key=lambda i: (i.model, i.kind, -size(i), i.start, i.job_id))
    if in_place:
        order.sort(key=lambda i: not (is_resident(i) and i.gpus == 1))  # stable: residents first
    # each pool's GPUs in creation order: a GPU's position there is its slot (its bit in the
    # bitsets), and first fit goes by it
    created: dict[tuple[str, str], list[GpuBin]] = {}
    slot: dict[int, int] = {}  # id(bin) -> its position in `created`
    homes: dict[tuple[str, str], dict[str, int]] = {}  # pool -> GPU its residents run on now -> slots
    bound: dict[tuple[str, str], dict[str, int]] = {}  # pool -> orchestrator -> slots of its GPUs
    # id(bin) -> the MPS thread shares on it: an MPS GPU without room for a job's share is passed
    # over without calling fits, which refuses it first anyway (without this, first-fit over a
    # fleet of full MPS GPUs is quadratic in the jobs: 15 M fits calls for 10,000 jobs)
    shares: dict[int, int] = {}
    # the smallest MPS share per pool: a GPU without room for it is full and leaves the pool
    least_share: dict[tuple[str, str], int] = {}
    members: dict[tuple[str, str], list[Item]] = {}
    for item in order:
        members.setdefault((item.kind, item.model), []).append(item)
        if item.kind == Kind.MPS:
            key = (item.kind, item.model)
            least_share[key] = min(least_share.get(key, 100), item.thread_pct or 0)
    indexes = {key: _free_time(pool) for key, pool in members.items() if key[0] == Kind.EXCLUSIVE}
    # MPS pools: each GPU's room (100 - its shares; -1 once full) in a max tree over its slots
    rooms = {key: Capacity(sum(i.gpus for i in pool)) for key, pool in members.items() if key[0] == Kind.MPS}
    # time-sliced pools: what each GPU carries at an instant, to pass over the GPUs a job's start
    # already rules out (nearly every refused fit) without testing them one by one
    loads = {
        key: InstantLoad(sum(i.gpus for i in pool))
        for key, pool in members.items()
        if key[0] == Kind.TIME_SLICING
    }
    for item in order:
        model = model_for_nvml_name(item.model)
        key = (item.kind, item.model)
        made = created.setdefault(key, [])
        pool_homes = homes.setdefault(key, {})
        resident = in_place and is_resident(item) and item.gpus == 1
        allowed = (1 << len(made)) - 1
        if resident:  # only the GPUs its fellow residents run on (never another resident group's)
            allowed = 0
            for uuid in item.origin_uuids:
                allowed |= pool_homes.get(uuid, 0)
        masks = bound.setdefault(key, {})
        allowed &= ~_foreign(masks, item)  # never beside another orchestrator's jobs
        index = indexes.get(key)
        chosen: list[GpuBin] = []
        if index is not None:
            for free in index.free(item.start, item.end, allowed):
                if len(chosen) == item.gpus:
                    break
                chosen.append(made[free])
        elif key in rooms:  # MPS: only the GPUs with room for its share, lowest first
            share, at = item.thread_pct or 0, 0
            while len(chosen) < item.gpus and (found := rooms[key].first(share, at)) is not None:
                at = found + 1
                if allowed >> found & 1 and fits(made[found], item, model, th):
                    chosen.append(made[found])
        else:
            candidates = made
            if resident:
                candidates = [g for g in made if allowed >> slot[id(g)] & 1]
            over = _over(loads.get(key), item, model, th) if candidates else []
            for gpu in candidates:
                if len(chosen) == item.gpus:
                    break
                n = slot[id(gpu)]
                if not (n < len(over) and over[n]) and fits(gpu, item, model, th):
                    chosen.append(gpu)
        while len(chosen) < item.gpus:
            counters[item.model] = counters.get(item.model, 0) + 1
            gpu = GpuBin(name=f"{item.model}#{counters[item.model]}", model=item.model, mode=item.kind)
            bins.append(gpu)
            slot[id(gpu)] = len(made)
            made.append(gpu)
            chosen.append(gpu)
        for gpu in chosen:
            gpu.add(item)
            _mark(masks, gpu, 1 << slot[id(gpu)])
            if index is not None:
                index.add(slot[id(gpu)], item.start, item.end)
            _place(loads.get(key), slot[id(gpu)], item)
            shares[id(gpu)] = shares.get(id(gpu), 0) + (item.thread_pct or 0)
            if item.kind == Kind.MPS:
                # full: no later item of this pool fits (fits refuses it first), so it has no room
                # (a list.remove here compared GPUs field by field: 2 M comparisons at 50,000 jobs)
                full = shares[id(gpu)] + least_share[key] > 100
                rooms[key].set(slot[id(gpu)], -1 if full else 100 - shares[id(gpu)])
            if resident:
                for uuid in item.origin_uuids:
                    pool_homes[uuid] = pool_homes.get(uuid, 0) | 1 << slot[id(gpu)]
    return _merge(bins, th) if in_place else bins


def _merge(bins: list[GpuBin], th: Thresholds) -> list[GpuBin]:
    """Empty the GPUs (fewest jobs first) whose every job fits on another GPU of its mode and model.

    Exclusive GPUs are found through a `FreeTime` index and MPS GPUs with room for a share
    through a `Capacity` tree, as in `pack`; time-sliced and MIG GPUs are scanned."""
    shares = {id(b): sum(i.thread_pct or 0 for i in b.items) for b in bins}  # as in pack
    groups: dict[tuple[str, str], list[GpuBin]] = {}
    for b in bins:
        groups.setdefault((b.mode, b.model), []).append(b)
    slot = {id(b): n for group in groups.values() for n, b in enumerate(group)}
    alive = {key: (1 << len(group)) - 1 for key, group in groups.items()}  # the group's kept GPUs
    indexes: dict[tuple[str, str], FreeTime | None] = {}
    bound: dict[tuple[str, str], dict[str, int]] = {}  # group -> orchestrator -> slots, as in pack
    rooms: dict[tuple[str, str], Capacity] = {}  # MPS groups: each GPU's room for shares, as in pack
    loads: dict[tuple[str, str], InstantLoad] = {}  # time-sliced groups, as in pack
    for key, group in groups.items():
        bound[key] = {}
        for b in group:
            _mark(bound[key], b, 1 << slot[id(b)])
        if key[0] == Kind.TIME_SLICING:
            loads[key] = InstantLoad(sum(len(b.items) for b in group))
            for b in group:
                for i in b.items:
                    _place(loads[key], slot[id(b)], i)
        if key[0] == Kind.MPS:
            rooms[key] = Capacity(len(group))
            for b in group:
                rooms[key].set(slot[id(b)], 100 - shares[id(b)])
        if key[0] == Kind.EXCLUSIVE:
            built = indexes[key] = _free_time(i for b in group for i in b.items)
            if built is not None:
                for b in group:
                    for i in b.items:
                        built.add(slot[id(b)], i.start, i.end)
    for gpu in sorted(bins, key=lambda b: (len(b.items), b.name)):
        model = model_for_nvml_name(gpu.model)
        key = (gpu.mode, gpu.model)
        group, index = groups[key], indexes.get(key)
        others_mask = alive[key] & ~(1 << slot[id(gpu)])
        if not others_mask or any(i.gpus != 1 for i in gpu.items):
            continue
        placed: list[tuple[GpuBin, Item]] = []
        for item in gpu.items:
            share = item.thread_pct or 0
            mps = item.kind == Kind.MPS  # MPS GPUs without room for its share are passed over
            if index is not None:
                mask = others_mask & ~_foreign(bound[key], item)
                free = next(index.free(item.start, item.end, mask), None)
                target = None if free is None else group[free]
            elif key in rooms:
                target, at = None, 0
                while (found := rooms[key].first(share, at)) is not None:
                    at = found + 1
                    if others_mask >> found & 1 and fits(group[found], item, model, th):
                        target = group[found]
                        break
            else:
                over = _over(loads.get(key), item, model, th)
                target = next(
                    (
                        group[n]
                        for n in set_bits(others_mask)
                        if not (n < len(over) and over[n])
                        and not (mps and shares[id(group[n])] + share > 100)
                        and fits(group[n], item, model, th)
                    ),
                    None,
                )
            if target is None:
                break
            target.add(item)
            _mark(bound[key], target, 1 << slot[id(target)])
            if index is not None:
                index.add(slot[id(target)], item.start, item.end)
            _place(loads.get(key), slot[id(target)], item)
            shares[id(target)] += share
            if key in rooms:
                rooms[key].set(slot[id(target)], 100 - shares[id(target)])
            placed.append((target, item))
        if len(placed) == len(gpu.items):
            alive[key] &= ~(1 << slot[id(gpu)])
            if key in rooms:
                rooms[key].set(slot[id(gpu)], -1)
        else:
            for target, item in placed:
                target.take(item)
                _mark(bound[key], target, 1 << slot[id(target)])
                if index is not None:
                    index.remove(slot[id(target)], item.start, item.end)
                if key in loads:
                    loads[key].remove(slot[id(target)], id(item))
                shares[id(target)] -= item.thread_pct or 0
                if key in rooms:
                    rooms[key].set(slot[id(target)], 100 - shares[id(target)])
    return [b for b in bins if alive[(b.mode, b.model)] >> slot[id(b)] & 1]


def _as_mps(item: Item, th: Thresholds) -> Item:
    settings = mps_settings(item.sm, item.memory, th)
    return replace(
        item,
        kind=Kind.MPS.value,
        thread_pct=settings.thread_percentage,
        memory_limit=settings.pinned_memory_limit_bytes,
    )


def _take_partner(gpu: GpuBin, bins: list[GpuBin], th: Thresholds) -> bool:
    """A lone sharer takes a job from the fullest GPU of its mode and model that keeps two; never
    a job that already runs that way (taking a partner saves no GPU: it must not move a resident)."""
    model = model_for_nvml_name(gpu.model)
    donors = [
        b for b in bins if b is not gpu and b.mode == gpu.mode and b.model == gpu.model and len(b.items) > 2
    ]
    for donor in sorted(donors, key=lambda b: -len(b.items)):
        for item in sorted(donor.items, key=size_of):
            if not is_resident(item) and fits(gpu, item, model, th):
                donor.take(item)
                gpu.add(item)
                return True
    return False


def _join_other(gpu: GpuBin, bins: list[GpuBin], removed: set[int], th: Thresholds) -> dict[str, Any] | None:
    """A lone sharer joins another GPU of its model in another mode; returns its new settings."""
    item = gpu.items[0]
    model = model_for_nvml_name(gpu.model)
    if model is None:
        return None
    for other in bins:
        if other is gpu or id(other) in removed or other.model != gpu.model or len(other.items) < 1:
            continue
        if other.mode == Kind.MIG and item.kind == Kind.MPS and item.mig_alternative and other.admits(item):
            wanted = first_fit([*(o.mig_profile for o in other.items), item.mig_alternative])
            try:
                place_mig_layout(model, wanted)
            except CatalogError:
                continue
            item.kind, item.mig_profile = Kind.MIG.value, item.mig_alternative
            other.add(item)
            return {"recommendation": Kind.MIG.value, "mig_profile": item.mig_alternative}
        if other.mode in SHARED and other.mode != item.kind and len(other.items) > 1:
            candidate = _as_mps(item, th) if other.mode == Kind.MPS else replace(item, kind=other.mode)
            if not fits(other, candidate, model, th):
                continue
            item.kind, item.thread_pct, item.memory_limit = (
                candidate.kind,
                candidate.thread_pct,
                candidate.memory_limit,
            )
            other.add(item)
            change: dict[str, Any] = {"recommendation": other.mode}
            if other.mode == Kind.MPS:
                change.update(
                    mps_active_thread_percentage=item.thread_pct,
                    mps_pinned_memory_limit_bytes=item.memory_limit,
                )
            return change
    return None


def settle_lone_sharers(bins: list[GpuBin], th: Thresholds) -> tuple[list[GpuBin], dict[str, dict[str, Any]]]:
    """No GPU is shared (MPS, time-slicing, MIG) by a single job: it joins another GPU (one GPU
    fewer), takes a partner that does not run that way already, or stays whole (a job already on
    a MIG slice keeps its slice). Jobs that share an MPS or time-sliced GPU but never run at the
    same time take it whole in turn (`_in_turn`): the layout places such a GPU whole
    (`hosts.place`, "lone-sharer"), so the plan says so too."""
    moved: dict[str, dict[str, Any]] = {}
    removed: set[int] = set()
    for gpu in bins:
        if gpu.mode in SHARED and len(gpu.items) > 1 and gpu.concurrency() < 2:
            moved.update(_in_turn(gpu))
            continue
        if (gpu.mode not in SHARED and gpu.mode != Kind.MIG) or len(gpu.items) != 1 or id(gpu) in removed:
            continue
        change = _join_other(gpu, bins, removed, th) if gpu.mode in SHARED else None
        if change is not None:
            removed.add(id(gpu))
            moved[gpu.items[0].job_id] = change
            continue
        if _take_partner(gpu, bins, th):
            continue
        item = gpu.items[0]
        if gpu.mode == Kind.MIG and item.origin_mode == Kind.MIG:
            continue  # already on a slice: it keeps one (the GPU's other slices stay free)
        item.kind, item.thread_pct, item.memory_limit = Kind.EXCLUSIVE.value, None, None
        gpu.mode = Kind.EXCLUSIVE.value
        moved[item.job_id] = {
            "recommendation": Kind.EXCLUSIVE.value,
            "note": "no other job fits beside it and a GPU shared by one job saves nothing: "
            "it keeps a whole GPU",
        }
    return [b for b in bins if id(b) not in removed], moved


def _in_turn(gpu: GpuBin) -> dict[str, dict[str, Any]]:
    """A shared GPU whose jobs never overlap made whole: each job runs on it alone, in turn."""
    gpu.mode = Kind.EXCLUSIVE.value
    note = (
        f"its GPU's jobs ({', '.join(i.job_id for i in gpu.items)}) never run at the same time, so "
        "sharing it saves nothing: each has the whole GPU in turn"
    )
    for item in gpu.items:
        item.kind, item.thread_pct, item.memory_limit = Kind.EXCLUSIVE.value, None, None
    return {i.job_id: {"recommendation": Kind.EXCLUSIVE.value, "note": note} for i in gpu.items}


def _moves(bins: list[GpuBin]) -> int:
    """Jobs a packing takes off the GPU they run on now (each GPU lands where most of its jobs
    are) or runs in another mode than the one recommended (it restarts as well)."""
    out = 0
    for gpu in bins:
        votes = Counter(u for i in gpu.items for u in i.origin_uuids)
        home = votes.most_common(1)[0][0] if votes else ""
        out += sum(1 for i in gpu.items if home not in i.origin_uuids or _mode_changed(i))
    return out


def _mode_of(item: Item) -> Mode:
    """The mode `item` is packed in, with that mode's settings."""
    kind = Kind(item.kind)
    if kind == Kind.MIG:
        return Mode(kind, mig_profile=item.mig_profile)
    if kind == Kind.MPS:
        return Mode(kind, thread_pct=item.thread_pct, memory_limit=item.memory_limit)
    return Mode(kind)


def _mode_changed(item: Item) -> bool:
    return bool(item.modes) and _mode_of(item) != item.modes[0]


def _as_mode(item: Item, mode: Mode) -> Item:
    """A copy of `item` packed in `mode` (a slice it leaves stays its way back as a lone sharer)."""
    own = item.modes[0] if item.modes else None
    return replace(
        item,
        kind=mode.kind.value,
        mig_profile=mode.mig_profile,
        thread_pct=mode.thread_pct,
        memory_limit=mode.memory_limit,
        mig_alternative=own.mig_profile if own is not None and own.kind == Kind.MIG else item.mig_alternative,
    )


def _gpu_fraction(item: Item, model: GpuModel | None) -> float:
    """The share of one GPU `item` occupies in its mode, as recommend.py's `gpu_fraction` counts
    it: MPS its memory or thread cap, MIG its slice's memory or compute slices, time-slicing its
    memory, else the whole GPU."""
    total = model.memory_bytes if model else item.device_memory
    memory = min(1.0, item.memory / total) if total else 1.0
    if item.kind == Kind.MPS:
        return max(memory, (item.thread_pct or 100) / 100)
    if item.kind == Kind.MIG and model is not None and item.mig_profile:
        profile = model.mig_profile(item.mig_profile)
        return max(profile.compute_slices / model.compute_slices, profile.memory_slices / model.memory_slices)
    if item.kind == Kind.TIME_SLICING:
        return memory
    return 1.0


def _footprint(item: Item, model: GpuModel | None, th: Thresholds) -> float:
    """`_gpu_fraction`, and for time-slicing also its replica and mean-load shares: the order of
    the joint first fit, and the mode in which a job that fits no GPU opens one."""
    if item.kind == Kind.TIME_SLICING:
        replicas = 1 / max(th.time_slicing.max_replicas, 1)
        return max(_gpu_fraction(item, model), replicas, item.load / max(th.plan.max_gpu_load, 1e-9))
    return _gpu_fraction(item, model)


# jobs of one model up to which the joint first fit (every mode of every job against every GPU,
# with `fits` alone: quadratic) runs; above it only the one-mode-for-all packings are tried
JOINT_MAX_ITEMS = 400


def pack_joint(items: list[Item], th: Thresholds) -> list[GpuBin]:
    """First-fit decreasing that chooses each job's mode as it goes: a job joins the first GPU
    that one of its modes fits (`fits`: the same safety line as `pack`), else opens a GPU in the
    mode where it takes least of one. Whole-GPU jobs are packed by `pack`."""
    whole = [i for i in items if i.kind in WHOLE or i.kind == Kind.EXCLUSIVE or i.gpus != 1]
    shared = [i for i in items if not (i.kind in WHOLE or i.kind == Kind.EXCLUSIVE or i.gpus != 1)]
    bins = pack(whole, th)
    counters = Counter(b.model for b in bins)
    opened: dict[str, list[GpuBin]] = {}
    variants = {id(i): [_as_mode(i, m) for m in i.modes] or [i] for i in shared}  # the recommended mode first
    catalog = {i.model: model_for_nvml_name(i.model) for i in shared}

    def smallest(item: Item) -> float:
        return min(_footprint(v, catalog[item.model], th) for v in variants[id(item)])

    for item in sorted(shared, key=lambda i: (i.model, -smallest(i), i.start, i.job_id)):
        model, mine = catalog[item.model], variants[id(item)]
        target = next(
            (
                (gpu, v)
                for gpu in opened.get(item.model, [])
                for v in mine
                if gpu.mode == v.kind and fits(gpu, v, model, th)
            ),
            None,
        )
        if target is None:
            v = min(mine, key=lambda v: _footprint(v, model, th))  # the first on a tie
            counters[item.model] += 1
            gpu = GpuBin(name=f"{item.model}#{counters[item.model]}", model=item.model, mode=v.kind)
            opened.setdefault(item.model, []).append(gpu)
            bins.append(gpu)
            target = (gpu, v)
        target[0].add(target[1])
    return bins


def _joint_changes(bins: list[GpuBin], baseline: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The new settings of every job a joint packing runs in another mode than recommended, with
    the GPU counts that justify it."""
    count = Counter(b.model for b in bins)
    out: dict[str, dict[str, Any]] = {}
    for gpu in bins:
        model = model_for_nvml_name(gpu.model)
        for item in gpu.items:
            if not _mode_changed(item) or item.kind not in (Kind.MPS, Kind.MIG, Kind.TIME_SLICING):
                continue
            own, now = item.modes[0], _mode_of(item)
            now = next((m for m in item.modes if m == now), now)  # with its note
            change: dict[str, Any] = {"recommendation": now.kind.value}
            if now.kind == Kind.MPS:
                change.update(
                    mps_active_thread_percentage=now.thread_pct,
                    mps_pinned_memory_limit_bytes=now.memory_limit,
                    mig_alternative=own.mig_profile or item.mig_alternative,
                )
            if now.kind == Kind.MIG:
                change["mig_profile"] = now.mig_profile
            change["gpu_fraction"] = _gpu_fraction(item, model)
            change["note"] = (
                f"modes chosen jointly: as {_describe(now)} instead of {_describe(own)}, the "
                f"{gpu.model} jobs fit {count[gpu.model]} GPU(s), {baseline.get(gpu.model, 0)} "
                "with each job's recommended mode"
            )
            if now.note:  # the settings it runs under now, kept (hysteresis.py)
                change["note"] += f"; {now.note}"
            out[item.job_id] = change
    return out


def _describe(mode: Mode) -> str:
    if mode.kind == Kind.MPS:
        limit = f", {mode.memory_limit / 1024**3:.1f} GiB pinned limit" if mode.memory_limit else ""
        return f"MPS ({mode.thread_pct} % threads{limit})"
    if mode.kind == Kind.MIG:
        return f"MIG {mode.mig_profile}"
    return mode.kind.value


# jobs from which the packing from scratch runs in a forked child beside the one in place
# (`forked`: ~0.5 s of a 10,000-job plan on the second core; a fork costs ~10 ms)
FORK_MIN_ITEMS = 2_000


Packing = tuple[list[GpuBin], dict[str, dict[str, Any]]]


def share_of(item: Item) -> float:
    """An MPS item's thread share (a fraction), then its `size_of` on a tie; others' `size_of`."""
    if item.kind == Kind.MPS and item.thread_pct:
        return item.thread_pct / 100.0 + size_of(item) * 1e-3
    return size_of(item)


def _packing(items: list[Item], th: Thresholds, in_place: bool, by_share: bool = False) -> Packing:
    """`pack` on copies of the items, lone sharers settled."""
    return settle_lone_sharers(
        pack([replace(i) for i in items], th, in_place=in_place, by_share=by_share), th
    )


def fewest_moves(
    items: list[Item], th: Thresholds, ceiling: dict[str, int] | None = None
) -> tuple[list[GpuBin], dict[str, dict[str, Any]]]:
    """Pack twice (first-fit decreasing, and in place) on copies of the items, each job in its
    recommended mode, then where it may pay, with the modes chosen jointly (`_joint_packings`;
    `ceiling`: per model, the GPUs a packing must need fewer of to be used at all), and keep, per
    GPU model, the packing with the fewest GPUs, then the fewest jobs moved (in place on a tie):
    a layout that frees nothing more never moves a job, and one model's gain never costs another
    model needless moves."""
    with forked.start(lambda: _packing(items, th, False), fork=len(items) >= FORK_MIN_ITEMS) as scratch:
        in_place = _packing(items, th, True)
        from_scratch = scratch.result()
    packings = [in_place, from_scratch]
    packings += _joint_packings(items, packings, th, ceiling or {})
    return best_per_model(packings, {i.job_id: i.model for i in items})


def _span(item: Item) -> modes.Span:
    return modes.Span(item.start, item.end, item.modes or (_mode_of(item),), item.memory)


def _joint_packings(
    items: list[Item], done: list[Packing], th: Thresholds, ceiling: dict[str, int]
) -> list[Packing]:
    """Packings of the models where another choice of the jobs' modes could need fewer GPUs:
    their lower bound (`modes.lower_bound`) below both the fewest GPUs the packings `done` need
    and the model's `ceiling`. Each such model is packed with every job that has an MPS mode in
    it, then with every job that has a MIG slice on one (both from scratch and in place; MPS also
    from scratch by decreasing thread share, `pack`'s `by_share`), and
    while it has at most `JOINT_MAX_ITEMS` jobs, with each job's mode chosen as it is placed
    (`pack_joint`). The fit tests judge every placement, so each packing is as safe as `pack`'s;
    `best_per_model` keeps a joint packing only for fewer GPUs (or as many with fewer moves)."""
    fewest: dict[str, int] = {}
    for bins, _ in done:
        for model, n in Counter(b.model for b in bins).items():
            fewest[model] = min(fewest.get(model, n), n)
    by_model: dict[str, list[Item]] = {}
    for item in items:
        by_model.setdefault(item.model, []).append(item)
    models = {
        model
        for model, mine in by_model.items()
        if any(i.modes for i in mine)
        and modes.lower_bound(model, map(_span, mine))
        < min(fewest.get(model, 0), ceiling.get(model, math.inf))
    }
    if not models:
        return []
    pool = [i for i in items if i.model in models]
    out: list[Packing] = []
    for kind in (Kind.MPS, Kind.MIG):
        chosen = [_choose(i, kind) for i in pool]
        if all(c is i for c, i in zip(chosen, pool, strict=True)):
            continue
        ways = [(True, False), (False, False)] + ([(False, True)] if kind == Kind.MPS else [])
        for in_place, by_share in ways:
            bins, moved = _packing(chosen, th, in_place, by_share)
            out.append((bins, {**_joint_changes(bins, fewest), **moved}))
    small = [i for i in pool if len(by_model[i.model]) <= JOINT_MAX_ITEMS]
    if small:
        bins, moved = settle_lone_sharers(pack_joint([replace(i) for i in small], th), th)
        out.append((bins, {**_joint_changes(bins, fewest), **moved}))
    return out


def _choose(item: Item, kind: Kind) -> Item:
    """`item` in its mode of `kind` when it has one, else as recommended (the item itself)."""
    if not item.modes or item.modes[0].kind == kind:
        return item
    mode = next((m for m in item.modes if m.kind == kind), None)
    return item if mode is None else _as_mode(item, mode)


def best_per_model(
    packings: list[tuple[list[GpuBin], dict[str, dict[str, Any]]]], model_of: dict[str, str]
) -> tuple[list[GpuBin], dict[str, dict[str, Any]]]:
    """Per GPU model, the bins and lone-sharer changes of the packing with the fewest GPUs of that
    model, then the fewest jobs moved there; the first packing on a tie.

    Why per model: neither step crosses models (an item packs only onto GPUs of its own model,
    lone sharers settle among them), so each model's part of a packing is a whole plan for that
    model, and the best part of each is never worse than the best whole packing: a model that
    frees a GPU only from scratch no longer makes another model's jobs move for nothing.
    `model_of`: job id -> the model it is packed on (the same in every packing)."""
    best: dict[str, tuple[int, int, int]] = {}  # model -> (GPUs, moves, packing): the least wins
    for n, (bins, _) in enumerate(packings):
        per_model: dict[str, list[GpuBin]] = {}
        for gpu in bins:
            per_model.setdefault(gpu.model, []).append(gpu)
        for model, group in per_model.items():
            score = (len(group), _moves(group), n)
            best[model] = min(best.get(model, score), score)
    chosen = {model: score[2] for model, score in best.items()}
    if len(set(chosen.values())) <= 1:  # one packing wins everywhere: it is the plan as it is
        return packings[next(iter(chosen.values()), 0)]
    bins = [gpu for n, (packed, _) in enumerate(packings) for gpu in packed if chosen[gpu.model] == n]
    moved = {
        job: change
        for n, (_, changes) in enumerate(packings)
        for job, change in changes.items()
        if chosen.get(model_of.get(job, ""), n) == n
    }
    return bins, moved
