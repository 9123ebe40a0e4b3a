"""A scenario's `processes:` entries: the job each belongs to, its workload, serving and limits."""

from __future__ import annotations

import math
import re
from typing import Any

from gpulens.catalog import MigProfile
from gpulens.sim.checks import Check, gib
from gpulens.sim.defaults import default_uid, make_container_id, make_uuid
from gpulens.sim.patterns import COMMON_KEYS, DEFAULT_SM, PATTERN_KEYS, PATTERNS, WorkloadSpec
from gpulens.sim.scenario import (
    FOREVER,
    MAX_UID,
    PINNED_MEM_LIMIT,
    PIPE_DIRECTORY,
    THREAD_PERCENTAGE,
    GpuSpec,
    Job,
    KubernetesJob,
    MappingJob,
    ProcessSpec,
    SlurmJob,
)
from gpulens.sim.serving import NON_KV_BYTES, Server, ServingSpec

# one device's entry of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=1G,1=512M"); units are binary, as the
# MPS control daemon prints them and gpulens' apply scripts write them (`<MiB>M`)
_PINNED = re.compile(r"^(\d+)=(\d+)([KMGT]?)B?$")
_PINNED_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


# a job name as people give `sbatch --job-name` in scripts: no blanks or quotes, which a label value
# and a shell line would have to escape; at most the exporter's label length
SLURM_JOB_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.+:@=-]{0,127}"
SLURM_JOB_NAME_WHAT = "a Slurm job name: 1-128 letters, digits or _.+:@=- (not starting with one of .+:@=-)"


def _parse_job(c: Check, path: str, raw: Any, k8s_defaults: dict[str, str]) -> Job:
    m = c.mapping(path, raw, (), ("slurm", "kubernetes", "mapping"))
    if len(m) != 1:
        found = " and ".join(m) or "none"
        raise c.fail(path, f"expected exactly one of slurm, kubernetes, mapping, found {found}")
    if "slurm" in m:
        p = f"{path}.slurm"
        s = c.mapping(p, m["slurm"], ("id",), ("user", "account", "step", "task", "cgroup", "name"))
        return SlurmJob(
            job_id=c.string(f"{p}.id", s["id"], r"\d+(_\d+)?", "a Slurm job id like 4711 or 4711_3"),
            user=c.string(f"{p}.user", s.get("user", "root")),
            account=c.string(f"{p}.account", s.get("account", "default")),
            step=c.string(f"{p}.step", s.get("step", 0), r"\d+|batch|extern|interactive", "a step id"),
            task=c.integer(f"{p}.task", s.get("task", 0), 0),
            cgroup=c.choice(f"{p}.cgroup", s.get("cgroup", "v2"), ("v1", "v2")),  # type: ignore[arg-type]
            name=c.string(f"{p}.name", s["name"], SLURM_JOB_NAME, SLURM_JOB_NAME_WHAT) if "name" in s else "",
        )
    if "kubernetes" in m:
        p = f"{path}.kubernetes"
        k = c.mapping(
            p,
            m["kubernetes"],
            ("namespace", "pod"),
            ("uid", "container", "container_id", "qos", "driver", "runtime", "cgroup"),
        )
        ns = c.string(f"{p}.namespace", k["namespace"], r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", "a namespace name")
        pod = c.string(f"{p}.pod", k["pod"], r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?", "a pod name")
        container = c.string(f"{p}.container", k.get("container", "main"))
        pod_uid = c.string(
            f"{p}.uid",
            k.get("uid", make_uuid("pod", ns, pod)),
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "a pod UID like 3f1c2a9e-5b7d-4e21-9a0c-1d2e3f405162",
        )
        cid = c.string(
            f"{p}.container_id",
            k.get("container_id", make_container_id(ns, pod, container)),
            r"[0-9a-f]{64}",
            "a 64-hex-digit container id",
        )
        return KubernetesJob(
            namespace=ns,
            pod=pod,
            pod_uid=pod_uid,
            container=container,
            container_id=cid,
            qos=c.choice(f"{p}.qos", k.get("qos", "burstable"), ("guaranteed", "burstable", "besteffort")),  # type: ignore[arg-type]
            driver=c.choice(
                f"{p}.driver", k.get("driver", k8s_defaults.get("driver", "systemd")), ("systemd", "cgroupfs")
            ),  # type: ignore[arg-type]
            runtime=c.choice(
                f"{p}.runtime",
                k.get("runtime", k8s_defaults.get("runtime", "containerd")),
                ("containerd", "cri-o"),
            ),  # type: ignore[arg-type]
            cgroup=c.choice(f"{p}.cgroup", k.get("cgroup", k8s_defaults.get("cgroup", "v2")), ("v1", "v2")),  # type: ignore[arg-type]
        )
    p = f"{path}.mapping"
    mm = c.mapping(p, m["mapping"], ("id",), ())
    return MappingJob(job_id=c.string(f"{p}.id", mm["id"], r"[A-Za-z0-9_.\-]+", "a job id"))


def parse_workload(c: Check, path: str, raw: Any, limit_bytes: int, limit_what: str) -> WorkloadSpec:
    if not isinstance(raw, dict):
        raise c.expected(path, "a mapping", raw)
    pattern = c.choice(f"{path}.pattern", raw.get("pattern"), PATTERNS)
    m = c.mapping(
        path,
        raw,
        ("pattern", "memory"),
        tuple(k for k in (*COMMON_KEYS, *PATTERN_KEYS[pattern]) if k not in ("pattern", "memory")),
    )
    memory = c.size(f"{path}.memory", m["memory"])
    if memory > limit_bytes:
        raise c.expected(f"{path}.memory", f"at most {gib(limit_bytes)} ({limit_what})", m["memory"])
    sm = c.fraction(f"{path}.sm", m.get("sm", DEFAULT_SM[pattern]))
    kwargs: dict[str, Any] = {"pattern": pattern, "memory_bytes": memory, "sm": sm}
    for key in ("tensor", "occupancy"):
        if key in m:
            value = c.fraction(f"{path}.{key}", m[key])
            if value > sm:
                raise c.expected(f"{path}.{key}", f"at most sm ({sm})", m[key])
            kwargs[key] = value
    if "dram" in m:
        kwargs["dram"] = c.fraction(f"{path}.dram", m["dram"])
    if "pcie_gbps" in m:
        kwargs["pcie_gbps"] = c.number(f"{path}.pcie_gbps", m["pcie_gbps"], 0, 128)
    if "nvlink_gbps" in m:
        kwargs["nvlink_gbps"] = c.number(f"{path}.nvlink_gbps", m["nvlink_gbps"], 0, 1800)
    if "busy" in m:
        busy = c.fraction(f"{path}.busy", m["busy"])
        if busy < sm:
            raise c.expected(
                f"{path}.busy", f"at least sm ({sm}): a kernel runs whenever SMs are active", m["busy"]
            )
        kwargs["busy"] = busy
    if "duty" in m:
        duty = c.fraction(f"{path}.duty", m["duty"])
        if duty < sm or duty == 0:
            raise c.expected(f"{path}.duty", f"at least sm ({sm}) and above 0", m["duty"])
        kwargs["duty"] = duty
    for key, field in (
        ("step", "step_seconds"),
        ("period", "period_seconds"),
        ("slot", "slot_seconds"),
        ("over", "over_seconds"),
    ):
        if key in m:
            value = c.duration(f"{path}.{key}", m[key])
            if value <= 0:
                raise c.expected(f"{path}.{key}", "a duration above 0", m[key])
            kwargs[field] = value
    if "warmup" in m:
        kwargs["warmup_seconds"] = c.duration(f"{path}.warmup", m["warmup"])
    if "rate" in m:
        kwargs["rate"] = c.fraction(f"{path}.rate", m["rate"])
    if "active" in m:
        kwargs["active"] = c.fraction(f"{path}.active", m["active"])
    if "memory_start" in m:
        start = c.size(f"{path}.memory_start", m["memory_start"])
        if start > memory:
            raise c.expected(f"{path}.memory_start", "at most memory", m["memory_start"])
        kwargs["memory_start_bytes"] = start
    if "repeat" in m:
        kwargs["repeat"] = c.boolean(f"{path}.repeat", m["repeat"])
    return WorkloadSpec(**kwargs)


def parse_process(
    c: Check,
    path: str,
    raw: Any,
    gpus: tuple[GpuSpec, ...],
    users: dict[str, int],
    k8s_defaults: dict[str, str],
    instances: dict[int, dict[int, MigProfile]],
) -> ProcessSpec:
    m = c.mapping(
        path,
        raw,
        ("pid", "gpu", "workload"),
        (
            "instance",
            "kind",
            "name",
            "cmdline",
            "user",
            "uid",
            "job",
            "start",
            "end",
            "environ",
            "memory_limit",
            "serving",
        ),
    )
    pid = c.integer(f"{path}.pid", m["pid"], 2, 4194304)
    gpu_index = c.integer(f"{path}.gpu", m["gpu"])
    if not 0 <= gpu_index < len(gpus):
        raise c.expected(f"{path}.gpu", f"a GPU index from 0 to {len(gpus) - 1}", gpu_index)
    gpu = gpus[gpu_index]
    instance: int | None = None
    limit, limit_what = gpu.model.memory_bytes, f"memory of {gpu.model.key}"
    if gpu.mig is not None:
        ids = sorted(instances[gpu_index])
        if "instance" not in m:
            raise c.fail(
                f"{path}.instance",
                f"expected a GPU instance id (GPU {gpu_index} is in MIG mode: "
                f"{', '.join(map(str, ids)) or 'none'}), found nothing",
            )
        instance = c.integer(f"{path}.instance", m["instance"])
        if instance not in ids:
            raise c.expected(
                f"{path}.instance",
                f"a GPU instance id of GPU {gpu_index} ({', '.join(map(str, ids)) or 'none'})",
                instance,
            )
        profile = instances[gpu_index][instance]
        limit, limit_what = profile.memory_bytes, f"memory of MIG {profile.name}"
    elif "instance" in m:
        raise c.expected(
            f"{path}.instance", f"no instance (GPU {gpu_index} is not in MIG mode)", m["instance"]
        )
    kind = c.choice(f"{path}.kind", m.get("kind", "compute"), ("compute", "graphics", "mps_client"))
    if kind == "mps_client" and gpu.mps is None:
        raise c.expected(f"{path}.kind", f"compute or graphics (GPU {gpu_index} runs no MPS server)", kind)
    if kind != "mps_client" and gpu.mps is not None:
        raise c.expected(
            f"{path}.kind", f"mps_client (GPU {gpu_index} runs MPS in exclusive-process mode)", kind
        )
    job = _parse_job(c, f"{path}.job", m["job"], k8s_defaults) if m.get("job") is not None else None
    default_user = job.user if isinstance(job, SlurmJob) else "root"
    user = c.string(f"{path}.user", m.get("user", default_user))
    uid = c.integer(f"{path}.uid", m["uid"], 0, MAX_UID) if "uid" in m else users.get(user, default_uid(user))
    name = c.string(f"{path}.name", m.get("name", "python"))
    cmdline_raw = m.get("cmdline", [name])
    if isinstance(cmdline_raw, str):
        cmdline = tuple(cmdline_raw.split())
    else:
        cmdline = tuple(
            c.string(f"{path}.cmdline[{i}]", a) for i, a in enumerate(c.list_(f"{path}.cmdline", cmdline_raw))
        )
    if not cmdline:
        raise c.expected(f"{path}.cmdline", "at least one word", cmdline_raw)
    start = c.duration(f"{path}.start", m.get("start", 0), negative=True)
    end = c.duration(f"{path}.end", m["end"], negative=True, forever=True) if "end" in m else FOREVER
    if end <= start:
        raise c.expected(f"{path}.end", f"a time after start ({start:g}s)", m.get("end"))
    env = c.any_mapping(f"{path}.environ", m.get("environ", {}))
    environ = tuple((str(k), c.string(f"{path}.environ.{k}", v)) for k, v in env.items())
    serving = None
    workload_raw = m["workload"]
    if "serving" in m:
        serving = parse_serving(c, f"{path}.serving", m["serving"], job, limit)
        if isinstance(workload_raw, dict):
            if "memory" in workload_raw:
                raise c.expected(
                    f"{path}.workload.memory",
                    "nothing (a serving process holds what its server pre-allocates)",
                    workload_raw["memory"],
                )
            workload_raw = {**workload_raw, "memory": serving.reserved_bytes(limit)}
    workload = parse_workload(c, f"{path}.workload", workload_raw, limit, limit_what)
    sm_cap, memory_limit = _limits(c, path, m, dict(environ), kind, gpu)
    if workload.nvlink_gbps and not gpu.nvlink:
        raise c.expected(
            f"{path}.workload.nvlink_gbps",
            f"0 (GPU {gpu_index} exposes no NVLink: nvlink: false)",
            m["workload"]["nvlink_gbps"],
        )
    return ProcessSpec(
        pid=pid,
        gpu=gpu_index,
        instance=instance,
        kind=kind,  # type: ignore[arg-type]
        name=name,
        cmdline=cmdline,
        user=user,
        uid=uid,
        job=job,
        start=start,
        end=end,
        workload=workload,
        environ=environ,
        sm_cap=sm_cap,
        memory_limit_bytes=memory_limit,
        serving=serving,
    )


# each server's pre-allocation flag (the `serving:` key) and its default
FLAGS = {
    Server.VLLM: ("gpu_memory_utilization", 0.9),
    Server.SGLANG: ("mem_fraction_static", 0.88),
    Server.TRITON: ("kv_cache_free_gpu_mem_fraction", 0.9),
}


def parse_serving(c: Check, path: str, raw: Any, job: Job | None, device_bytes: int) -> ServingSpec:
    """A process's `serving:` block: the server, its pre-allocation flags and its load."""
    if not isinstance(job, KubernetesJob):
        raise c.expected(
            path.rsplit(".", 1)[0] + ".job",
            "a kubernetes job (a server's metrics join its job by namespace and pod)",
            job,
        )
    if not isinstance(raw, dict):
        raise c.expected(path, "a mapping", raw)
    server = Server(c.choice(f"{path}.server", raw.get("server"), tuple(Server)))
    # each server's pre-allocation flag and its default; a Triton server runs TensorRT-LLM, whose
    # model is conventionally named `tensorrt_llm`
    flag, default = FLAGS[server]
    optional = (
        ("model", "queue", flag)
        + (("kv_cache_memory",) if server is Server.VLLM else ())
        + (() if server is Server.TRITON else ("preemptions_per_hour",))
    )
    m = c.mapping(path, raw, ("server", "weights", "kv_peak"), optional)
    weights = c.size(f"{path}.weights", m["weights"])
    fraction = c.fraction(f"{path}.{flag}", m.get(flag, default))
    kv_set = c.size(f"{path}.kv_cache_memory", m["kv_cache_memory"]) if "kv_cache_memory" in m else None
    spec = ServingSpec(
        server=server,
        model_name=c.string(
            f"{path}.model", m.get("model", "tensorrt_llm" if server is Server.TRITON else "model")
        ),
        weights_bytes=weights,
        memory_fraction=fraction,
        kv_cache_memory_bytes=kv_set,
        kv_peak=c.fraction(f"{path}.kv_peak", m["kv_peak"]),
        queue=c.number(f"{path}.queue", m.get("queue", 0), 0, 10_000),
        preemptions_per_hour=c.number(
            f"{path}.preemptions_per_hour", m.get("preemptions_per_hour", 0), 0, 1e6
        ),
        device_bytes=device_bytes,
    )
    if spec.pool_bytes(device_bytes) <= 0:
        raise c.expected(
            f"{path}.{flag}",
            f"a fraction whose share of {gib(device_bytes)} holds the weights and "
            f"{gib(NON_KV_BYTES)} of non-KV memory with room for a KV cache",
            fraction,
        )
    if spec.reserved_bytes(device_bytes) > device_bytes:
        raise c.expected(
            f"{path}.kv_cache_memory", f"a pool that fits {gib(device_bytes)} with the weights", kv_set
        )
    return spec


def _limits(
    c: Check, path: str, m: dict[str, Any], env: dict[str, str], kind: str, gpu: GpuSpec
) -> tuple[float | None, int | None]:
    """(SM cap, memory limit) of a process: an MPS client runs under its server's active thread
    percentage and pinned memory limit (the control daemon's, `gpus[].mps.active_thread_percentage`
    and `pinned_memory_limit`), which its own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT can only lower, read from its environment as the CUDA runtime
    does (a process without MPS ignores those variables); `memory_limit` is what a framework sets
    (PyTorch's per-process memory fraction, TensorFlow's memory limit); the lowest limit holds."""
    limit = None
    if "memory_limit" in m:
        limit = c.size(f"{path}.memory_limit", m["memory_limit"])
        if limit <= 0:
            raise c.expected(f"{path}.memory_limit", "a size above 0", m["memory_limit"])
    if kind != "mps_client" or gpu.mps is None:
        return None, limit
    daemon = gpu.mps.active_thread_percentage
    if PIPE_DIRECTORY in env and env[PIPE_DIRECTORY] != gpu.mps.pipe_dir:
        # a client behind another pipe directory would reach another daemon (or none), not this server
        raise c.expected(
            f"{path}.environ.{PIPE_DIRECTORY}",
            f"{gpu.mps.pipe_dir} (GPU {gpu.index}'s mps.pipe_dir) or nothing",
            env[PIPE_DIRECTORY],
        )
    cap = daemon / 100 if daemon < 100 else None  # the daemon's 100 %: the whole GPU, no cap
    if THREAD_PERCENTAGE in env:
        raw = env[THREAD_PERCENTAGE]
        try:
            pct = float(raw)
        except ValueError:
            pct = math.nan
        if not 0 < pct <= 100:
            raise c.expected(f"{path}.environ.{THREAD_PERCENTAGE}", "a percentage above 0, at most 100", raw)
        cap = min(pct, daemon) / 100
    if PINNED_MEM_LIMIT in env:
        pinned = parse_pinned_limit(env[PINNED_MEM_LIMIT])
        if pinned is None:
            raise c.expected(
                f"{path}.environ.{PINNED_MEM_LIMIT}",
                "device limits like '0=20G' or '0=20480M,1=8G' (device 0: the process's GPU)",
                env[PINNED_MEM_LIMIT],
            )
        if pinned:  # no entry for device 0: this process's GPU is not limited
            limit = pinned if limit is None else min(limit, pinned)
    default = gpu.mps.pinned_memory_limit  # the daemon's: a client's own can only lower it
    if default is not None:
        limit = default if limit is None else min(limit, default)
    return cap, limit


def parse_pinned_limit(value: str) -> int | None:
    """Device 0's limit in bytes from a CUDA_MPS_PINNED_DEVICE_MEM_LIMIT value (0: none for device
    0), or None when the value is malformed. A process here sees one GPU: device 0."""
    found = 0
    for part in value.split(","):
        match = _PINNED.match(part.strip())
        if match is None or int(match[2]) == 0:
            return None
        if match[1] == "0":
            found = int(match[2]) * _PINNED_UNITS[match[3]]
    return found
