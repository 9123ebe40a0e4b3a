"""A scenario's `faults:` section: one parser per fault kind, then the MIG timeline played through.

Each timeline entry names exactly one kind (`FaultKind`); `FAULT_PARSERS` says which keys the
kind takes and whether it hits the node or one GPU, and its parser builds the kind's `Fault`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from gpulens.catalog import CatalogError
from gpulens.migplacement import place_mig_layout
from gpulens.sim.checks import Check
from gpulens.sim.defaults import default_gpu_instance_id
from gpulens.sim.scenario import (
    DIAG_TESTS,
    FAULT_KINDS,
    FOREVER,
    INIT_ERRORS,
    MEMORY_LOCATIONS,
    NVLINK_COUNTERS,
    THROTTLE_BITS,
    DiagFailFault,
    EccFault,
    EccStormFault,
    Fault,
    FaultKind,
    GpuSpec,
    HangFault,
    InitErrorFault,
    LostFault,
    MigCreateFault,
    MigDestroyFault,
    MigInstanceSpec,
    MpsRestartFault,
    NvlinkErrorFault,
    PcieReplayFault,
    RowRemapFault,
    ThrottleFault,
    XidFault,
    instance_profiles,
)


@dataclass(frozen=True)
class _FaultEntry:
    """What every fault parser gets: the checked entry, its kind's value, time, GPU and `for`."""

    c: Check
    path: str  # faults.timeline[i]
    kind: FaultKind
    raw: dict[str, Any]  # the whole entry (keys checked)
    value: Any  # the value under the kind's key
    at: float
    gpu: GpuSpec | None  # None only for node-level kinds
    duration: float  # `for`, FOREVER when absent

    @property
    def vpath(self) -> str:
        return f"{self.path}.{self.kind}"

    @property
    def gpu_spec(self) -> GpuSpec:
        assert self.gpu is not None, "node-level kinds have no GPU"
        return self.gpu

    @property
    def gpu_index(self) -> int | None:
        return None if self.gpu is None else self.gpu.index


def _xid(e: _FaultEntry) -> Fault:
    c, code = e.c, e.c.integer(e.vpath, e.value, 1, 999)
    if "instance" not in e.raw:
        return XidFault(at=e.at, gpu=e.gpu_index, code=code)
    if e.gpu_spec.mig is None:
        raise c.expected(
            f"{e.path}.instance",
            f"no instance (GPU {e.gpu_spec.index} is not in MIG mode)",
            e.raw["instance"],
        )
    instance = c.integer(f"{e.path}.instance", e.raw["instance"], 0, 14)
    return XidFault(at=e.at, gpu=e.gpu_index, code=code, instance=instance)


def _ecc_counts(e: _FaultEntry, keys: tuple[str, ...]) -> tuple[int, int, int]:
    """(corrected, uncorrected, location) of an ecc / ecc_storm value, on a GPU with ECC on."""
    c = e.c
    m = c.mapping(e.vpath, e.value, (), keys)
    corrected = c.integer(f"{e.vpath}.corrected", m.get("corrected", 0), 0)
    uncorrected = c.integer(f"{e.vpath}.uncorrected", m.get("uncorrected", 0), 0)
    if corrected + uncorrected == 0:
        raise c.expected(e.vpath, "a corrected or uncorrected count above 0", e.value)
    location = MEMORY_LOCATIONS[
        c.choice(f"{e.vpath}.location", m.get("location", "dram"), list(MEMORY_LOCATIONS))
    ]
    if not e.gpu_spec.ecc:
        raise c.expected(e.path, f"a GPU with ECC enabled (GPU {e.gpu_spec.index} has ECC off)", e.value)
    return corrected, uncorrected, location


def _ecc(e: _FaultEntry) -> Fault:
    corrected, uncorrected, location = _ecc_counts(e, ("corrected", "uncorrected", "location"))
    return EccFault(
        at=e.at,
        gpu=e.gpu_index,
        corrected=corrected,
        uncorrected=uncorrected,
        location=location,
        duration=e.duration,
    )


def _ecc_storm(e: _FaultEntry) -> Fault:
    corrected, _, location = _ecc_counts(e, ("corrected", "location"))
    if e.duration <= 0 or e.duration == FOREVER:
        raise e.c.expected(f"{e.path}.for", "a finite duration above 0", e.raw["for"])
    return EccStormFault(
        at=e.at, gpu=e.gpu_index, corrected=corrected, location=location, duration=e.duration
    )


def _row_remap(e: _FaultEntry) -> Fault:
    c = e.c
    value = {"state": e.value} if isinstance(e.value, str) else e.value
    m = c.mapping(e.vpath, value, ("state",), ("rows",))
    if not e.gpu_spec.model.row_remapping:
        raise c.expected(e.path, f"a GPU with row remapping ({e.gpu_spec.model.key} has none)", value)
    state: Literal["pending", "failed"] = "pending"
    if c.choice(f"{e.vpath}.state", m["state"], ("pending", "failed")) == "failed":
        state = "failed"
    return RowRemapFault(
        at=e.at, gpu=e.gpu_index, state=state, rows=c.integer(f"{e.vpath}.rows", m.get("rows", 1), 1)
    )


def _lost(e: _FaultEntry) -> Fault:
    return LostFault(at=e.at, gpu=e.gpu_index, duration=e.c.duration(e.vpath, e.value, forever=True))


def _hang(e: _FaultEntry) -> Fault:
    seconds = e.c.duration(e.vpath, e.value)
    if seconds <= 0:
        raise e.c.expected(e.vpath, "a duration above 0", e.value)
    return HangFault(at=e.at, gpu=e.gpu_index, duration=seconds)


def _mps_restart(e: _FaultEntry) -> Fault:
    seconds = e.c.duration(e.vpath, e.value)
    if e.gpu_spec.mps is None:
        raise e.c.expected(f"{e.path}.gpu", "a GPU that runs an MPS server", e.gpu_spec.index)
    return MpsRestartFault(at=e.at, gpu=e.gpu_index, duration=seconds)


def _throttle(e: _FaultEntry) -> Fault:
    c = e.c
    names = [e.value] if isinstance(e.value, str) else c.list_(e.vpath, e.value)
    bits = 0
    for i, name in enumerate(names):
        bits |= THROTTLE_BITS[c.choice(f"{e.vpath}[{i}]", name, list(THROTTLE_BITS))]
    if not bits:
        raise c.expected(e.vpath, "at least one throttle reason", e.value)
    if bits & THROTTLE_BITS["hw_power_brake"]:
        bits |= THROTTLE_BITS["hw_slowdown"]  # power brake is a kind of HW slowdown
    return ThrottleFault(at=e.at, gpu=e.gpu_index, reasons=bits, duration=e.duration)


def _init_error(e: _FaultEntry) -> Fault:
    c = e.c
    if isinstance(e.value, int) and not isinstance(e.value, bool):
        code = c.integer(e.vpath, e.value, 1, 999)
    else:
        code = INIT_ERRORS[c.choice(e.vpath, e.value, list(INIT_ERRORS))]
    return InitErrorFault(at=e.at, code=code, duration=e.duration)


def _mig_gpu(e: _FaultEntry) -> GpuSpec:
    if e.gpu_spec.mig is None:
        raise e.c.expected(f"{e.path}.gpu", "a GPU in MIG mode", e.gpu_spec.index)
    return e.gpu_spec


def _mig_create(e: _FaultEntry) -> Fault:
    c, gpu = e.c, _mig_gpu(e)
    m = c.mapping(e.vpath, e.value, ("profile",), ("start", "id"))
    try:
        profile = gpu.model.mig_profile(c.string(f"{e.vpath}.profile", m["profile"]))
    except CatalogError:
        valid = ", ".join(pr.name for pr in gpu.model.mig_profiles)
        raise c.expected(
            f"{e.vpath}.profile", f"a MIG profile of {gpu.model.key} ({valid})", m["profile"]
        ) from None
    start = -1
    if "start" in m:
        start = c.integer(f"{e.vpath}.start", m["start"], 0, gpu.model.memory_slices - 1)
        if start not in profile.placement_starts:
            raise c.expected(
                f"{e.vpath}.start", f"a start of {profile.name} ({list(profile.placement_starts)})", start
            )
    gid = c.integer(f"{e.vpath}.id", m["id"], 0, 14) if "id" in m else -1
    return MigCreateFault(at=e.at, gpu=gpu.index, mig=MigInstanceSpec(profile, start, gid, -1))


def _mig_destroy(e: _FaultEntry) -> Fault:
    gpu = _mig_gpu(e)
    return MigDestroyFault(at=e.at, gpu=gpu.index, instance=e.c.integer(e.vpath, e.value, 0, 14))


def _pcie_replay(e: _FaultEntry) -> Fault:
    return PcieReplayFault(at=e.at, gpu=e.gpu_index, count=e.c.integer(e.vpath, e.value, 1))


def _nvlink_error(e: _FaultEntry) -> Fault:
    c, gpu = e.c, e.gpu_spec
    m = c.mapping(e.vpath, e.value, ("link",), ("counter", "count"))
    if gpu.model.nvlink_links == 0 or not gpu.nvlink:
        raise c.expected(f"{e.path}.gpu", "a GPU with NVLink", gpu.index)
    return NvlinkErrorFault(
        at=e.at,
        gpu=gpu.index,
        link=c.integer(f"{e.vpath}.link", m["link"], 0, gpu.model.nvlink_links - 1),
        counter=NVLINK_COUNTERS[
            c.choice(f"{e.vpath}.counter", m.get("counter", "crc_flit"), list(NVLINK_COUNTERS))
        ],
        count=c.integer(f"{e.vpath}.count", m.get("count", 1), 1),
    )


def _diag_fail(e: _FaultEntry) -> Fault:
    test = e.c.choice(e.vpath, e.value, list(DIAG_TESTS))
    return DiagFailFault(at=e.at, gpu=e.gpu_index, test=test, duration=e.duration)


@dataclass(frozen=True)
class _FaultRule:
    """How to read one kind: its parser and the keys its entry takes besides `at` and the kind."""

    parse: Callable[[_FaultEntry], Fault]
    optional: tuple[str, ...] = ("gpu",)
    required: tuple[str, ...] = ()
    node_level: bool = False  # applies to the node (no `gpu`)


FAULT_PARSERS: dict[FaultKind, _FaultRule] = {
    FaultKind.XID: _FaultRule(_xid, optional=("gpu", "instance")),
    FaultKind.ECC: _FaultRule(_ecc),
    FaultKind.ECC_STORM: _FaultRule(_ecc_storm, required=("for",)),
    FaultKind.ROW_REMAP: _FaultRule(_row_remap),
    FaultKind.LOST: _FaultRule(_lost),
    FaultKind.THROTTLE: _FaultRule(_throttle, optional=("gpu", "for")),
    FaultKind.HANG: _FaultRule(_hang),
    FaultKind.INIT_ERROR: _FaultRule(_init_error, optional=("for",), node_level=True),
    FaultKind.MIG_CREATE: _FaultRule(_mig_create),
    FaultKind.MIG_DESTROY: _FaultRule(_mig_destroy),
    FaultKind.MPS_RESTART: _FaultRule(_mps_restart),
    FaultKind.PCIE_REPLAY: _FaultRule(_pcie_replay),
    FaultKind.NVLINK_ERROR: _FaultRule(_nvlink_error),
    FaultKind.DIAG_FAIL: _FaultRule(_diag_fail, optional=("gpu", "for")),
}


def _parse_fault(c: Check, path: str, raw: Any, gpus: tuple[GpuSpec, ...]) -> Fault:
    """One timeline entry: exactly one kind key, `at`, the GPU it hits, then the kind's parser."""
    if not isinstance(raw, dict):
        raise c.expected(path, "a mapping", raw)
    kinds = [FaultKind(k) for k in raw if k in FAULT_KINDS]
    if len(kinds) != 1:
        found = " and ".join(kinds) or "none"
        raise c.fail(path, f"expected exactly one fault kind ({', '.join(FAULT_KINDS)}), found {found}")
    kind = kinds[0]
    rule = FAULT_PARSERS[kind]
    m = c.mapping(path, raw, ("at", kind, *rule.required), rule.optional)
    at = c.duration(f"{path}.at", m["at"])
    gpu: GpuSpec | None = None
    if not rule.node_level:
        if "gpu" not in m:
            raise c.fail(f"{path}.gpu", "expected a GPU index for this fault, found nothing")
        index = c.integer(f"{path}.gpu", m["gpu"])
        if not 0 <= index < len(gpus):
            raise c.expected(f"{path}.gpu", f"a GPU index from 0 to {len(gpus) - 1}", index)
        gpu = gpus[index]
    duration = c.duration(f"{path}.for", m["for"], forever=True) if "for" in m else FOREVER
    return rule.parse(_FaultEntry(c, path, kind, m, m[kind], at, gpu, duration))


def _resolve_mig_timeline(
    c: Check, faults: list[Fault], gpus: tuple[GpuSpec, ...], repeat: float | None
) -> list[Fault]:
    """Play mig_create / mig_destroy in time order (two cycles when repeating), placing created
    instances and checking every step is possible; returns the faults with placements filled in."""
    resolved = list(faults)
    order = sorted(
        (i for i, f in enumerate(faults) if isinstance(f, MigCreateFault | MigDestroyFault)),
        key=lambda i: (faults[i].at, i),
    )
    if not order:
        return resolved
    alive: dict[int, dict[int, MigInstanceSpec]] = {
        g.index: {inst.gpu_instance_id: inst for inst in g.mig} for g in gpus if g.mig is not None
    }
    for _cycle in range(2 if repeat else 1):
        for i in order:
            f = resolved[i]
            path = f"faults.timeline[{i}]"
            assert f.gpu is not None
            gpu = gpus[f.gpu]
            instances = alive[f.gpu]
            if isinstance(f, MigDestroyFault):
                if f.instance not in instances:
                    raise c.expected(
                        f"{path}.mig_destroy",
                        f"an instance that exists on GPU {f.gpu} at {f.at:g}s "
                        f"({', '.join(map(str, sorted(instances))) or 'none'})",
                        f.instance,
                    )
                del instances[f.instance]
                continue
            assert isinstance(f, MigCreateFault)
            requests: list[tuple[str, int | None]] = [
                (inst.profile.name, inst.start) for inst in instances.values()
            ]
            requests.append((f.mig.profile.name, f.mig.start if f.mig.start >= 0 else None))
            try:
                placed = place_mig_layout(gpu.model, requests)[-1]
            except CatalogError as e:
                raise c.fail(
                    f"{path}.mig_create", f"expected an instance that fits at {f.at:g}s, found: {e}"
                ) from None
            gid = (
                f.mig.gpu_instance_id
                if f.mig.gpu_instance_id >= 0
                else default_gpu_instance_id(gpu.model, placed.profile, placed.start)
            )
            if gid in instances:
                raise c.expected(
                    f"{path}.mig_create.id", f"an id not in use on GPU {f.gpu} at {f.at:g}s", gid
                )
            used = {inst.slot for inst in instances.values()}
            slot = next(s for s in range(gpu.model.compute_slices) if s not in used)
            spec = MigInstanceSpec(placed.profile, placed.start, gid, slot)
            if f.mig.slot >= 0 and (f.mig.start, f.mig.gpu_instance_id, f.mig.slot) != (
                spec.start,
                gid,
                slot,
            ):
                raise c.fail(
                    f"{path}.mig_create",
                    "expected the same placement in every cycle of the repeated timeline; give start and id",
                )
            resolved[i] = replace(f, mig=spec)
            instances[gid] = spec
    return resolved


def parse_faults(c: Check, raw: Any, gpus: tuple[GpuSpec, ...]) -> tuple[tuple[Fault, ...], float | None]:
    if raw is None:
        return (), None
    m = c.mapping("faults", raw, ("timeline",), ("repeat",))
    repeat = c.duration("faults.repeat", m["repeat"]) if m.get("repeat") is not None else None
    if repeat is not None and repeat <= 0:
        raise c.expected("faults.repeat", "a duration above 0", m["repeat"])
    faults: list[Fault] = []
    for i, entry in enumerate(c.list_("faults.timeline", m["timeline"])):
        fault = _parse_fault(c, f"faults.timeline[{i}]", entry, gpus)
        if repeat is not None:
            if fault.at >= repeat:
                raise c.expected(
                    f"faults.timeline[{i}].at", f"a time before the repeat period ({repeat:g}s)", entry["at"]
                )
            if fault.duration != FOREVER and fault.duration > repeat:
                raise c.expected(
                    f"faults.timeline[{i}]",
                    f"a duration within the repeat period ({repeat:g}s)",
                    fault.duration,
                )
        faults.append(fault)
    faults = _resolve_mig_timeline(c, faults, gpus, repeat)
    for i, f in enumerate(faults):
        if isinstance(f, XidFault) and f.instance is not None:
            assert f.gpu is not None
            ids = sorted(instance_profiles(gpus[f.gpu], faults))
            if f.instance not in ids:
                raise c.expected(
                    f"faults.timeline[{i}].instance",
                    f"a GPU instance id of GPU {f.gpu} ({', '.join(map(str, ids))})",
                    f.instance,
                )
    return tuple(faults), repeat
