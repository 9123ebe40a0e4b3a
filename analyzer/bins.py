"""The packer's records and fit tests: a job as the packer sees it (`Item`), one GPU after
consolidation (`GpuBin`) and whether a job fits a GPU (`fits`).

Fit tests (evidence, not a "more than half a GPU" rule):

- `exclusive` / `downsize-model`: one job at a time per GPU (sequential jobs may reuse it);
- `mig`: a static geometry; a new slice fits only when `migplacement.place_mig_layout` places the whole
  set (slices are not reused over time: reconfiguring needs an idle GPU; a later job reusing an
  idle slice of its profile would be sound, but the layout holds one job per slice);
- `mps`: pinned memory limits sum to at most the GPU memory, the thread caps of every job on the
  GPU to 100 % (Slurm's MPS shares are per GPU, not per instant; on Kubernetes each client's cap
  to 100 / clients, the device plugin's split), clients to the model's MPS client limit, the
  co-located SM demand to `mps.max_load` and DRAM activity to `plan.max_dram_load`;
- `time-slicing`: memory need sums to the GPU memory (no isolation), at most
  `time_slicing.max_replicas` jobs, mean activity to `plan.max_gpu_load`, the co-located SM
  demand and duty cycle (kernels of time-sliced jobs take turns, so busy time summed past one
  GPU's is waiting, however narrow the kernels) to `time_slicing.max_interference`, DRAM activity
  to `plan.max_dram_load`, and an inference server's neighbours' duty cycle to
  `serving.max_latency_increase`.

Every mode: a job runs only beside jobs of its own orchestrator (`job_source`: a pod cannot be
scheduled on a Slurm node, nor a Slurm job on a Kubernetes node), so a job of a known orchestrator
joins only a GPU whose `orchestrator` is its own or not yet known; a job of unknown source may go
with either, and cannot make a GPU mix the two.

Co-located demand (MIG isolates it, MPS and time-slicing do not): where the job and those it
meets have per-bin series (`demand`), their sum may exceed the limit in at most
`compute.max_bind_fraction` of each job's bins (two bursty jobs that never burst together
share); otherwise their p95s (MPS: sizing-percentile demand) summed over time stay within it.
`interference` reports both per shared GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpulens.analyzer import demand
from gpulens.analyzer.hosts import Orchestrator
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.modes import Mode
from gpulens.analyzer.thresholds import Thresholds
from gpulens.catalog import CatalogError, GpuModel, model_for_nvml_name
from gpulens.migplacement import place_mig_layout

UNCHANGED = "unchanged"  # the mode of a held GPU (or a model kept as it is)
KUBERNETES = Orchestrator.KUBERNETES.value
# the job sources that bind a job to their nodes: a job of any other source (none, "unknown") may
# share with either
ORCHESTRATORS = frozenset({Orchestrator.KUBERNETES.value, Orchestrator.SLURM.value})


@dataclass
class Item:
    """One job as the packer sees it."""

    job_id: str
    kind: str
    model: str
    start: float
    end: float
    gpus: int
    memory: float  # bytes needed per GPU
    sm: float  # compute demand at the sizing percentile, share of the GPU
    load: float  # mean activity as a share of the GPU (projected utilisation)
    used_hours: float
    p95: float = 0.0  # p95 compute demand, share of the GPU (interference)
    dram: float = 0.0  # p95 DRAM activity, share of the GPU's bandwidth (0 when not measured)
    # job_source: its orchestrator (`ORCHESTRATORS`); Kubernetes MPS caps follow the device plugin's split
    source: str = ""
    origin_model: str = ""  # the model the job runs on now
    origin_mode: str = ""  # how it shares now (profile `sharing`)
    origin_uuids: tuple[str, ...] = ()
    mig_profile: str | None = None
    mig_alternative: str | None = None
    thread_pct: int | None = None
    memory_limit: int | None = None
    device_memory: float = math.inf  # a model the catalog does not know: its memory from the data
    unsized: bool = False  # too little data to size: packed whole over its lifetime, not resized
    # per-bin SM demand / DRAM activity as shares of the whole GPU (`demand`); None: not measured,
    # the percentile sums decide for it (module docstring)
    sm_series: demand.Series | None = None
    dram_series: demand.Series | None = None
    # per-bin duty cycle (time running kernels, `signals.BUSY`): what a time-sliced neighbour waits for
    busy_series: demand.Series | None = None
    serving: bool = False  # an inference server whose latency next week's report judges
    # its recommended mode first, then the others it fits (`modes.modes_of`); () = only its own
    modes: tuple[Mode, ...] = ()


@dataclass
class GpuBin:
    """One GPU after consolidation."""

    name: str
    model: str
    mode: str  # a Kind value, or "unchanged"
    items: list[Item] = field(default_factory=list)
    node_group: str = ""
    mig_layout: list[dict[str, Any]] = field(default_factory=list)
    original_uuid: str = ""
    node: str = ""
    # the orchestrator of its jobs (`ORCHESTRATORS`), "" while none is known: kept by `add` and
    # `take` so the fit test compares one field, not every job's source (`fits` is the hottest call)
    orchestrator: str = ""

    def add(self, item: Item) -> None:
        """Put `item` on this GPU (every placement in the packer goes through here)."""
        self.items.append(item)
        if item.source in ORCHESTRATORS:
            self.orchestrator = item.source

    def take(self, item: Item) -> None:
        """Take `item` off this GPU; its orchestrator is its remaining jobs' again."""
        self.items.remove(item)
        self.orchestrator = next((i.source for i in self.items if i.source in ORCHESTRATORS), "")

    def admits(self, item: Item) -> bool:
        """Whether `item` may run beside this GPU's jobs as far as orchestrators go (no mix)."""
        return item.source not in ORCHESTRATORS or self.orchestrator in ("", item.source)

    def _overlapping(self, item: Item) -> list[Item]:
        """Placed items overlapping `item` (the packer's innermost loop)."""
        start, end = item.start, item.end
        return [o for o in self.items if o.start <= end and start <= o.end]

    def peaks(self, item: Item, attrs: tuple[str, ...]) -> dict[str, float]:
        """Largest sum over time of each attribute (and "count") among overlapping items, plus `item`."""
        others = self._overlapping(item)
        best = dict.fromkeys(attrs, 0.0)
        if others:  # each attribute read once per job, summed in the jobs' order at every start
            columns = {a: [getattr(o, a) or 0 for o in others] for a in attrs if a != "count"}
            spans = [(o.start, o.end) for o in others]
            for t in [item.start] + [a for a, _ in spans if a > item.start]:
                active = [n for n, (a, b) in enumerate(spans) if a <= t <= b]
                for attr, column in columns.items():
                    value = sum(map(column.__getitem__, active))
                    if value > best[attr]:
                        best[attr] = value
                if "count" in best and len(active) > best["count"]:
                    best["count"] = len(active)
        return {a: best[a] + (1 if a == "count" else (getattr(item, a) or 0)) for a in attrs}

    def within(self, item: Item, bounds: tuple[tuple[str, float], ...]) -> bool:
        """Whether `peaks(item, ...)` stays within every (attribute, bound): the same sums, in the
        same order, stopping at the first start where one goes past its bound (a refused fit,
        most first-fit probes, then costs a fraction of the peaks)."""
        own = [1 if attr == "count" else (getattr(item, attr) or 0) for attr, _ in bounds]
        if any(0.0 + x > bound for x, (_, bound) in zip(own, bounds, strict=True)):
            return False  # peaks' sums start from 0.0
        others = self._overlapping(item)
        if not others:
            return True
        spans = [(o.start, o.end) for o in others]
        # an attribute's column is read when its bound is first checked: most refusals come on
        # memory at the item's start, before the other columns are needed
        columns: list[list[float] | None] = [None] * len(bounds)
        for t in [item.start] + [a for a, _ in spans if a > item.start]:
            active = [n for n, (a, b) in enumerate(spans) if a <= t <= b]
            for k, ((attr, bound), x) in enumerate(zip(bounds, own, strict=True)):
                if attr == "count":
                    value: float = len(active)
                else:
                    column = columns[k]
                    if column is None:
                        column = columns[k] = [getattr(o, attr) or 0 for o in others]
                    value = sum(map(column.__getitem__, active))
                if value + x > bound:
                    return False
        return True

    def max_sum(self, attr: str) -> float:
        """Largest sum of `attr` over time among the placed items (committed memory, interference)."""
        return max(
            (
                sum(getattr(o, attr) or 0 for o in self.items if o.start <= i.start <= o.end)
                for i in self.items
            ),
            default=0.0,
        )

    def concurrency(self) -> int:
        return int(
            max((sum(1 for o in self.items if o.start <= i.start <= o.end) for i in self.items), default=0)
        )


def first_fit(profiles: Iterable[str | None]) -> list[tuple[str, int | None]]:
    """MIG placement requests, each at its first free start; a missing profile ("") cannot be placed."""
    return [(profile or "", None) for profile in profiles]


def _colocated(gpu: GpuBin, item: Item, figure: str) -> list[demand.Series] | None:
    """The `figure` ("sm", "dram" or "busy": duty cycle) series of `item` and of the jobs it would
    meet on `gpu`; None when one of them has none (its percentile then goes into the percentile
    sum; without duty cycles, no duty test). A job whose DRAM activity is not measured adds
    nothing to either sum."""
    out = []
    for job in [*gpu._overlapping(item), item]:
        found: demand.Series | None = getattr(job, f"{figure}_series")  # sm_series, dram_series, busy_series
        if found is None:
            if figure == "dram" and not job.dram:
                continue
            return None
        out.append(found)
    return out


def _series_within(series: list[demand.Series] | None, limit: float, th: Thresholds) -> bool:
    """Whether the co-located sum exceeds `limit` in at most `compute.max_bind_fraction` of each
    job's bins (True without series: the percentile sums decided)."""
    if series is None:
        return True
    return demand.colocated(series, limit).over_share <= th.compute.max_bind_fraction + 1e-12


def _servers_wait_within(gpu: GpuBin, item: Item, th: Thresholds) -> bool:
    """Whether each inference server among the GPU's time-sliced jobs waits little enough for its
    neighbours: while their kernels run its requests wait, so their summed duty cycle is, at first
    order, the latency they add; it may exceed `serving.max_latency_increase` (what next week's
    report rolls a server back for) in at most `compute.max_bind_fraction` of the server's bins.
    A job without a duty-cycle series leaves it to the other tests."""
    sharers = [*gpu._overlapping(item), item]
    for server in (s for s in sharers if s.serving):
        others = [o.busy_series for o in sharers if o is not server]
        if server.busy_series is None or any(o is None for o in others):
            continue
        share = demand.waits(
            server.busy_series, [o for o in others if o is not None], th.serving.max_latency_increase
        )
        if share > th.compute.max_bind_fraction + 1e-12:
            return False
    return True


def fits(gpu: GpuBin, item: Item, model: GpuModel | None, th: Thresholds) -> bool:
    """Whether `item` can join `gpu` (the fit tests of the module docstring)."""
    if gpu.mode != item.kind or gpu.model != item.model or not gpu.admits(item):
        return False
    memory_total = model.memory_bytes if model else item.device_memory
    if item.kind == Kind.EXCLUSIVE:
        return not gpu._overlapping(item)
    if item.kind == Kind.MIG:
        if model is None:
            return False
        try:
            place_mig_layout(model, first_fit([*(o.mig_profile for o in gpu.items), item.mig_profile]))
        except CatalogError:
            return False
        return True
    # Slurm's MPS shares are configured per GPU, not per instant: every client's cap counts.
    # Checked before the peaks: on a fleet of MPS GPUs nearly every first-fit probe ends here,
    # and the peaks over time are the packer's costliest step.
    if item.kind == Kind.MPS and sum(o.thread_pct or 0 for o in gpu.items) + (item.thread_pct or 0) > 100:
        return False
    if item.kind != Kind.MPS:  # time-slicing: every limit a bound, the first excess refuses
        sm, dram = _colocated(gpu, item, "sm"), _colocated(gpu, item, "dram")
        return (
            gpu.within(item, sliced_bounds(item, model, th, sm is not None, dram is not None))
            and _series_within(sm, th.time_slicing.max_interference, th)
            and _series_within(dram, th.plan.max_dram_load, th)
            # kernels of time-sliced jobs take turns: their duty cycles summed past one GPU's time
            # is time some job waits, however few SMs each keeps busy (narrow kernels)
            and _series_within(_colocated(gpu, item, "busy"), th.time_slicing.max_interference, th)
            and _servers_wait_within(gpu, item, th)
        )
    # one pass over the GPU's items for every limit of MPS (the packer's hottest call)
    peak = gpu.peaks(item, ("memory", "dram", "count", "sm"))
    if peak["memory"] > memory_total:
        return False
    clients = th.mps.max_clients or (model.mps_max_clients if model else 48)
    if peak["count"] > clients:
        return False
    dram = _colocated(gpu, item, "dram")
    if dram is None and peak["dram"] > th.plan.max_dram_load + 1e-9:
        return False
    sm = _colocated(gpu, item, "sm")
    if sm is None and peak["sm"] > th.mps.max_load + 1e-9:
        return False
    if not (_series_within(dram, th.plan.max_dram_load, th) and _series_within(sm, th.mps.max_load, th)):
        return False
    sharers = [*gpu._overlapping(item), item]
    if any(o.source == KUBERNETES for o in sharers):
        split = 100 // int(peak["count"])
        return all((o.thread_pct or 0) <= split for o in sharers)
    return True


def sliced_bounds(
    item: Item, model: GpuModel | None, th: Thresholds, sm_series: bool, dram_series: bool
) -> tuple[tuple[str, float], ...]:
    """A time-sliced GPU's limits for `item`, in the order `GpuBin.within` checks them; the p95
    sums of SM demand and DRAM activity only where the co-located series do not decide."""
    bounds: list[tuple[str, float]] = [("memory", model.memory_bytes if model else item.device_memory)]
    if not dram_series:
        bounds.append(("dram", th.plan.max_dram_load + 1e-9))
    bounds += [("count", th.time_slicing.max_replicas), ("load", th.plan.max_gpu_load + 1e-9)]
    if not sm_series:
        bounds.append(("p95", th.time_slicing.max_interference + 1e-9))
    return tuple(bounds)


def size_of(item: Item) -> float:
    model = model_for_nvml_name(item.model)
    return max(item.memory / (model.memory_bytes if model else item.device_memory), item.sm, item.load)


def is_resident(item: Item) -> bool:
    """The job already runs this way, on this model: it has a GPU of the packing's kind now."""
    return item.kind == item.origin_mode and item.model == item.origin_model and bool(item.origin_uuids)
