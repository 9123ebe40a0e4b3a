"""What a real node assigns that a scenario need not spell out.

Stable identifiers derived from the scenario's own keys (UUIDs, container ids, uids, the GPU
instance ids the driver gives each MIG placement), so one scenario always shows the same node,
and the memory the driver reserves on a GPU or an empty MIG instance.
"""

from __future__ import annotations

import zlib

from gpulens.catalog import GpuModel, MigProfile
from gpulens.sim.patterns import splitmix64


def stable_hex(*keys: int | str, digits: int) -> str:
    out = ""
    counter = 0
    base = [k if isinstance(k, int) else zlib.crc32(k.encode()) for k in keys]
    while len(out) < digits:
        h = 0x9E3779B9
        for k in (*base, counter):
            h = splitmix64(h ^ k)
        out += f"{h:016x}"
        counter += 1
    return out[:digits]


def make_uuid(*keys: int | str) -> str:
    """A stable UUID-shaped string from keys (hostname, index, ...)."""
    h = stable_hex(*keys, digits=32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def make_container_id(namespace: str, pod: str, container: str, restart: int = 0) -> str:
    """A container's stable 64-hex id; each restart of the container gets another."""
    if restart:
        return stable_hex("ctr", namespace, pod, container, restart, digits=64)
    return stable_hex("ctr", namespace, pod, container, digits=64)


def gpu_reserved_bytes(model: GpuModel) -> int:
    """Memory the driver keeps for itself on a whole GPU (NVML v2 `reserved`): the catalog's figure
    where a real GPU showed it, else 0.65 % of the framebuffer in whole MiB."""
    if model.memory_reserved_bytes is not None:
        return model.memory_reserved_bytes
    return int(model.memory_bytes * 0.0065) // (1024**2) * 1024**2


def instance_reserved_bytes(profile: MigProfile) -> int:
    """Memory an empty MIG instance already shows as used."""
    return (11 + 2 * profile.placement_size) * 1024**2


def default_uid(user: str) -> int:
    """A stable uid for a user name the scenario did not map (root is 0)."""
    if user == "root":
        return 0
    return 2000 + zlib.crc32(user.encode()) % 60000


def default_gpu_instance_id(model: GpuModel, profile: MigProfile, start: int) -> int:
    """The GPU instance id the driver gives an instance at this placement.

    Follows `nvidia-smi mig -lgi` on 7-slice GPUs: 7g is 0, 3g/4g at start 0 are 1, 3g at 4 is 2,
    2-slice instances at 0/2/4/6 are 3/4/5/6 and 1-slice instances at s are 7+s. A30: 4g is 0, 2g at
    0/2 are 1/2, 1g at s is 3+s.
    """
    size = profile.placement_size
    if model.memory_slices == 4:
        return {4: 0, 2: 1 + start // 2, 1: 3 + start}[size]
    if size == 8:
        return 0
    if size == 4:
        return 1 + start // 4
    if size == 2:
        return 3 + start // 2
    return 7 + start
