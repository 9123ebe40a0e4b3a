"""Which GPU (or MIG device) a Dynamic Resource Allocation device is.

The kubelet's pod-resources answer names a DRA device by its (driver, pool, device) triplet plus
the CDI devices the driver prepared for it. NVIDIA's DRA driver (`gpu.nvidia.com`) names devices
`gpu-<minor>` and `gpu-<minor>-mig-<profile>-<profile id>-<placement>`, its pool after the node,
and its CDI devices `k8s.gpu.nvidia.com/claim=<claim uid>-<device>`: none of them carries the UUID
NVML reports. The UUID is in the `uuid` attribute the driver publishes for the device in the
node's ResourceSlice (resourceslices.py). Other drivers, and CDI specs generated with NVIDIA's
`uuid` name strategy, do put the UUID in a name: that is used first, without any API call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

# NVML's forms: `GPU-<uuid>`, `MIG-<uuid>` (R470+), and the older `MIG-GPU-<uuid>/<gi>/<ci>`
_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_MIG_UUID = re.compile(rf"MIG-(?:GPU-{_HEX_UUID}/\d+/\d+|{_HEX_UUID})")
_GPU_UUID = re.compile(rf"GPU-{_HEX_UUID}")


@dataclass(frozen=True)
class DraDevice:
    """One device of a ResourceClaim as the kubelet reports it for a container."""

    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


class DeviceUuids(Protocol):
    """(driver, pool, device) -> the GPU or MIG UUID it is, "" when it is known not to be a GPU,
    or None when unknown."""

    def uuid_of(self, device: DraDevice) -> str | None: ...


def uuid_in_names(device: DraDevice) -> str | None:
    """The MIG or GPU UUID written in the device's name or one of its CDI device names (a MIG UUID
    wins over a GPU UUID: a MIG device's name may also carry its parent's)."""
    names = (device.device, *device.cdi_devices)
    for pattern in (_MIG_UUID, _GPU_UUID):
        for name in names:
            match = pattern.search(name)
            if match:
                return match.group(0)
    return None
