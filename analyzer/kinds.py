"""The analyzer's typed vocabulary: what a recommendation proposes and what the SRE is asked to do.

Both are `StrEnum`s so that tables and JSON carry their plain values ("mps", "keep") while code
compares against members, never against bare strings.
"""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    """How a job should run (the `recommendation` column)."""

    EXCLUSIVE = "exclusive"
    MIG = "mig"
    MPS = "mps"
    TIME_SLICING = "time-slicing"
    RECLAIM = "reclaim"
    DOWNSIZE = "downsize-model"
    INSUFFICIENT_DATA = "insufficient-data"


# kinds whose GPUs are shared by several jobs at once under one device-plugin sharing mode
SHARED = frozenset({Kind.MPS, Kind.TIME_SLICING})
# kinds that hold whole GPUs
WHOLE = frozenset({Kind.EXCLUSIVE, Kind.DOWNSIZE})


class Action(StrEnum):
    """What the report asks for (the `action` column): only `change`, `reclaim` and `fix` are actions."""

    KEEP = "keep"  # already well placed: nothing to do
    CHANGE = "change"  # move to another mode, slice, limit, model or GPU
    RECLAIM = "reclaim"  # allocated and idle: give the GPU back
    FIX = "fix"  # stays where it is, but wastes memory the job does not need (hog, leak, pre-allocation)
    REVIEW = "review"  # not enough data to decide


ACTIONS = frozenset({Action.CHANGE, Action.RECLAIM, Action.FIX})
