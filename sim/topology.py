"""The simulated node's GPU topology: NVLink domains, PCIe switches and NUMA nodes.

A scenario may say it (`topology:`, validated here with one-line errors); otherwise the model
family decides, as the shipped boxes are built:

- NVSwitch boards (SXM/HGX: DGX A100/H100/H200/B200): NVLink all-to-all among the GPUs of one
  model that expose NVLink;
- NVLink-bridge cards (A30, A40, H100 NVL): bridged in pairs of consecutive GPUs of one model;
- everything else: no NVLink.

PCIe: the first half of the GPUs (rounded up) sits under switch 0 on NUMA node 0, the rest under
switch 1 on NUMA node 1 (two-socket servers wire each socket's root complex to one switch). Each
NUMA node has one host bridge, so GPUs under different switches of one NUMA node meet at the host
bridge, and GPUs on different NUMA nodes only at the system level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pynvml

from gpulens.catalog import GpuModel

# cards whose NVLink is a bridge between two boards, not an NVSwitch fabric
BRIDGED_MODELS = frozenset({"A30-24GB", "A40-48GB", "H100-94GB-NVL"})
KEYS = ("nvlink", "pcie_switches", "numa_nodes")


class _Gpu(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def model(self) -> GpuModel: ...
    @property
    def nvlink(self) -> bool: ...


@dataclass(frozen=True)
class Topology:
    """Groups of GPU indexes: every GPU is in exactly one switch and one NUMA node group, and in at
    most one NVLink domain (GPUs of a domain reach each other over NVLink)."""

    nvlink_domains: tuple[tuple[int, ...], ...]
    pcie_switches: tuple[tuple[int, ...], ...]
    numa_nodes: tuple[tuple[int, ...], ...]  # position = NUMA node id

    def _group(self, groups: tuple[tuple[int, ...], ...], gpu: int) -> int | None:
        return next((n for n, members in enumerate(groups) if gpu in members), None)

    def nvlink(self, a: int, b: int) -> bool:
        domain = self._group(self.nvlink_domains, a)
        return a != b and domain is not None and domain == self._group(self.nvlink_domains, b)

    def numa_node(self, gpu: int) -> int:
        return self._group(self.numa_nodes, gpu) or 0

    def common_ancestor(self, a: int, b: int) -> int:
        """The NVML topology level (`NVML_TOPOLOGY_*`) of the pair's PCIe paths."""
        if self._group(self.pcie_switches, a) == self._group(self.pcie_switches, b):
            return int(pynvml.NVML_TOPOLOGY_SINGLE)
        if self.numa_node(a) == self.numa_node(b):
            return int(pynvml.NVML_TOPOLOGY_HOSTBRIDGE)
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)


def default_topology(gpus: Sequence[_Gpu]) -> Topology:
    """The layout of the model family (module docstring)."""
    indexes = [g.index for g in gpus]
    half = (len(indexes) + 1) // 2
    halves = tuple(group for group in (tuple(indexes[:half]), tuple(indexes[half:])) if group)
    domains: list[tuple[int, ...]] = []
    by_model: dict[str, list[int]] = {}
    for g in gpus:
        if g.nvlink and g.model.nvlink_links > 0:
            by_model.setdefault(g.model.key, []).append(g.index)
    for key, members in by_model.items():
        if key in BRIDGED_MODELS:
            domains += [tuple(members[i : i + 2]) for i in range(0, len(members) - 1, 2)]
        elif len(members) > 1:
            domains.append(tuple(members))
    return Topology(tuple(domains), halves, halves)


def parse_topology(raw: Any, gpus: Sequence[_Gpu], fail: Callable[[str, str], Exception]) -> Topology:
    """`topology:` of a scenario: any of `nvlink` (`all`, `none` or a list of GPU-index lists),
    `pcie_switches` and `numa_nodes` (lists of GPU-index lists covering every GPU once); what is
    not given keeps its default. `fail(path, message)` makes the one-line error."""
    default = default_topology(gpus)
    if not isinstance(raw, dict):
        raise fail("topology", f"expected a mapping with keys {', '.join(KEYS)}, found {_found(raw)}")
    for key in raw:
        if key not in KEYS:
            raise fail(f"topology.{key}", f"expected one of the keys {', '.join(KEYS)}, found {key!r}")
    indexes = [g.index for g in gpus]
    capable = [g.index for g in gpus if g.nvlink and g.model.nvlink_links > 0]
    domains = default.nvlink_domains
    if "nvlink" in raw:
        value = raw["nvlink"]
        if value == "all":
            domains = (tuple(capable),) if len(capable) > 1 else ()
        elif value == "none":
            domains = ()
        else:
            domains = _groups("topology.nvlink", value, indexes, fail, cover=False)
            for group in domains:
                lacking = [i for i in group if i not in capable]
                if lacking:
                    raise fail(
                        "topology.nvlink",
                        f"expected GPUs that expose NVLink, found GPU {lacking[0]} (its model has no"
                        " NVLink or its entry says nvlink: false)",
                    )
    switches = (
        _groups("topology.pcie_switches", raw["pcie_switches"], indexes, fail, cover=True)
        if "pcie_switches" in raw
        else default.pcie_switches
    )
    numa = (
        _groups("topology.numa_nodes", raw["numa_nodes"], indexes, fail, cover=True)
        if "numa_nodes" in raw
        else default.numa_nodes
    )
    topo = Topology(domains, switches, numa)
    for members in switches:
        nodes = {topo.numa_node(i) for i in members}
        if len(nodes) > 1:
            raise fail(
                "topology.pcie_switches",
                f"expected the GPUs of one switch on one NUMA node, found {list(members)}"
                f" on nodes {sorted(nodes)}",
            )
    return topo


def _groups(
    path: str, value: Any, indexes: list[int], fail: Callable[[str, str], Exception], *, cover: bool
) -> tuple[tuple[int, ...], ...]:
    what = "a list of GPU-index lists like [[0, 1, 2, 3], [4, 5, 6, 7]]"
    if not isinstance(value, list) or not all(isinstance(g, list) and g for g in value):
        raise fail(path, f"expected {what}, found {_found(value)}")
    seen: dict[int, int] = {}
    for n, group in enumerate(value):
        for i in group:
            if isinstance(i, bool) or not isinstance(i, int) or i not in indexes:
                raise fail(f"{path}[{n}]", f"expected GPU indexes 0..{len(indexes) - 1}, found {_found(i)}")
            if i in seen:
                raise fail(f"{path}[{n}]", f"expected each GPU once, found GPU {i} also in {path}[{seen[i]}]")
            seen[i] = n
    missing = [i for i in indexes if i not in seen]
    if cover and missing:
        raise fail(path, f"expected every GPU in one group, found GPU {missing[0]} in none")
    return tuple(tuple(group) for group in value)


def _found(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return repr(value)
    return "nothing" if value is None else repr(value)
