"""The PromQL text of the queries every Prometheus run starts with: identity and rule coverage.

Kept apart from `prometheus.py` (which needs pandas) so the CLI can ask them (`ask_first`)
before it imports the analysis; `prometheus.py` builds the very same text from here, so the
answers asked ahead are the ones its calls take.
"""

from __future__ import annotations

from gpulens.analyzer import signals
from gpulens.analyzer.sources import rules
from gpulens.analyzer.sources.promclient import PromClient

JOB_INFO = f'gpu_job_info{{job_source!="{signals.SYSTEM_SOURCE}"}}'
GPU_INFO = "gpu_info"
MIG_INFO = "gpu_mig_instance_info"
TOPOLOGY_INFO = "gpu_topology_info"  # absent from older exporters: no topology, no finding


def labels(family: str, window_s: float) -> str:
    """Every series of `family` with a sample in the window, with its labels (its last sample)."""
    return f"last_over_time({family}[{int(window_s)}s])"


def memory_totals(window_s: float) -> str:
    """Each GPU's largest total memory in the window."""
    return f"max by (uuid) (max_over_time(gpu_memory_total_bytes[{int(window_s)}s]))"


def thread_caps(window_s: float) -> str:
    """Each job's MPS thread cap at the window's end (`profile.thread_caps_now`): the last sample
    of each of its series, the largest. One query over the family's few series (MPS clients only),
    the same on the raw and the rule path: it needs no recording rule."""
    return f"max by (job_id) (last_over_time({signals.THREAD_CAP}[{int(window_s)}s]) > 0)"


def coverage(window_s: float) -> str:
    """The analyzer rules' heartbeat over the window, one `stat` per figure (`rule_coverage`)."""
    hb, idle, w = rules.HEARTBEAT, rules.IDLE_BELOW, f"{int(window_s)}s"
    drop = rules.RESTART_DROP
    return " or ".join(
        f'label_replace({e}, "stat", "{stat}", "", "")'
        for stat, e in (
            ("first", f"min(min_over_time({hb}[{w}]))"),
            ("last", f"max(max_over_time({hb}[{w}]))"),
            ("interval", f"min(quantile_over_time(0.5, idelta({hb}[1h])[{w}:1h]))"),
            ("evaluations", f"sum(count_over_time({hb}[{w}]))"),
            ("idle_evaluations", f"sum(count_over_time({idle}[{w}]))"),
            ("idle_min", f"min(min_over_time({idle}[{w}]))"),
            ("idle_max", f"max(max_over_time({idle}[{w}]))"),
            ("restart_evaluations", f"sum(count_over_time({drop}[{w}]))"),
            ("restart_min", f"min(min_over_time({drop}[{w}]))"),
            ("restart_max", f"max(max_over_time({drop}[{w}]))"),
        )
    )


def first(window_s: float, with_coverage: bool) -> list[str]:
    """What a run asks at the window's end before anything else, the rules' coverage first (it
    is the quickest, and the rule path's next queries wait for it)."""
    head = [coverage(window_s)] if with_coverage else []
    return [
        *head,
        labels(JOB_INFO, window_s),
        labels(GPU_INFO, window_s),
        labels(MIG_INFO, window_s),
        memory_totals(window_s),
        thread_caps(window_s),
    ]


def ask_first(client: PromClient, window_s: float, end: float, with_coverage: bool) -> None:
    """Ask `first(...)` ahead (`PromClient.ask`): a run then takes the answers as it needs them."""
    for expr in first(window_s, with_coverage):
        client.ask(expr, end)
