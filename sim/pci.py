"""A GPU's PCI address as NVML reads and prints it, shared by the ctypes and the native driver.

One parser, so `nvmlDeviceGetHandleByPciBusId` (which takes what a caller types) and both drivers'
`nvmlPciInfo_t` (built from a scenario's `pci_bus_id`) agree on which spellings name a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PciAddress:
    domain: int
    bus: int
    device: int
    function: int

    @property
    def bus_id(self) -> str:
        """`nvmlPciInfo_t.busId`: "00000000:18:00.0" (eight-digit domain, upper case)."""
        return f"{self.domain:08x}:{self.bus:02x}:{self.device:02x}.{self.function:x}".upper()

    @property
    def legacy_bus_id(self) -> str:
        """`nvmlPciInfo_t.busIdLegacy`: "0000:18:00.0" (four-digit domain, upper case)."""
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}".upper()


def parse_bus_id(text: str) -> PciAddress | None:
    """The address in "00000000:18:00.0", "0000:18:00.0" or "18:00.0" (domain 0); None when
    `text` is none of these."""
    try:
        head, function = text.strip().rsplit(".", 1)
        parts = head.split(":")
        if len(parts) == 2:
            parts.insert(0, "0")
        domain, bus, device = (int(p, 16) for p in parts)
        return PciAddress(domain, bus, device, int(function, 16))
    except ValueError:
        return None
