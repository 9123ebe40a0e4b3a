"""`gpulens remediate`: an Alertmanager webhook receiver that closes the fault loop for GPU nodes.

Alerts labelled `remediate=isolate_gpu|isolate_node` (see alerts/gpu_alerts.yml) make it cordon and
taint the node through the Kubernetes API (optionally draining it with the eviction API) or drain
it in Slurm with `scontrol`; their `recovery` label (reset_gpu, reboot_node, rma) says what comes
next: a GPU reset or a node reboot through the orchestrator's own mechanism (a Job pinned to the
node; `scontrol reboot ASAP`), a hold-down once the alert resolved and the GPU stays healthy, and
the return to service (automatic with `--return-to-service`, else `gpulens remediate return
NODE`). RMA-class faults and flapping nodes stay out. Dry-run by default, idempotent, guarded by a
circuit breaker, every step in a JSON-lines audit log. docs/alerts.md describes its use.
"""
