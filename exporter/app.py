"""The exporter as a library: sampler + collectors + renderer, with or without HTTP.

Entry points (also used by the analyzer's history generator, which writes a simulated week as
OpenMetrics without starting a server):

    from gpulens.exporter.app import Exporter
    from gpulens.exporter.config import ExporterConfig

    exporter = Exporter(config)             # real NVML; Exporter(config, node=node) for a simulated one
    snapshot = exporter.sample_once()       # one blocking sample at the (simulated) current time
    families = exporter.families(snapshot)  # list[prometheus_client Metric], meta metrics included
    rendered = exporter.render(snapshot)    # text / OpenMetrics bytes (plain and gzip)
    exporter.close()

`sample_once` drains pending Xid events synchronously, so no background thread is needed; pass
`node=` (a simulated node already installed by `gpulens.sim`) to drive the clock yourself. The
exporter never builds a simulator: the CLI's `--simulate` branch does (`gpulens.sim.node`).
`start()` runs the background sampling loop and the Xid watcher thread; `current` is the last
published (snapshot, rendered).
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric

from gpulens.exporter.attribution import AttributionConfig, Attributor, DeviceRef, ProcessRef
from gpulens.exporter.attribution.resourceslices import KubeApi, in_cluster_api
from gpulens.exporter.backends.events import XidWatcher
from gpulens.exporter.backends.nvml import NvmlBackend, error_text
from gpulens.exporter.backends.profiling_source import make_profiler_factory
from gpulens.exporter.collectors import REGISTRY, CollectorOptions, enabled
from gpulens.exporter.collectors import exporter as meta
from gpulens.exporter.config import ExporterConfig
from gpulens.exporter.hints import no_gpu_hint
from gpulens.exporter.render import Rendered, Renderer
from gpulens.exporter.sampler import Sampler, SamplerSettings
from gpulens.exporter.snapshot import NO_PROCESSES, Area, AreaTiming, NodeSnapshot, sm_figure
from gpulens.httpd.metrics import families as http_families
from gpulens.httpd.server import Server, freeze_startup_heap
from gpulens.selfmetrics import SelfMetrics

SWITCH_INTERVAL = 0.0005  # seconds a thread may hold the GIL while others wait (CPython default 0.005)
# allocations of tracked objects between young-generation collections (CPython default 700); see start()
GC_YOUNG_THRESHOLD = 20_000


@dataclass(frozen=True)
class Published:
    """What scrapes read: swapped atomically after each sample."""

    snapshot: NodeSnapshot
    rendered: Rendered
    statuses: dict[str, AreaTiming]
    ready: bool


def node_hostname(simulated: str | None = None) -> str:
    """The node's name as dcgm-exporter labels series: $NODE_NAME (Kubernetes downward API), else a
    simulated node's host name, else the OS host name."""
    return os.environ.get("NODE_NAME") or simulated or socket.gethostname()


def _exposed_name(family: Metric) -> str:
    """The name a family's samples carry on the wire (`<name>_total` for a counter)."""
    return family.samples[0].name if family.samples else family.name


class Exporter:
    """Sampler, collectors and renderer for one node; see the module docstring for the entry points.

    `node` is an already installed simulated node (its clock drives sampling timestamps, GPM windows,
    NVML retry backoff and Xid timestamps, and its fake procfs is read unless `config.procfs` is
    set). Without it the exporter reads the real NVML library.
    """

    def __init__(
        self,
        config: ExporterConfig,
        *,
        node: Any = None,
        clock: Callable[[], float] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.config = config
        self.log = logger or logging.getLogger("gpulens.exporter")
        # keeps each family's label prefixes and last body between cycles (render.py); rendering
        # happens on the sampling thread only
        self._renderer = Renderer()
        self.node = node
        procfs = config.procfs
        if node is not None and procfs is None and getattr(node, "procfs_root", None):
            procfs = Path(node.procfs_root)
        self.procfs = procfs or Path("/proc")
        if clock is None:
            clock = self.node.clock.now if self.node is not None else time.time
        self.clock = clock
        self.backend_name = (
            f"simulated ({config.simulate})" if config.simulate else ("simulated" if node else "nvml")
        )

        self.compat_spec = config.compat_spec()  # other exporters' names from the same snapshot
        self.enabled = enabled(config.collectors, self.compat_spec)
        # what collectors need from outside the snapshot, read once here so that they stay pure
        self.options = CollectorOptions(
            processes_max=config.processes_max,
            nvlink_per_link=config.nvlink_per_link,
            hostname=node_hostname(getattr(getattr(node, "scenario", None), "hostname", None)),
            compat=self.compat_spec,
        )
        areas = frozenset(Area(n) for n in self.enabled if REGISTRY[n].reads_nvml)
        if config.profiling == "off":
            areas -= {Area.PROFILING}
        profiler_factory = None
        if Area.PROFILING in areas:  # DCGM / GPM / NVML-only per --profiling (backends/profiling_source.py)
            profiler_factory = make_profiler_factory(config, self.clock, self.log, node=self.node)
        self._hint_logged = False

        self.backend = NvmlBackend(
            clock=self.clock,
            procfs_root=self.procfs,
            profiler_factory=profiler_factory,
            smi=self.compat_spec.nvidia_gpu_exporter,  # the fields only nvidia-smi's view needs
        )
        self.xid = XidWatcher(self.clock, self.log) if Area.XID in areas else None
        self.http: Server | None = None  # set by the HTTP server serving this exporter (server.py)
        # process_* / python_* of this process: served with the HTTP server's own series
        self.self_metrics = None if config.disable_exporter_metrics else SelfMetrics()
        self._attributor: Any = None
        if Area.JOBS in self.enabled:
            self._init_attribution()
        self.sampler = Sampler(
            self.backend,
            SamplerSettings(
                areas=areas,
                interval=config.interval,
                deadline=config.read_deadline(),
                jobs_enabled=Area.JOBS in self.enabled,
                slow_every=config.slow_every,
            ),
            clock=self.clock,
            xid=self.xid,
            poll_events_inline=True,
            attribute=self._attribute,
            logger=self.log,
            probe=self._attributor,
        )
        initial = NodeSnapshot(timestamp=0.0, duration_seconds=0.0, nvml_up=False, nvml_error="no sample yet")
        self._published = self._publish(initial, ready=False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- attribution ---------------------------------------------------------------------
    def _init_attribution(self) -> None:
        cfg = self.config
        self._attributor = Attributor(
            AttributionConfig(
                procfs_root=self.procfs,
                job_mapping_dir=cfg.job_mapping_dir,
                pod_resources_socket=cfg.pod_resources_socket,
                pod_logs_dir=cfg.pod_logs_dir,
                enable_procfs=cfg.attribution_procfs,
                enable_mapping=cfg.attribution_mapping,
                enable_pod_resources=cfg.attribution_kubernetes,
                kube_api=self._kube_api(),
                node_name=cfg.kubernetes_node_name or os.environ.get("NODE_NAME", ""),
                mapping_max_files=cfg.job_mapping_max_files,
                # a quarter of the attribution deadline: procfs and the kubelet need the rest
                mapping_budget_seconds=cfg.read_deadline() / 4,
                mps_control=cfg.mps_control,
                mps_pipe_dir=cfg.mps_pipe_dir or None,
                # at most 1 s and half the deadline a sample, whatever the number of MPS daemons
                mps_control_timeout_seconds=min(1.0, cfg.read_deadline() / 2),
            ),
            logger=logging.getLogger("gpulens.exporter.attribution"),
            # a simulated node's pods come and go on its clock (Attributor's docstring)
            pods_clock=self.clock if self.node is not None else time.monotonic,
        )

    def _kube_api(self) -> Any:
        """The API server whose ResourceSlices name DRA devices: `--kubernetes.api-url`, else the
        in-cluster one where a service-account token is mounted, else None (no lookups)."""
        cfg = self.config
        if cfg.kubernetes_api_url:
            return KubeApi(cfg.kubernetes_api_url, cfg.kubernetes_token_file, cfg.kubernetes_ca_file)
        return in_cluster_api()

    def _attribute(self, snapshot: NodeSnapshot) -> tuple[list[Any], str, list[Any]]:
        """(jobs, error, device holders) for the sampler; holders only when a compatibility view
        labels device series with them."""
        if self._attributor is None:
            return [], "attribution disabled", []
        refs: list[ProcessRef] = []
        devices: list[DeviceRef] = []
        duty: dict[int, float] = {}
        sm_active: dict[tuple[int, int | None], float] = {}
        profiled: set[int] = set()  # GPUs whose figure is SM activity, not NVML utilization
        for gpu in snapshot.gpus:
            if not gpu.up:
                continue
            mig_uuids = {m.gpu_instance: m.uuid for m in gpu.mig_instances}
            devices.append(DeviceRef(gpu.identity.index, gpu.identity.uuid))
            devices += [
                DeviceRef(gpu.identity.index, gpu.identity.uuid, m.gpu_instance, m.uuid)
                for m in gpu.mig_instances
            ]
            lists = gpu.processes or NO_PROCESSES
            for p in (*lists.processes, *lists.mps_clients):
                refs.append(
                    ProcessRef(
                        pid=p.pid,
                        gpu=gpu.identity.index,
                        uuid=gpu.identity.uuid,
                        gpu_instance=p.gpu_instance,
                        mig_uuid=mig_uuids.get(p.gpu_instance) if p.gpu_instance is not None else None,
                        kind=p.kind,
                        used_memory_bytes=p.used_memory_bytes,
                        sm_util_ratio=p.sm_util_ratio,
                    )
                )
            gpu_sm = sm_figure(gpu)
            if gpu_sm is not None:
                sm_active[(gpu.identity.index, None)] = gpu_sm
            if gpu.profiling is not None and dict(gpu.profiling.values).get("sm") is not None:
                profiled.add(gpu.identity.index)
            if gpu.device is not None and gpu.device.utilization_ratio is not None:
                duty[gpu.identity.index] = gpu.device.utilization_ratio
            for m in gpu.mig_instances:
                mig_sm = sm_figure(m)
                if mig_sm is not None:
                    sm_active[(gpu.identity.index, m.gpu_instance)] = mig_sm
        usages = self._attributor.attribute(refs, sm_active, duty, profiled)
        holders = self._attributor.holders(devices, usages) if self.compat_spec else []
        return usages, "", holders

    # ---- sampling and rendering ----------------------------------------------------------
    def sample_once(self) -> NodeSnapshot:
        """One blocking sample (bounded by the per-GPU deadline); does not publish it."""
        return self.sampler.sample()

    def families_with_status(self, snapshot: NodeSnapshot) -> tuple[list[Metric], dict[str, AreaTiming]]:
        families: list[Metric] = []
        statuses: dict[str, AreaTiming] = {}
        for name in self.enabled:
            spec = REGISTRY[name]
            read = snapshot.areas.get(name, AreaTiming(0.0, snapshot.nvml_up or not spec.reads_nvml))
            started = time.perf_counter()
            ok = read.success
            try:
                families.extend(spec.collect(snapshot, self.options))
            except Exception as exc:  # a collector bug must not take the others down
                ok = False
                self.log.error("collector %s failed: %s", name, error_text(exc))
            statuses[name] = AreaTiming(seconds=read.seconds + time.perf_counter() - started, success=ok)
        families.extend(meta.collect(snapshot, statuses))
        if self.http is not None:  # the HTTP server's own series, as of this render
            families.extend(http_families(self.http))
            if self.self_metrics is not None:  # the process's (--web.disable-exporter-metrics)
                families.extend(self.self_metrics.families())
        if self.config.metrics_allow or self.config.metrics_deny:  # --metrics.allow / --metrics.deny
            families = [f for f in families if self.config.serves_family(f.name, _exposed_name(f))]
        return families, statuses

    def families(self, snapshot: NodeSnapshot) -> list[Metric]:
        """The metric families of `snapshot` (all enabled collectors plus the exporter's own)."""
        return self.families_with_status(snapshot)[0]

    def render(self, snapshot: NodeSnapshot) -> Rendered:
        return self._renderer.render(self.families(snapshot))

    def _publish(self, snapshot: NodeSnapshot, ready: bool) -> Published:
        families, statuses = self.families_with_status(snapshot)
        return Published(
            snapshot=snapshot, rendered=self._renderer.render(families), statuses=statuses, ready=ready
        )

    def refresh(self) -> Published:
        """Sample, render and publish once (what the background loop does every interval)."""
        snapshot = self.sample_once()
        published = self._publish(snapshot, ready=True)
        self._published = published
        hint = self.hint
        if hint and not self._hint_logged:
            self.log.warning("%s", hint)
        self._hint_logged = bool(hint)
        return published

    @property
    def current(self) -> Published:
        return self._published

    @property
    def hint(self) -> str:
        """What to do when no GPU can be read on a real node (empty otherwise): for the log and the
        landing page, since "NVML unavailable" alone does not mention --simulate."""
        snap = self._published.snapshot
        if self.node is not None or not snap.timestamp or (snap.nvml_up and snap.gpu_count):
            return ""
        return no_gpu_hint(snap.nvml_error if not snap.nvml_up else "NVML sees no GPU")

    # ---- background loop -----------------------------------------------------------------
    def start(self) -> None:
        """Start the Xid watcher thread and the sampling loop (first sample immediately).

        Also shortens the interpreter's GIL switch interval (process-wide) to `SWITCH_INTERVAL`:
        while a sample runs, the GPU reader, attribution and rendering compete for
        the GIL (the simulated driver's calls never release it), and a scrape thread needing the
        GIL a few times per request waited one default 5 ms slice per busy thread each time,
        which put the scrape p99 at tens of ms. Serving a scrape needs well under 1 ms of CPU.
        The start-up heap is frozen out of the garbage collector's reach for the same reason.

        And it raises the young generation's collection threshold to `GC_YOUNG_THRESHOLD`: a
        `large` cycle allocates ~10,000 tracked objects (the snapshot, its families) that refcounting
        frees, nearly all of them acyclic; at CPython's 700 about three collections per cycle
        traversed the live part of them and promoted it to older generations to be traversed
        again, ~1-2 ms of CPU per cycle for a few dozen cyclic objects (ctypes array types).
        """
        if self._thread is not None:
            return
        if sys.getswitchinterval() > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)
        # start-up objects out of the GC's full collections, before /-/ready says yes (the tail
        # latency of scrapes during a connection flood; httpd/server.py says why)
        freeze_startup_heap()
        young, *older = gc.get_threshold()
        if 0 < young < GC_YOUNG_THRESHOLD:  # 0: collection switched off by the embedding program
            gc.set_threshold(GC_YOUNG_THRESHOLD, *older)
        if self.xid is not None:
            self.sampler.poll_events_inline = False
            self.xid.start()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="gpulens-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:
                self.log.exception("sampling cycle failed")
            next_tick += self.config.interval
            now = time.monotonic()
            if next_tick < now:  # overran: skip missed ticks instead of bursting
                next_tick = now + self.config.interval
            self._stop.wait(max(0.0, next_tick - now))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.xid is not None:
            self.xid.stop()
        self.sampler.close()
        if self._attributor is not None:
            self._attributor.close()
