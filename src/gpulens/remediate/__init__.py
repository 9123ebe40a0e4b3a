"""`gpulens remediate`: an Alertmanager webhook receiver that isolates faulty GPUs' nodes.

Alerts labelled `remediate=isolate_gpu|isolate_node` (see alerts/gpu_alerts.yml) make it cordon and
taint the node through the Kubernetes API (optionally draining it with the eviction API) or drain
it in Slurm with `scontrol`. Dry-run by default, idempotent, guarded by a circuit breaker, and it
never returns a node to service by itself. docs/alerts.md describes its use.
"""
