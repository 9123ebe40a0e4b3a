"""What each GPU runs now, and which GPUs and nodes a placed plan changes.

Emitted files are changes against what a node runs now, never whole-fleet targets: a node where
the plan moves no job and changes no mode gets no line in any file, and a GPU the plan leaves as
it is keeps its mode, MIG instances and advertised resources in every file of a node that does
change. The state now comes from the jobs' own rows (their GPUs, `sharing` and `mig_profile_now`,
read from `gpu_job_info`); a GPU no job used in the window is idle, its MIG mode unknown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from gpulens.analyzer.hosts import Family, GpuSlot, PlacedGpu, Placement


class Mode(StrEnum):
    """How one GPU is used, now or after the plan."""

    EXCLUSIVE = "exclusive"
    MIG = "mig"
    MPS = "mps"
    TIME_SLICING = "time-slicing"
    IDLE = "idle"  # no job on it


_FAMILY_OF = {
    Mode.MPS: Family.MPS,
    Mode.TIME_SLICING: Family.TIME_SLICING,
    Mode.EXCLUSIVE: Family.WHOLE,
    Mode.MIG: Family.WHOLE,
}


@dataclass(frozen=True)
class GpuNow:
    """One GPU as the window's last rows show it."""

    uuid: str
    mode: Mode
    jobs: frozenset[str]
    mig_profiles: tuple[tuple[str, int], ...] = ()  # profile -> instances its jobs use

    @property
    def family(self) -> Family:
        """The device plugin's sharing family of what runs now (an idle GPU counts as whole)."""
        return _FAMILY_OF.get(self.mode, Family.WHOLE)


def _mode(value: object) -> Mode:
    text = str(value or "").replace("_", "-")
    return Mode(text) if text in Mode.__members__.values() else Mode.EXCLUSIVE


def gpus_now(rows: Iterable[Mapping[str, object]]) -> dict[str, GpuNow]:
    """uuid -> what runs on it now, from job rows (`job_id`, `uuids`, `sharing`, `mig_profile_now`).

    A GPU with several jobs in different modes (a history that saw it re-partitioned) takes the
    mode of most of them; MIG wins a tie, since its instances are what a wrong file would break.
    """
    jobs: dict[str, set[str]] = {}
    modes: dict[str, Counter[Mode]] = {}
    profiles: dict[str, Counter[str]] = {}
    for row in rows:
        job = str(row.get("job_id"))
        mode = _mode(row.get("sharing"))
        for uuid in str(row.get("uuids") or "").split(","):
            if not uuid:
                continue
            jobs.setdefault(uuid, set()).add(job)
            modes.setdefault(uuid, Counter())[mode] += 1
            profile = str(row.get("mig_profile_now") or "")
            if mode is Mode.MIG and profile:
                profiles.setdefault(uuid, Counter())[profile] += 1
    out: dict[str, GpuNow] = {}
    for uuid, seen in jobs.items():
        counts = modes[uuid]
        mode = max(counts, key=lambda m: (counts[m], m is Mode.MIG))
        out[uuid] = GpuNow(uuid, mode, frozenset(seen), tuple(sorted(profiles.get(uuid, Counter()).items())))
    return out


def planned_mode(gpu: PlacedGpu, now: GpuNow | None) -> Mode:
    """The mode a placed GPU runs after the plan (a GPU left as it is keeps its mode now)."""
    if gpu.family is Family.UNCHANGED:
        return now.mode if now is not None else Mode.EXCLUSIVE
    if gpu.entry.get("sharing") == "mig" and gpu.entry.get("mig_layout"):
        return Mode.MIG
    if gpu.family is Family.MPS:
        return Mode.MPS
    if gpu.family is Family.TIME_SLICING:
        return Mode.TIME_SLICING
    return Mode.EXCLUSIVE


def planned_profiles(gpu: PlacedGpu) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(Counter(str(s["profile"]) for s in gpu.entry.get("mig_layout", [])).items()))


@dataclass(frozen=True)
class GpuChange:
    """One GPU whose use the plan changes: what it runs now and after, and the jobs concerned."""

    host: str
    index: int
    uuid: str
    before: str
    after: str
    jobs: tuple[str, ...]  # jobs that leave, arrive or stay on it

    @property
    def where(self) -> str:
        return f"{self.host}/GPU {self.index}"


def describe(mode: Mode, jobs: Iterable[str], profiles: tuple[tuple[str, int], ...] = ()) -> str:
    names = sorted(jobs)
    if mode is Mode.IDLE or not names:
        return "free"
    what = mode.value
    if mode is Mode.MIG and profiles:
        what += " " + " + ".join(f"{n}x {p}" if n > 1 else p for p, n in profiles)
    return f"{what}: {', '.join(names)}"


@dataclass(frozen=True)
class Changes:
    """The plan's changes on the real GPUs, and what runs now on each GPU."""

    gpus: tuple[GpuChange, ...]
    now: Mapping[str, GpuNow]
    known: bool = True  # whether the state now was in the data (else every planned GPU changes)

    # emit asks these for every placed GPU and host: derived once, not scanned each time
    @cached_property
    def hosts(self) -> frozenset[str]:
        return frozenset(c.host for c in self.gpus)

    @cached_property
    def _uuids(self) -> frozenset[str]:
        return frozenset(c.uuid for c in self.gpus)

    def changed(self, uuid: str) -> bool:
        return uuid in self._uuids

    def on(self, host: str) -> list[GpuChange]:
        return [c for c in self.gpus if c.host == host]

    def freed_mig(self, host: str, placement: Placement) -> list[GpuSlot]:
        """GPUs of `host` in MIG mode now that the plan empties: cleared to whole GPUs."""
        used = {g.uuid for g in placement.gpus}
        return [
            s
            for s in placement.inventory.on(host)
            if s.uuid not in used and (n := self.now.get(s.uuid)) is not None and n.mode is Mode.MIG
        ]


def changes(placement: Placement, now: Mapping[str, GpuNow], known: bool = True) -> Changes:
    """Every GPU the placed plan changes: other jobs, another mode or other MIG instances; GPUs
    it empties. `known=False` (no state now in the data) counts every GPU the plan does not leave
    as it is as changed, as before the state was read."""
    out: list[GpuChange] = []
    for gpu in placement.gpus:
        if gpu.family is Family.UNCHANGED:
            continue
        here = now.get(gpu.uuid)
        mode = planned_mode(gpu, here)
        after_jobs = frozenset(gpu.jobs)
        profiles = planned_profiles(gpu)
        before_jobs = here.jobs if here is not None else frozenset()
        before_mode = here.mode if here is not None else Mode.IDLE
        before_profiles = here.mig_profiles if here is not None else ()
        same = (
            known
            and after_jobs == before_jobs
            and mode is before_mode
            and (mode is not Mode.MIG or not before_profiles or profiles == before_profiles)
        )
        if same:
            continue
        out.append(
            GpuChange(
                gpu.host,
                gpu.index,
                gpu.uuid,
                describe(before_mode, before_jobs, before_profiles),
                describe(mode, after_jobs, profiles),
                tuple(sorted(after_jobs | before_jobs)),
            )
        )
    for slot in placement.free():
        here = now.get(slot.uuid)
        if here is None or not here.jobs:
            continue
        out.append(
            GpuChange(
                slot.host,
                slot.index,
                slot.uuid,
                describe(here.mode, here.jobs, here.mig_profiles),
                "free" + (" (MIG disabled)" if here.mode is Mode.MIG else ""),
                tuple(sorted(here.jobs)),
            )
        )
    out.sort(key=lambda c: (c.host, c.index))
    return Changes(tuple(out), dict(now), known)
