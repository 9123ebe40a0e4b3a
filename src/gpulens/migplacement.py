"""MIG placement: where a layout's GPU instances go on a model's memory slices, or why they cannot.

The geometry (each profile's `placement_starts`, `placement_size`, `max_instances` and the
model's compute and memory slices) is catalog data (`catalog.py`); this module only searches it.
Shared by the simulator (scenario layouts, `mig_create`), the analyzer's plan and its mig-parted
check, so it lives in the core.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpulens.catalog import CatalogError, GpuModel, MigProfile


@dataclass(frozen=True)
class Placement:
    """A MIG instance placed on the memory axis."""

    profile: MigProfile
    start: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.profile.placement_size)


def place_mig_layout(model: GpuModel, requests: Sequence[tuple[str, int | None]]) -> list[Placement]:
    """Place MIG instances; `requests` are (profile name, start slice or None for first fit).

    Raises CatalogError naming the first instance that cannot be placed. Explicit starts are
    placed first so first-fit instances go around them.
    """
    if not model.mig_capable:
        raise CatalogError(f"{model.key} does not support MIG")
    profiles = [(model.mig_profile(name), start) for name, start in requests]
    compute = sum(p.compute_slices for p, _ in profiles)
    if compute > model.compute_slices:
        raise CatalogError(
            f"layout needs {compute} compute slices but {model.key} has {model.compute_slices}"
        )
    for profile in {p for p, _ in profiles}:
        count = sum(1 for p, _ in profiles if p == profile)
        if count > profile.max_instances:
            raise CatalogError(
                f"{count} x {profile.name} exceeds the maximum of {profile.max_instances} on {model.key}"
            )
    for profile, start in profiles:
        if start is not None and start not in profile.placement_starts:
            raise CatalogError(
                f"{profile.name} cannot start at memory slice {start} on {model.key}; "
                f"valid starts: {list(profile.placement_starts)}"
            )
    # explicit starts first, then the widest instances: they have the fewest valid starts
    order = sorted(
        range(len(profiles)), key=lambda i: (profiles[i][1] is None, -profiles[i][0].placement_size)
    )
    placed: dict[int, Placement] = {}

    def search(position: int, used: frozenset[int]) -> bool:
        """Backtracking over valid starts: greedy first fit strands slices (3g at 0 + 1g's)."""
        if position == len(order):
            return True
        i = order[position]
        profile, start = profiles[i]
        for candidate in [start] if start is not None else profile.placement_starts:
            span = frozenset(range(candidate, candidate + profile.placement_size))
            if not span & used and search(position + 1, used | span):
                placed[i] = Placement(profile, candidate)
                return True
        return False

    if not search(0, frozenset()):
        names = " + ".join(f"{p.name}" + (f"@{s}" if s is not None else "") for p, s in profiles)
        raise CatalogError(f"MIG layout {names} does not fit the memory slices of {model.key}")
    return [placed[i] for i in range(len(profiles))]
