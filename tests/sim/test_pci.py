"""PCI addresses: the spellings NVML accepts for a bus id, and the two forms it prints."""

from __future__ import annotations

import pytest

from gpulens.sim.pci import PciAddress, parse_bus_id


@pytest.mark.parametrize("text", ["00000000:2A:00.1", "0000:2a:00.1", "2A:00.1", " 00000000:2a:00.1\n"])
def test_every_domain_width_and_case_names_the_same_address(text: str) -> None:
    assert parse_bus_id(text) == PciAddress(domain=0, bus=0x2A, device=0, function=1)


@pytest.mark.parametrize("text", ["", "2A:00", "2A.0", "0:0:2A:00.0", "zz:00.0", "00:00.x"])
def test_a_text_that_is_no_bus_id_gives_none(text: str) -> None:
    assert parse_bus_id(text) is None


def test_an_address_prints_as_nvml_prints_busid_and_busidlegacy() -> None:
    address = PciAddress(domain=1, bus=0xB3, device=0x1F, function=7)
    assert (address.bus_id, address.legacy_bus_id) == ("00000001:B3:1F.7", "0001:B3:1F.7")
