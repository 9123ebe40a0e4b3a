"""Generated files kept in step with their sources: write what differs, remove what is stale.

The dashboards' build, the mixin's build and the Helm chart's generator all end the same way: a
set of wanted files (path -> text) is compared with the tree, the differing ones are written (or,
with `check`, only listed, which is how the tests and CI find a stale build) and files the build
no longer makes are removed. One copy of that step, here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Outcome:
    """What a build wrote (or, with check, what differs from a fresh build)."""

    changed: list[Path]
    removed: list[Path]


def read(path: Path) -> str | None:
    """The file's text, or None when it does not exist yet."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def sync(wanted: Mapping[Path, str], present: Iterable[Path] = (), *, check: bool) -> Outcome:
    """Write each wanted file whose text differs and remove the `present` files that are not
    wanted (the build no longer makes them), in the order given; with `check`, touch nothing and
    only say what would change."""
    changed = [path for path, text in wanted.items() if read(path) != text]
    removed = [path for path in present if path not in wanted]
    if not check:
        for path in changed:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(wanted[path], encoding="utf-8")
        for path in removed:
            path.unlink()
    return Outcome(changed=changed, removed=removed)
