"""The Kubernetes backend that fences one GPU where the cluster can, and the node where it cannot.

A GPU-level fault (`isolate_gpu`, recovery other than `reboot_node`) on a cluster that serves DRA
device taints and publishes the GPU in a ResourceSlice gets one `DeviceTaintRule` per device of
that GPU (the GPU, or each of its MIG devices) and the node stays schedulable: its other GPUs keep
taking work. The taint is `NoExecute` for the reset class (NVIDIA's RESET_GPU: the GPU's processes
must stop before `nvidia-smi -r`), `NoSchedule` otherwise (running work may finish). Everything
else (node-level faults, device-plugin clusters, a GPU no DRA driver publishes) cordons and taints
the node as `KubernetesIsolator` does.

The episode keeps the rules' names (`Episode.fence`): the reconciler checks they still exist
before each step (a person deleting one returned the GPU by hand) and deletes them to return it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from gpulens.httpclient import Deadline
from gpulens.remediate.dra import DeviceTaints, DraError, DraMode, Effect, rule, rule_name
from gpulens.remediate.episodes import Episode, Recovery
from gpulens.remediate.kubernetes import TAINT_KEY, KubernetesIsolator, taint_value
from gpulens.remediate.model import IsolationRequest, Outcome


def effect_of(recovery: Recovery) -> Effect:
    """NoExecute where the catalogue's action needs the GPU idle (a reset), else NoSchedule."""
    return Effect.NO_EXECUTE if recovery is Recovery.RESET_GPU else Effect.NO_SCHEDULE


def gpu_level(request: IsolationRequest) -> bool:
    """A fault of one GPU that one GPU's fence contains: not a node-level kind or recovery."""
    return (
        request.kind == "isolate_gpu"
        and bool(request.uuid)
        and Recovery.from_label(request.recovery) is not Recovery.REBOOT_NODE
    )


@dataclass
class FencingKubernetesIsolator(KubernetesIsolator):
    taints: DeviceTaints | None = field(default=None)

    def _may_fence(self, request: IsolationRequest) -> bool:
        return self.taints is not None and self.taints.mode is not DraMode.OFF and gpu_level(request)

    def describe(self, request: IsolationRequest, now: float) -> str:
        node = super().describe(request, now)
        if not self._may_fence(request):
            return node
        assert self.taints is not None
        effect = effect_of(Recovery.from_label(request.recovery))
        return (
            f"POST {self.taints.describe()} a DeviceTaintRule {request.uuid}:{effect.value} for each "
            f"device of GPU {request.uuid} on node {request.node} (node left schedulable) where the "
            f"cluster serves DRA device taints and publishes that GPU; else {node}"
        )

    def isolate(self, request: IsolationRequest, now: float, deadline: Deadline) -> Outcome:
        if self._may_fence(request):
            assert self.taints is not None
            try:
                if self.taints.served(deadline):
                    fenced = self._fence(request, deadline)
                    if fenced is not None:
                        return fenced
            except DraError as exc:  # the node's isolation contains the fault all the same
                outcome = super().isolate(request, now, deadline)
                why = f"GPU {request.uuid} could not be fenced ({exc}): the node is isolated instead"
                return Outcome(outcome.result, f"{why}: {outcome.detail}")
        return super().isolate(request, now, deadline)

    def _fence(self, request: IsolationRequest, deadline: Deadline) -> Outcome | None:
        """Create the GPU's rules; None when no DRA driver publishes it on the node (fence the node)."""
        assert self.taints is not None
        found = self.taints.devices(request.node, request.uuid, deadline)
        if not found.faulty:
            return None
        effect = effect_of(Recovery.from_label(request.recovery))
        value = taint_value(request.alertname)
        names, created = [], 0
        try:
            for device in found.faulty:
                name = rule_name(request.episode, device)
                body = rule(name, device, effect, value, request.node, request.episode)
                created += self.taints.create(body, deadline)
                names.append(name)
        except DraError:
            for name in names:  # the node is isolated instead: leave no half fence behind
                with contextlib.suppress(DraError):
                    self.taints.delete(name, deadline)
            raise
        devices = ", ".join(f"{d.driver}/{d.pool}/{d.name}" for d in found.faulty)
        detail = (
            f"fenced GPU {request.uuid} on node {request.node}: DeviceTaintRule {', '.join(names)} "
            f"({devices}) {TAINT_KEY}={value}:{effect.value}; the node stays schedulable, "
            f"{found.other_gpus} other GPU(s) in service"
        )
        fence, kept = ",".join(names), found.other_gpus
        if not created:  # every rule was there already: an earlier try of this episode made them
            return Outcome("already", detail, fence=fence, kept_gpus=kept)
        return Outcome("applied", detail, fence=fence, kept_gpus=kept)

    # ---- the episode's fence (recovery.Recoverer) ------------------------------------------------

    def fence_in_place(self, episode: Episode, deadline: Deadline) -> bool | None:
        if self.taints is None:
            return None
        try:
            return all(self.taints.exists(name, deadline) for name in episode.fences)
        except DraError:
            return None

    def describe_return_gpu(self, episode: Episode) -> str:
        where = self.taints.describe() if self.taints is not None else "devicetaintrules"
        return f"DELETE {where}/{{{','.join(episode.fences)}}}: GPU {episode.uuid} on node {episode.node}"

    def return_gpu(self, episode: Episode, deadline: Deadline) -> Outcome:
        if self.taints is None:
            return Outcome("failed", "DRA device taints are not configured: delete the rules by hand")
        deleted = 0
        try:
            for name in episode.fences:
                deleted += self.taints.delete(name, deadline)
        except DraError as exc:
            return Outcome("failed", str(exc))
        if not deleted:
            return Outcome("already", f"GPU {episode.uuid} on node {episode.node} carries no gpulens fence")
        return Outcome(
            "applied", f"deleted DeviceTaintRule {episode.fence}: GPU {episode.uuid} on node {episode.node}"
        )
