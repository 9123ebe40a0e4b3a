"""The per-step PromQL of one signal, shared by the raw query path and the recording rules.

`prometheus.py` wraps these expressions in subqueries for a chunk of jobs; `rules.py` records them
with "every non-system job" as the job matcher. Both import them from here, a module that imports
neither of them, so the two paths build the very same text without an import loop (standard
library only: `promqueries.py` reaches it through `rules.py` before pandas loads).
"""

from __future__ import annotations

from gpulens.analyzer import signals


def signal_expr(signal: signals.Signal, regex: str | None, how: str, uuid_regex: str | None = None) -> str:
    """Per-step, per-job aggregate of one signal (mirrors `profile._signal_steps`).

    `regex` selects the jobs; None means every non-system job (the recording rules, `rules.py`).
    `uuid_regex` (the chunk's GPUs) narrows the device side of the join to series that can match:
    the same result, but the store no longer evaluates every GPU of the cluster at every step.
    """
    sel = f'job_id=~"{regex}"' if regex is not None else f'job_source!="{signals.SYSTEM_SOURCE}"'
    dev = f'{{uuid=~"{uuid_regex}"}}' if uuid_regex is not None else ""
    if signal.scope == "job":
        own = f'{{job_id=~"{regex}"}}' if regex is not None else ""
        return f"{how} by (job_id) ({signal.family}{own} >= 0)"
    if signal.scope == "job_share":
        return f"{how} by (job_id) ({share_expr(signal, regex, dev)})"
    if signal.scope == "gpu_share":
        on_gpus = f',uuid=~"{uuid_regex}"' if uuid_regex is not None else ""
        jobs_on_gpu = f'count by (uuid) (gpu_job_info{{job_source!="{signals.SYSTEM_SOURCE}"{on_gpus}}})'
        share = f"(({signal.family}{dev} >= 0) / on(uuid) group_left() {jobs_on_gpu})"
        return f"{how} by (job_id) (gpu_job_info{{{sel}}} * on(uuid) group_left() {share})"
    on = "uuid" if signal.scope == "gpu" else "uuid, gpu_instance"
    return f"{how} by (job_id) (gpu_job_info{{{sel}}} * on({on}) group_left() ({signal.family}{dev} >= 0))"


def share_expr(signal: signals.Signal, regex: str | None, dev: str) -> str:
    """Each shared job's demand per device and step, on the scale of the whole GPU's figure
    (mirrors `profile._share_rows`): its share, at steps where the GPU publishes the remainder and
    whose figure is `signal.figure`, plus its part of the remainder in proportion to its share;
    where no job on the device has a share, the remainder split equally among them. On SM
    activity, a device with a capped MPS client at that step splits the remainder by each
    client's room under its cap instead (`capped_share_expr`).

    Every share on the device is computed, then kept for the jobs `regex` asks for (`and own`):
    the device sums are over every job on the device (`dev` selects the chunk's GPUs), never only
    the asked ones, as a GPU's jobs may fall in different chunks. They need not repeat the
    remainder and figure conditions: those hold for a whole device at a step, and `own` has them.
    """
    on = "on(uuid, gpu_instance)"
    profiled = "and" if signal.figure == signals.PROFILED_FIGURE else "unless"
    rest = f"({signals.UNATTRIBUTED}{dev} >= 0)"
    selector = f'{{job_id=~"{regex}"}}' if regex is not None else ""
    own = (
        f"(({signal.family}{selector} >= 0) and {on} {rest}"
        f" {profiled} on(uuid) ({signals.PROFILED_FIGURE}{dev} >= 0))"
    )
    every = f"({signal.family}{dev} >= 0)"
    total = f"sum by (uuid, gpu_instance) ({every})"
    count = f"count by (uuid, gpu_instance) ({every})"
    # `or` adds the equal split only where the scaled share is absent (no share on the device)
    scaled = f"{every} * {on} group_left() (({total} + {on} {rest}) / ({total} > 0))"
    split = f"{every} * 0 + {on} group_left() ({rest} / {on} {count})"
    by_share = f"({scaled} or {split})"
    if signal.figure != signals.PROFILED_FIGURE:
        return f"({by_share} and {own})"
    capped = f"({signals.THREAD_CAP}{dev} > 0)"
    by_room = capped_share_expr(every, rest, dev)
    return f"((({by_room} and {on} {capped}) or {by_share}) and {own})"


def capped_share_expr(every: str, rest: str, dev: str) -> str:
    """Each share (`every`) plus its part of the device's remainder (`rest`) by room under the MPS
    thread caps (mirrors `profile._room_split`): room = cap - share, at least 0, with cap 1 for a
    client that publishes none; each client gets room x min(1, remainder / the device's room), so
    a client at its cap gets none and what no client has room for stays unattributed."""
    on = "on(uuid, gpu_instance)"
    ids = "job_id, uuid, gpu_instance"
    cap = f"max by ({ids}) ({signals.THREAD_CAP}{dev} > 0)"
    server = f'label_replace(vector(1), "job_id", "{signals.MPS_SERVER_JOB}", "", "")'
    uncapped = f"(1 - {every}) unless on(job_id) {server}"  # the MPS server has no room
    room = f"clamp_min(({cap} - on({ids}) group_right() {every}) or ({uncapped}), 0)"
    fill = f"clamp_max({rest} / {on} (sum by (uuid, gpu_instance) ({room}) > 0), 1)"
    return f"({every} + ({room} * {on} group_left() {fill} or {every} * 0))"
