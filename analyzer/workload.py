"""A job's workload: what stays the same when the job restarts or a rollout replaces its pod.

Applying a recommendation rolls a Kubernetes pod: a Deployment's new pod has a new ReplicaSet hash
and suffix (`chat-api-7d9f8c6b5-x2kqp` -> `chat-api-5f6b8d9c47-q8wzt`), a Job's or CronJob's run a
new suffix or timestamp. Week over week follows the workload, not the pod: on Kubernetes the
namespace and the pod's name without the controller's generated parts (a StatefulSet pod keeps
its ordinal: its name is stable). On Slurm a resubmitted job gets a new id but keeps its name
(`sbatch --job-name`, published by the exporter as `job_name` from SLURM_JOB_NAME): a named job's
workload is its user and name, cluster-wide (a node is not part of it: a move changes the node),
and an array task's its index besides (`1234_7` -> `slurm alice/sweep[7]`), so each task of a
resubmitted array follows its own predecessor. A job without a name keeps its id: an array's tasks
and reruns share the array's id, any other job is its own workload.

Owner references would be exact, but neither the exporter nor the kubelet's pod-resources answer
carries them; the generated parts follow fixed rules (Kubernetes' `rand.SafeEncodeString`
alphabet for hashes and suffixes, minutes since the epoch for CronJob runs), so stripping only
strings of that alphabet and length leaves names people chose alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# k8s.io/apimachinery/pkg/util/rand: the alphabet of generated names (no vowels, no 0/1/3)
_SAFE = "bcdfghjklmnpqrstvwxz2456789"
_SUFFIX = re.compile(rf"-[{_SAFE}]{{5}}$")  # a pod's random suffix (ReplicaSet, Job, DaemonSet)
_TEMPLATE_HASH = re.compile(rf"-[{_SAFE}]{{6,10}}$")  # a Deployment's pod-template-hash
_CRON_RUN = re.compile(r"-\d{8,}$")  # a CronJob's Job: minutes since the epoch
_ARRAY = re.compile(r"^(\d+)_(\d+|\[.*\])$")  # Slurm array task: 1234_7


def pod_owner(pod: str) -> str:
    """The controller's name a pod was generated from (the pod's own name when it was not)."""
    name = _SUFFIX.sub("", pod)
    if name == pod:
        return pod  # no generated suffix: a bare pod or a StatefulSet's (stable) pod
    return _CRON_RUN.sub("", _TEMPLATE_HASH.sub("", name)) or pod


def _text(row: Mapping[str, object], key: str) -> str:
    """The row's value as text; missing, None and NaN (a column absent from older data) are empty."""
    value = row.get(key)
    return "" if value is None or value != value else str(value)


# the columns `workload_of` reads
WORKLOAD_COLUMNS = ("job_id", "job_source", "job_namespace", "job_pod", "job_user", "job_name")


def workload_of(row: Mapping[str, object]) -> str:
    """The workload of a job row (`job_id`, `job_source`, `job_namespace`, `job_pod`, `job_user`,
    `job_name`)."""
    job_id, pod, source = _text(row, "job_id"), _text(row, "job_pod"), _text(row, "job_source")
    if source == "kubernetes" and pod:
        namespace = _text(row, "job_namespace")
        owner = pod_owner(pod)
        return f"{namespace}/{owner}" if namespace else owner
    array = _ARRAY.match(job_id)
    name = _text(row, "job_name")
    if source == "slurm" and name:
        user = _text(row, "job_user")
        task = "" if not array else array[2] if array[2].startswith("[") else f"[{array[2]}]"
        return f"slurm {user}/{name}{task}"
    if array:
        return f"slurm array {array[1]}"
    return job_id
