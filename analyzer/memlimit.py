"""How much memory this process may use: the machine's, or its cgroup's limit where that is smaller.

In a container (a Kubernetes pod, a systemd unit with `MemoryMax=`) the machine's physical memory
says nothing about what the process may take before the kernel kills it: a 2 GiB pod on a 512 GiB
node would otherwise accept inputs expanding to 256 GiB. The limit is read from cgroup v2
(`memory.max`) and cgroup v1 (`memory/memory.limit_in_bytes`), at the process's own cgroup (from
`/proc/self/cgroup`) and every cgroup above it up to the mount point, the smallest winning.

Standard library only: the Prometheus path sizes its answer limit from it before pandas is imported.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
FALLBACK_BYTES = 16 * 1024**3  # when the machine will not say


def physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return FALLBACK_BYTES


def _own_cgroups(self_cgroup: Path) -> tuple[str | None, str | None]:
    """(cgroup v2 path, cgroup v1 memory controller path) of this process, None where absent."""
    v2 = v1 = None
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in self_cgroup.read_text().splitlines():
            hierarchy, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            if hierarchy == "0" and controllers == "":
                v2 = path
            elif "memory" in controllers.split(","):
                v1 = path
    return v2, v1


def _limits_up(top: Path, own: str | None, name: str) -> list[int]:
    """The limits in `name` at `top/own` and each directory above it up to `top` (a cgroup nests
    in its parents' limits). With a cgroup namespace `own` is `/` and `top` is the container's."""
    found: list[int] = []
    here = top / (own or "/").lstrip("/")
    chain = [here, *here.parents]
    for directory in chain:
        if directory != top and top not in directory.parents:
            break
        with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
            text = (directory / name).read_text().strip()
            if text != "max":
                found.append(int(text))
        if directory == top:
            break
    return [n for n in found if n > 0]


def cgroup_limit(cgroup_root: Path | None = None, self_cgroup: Path | None = None) -> int | None:
    """The smallest cgroup memory limit over this process, None when there is none (or no cgroups).

    cgroup v1 reports "no limit" as a huge number (9223372036854771712); `usable_memory` takes
    the smaller of it and the physical memory, so that needs no special case.
    """
    root = CGROUP_ROOT if cgroup_root is None else cgroup_root
    v2, v1 = _own_cgroups(SELF_CGROUP if self_cgroup is None else self_cgroup)
    limits = _limits_up(root, v2, "memory.max")
    limits += _limits_up(root / "memory", v1, "memory.limit_in_bytes")
    return min(limits) if limits else None


def usable_memory(cgroup_root: Path | None = None, self_cgroup: Path | None = None) -> int:
    """What this process may use: the physical memory or the cgroup limit, whichever is smaller."""
    limit = cgroup_limit(cgroup_root, self_cgroup)
    physical = physical_memory()
    return physical if limit is None else min(physical, limit)
