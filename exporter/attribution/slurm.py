"""Slurm job identity of a process from its cgroup (authoritative) and its environment.

The cgroup path is set by slurmstepd and cannot be changed by the job, so its job id wins over
`SLURM_JOB_ID` in the environment; the environment supplies what the cgroup lacks (user, account,
the job's name: `SLURM_JOB_NAME`, which sbatch/salloc set for every task, so no `scontrol` call).
The account goes into `JobIdentity.namespace`: it is Slurm's tenant, as the namespace is in Kubernetes.
"""

from __future__ import annotations

import pwd
import time
from collections.abc import Callable

from gpulens.exporter.attribution.model import JobIdentity
from gpulens.exporter.attribution.procfs import ProcessInfo

SOURCE_SLURM = "slurm"


class UserNames:
    """uid -> user name through NSS, cached (NSS may be LDAP: slow, so look each uid up rarely)."""

    def __init__(self, ttl_s: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[int, tuple[float, str]] = {}

    def name(self, uid: int) -> str:
        now = self._clock()
        cached = self._cache.get(uid)
        if cached is not None and now - cached[0] < self._ttl_s:
            return cached[1]
        try:
            name = pwd.getpwuid(uid).pw_name
        except (KeyError, OverflowError):
            name = str(uid)
        self._cache[uid] = (now, name)
        return name


def slurm_identity(info: ProcessInfo, users: UserNames) -> JobIdentity | None:
    """The process's Slurm job, or None when neither its cgroup nor its env names one."""
    env = info.slurm_env
    job_id = info.cgroup.slurm_job_id or env.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return None
    uid = info.cgroup.slurm_uid
    if uid is None and env.get("SLURM_JOB_UID", "").strip().isdigit():
        uid = int(env["SLURM_JOB_UID"].strip())
    if uid is None:
        uid = info.uid
    user = env.get("SLURM_JOB_USER", "").strip()
    if not user:
        user = users.name(uid) if uid is not None else ""
    return JobIdentity(
        job_id=job_id,
        source=SOURCE_SLURM,
        user=user,
        namespace=env.get("SLURM_JOB_ACCOUNT", "").strip(),
        name=env.get("SLURM_JOB_NAME", "").strip(),
        uid=uid,
    )
