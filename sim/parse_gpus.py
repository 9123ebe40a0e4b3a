"""A scenario's `node:` and `gpus:` sections: the driver, each GPU, its MIG layout and MPS server."""

from __future__ import annotations

import zlib
from typing import Any

from gpulens.catalog import MIB, CatalogError, GpuModel, get_model
from gpulens.migplacement import place_mig_layout
from gpulens.sim.checks import Check
from gpulens.sim.defaults import default_gpu_instance_id, default_uid, make_uuid
from gpulens.sim.mpscontrol import DEFAULT_PIPE_DIRECTORY
from gpulens.sim.patterns import hash_unit
from gpulens.sim.scenario import COMPUTE_MODES, GpuSpec, MigInstanceSpec, MpsSpec
from gpulens.sim.state import DriverInfo

# an absolute directory: non-empty components without control characters, no trailing slash, at
# most 256 characters (what the exporter accepts from a client's CUDA_MPS_PIPE_DIRECTORY)
_PIPE_DIR = r"(?=.{1,256}$)(/[^/\x00-\x1f\x7f]+)+"
# PCI bus numbers of the eight GPUs of a DGX H100 / A100 (nvidia-smi on those systems)
_DGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def parse_driver(c: Check, raw: dict[str, Any]) -> tuple[str, DriverInfo]:
    node = c.mapping(
        "node", raw, (), ("hostname", "driver_version", "nvml_version", "cuda_driver_version", "kubernetes")
    )
    hostname = c.string("node.hostname", node.get("hostname", "gpu-node-01"))
    default = DriverInfo()
    driver_version = c.string("node.driver_version", node.get("driver_version", default.driver_version))
    nvml_version = node.get("nvml_version")
    nvml_version = (
        c.string("node.nvml_version", nvml_version)
        if nvml_version is not None
        else (default.nvml_version if "driver_version" not in node else f"12.{driver_version}")
    )
    cuda = c.integer(
        "node.cuda_driver_version", node.get("cuda_driver_version", default.cuda_driver_version), 1000
    )
    return hostname, DriverInfo(
        driver_version=driver_version, nvml_version=nvml_version, cuda_driver_version=cuda
    )


def _mps_memory(c: Check, path: str, raw: Any) -> int:
    size = c.size(path, raw)
    if size > 4 * 1024**3:
        raise c.expected(path, "at most 4GiB (the server's own context)", raw)
    return size


def _thread_percentage(c: Check, path: str, raw: Any) -> float:
    """The daemon's active thread percentage: above 0 (a server with no SMs runs nothing), at most 100."""
    what = "a percentage above 0, at most 100"
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw <= 100:
        raise c.expected(path, what, raw)
    return float(raw)


def _pinned_limit(c: Check, path: str, raw: Any) -> int | None:
    """The daemon's default pinned device memory limit (None: absent, no limit): above 0 (a client
    under 0 bytes can allocate nothing) and in whole MiB, as `set_default_device_pinned_mem_limit`
    takes it (`<N>M` or `<N>G`)."""
    if raw is None:
        return None
    size = c.size(path, raw)
    if size <= 0 or size % MIB:
        raise c.expected(path, "a size above 0 in whole MiB, like 20480MiB or 20GiB", raw)
    return size


def _pipe_dir(c: Check, path: str, raw: Any) -> str:
    """An absolute, normalized directory: the simulated node writes its daemon's state below it
    (inside its procfs root), so `.`/`..` components, which could leave that root, are refused."""
    what = "an absolute directory like /tmp/nvidia-mps (at most 256 characters, no . or ..)"
    value = c.string(path, raw, _PIPE_DIR, what)
    if any(part in (".", "..") for part in value.split("/")):
        raise c.expected(path, what, raw)
    return value


def _parse_mig(c: Check, path: str, model: GpuModel, raw: Any) -> tuple[MigInstanceSpec, ...]:
    entries = c.list_(path, raw)
    requests: list[tuple[str, int | None]] = []
    ids: list[int | None] = []
    for i, entry in enumerate(entries):
        p = f"{path}[{i}]"
        if isinstance(entry, str):
            entry = {"profile": entry}
        m = c.mapping(p, entry, ("profile",), ("start", "id"))
        name = c.string(f"{p}.profile", m["profile"])
        try:
            model.mig_profile(name)
        except CatalogError:
            valid = ", ".join(pr.name for pr in model.mig_profiles)
            raise c.expected(f"{p}.profile", f"a MIG profile of {model.key} ({valid})", name) from None
        start = c.integer(f"{p}.start", m["start"], 0, model.memory_slices - 1) if "start" in m else None
        requests.append((name, start))
        ids.append(c.integer(f"{p}.id", m["id"], 0, 14) if "id" in m else None)
    try:
        placed = place_mig_layout(model, requests)
    except CatalogError as e:
        raise c.fail(path, f"expected a MIG layout that fits, found: {e}") from None
    out: list[MigInstanceSpec] = []
    seen: dict[int, int] = {}
    for i, (placement, gi) in enumerate(zip(placed, ids, strict=True)):
        gid = gi if gi is not None else default_gpu_instance_id(model, placement.profile, placement.start)
        if gid in seen:
            raise c.expected(f"{path}[{i}].id", f"a GPU instance id not used by {path}[{seen[gid]}]", gid)
        seen[gid] = i
        out.append(MigInstanceSpec(placement.profile, placement.start, gid, i))
    return tuple(out)


def parse_gpus(c: Check, raw: Any, hostname: str, users: dict[str, int]) -> tuple[GpuSpec, ...]:
    entries = c.list_("gpus", raw)
    if not entries:
        raise c.expected("gpus", "at least one GPU", raw)
    gpus: list[GpuSpec] = []
    for i, entry in enumerate(entries):
        p = f"gpus[{i}]"
        m = c.mapping(p, entry, ("model",), ("count", "mig", "mps", "nvlink", "overrides"))
        try:
            model = get_model(c.string(f"{p}.model", m["model"]))
        except CatalogError as e:
            raise c.fail(f"{p}.model", f"expected a catalog model, found {m['model']!r} ({e})") from None
        count = c.integer(f"{p}.count", m.get("count", 1), 1, 64)
        nvlink = c.boolean(f"{p}.nvlink", m.get("nvlink", True))
        mig = None
        if "mig" in m:
            if not model.mig_capable:
                raise c.expected(f"{p}.mig", f"no MIG layout ({model.key} has no MIG)", m["mig"])
            mig = _parse_mig(c, f"{p}.mig", model, m["mig"])
        mps = None
        if m.get("mps") is not None:
            if mig is not None:
                raise c.expected(f"{p}.mps", "no MPS server on a GPU in MIG mode", m["mps"])
            if count != 1:
                raise c.expected(f"{p}.count", "1 on an entry with an MPS server (pids are per GPU)", count)
            mm = c.mapping(
                f"{p}.mps",
                m["mps"],
                ("server_pid",),
                (
                    "restart_pid",
                    "user",
                    "memory",
                    "start",
                    "active_thread_percentage",
                    "pinned_memory_limit",
                    "pipe_dir",
                ),
            )
            server_pid = c.integer(f"{p}.mps.server_pid", mm["server_pid"], 2, 4194304)
            restart_pid = c.integer(f"{p}.mps.restart_pid", mm.get("restart_pid", server_pid + 1), 2, 4194304)
            if restart_pid == server_pid:
                raise c.expected(f"{p}.mps.restart_pid", "a pid other than server_pid", restart_pid)
            user = c.string(f"{p}.mps.user", mm.get("user", "root"))
            mps = MpsSpec(
                server_pid,
                restart_pid,
                user,
                users.get(user, default_uid(user)),
                _mps_memory(c, f"{p}.mps.memory", mm.get("memory", "32MiB")),
                c.duration(f"{p}.mps.start", mm.get("start", "-1h"), negative=True),
                _thread_percentage(
                    c, f"{p}.mps.active_thread_percentage", mm.get("active_thread_percentage", 100)
                ),
                _pinned_limit(c, f"{p}.mps.pinned_memory_limit", mm.get("pinned_memory_limit")),
                _pipe_dir(c, f"{p}.mps.pipe_dir", mm.get("pipe_dir", DEFAULT_PIPE_DIRECTORY)),
            )
        ov = c.mapping(
            f"{p}.overrides",
            m.get("overrides", {}),
            (),
            (
                "power_limit_watts",
                "ecc",
                "persistence_mode",
                "compute_mode",
                "serial",
                "uuid",
                "pci_bus_id",
                "accounting",
                "ecc_aggregate",
                "remapped_rows",
                "ambient_c",
            ),
        )
        for key in ("uuid", "pci_bus_id", "serial"):
            if key in ov and ov[key] is not None and count != 1:
                raise c.expected(f"{p}.count", f"1 on an entry that overrides {key}", count)
        power = c.integer(
            f"{p}.overrides.power_limit_watts",
            ov.get("power_limit_watts", model.power_limit_watts),
            model.idle_power_watts + 1,
            model.power_limit_watts,
        )
        mode_name = ov.get("compute_mode", "exclusive_process" if mps else "default")
        compute_mode = COMPUTE_MODES[c.choice(f"{p}.overrides.compute_mode", mode_name, list(COMPUTE_MODES))]
        if mps is not None and compute_mode != 3:
            raise c.expected(f"{p}.overrides.compute_mode", "exclusive_process on an MPS GPU", mode_name)
        agg = c.mapping(
            f"{p}.overrides.ecc_aggregate", ov.get("ecc_aggregate", {}), (), ("corrected", "uncorrected")
        )
        rows = c.mapping(
            f"{p}.overrides.remapped_rows", ov.get("remapped_rows", {}), (), ("correctable", "uncorrectable")
        )
        if len(gpus) + count > 64:
            raise c.expected(f"{p}.count", "at most 64 GPUs on the node", count)
        for _ in range(count):
            index = len(gpus)
            bus = _DGX_BUSES[index] if index < len(_DGX_BUSES) else 0x100 - len(gpus) * 4
            serial: str | None = str(
                1650000000000 + int(hash_unit(zlib.crc32(hostname.encode()), index) * 1e9)
            )
            if "serial" in ov:
                serial = None if ov["serial"] is None else c.string(f"{p}.overrides.serial", ov["serial"])
            uuid = "GPU-" + make_uuid(hostname, index)
            if ov.get("uuid") is not None:
                uuid = c.string(
                    f"{p}.overrides.uuid",
                    ov["uuid"],
                    r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                    "a UUID like GPU-0fd3b7c2-1b7e-4a84-9f1e-2c1a5d6e7f80",
                )
            bus_id = f"00000000:{bus:02X}:00.0"
            if ov.get("pci_bus_id") is not None:
                bus_id = c.string(
                    f"{p}.overrides.pci_bus_id",
                    ov["pci_bus_id"],
                    r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]",
                    "a bus id like 00000000:18:00.0",
                )
            gpus.append(
                GpuSpec(
                    index=index,
                    model=model,
                    mig=mig,
                    mps=mps,
                    power_limit_watts=power,
                    ecc=c.boolean(f"{p}.overrides.ecc", ov.get("ecc", model.ecc_default)),
                    persistence_mode=c.integer(
                        f"{p}.overrides.persistence_mode", ov.get("persistence_mode", 1), 0, 1
                    ),
                    compute_mode=compute_mode,
                    serial=serial,
                    uuid=uuid,
                    pci_bus_id=bus_id,
                    accounting=c.boolean(f"{p}.overrides.accounting", ov.get("accounting", False)),
                    ecc_aggregate=(
                        c.integer(f"{p}.overrides.ecc_aggregate.corrected", agg.get("corrected", 0), 0),
                        c.integer(f"{p}.overrides.ecc_aggregate.uncorrected", agg.get("uncorrected", 0), 0),
                    ),
                    remapped_rows=(
                        c.integer(f"{p}.overrides.remapped_rows.correctable", rows.get("correctable", 0), 0),
                        c.integer(
                            f"{p}.overrides.remapped_rows.uncorrectable", rows.get("uncorrectable", 0), 0
                        ),
                    ),
                    ambient_c=c.number(f"{p}.overrides.ambient_c", ov.get("ambient_c", 28), 0, 60),
                    nvlink=nvlink,
                )
            )
    return tuple(gpus)
