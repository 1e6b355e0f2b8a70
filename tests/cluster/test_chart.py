"""The Helm chart installed for real into the testbed: scheduling, RBAC, upgrade, uninstall.

The operator's pod runs in name only (kwok), so the chart's RBAC is proven by acting
with a token of the chart's ServiceAccount: every verb the operator uses works, and
nothing else does.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_operator.render.names import JobRef, trainer_account
from grpo_testbed.chaos import end_pod
from grpo_testbed.chart import CHART, KUBE_VERSION
from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed
from grpo_testbed.operator_process import OPERATOR_NS_PREFIX, OperatorProcess
from grpo_testbed.processes import wait_until

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
INSTANCE = "app.kubernetes.io/instance"
# The API server cannot reach a kwok pod, so the webhooks must not block the tests.
WEBHOOK_SOFT = ("--set", "webhook.failurePolicy=Ignore", "--set", "webhook.timeoutSeconds=2")
# The chart refuses images without a registry host; kwok runs no image, so the names
# `make images` gives them serve (localhost/grpo-operator/{operator,trainer}:0.1.0).
IMAGES = ("--set", "global.imageRegistry=localhost")
CHART_CRDS = ("grpojobs.grpo.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")


def helm(tb: Testbed, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return tb.helm(*args, check=check, timeout=240)


def get_json(tb: Testbed, *args: str, kubeconfig: Path | None = None) -> Any:
    extra = ["--kubeconfig", str(kubeconfig)] if kubeconfig else []
    return json.loads(tb.kubectl(*extra, "get", *args, "-o", "json").stdout)


REPLICAS = 2  # the chart's default


def operator_pods(tb: Testbed, ns: str, release: str) -> list[dict[str, Any]]:
    pods = get_json(tb, "pods", "-n", ns, "-l", f"{INSTANCE}={release}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def wait_operator_running(tb: Testbed, ns: str, release: str) -> list[dict[str, Any]]:
    def running() -> bool:
        pods = operator_pods(tb, ns, release)
        return len(pods) == REPLICAS and all(p["status"].get("phase") == "Running"
                                             for p in pods)

    wait_until(f"{REPLICAS} operator pods of {release} Running", running, 120)
    return operator_pods(tb, ns, release)


@dataclass
class Release:
    name: str
    ns: str
    sa: str
    install_output: str

    @property
    def who(self) -> str:
        return f"system:serviceaccount:{self.ns}:{self.sa}"


def can_i(tb: Testbed, who: str, verb: str, resource: str, *where: str) -> bool:
    proc = tb.kubectl("auth", "can-i", verb, resource, "--as", who, *where, check=False)
    answer = proc.stdout.strip()
    assert answer in {"yes", "no"}, f"can-i {verb} {resource}: {proc.stdout}{proc.stderr}"
    return answer == "yes"


# The platform's defaults and hub list the release is installed with (docs/deployment.md).
TOLERATION = {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
PRIORITY = "grpo-chart-default"
JOB_DEFAULTS = {"tolerations": [TOLERATION], "nodeSelector": {"type": "kwok"},
                "priorityClassName": PRIORITY}
HUBS = {"mirror": "https://hf-mirror.internal"}


@pytest.fixture(scope="module")
def release(testbed: Testbed) -> Iterator[Release]:
    """The chart with its default values (all namespaces), jobNetworkPolicy on, job
    defaults and a hub list, installed once for the module."""
    ns = testbed.namespace("chart")
    name = "grpo"
    proc = helm(testbed, "install", name, str(CHART), "-n", ns, "--wait", "--timeout", "180s",
                *WEBHOOK_SOFT, *IMAGES, "--set", "jobNetworkPolicy.enabled=true",
                "--set", "metrics.podMonitor.enabled=true",
                "--set", "metrics.serviceMonitor.enabled=true",
                "--set-json", f"jobDefaults={json.dumps(JOB_DEFAULTS)}",
                "--set-json", f"hubEndpoints={json.dumps(HUBS)}")
    yield Release(name, ns, f"{name}-grpo-operator", proc.stdout)
    helm(testbed, "uninstall", name, "-n", ns, "--wait", "--timeout", "120s", check=False)
    testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_install_runs_the_operator_on_the_cpu_node_and_says_how_to_start(
        testbed: Testbed, release: Release) -> None:
    for pod in wait_operator_running(testbed, release.ns, release.name):
        assert pod["spec"]["nodeName"] == "cpu-0"  # the GPU nodes are tainted
        c = pod["spec"]["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["spec"]["serviceAccountName"] == release.sa
    pdb = get_json(testbed, "pdb", f"{release.name}-grpo-operator", "-n", release.ns)
    assert pdb["spec"]["minAvailable"] == 1
    notes = release.install_output
    assert "kubectl apply -f examples/grpojob-first.yaml" in notes
    assert "kubectl get grpojobs -w" in notes
    for crd in CHART_CRDS:
        testbed.kubectl("get", "crd", crd)
    peering = get_json(testbed, "clusterkopfpeering", f"{release.name}-grpo-operator")
    assert peering["metadata"]["labels"][INSTANCE] == release.name


# (verb, resource[, subresource]) the operator uses in the namespaces it watches.
NAMESPACED_VERBS = [
    *[(v, "grpojobs.grpo.dev", "") for v in ("get", "list", "watch", "patch", "update")],
    *[(v, "grpojobs.grpo.dev", "status") for v in ("get", "patch", "update")],
    *[(v, "rayclusters.ray.io", "")
      for v in ("get", "list", "watch", "create", "patch", "update", "delete")],
    *[(v, r, "") for r in ("configmaps", "persistentvolumeclaims", "serviceaccounts")
      for v in ("get", "list", "watch", "create", "patch", "delete")],
    # create and delete: a new job's model-config reader pod (nothing else of the pods)
    *[(v, "pods", "") for v in ("get", "list", "watch", "create", "patch", "delete")],
    *[(v, "resourcequotas", "") for v in ("get", "list")],
    *[(v, r, "") for r in ("events", "events.events.k8s.io") for v in ("create", "patch")],
    *[(v, r, "") for r in ("roles.rbac.authorization.k8s.io",
                           "rolebindings.rbac.authorization.k8s.io")
      for v in ("get", "list", "watch", "create", "patch", "delete")],
    # jobNetworkPolicy: each job's NetworkPolicy (owned by the job: GC deletes it).
    *[(v, "networkpolicies.networking.k8s.io", "") for v in ("get", "create")],
]
CLUSTER_VERBS = [
    *[(v, "customresourcedefinitions.apiextensions.k8s.io") for v in ("get", "list", "watch")],
    *[(v, "namespaces") for v in ("get", "list", "watch")],
    *[(v, "nodes") for v in ("get", "list")],
]
FORBIDDEN = [
    ("get", "secrets", "-A"), ("list", "secrets", "-A"), ("watch", "secrets", "-A"),
    ("delete", "nodes", ""), ("patch", "nodes", ""), ("watch", "nodes", ""),
    ("create", "deployments.apps", "-A"), ("list", "deployments.apps", "-A"),
    ("create", "jobs.batch", "-A"), ("list", "jobs.batch", "-A"),
    ("create", "grpojobs.grpo.dev", "-A"), ("delete", "grpojobs.grpo.dev", "-A"),
    ("create", "pods", "-A --subresource=exec"), ("get", "pods", "-A --subresource=log"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", ""),
    ("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io", ""),
    ("create", "mutatingwebhookconfigurations.admissionregistration.k8s.io", ""),
    ("create", "clusterroles.rbac.authorization.k8s.io", ""),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", ""),
    ("escalate", "roles.rbac.authorization.k8s.io", "-A"),
    ("bind", "roles.rbac.authorization.k8s.io", "-A"),
    ("impersonate", "serviceaccounts", "-A"),
    ("create", "serviceaccounts", "-A --subresource=token"),
    ("delete", "namespaces", ""),
    ("update", "rayclusters.ray.io", "-A --subresource=status"),
    ("delete", "networkpolicies.networking.k8s.io", "-A"),
    ("patch", "networkpolicies.networking.k8s.io", "-A"),
]


def test_service_account_can_do_every_verb_the_operator_uses(
        testbed: Testbed, release: Release, ns: str) -> None:
    missing = []
    for verb, resource, sub in NAMESPACED_VERBS:
        where = ["-n", ns] + ([f"--subresource={sub}"] if sub else [])
        if not can_i(testbed, release.who, verb, resource, *where):
            missing.append(f"{verb} {resource}{'/' + sub if sub else ''} in {ns}")
    for verb, resource in CLUSTER_VERBS:
        if not can_i(testbed, release.who, verb, resource):
            missing.append(f"{verb} {resource}")
    for verb in ("get", "list", "watch", "patch"):
        if not can_i(testbed, release.who, verb, "clusterkopfpeerings.kopf.dev"):
            missing.append(f"{verb} clusterkopfpeerings")
    assert not missing, f"the chart's RBAC lacks: {missing}"


def test_service_account_cannot_read_secrets_delete_nodes_or_touch_other_groups(
        testbed: Testbed, release: Release) -> None:
    allowed = [f"{verb} {resource} {where}" for verb, resource, where in FORBIDDEN
               if can_i(testbed, release.who, verb, resource, *where.split())]
    assert not allowed, f"the operator's ServiceAccount may: {allowed}"


def sa_kubeconfig(tb: Testbed, rel: Release, path: Path) -> Path:
    return tb.token_kubeconfig(rel.sa, rel.ns, path, duration="20m")


RAYCLUSTER: dict[str, Any] = {
    "apiVersion": "ray.io/v1", "kind": "RayCluster",
    "metadata": {"name": "rc", "labels": {"grpo.dev/job": "tiny"}},
    "spec": {
        "rayVersion": "2.60.0",
        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
            "name": "ray-head", "image": "rayproject/ray:2.60.0",
            "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}]}}},
    },
}


def test_a_token_of_the_service_account_performs_the_operators_work(
        testbed: Testbed, release: Release, ns: str, tmp_path: Path) -> None:
    """What the operator does for a job, done with the chart's identity."""
    kc = sa_kubeconfig(testbed, release, tmp_path / "operator.kubeconfig")
    try:
        _operators_work(testbed, release, ns, kc)
    finally:  # never leave a finalizer that would hold the namespace's deletion
        testbed.kubectl("patch", "grpojob", "tiny", "-n", ns, "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}', check=False)


def _operators_work(testbed: Testbed, release: Release, ns: str, kc: Path) -> None:

    def op(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return testbed.kubectl("--kubeconfig", str(kc), *args, input=input, check=False)

    def ok(*args: str, input: str | None = None) -> str:
        proc = op(*args, input=input)
        assert proc.returncode == 0, f"as {release.sa}: kubectl {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    # A user submits a job (admin identity); the operator sees it.
    testbed.kubectl("apply", "-n", ns, "-f", str(ROOT / "examples/grpojob-tiny.yaml"))
    assert "tiny" in ok("get", "grpojobs", "-A", "-o", "name")
    ok("patch", "grpojob", "tiny", "-n", ns, "--type=merge",
       "-p", '{"metadata":{"finalizers":["grpo.dev/operator"]}}')
    ok("patch", "grpojob", "tiny", "-n", ns, "--subresource=status", "--type=merge",
       "-p", '{"status":{"phase":"Starting","progress":{"step":0,"totalSteps":3}}}')
    assert get_json(testbed, "grpojob", "tiny", "-n", ns)["status"]["phase"] == "Starting"

    # Children: config, checkpoint claim, trainer identity with a Role on its own status.
    ok("create", "configmap", "tiny-config-1", "-n", ns, "--from-literal=config.yaml=x: 1")
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "tiny-checkpoints", "namespace": ns},
           "spec": {"accessModes": ["ReadWriteMany"],
                    "resources": {"requests": {"storage": "1Gi"}}}}
    ok("create", "-f", "-", input=json.dumps(pvc))
    ok("create", "serviceaccount", "tiny-trainer", "-n", ns)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "tiny-trainer", "namespace": ns},
            "rules": [{"apiGroups": ["grpo.dev"], "resources": ["grpojobs/status"],
                       "resourceNames": ["tiny"], "verbs": ["get", "patch"]},
                      {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}]}
    ok("create", "-f", "-", input=json.dumps(role))
    ok("create", "rolebinding", "tiny-trainer", "-n", ns, "--role=tiny-trainer",
       f"--serviceaccount={ns}:tiny-trainer")
    trainer = f"system:serviceaccount:{ns}:tiny-trainer"
    assert can_i(testbed, trainer, "patch", "grpojobs.grpo.dev/tiny", "-n", ns,
                 "--subresource=status")
    assert not can_i(testbed, trainer, "patch", "grpojobs.grpo.dev/other", "-n", ns,
                     "--subresource=status")
    assert can_i(testbed, trainer, "list", "events", "-n", ns)
    assert not can_i(testbed, trainer, "get", "pods", "-n", ns)

    # The RayCluster, then KubeRay's pods, which the operator watches and marks.
    rc = {**RAYCLUSTER, "metadata": {**RAYCLUSTER["metadata"], "namespace": ns}}
    ok("create", "-f", "-", input=json.dumps(rc))
    ok("patch", "raycluster", "rc", "-n", ns, "--type=merge",
       "-p", '{"metadata":{"annotations":{"grpo.dev/attempt":"1"}}}')

    def head_pod() -> str:
        return ok("get", "pods", "-n", ns, "-l", "ray.io/cluster=rc,ray.io/node-type=head",
                  "-o", "jsonpath={.items[*].metadata.name}").strip()

    wait_until("KubeRay head pod", lambda: bool(head_pod()), 60)
    ok("patch", "pod", head_pod(), "-n", ns, "--type=merge",
       "-p", '{"metadata":{"finalizers":["grpo.dev/operator"]}}')
    ok("patch", "pod", head_pod(), "-n", ns, "--type=json",
       "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')

    # Events on the job, both APIs.
    uid = get_json(testbed, "grpojob", "tiny", "-n", ns)["metadata"]["uid"]
    ref = {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "name": "tiny",
           "namespace": ns, "uid": uid}
    core_event = {"apiVersion": "v1", "kind": "Event",
                  "metadata": {"name": "tiny.planned", "namespace": ns},
                  "involvedObject": ref, "reason": "Planned", "message": "1 node",
                  "type": "Normal", "source": {"component": "grpo-operator"}}
    ok("create", "-f", "-", input=json.dumps(core_event))
    # Kopf patches events without reading them (kubectl patch would GET first).
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kc)))
    assert api.patch_namespaced_event("tiny.planned", ns, {"count": 2}).count == 2
    new_event = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                 "metadata": {"name": "tiny.started", "namespace": ns},
                 "regarding": ref, "reason": "Started", "note": "attempt 1", "type": "Normal",
                 "action": "Create", "reportingController": "grpo.dev/operator",
                 "reportingInstance": "grpo-operator-0",
                 "eventTime": "2026-01-01T00:00:00.000000Z"}
    ok("create", "-f", "-", input=json.dumps(new_event))

    # Kopf peering: the operator announces itself in the chart's peering object.
    ok("patch", "clusterkopfpeering", f"{release.name}-grpo-operator", "--type=merge",
       "-p", '{"status":{"grpo-operator-0":{"priority":0,"lifetime":60}}}')

    # Discovery, then cleanup of what the operator owns.
    ok("get", "crd", "grpojobs.grpo.dev")
    ok("get", "namespaces")
    ok("delete", "raycluster", "rc", "-n", ns, "--wait=false")
    for kind, name in (("rolebinding", "tiny-trainer"), ("role", "tiny-trainer"),
                       ("serviceaccount", "tiny-trainer"), ("pvc", "tiny-checkpoints"),
                       ("configmap", "tiny-config-1")):
        ok("delete", kind, name, "-n", ns, "--wait=false")
    ok("patch", "grpojob", "tiny", "-n", ns, "--type=json",
       "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')

    # ...and nothing beyond it.
    for args in (("get", "secrets", "-n", ns), ("get", "secrets", "-n", release.ns),
                 ("delete", "grpojob", "tiny", "-n", ns),
                 ("create", "deployment", "x", "-n", ns, "--image=busybox:1.36"),
                 ("delete", "node", "cpu-0")):
        proc = op(*args)
        assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), (args, proc.stderr)


def names(tb: Testbed, kinds: str, selector: str, *where: str) -> list[str]:
    out = tb.kubectl("get", kinds, "-l", selector, "-o", "name", *where).stdout
    return sorted(out.split())


NAMESPACED_KINDS = ("deployments,services,configmaps,secrets,serviceaccounts,roles,"
                    "rolebindings,kopfpeerings.kopf.dev,pods,poddisruptionbudgets")
CLUSTER_KINDS = ("clusterroles,clusterrolebindings,validatingwebhookconfigurations,"
                 "mutatingwebhookconfigurations,clusterkopfpeerings.kopf.dev")


def test_upgrade_to_watched_namespaces_then_uninstall_leaves_no_orphans(
        testbed: Testbed, ns: str, tmp_path: Path) -> None:
    home = testbed.namespace("chart")
    name = "life"
    sel = f"{INSTANCE}={name}"
    sa = f"system:serviceaccount:{home}:{name}-grpo-operator"
    try:
        helm(testbed, "install", name, str(CHART), "-n", home, "--wait", "--timeout", "180s",
             "--set", "webhook.enabled=false", *IMAGES)
        assert names(testbed, CLUSTER_KINDS, sel).count(
            f"validatingwebhookconfiguration.admissionregistration.k8s.io/{name}-grpo-operator"
        ) == 0
        assert can_i(testbed, sa, "create", "rayclusters.ray.io", "-n", home)  # all namespaces
        first_pods = {p["metadata"]["name"] for p in wait_operator_running(testbed, home, name)}

        # Upgrade: watch only `ns`, webhook on, more memory.
        helm(testbed, "upgrade", name, str(CHART), "-n", home, "--wait", "--timeout", "180s",
             "--set", f"watchNamespaces={{{ns}}}", "--set", "webhook.enabled=true",
             "--set", "resources.limits.memory=1Gi", *WEBHOOK_SOFT, *IMAGES)
        status = json.loads(helm(testbed, "status", name, "-n", home, "-o", "json").stdout)
        assert status["version"] == 2 and status["info"]["status"] == "deployed"
        pods = wait_operator_running(testbed, home, name)
        assert not first_pods & {p["metadata"]["name"] for p in pods}  # rolled: new pods
        c = pods[0]["spec"]["containers"][0]
        assert f"--namespace={ns}" in c["args"] and "--webhook-port=9443" in c["args"]
        assert c["resources"]["limits"]["memory"] == "1Gi"
        assert can_i(testbed, sa, "create", "rayclusters.ray.io", "-n", ns)
        assert not can_i(testbed, sa, "create", "rayclusters.ray.io", "-n", home)
        # The namespaced install docs/deployment.md recommends for shared clusters: in a
        # namespace it does not watch the operator creates nothing that runs code.
        for kind in ("pods", "rayclusters.ray.io", "roles.rbac.authorization.k8s.io",
                     "rolebindings.rbac.authorization.k8s.io", "serviceaccounts"):
            assert can_i(testbed, sa, "create", kind, "-n", ns), kind
            assert not can_i(testbed, sa, "create", kind, "-n", home), kind
            assert not can_i(testbed, sa, "create", kind, "-n", "default"), kind
        # And with the ServiceAccount's own token, as the operator calls: refused.
        kc = sa_kubeconfig(testbed, Release(name, home, f"{name}-grpo-operator", ""),
                           tmp_path / "sa.kubeconfig")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        refused = testbed.kubectl("--kubeconfig", str(kc), "create", "-n", home, "-f", "-",
                                  input=json.dumps(pod), check=False)
        assert refused.returncode != 0 and "Forbidden" in refused.stderr, refused.stderr
        assert f'cannot create resource "pods" in API group "" in the namespace "{home}"' \
            in refused.stderr, refused.stderr
        assert can_i(testbed, sa, "patch", "kopfpeerings.kopf.dev", "-n", ns)
        assert not can_i(testbed, sa, "patch", "clusterkopfpeerings.kopf.dev")
        assert names(testbed, "clusterkopfpeerings.kopf.dev", sel) == []
        assert names(testbed, "kopfpeerings.kopf.dev", sel, "-n", ns) == [
            f"kopfpeering.kopf.dev/{name}-grpo-operator"]
        secret = get_json(testbed, "secret", f"{name}-grpo-operator-webhook-tls", "-n", home)
        hook = get_json(testbed, "validatingwebhookconfiguration", f"{name}-grpo-operator")
        ca = secret["data"]["ca.crt"]
        assert hook["webhooks"][0]["clientConfig"]["caBundle"] == ca
        assert base64.b64decode(ca).startswith(b"-----BEGIN CERTIFICATE-----")

        # A second upgrade keeps the generated certificate (no surprise rotation).
        helm(testbed, "upgrade", name, str(CHART), "-n", home, "--reuse-values",
             "--set", "logLevel=debug", "--wait", "--timeout", "180s")
        again = get_json(testbed, "secret", f"{name}-grpo-operator-webhook-tls", "-n", home)
        assert again["data"] == secret["data"]
    finally:
        helm(testbed, "uninstall", name, "-n", home, "--wait", "--timeout", "120s",
             check=False)

    wait_until("operator pod gone", lambda: names(testbed, "pods", sel, "-n", home) == [], 60)
    left = (names(testbed, NAMESPACED_KINDS, sel, "-A")
            + names(testbed, CLUSTER_KINDS, sel))
    assert not left, f"helm uninstall left {left}"
    for crd in CHART_CRDS:  # kept, as Helm does: deleting them would delete every job
        testbed.kubectl("get", "crd", crd)
    testbed.kubectl("delete", "namespace", home, "--wait=false", check=False)


def test_bad_values_fail_helm_install_with_a_message(testbed: Testbed, ns: str) -> None:
    proc = helm(testbed, "install", "bad", str(CHART), "-n", ns, "--set", "replicaCount=3",
                "--set", "leaderElection.enabled=false", *IMAGES, check=False)
    assert proc.returncode != 0
    assert "replicaCount: 3 replicas need leaderElection.enabled=true" in proc.stderr
    assert names(testbed, "deployments", f"{INSTANCE}=bad", "-A") == []
    listed = yaml.safe_load(helm(testbed, "list", "-A", "-o", "yaml").stdout) or []
    assert "bad" not in {r["name"] for r in listed}


def test_operator_under_the_chart_service_account_runs_a_job_to_success(
        testbed: Testbed, release: Release, tmp_path: Path) -> None:
    """The chart's RBAC is exactly enough: the real operator, authenticated only by a
    token of the chart's ServiceAccount, takes a job from apply to Succeeded."""
    kc = sa_kubeconfig(testbed, release, tmp_path / "sa.kubeconfig")
    # The release's jobNetworkPolicy, job defaults and hubs, as its Deployment passes them.
    dep = get_json(testbed, "deployment", f"{release.name}-grpo-operator", "-n", release.ns)
    args = tuple(a for a in dep["spec"]["template"]["spec"]["containers"][0]["args"]
                 if a.split("=")[0] in {"--job-network-policy", "--job-defaults",
                                        "--hub-endpoints"})
    assert len(args) == 3, dep["spec"]["template"]["spec"]["containers"][0]["args"]
    testbed.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                   "metadata": {"name": PRIORITY}, "value": 100})
    op = OperatorProcess(testbed, tmp_path, kubeconfig=kc, webhook=False,
                         extra_args=args).start()
    ns = testbed.namespace(OPERATOR_NS_PREFIX)
    try:
        doc = example_job(recovery={"backoff": {"initialSeconds": 1}})
        testbed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))

        def phase() -> str:
            job = get_json(testbed, "grpojob", "tiny", "-n", ns)
            return str(job.get("status", {}).get("phase", ""))

        def head(attempt: int) -> str:
            pods = get_json(testbed, "pods", "-n", ns, "-l",
                            f"grpo.dev/job=tiny,grpo.dev/role=head,grpo.dev/attempt={attempt}")
            return str(pods["items"][0]["metadata"]["name"])

        wait_until("tiny Running under the chart's ServiceAccount",
                   lambda: phase() == "Running", 120)
        # The platform's defaults reached the real pod, and status says where from.
        pod = get_json(testbed, "pod", head(0), "-n", ns)["spec"]
        assert TOLERATION in pod["tolerations"] and pod["priorityClassName"] == PRIORITY
        assert pod["nodeSelector"]["type"] == "kwok" and pod.get("priority") == 100
        inherited = get_json(testbed, "grpojob", "tiny", "-n", ns)["status"]["plan"][
            "inherited"]
        assert inherited == {"spec.pods.common.tolerations": "jobDefaults",
                             "spec.pods.common.nodeSelector.type": "jobDefaults",
                             "spec.pods.common.priorityClassName": "jobDefaults"}, inherited
        # Its Ray pods got their NetworkPolicy: the job's own pods select and reach them.
        policy = get_json(testbed, "networkpolicy", "tiny-ray-pods", "-n", ns)
        assert policy["spec"]["podSelector"] == {"matchLabels": {"grpo.dev/job": "tiny"}}
        assert policy["spec"]["ingress"] == [
            {"from": [{"podSelector": policy["spec"]["podSelector"]}]}]
        assert policy["metadata"]["ownerReferences"][0]["kind"] == "GRPOJob"
        # Ray's token authentication, as the real KubeRay sets it up for the cluster we
        # render: its Secret, owned by the RayCluster, and the token in the Ray container.
        secret = get_json(testbed, "secret", "tiny-a0", "-n", ns)
        assert secret["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"
        assert "auth_token" in secret["data"]
        ray = get_json(testbed, "pod", head(0), "-n", ns)["spec"]["containers"][0]
        env = {e["name"]: e for e in ray["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "tiny-a0", "key": "auth_token"}
        _trainer_may_write_progress_only(testbed, ns, tmp_path)
        _the_pod_monitor_selects_the_drivers_port(testbed, release, head(0), ns)
        # A hub the release does not list: the job is refused, naming the field, unread.
        stray = example_job(name="stray", hub={"endpoint": "http://169.254.169.254/latest"})
        testbed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(stray))
        wait_until("stray refused", lambda: get_json(testbed, "grpojob", "stray", "-n", ns)
                   .get("status", {}).get("phase") == "Failed", 60)
        failed = next(c for c in get_json(testbed, "grpojob", "stray", "-n", ns)["status"][
            "conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "InvalidSpec" and "spec.hub.endpoint" in failed[
            "message"] and "mirror" in failed["message"], failed
        assert phase() == "Running"
        # Recovery's main path: an OOM kill, then attempt 1 from the checkpoint.
        testbed.kubectl("label", "pod", head(0), "-n", ns, "grpo.dev/chaos=terminate")
        wait_until("attempt 1 Running", lambda: phase() == "Running" and get_json(
            testbed, "grpojob", "tiny", "-n", ns)["status"]["attempt"] == 1, 120)
        end_pod(testbed.kubectl, ns, head(1), 0, "Completed")
        wait_until("tiny Succeeded", lambda: phase() == "Succeeded", 120)
        wait_until("RayCluster released", lambda: not get_json(
            testbed, "rayclusters", "-n", ns)["items"], 60)
        # An API denial reads "(403)" / "Forbidden" (the client's ApiException, kopf's
        # APIForbiddenError); a bare 403 may be a timestamp's milliseconds.
        denied = [line for line in op.log.read_text().splitlines()
                  if "(403)" in line or "Forbidden" in line]
        assert not denied, denied[:5]
    finally:
        op.stop()
        testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _the_pod_monitor_selects_the_drivers_port(testbed: Testbed, release: Release, head: str,
                                             ns: str) -> None:
    """The chart's PodMonitor, as the API server took it (the Prometheus Operator's real
    CRD), selects what Prometheus's pod discovery would under it: the job's head pod, the
    one that runs the driver (the chart render test shows worker pods are not), and only
    Ray heads in any namespace; and that pod, as the real
    KubeRay built it from our RayCluster, declares the port the monitor names (9100). No
    Prometheus runs in the testbed: the selection is done here with the API server's own
    label selector."""
    (pm,) = get_json(testbed, "podmonitors", "-n", release.ns)["items"]
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    sel = pm["spec"]["selector"]
    selector = ",".join([*(f"{k}={v}" for k, v in sel["matchLabels"].items()),
                         *(e["key"] for e in sel["matchExpressions"]
                           if e["operator"] == "Exists")])
    picked = get_json(testbed, "pods", "-A", "-l", selector)["items"]
    # Other modules' jobs may still be going in their namespaces: Ray heads all.
    assert {p["metadata"]["labels"].get("ray.io/node-type") for p in picked} == {"head"}
    mine = [p for p in picked if p["metadata"]["namespace"] == ns]
    assert [p["metadata"]["name"] for p in mine] == [head], selector
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    ports = [port for c in mine[0]["spec"]["containers"] for port in c.get("ports", [])
             if port.get("name") == endpoint["port"]]
    assert [p["containerPort"] for p in ports] == [9100], mine[0]["spec"]["containers"]


def _trainer_may_write_progress_only(testbed: Testbed, ns: str, tmp_path: Path) -> None:
    """With a token of the job's own trainer ServiceAccount (the operator made it), a
    progress report lands and every other status write is refused by the chart's
    ValidatingAdmissionPolicy, which names the one field it may change."""
    account = trainer_account(JobRef("tiny", ns, ""))
    kc = testbed.token_kubeconfig(account, ns, tmp_path / "trainer.kubeconfig", "20m")

    def as_trainer(status: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return testbed.kubectl("--kubeconfig", str(kc), "patch", "grpojob", "tiny", "-n", ns,
                               "--subresource=status", "--type=merge",
                               "-p", json.dumps({"status": status}), check=False)

    report = as_trainer({"progress": {"step": 1, "totalSteps": 3, "rewardMean": 0.5}})
    assert report.returncode == 0, report.stderr
    assert get_json(testbed, "grpojob", "tiny", "-n", ns)["status"]["progress"]["step"] == 1
    for forged in ({"phase": "Succeeded"}, {"attempts": []}, {"plan": {"nodes": 64}},
                   {"conditions": None}, {"progress": {"step": 2}, "restarts": 7}):
        proc = as_trainer(forged)
        assert proc.returncode != 0, f"{forged} was taken"
        assert "may change only status.progress" in proc.stderr, proc.stderr
    after = get_json(testbed, "grpojob", "tiny", "-n", ns)["status"]
    assert after["phase"] == "Running" and after["restarts"] == 0, after
    assert after["progress"]["step"] == 1  # the forged report with restarts was refused whole


def secret_data(docs: str) -> dict[str, str]:
    (secret,) = [d for d in yaml.safe_load_all(docs) if d and d["kind"] == "Secret"]
    return dict(secret["data"])


def test_generated_certificate_survives_re_renders_and_upgrades(
        testbed: Testbed, release: Release) -> None:
    """The Secret is read back (`lookup`) and reused: a render with cluster access and a
    plain upgrade keep the CA and the serving certificate; only a render without the
    cluster (plain `helm template`, as GitOps tools run it) makes a new pair."""
    name = f"{release.name}-grpo-operator"

    def live() -> tuple[dict[str, str], set[str]]:
        data = get_json(testbed, "secret", f"{name}-webhook-tls", "-n", release.ns)["data"]
        bundles = {h["clientConfig"]["caBundle"] for kind in (
            "validatingwebhookconfiguration", "mutatingwebhookconfiguration")
            for h in get_json(testbed, kind, name)["webhooks"]}
        return dict(data), bundles

    data, bundles = live()
    assert bundles == {data["ca.crt"]}
    # helm template checks kubeVersion against its default (v1.20) even when it may
    # reach the cluster: name the version.
    render = ("template", release.name, str(CHART), "-n", release.ns, *WEBHOOK_SOFT,
              *IMAGES, "--kube-version", KUBE_VERSION)
    for _ in range(2):
        assert secret_data(helm(testbed, *render, "--dry-run=server").stdout) == data
    offline = helm(testbed, *render).stdout  # no cluster, no lookup
    assert secret_data(offline)["ca.crt"] != data["ca.crt"]
    helm(testbed, "upgrade", release.name, str(CHART), "-n", release.ns, *WEBHOOK_SOFT,
         *IMAGES, "--set", "logLevel=debug", "--wait", "--timeout", "180s")
    assert live() == (data, bundles)

    # Past its renewal time (here at once: renew 400 days before a 365-day certificate's
    # end), an upgrade makes a new CA and certificate; the webhooks trust the new CA and
    # the old one until the next upgrade, so replicas still serving the old certificate
    # are answered until they restart with the new files (cert_watch.py).
    helm(testbed, "upgrade", release.name, str(CHART), "-n", release.ns, "--reuse-values",
         "--set", "webhook.certificate.renewBeforeDays=400", "--wait", "--timeout", "180s")
    rotated, rotated_bundles = live()
    assert rotated["tls.crt"] != data["tls.crt"] and rotated["ca.crt"] != data["ca.crt"]
    (bundle,) = rotated_bundles
    pem = base64.b64decode(bundle).decode()
    assert pem.count("BEGIN CERTIFICATE") == 2
    assert base64.b64decode(rotated["ca.crt"]).decode() in pem
    assert base64.b64decode(data["ca.crt"]).decode() in pem
    helm(testbed, "upgrade", release.name, str(CHART), "-n", release.ns, "--reuse-values",
         "--set", "webhook.certificate.renewBeforeDays=60", "--wait", "--timeout", "180s")
    kept, kept_bundles = live()
    assert kept == rotated and kept_bundles == {rotated["ca.crt"]}  # the old CA dropped


def test_finalizer_removal_and_delete_pass_while_no_webhook_answers(
        testbed: Testbed, release: Release, ns: str) -> None:
    """The chart's kwok pods never answer the API server: with failurePolicy Fail, a
    spec change is refused, but a delete and the removal of a finalizer go through (the
    validating webhook's rules hold no DELETE, and its matchConditions skip an update
    that keeps the spec). Without the condition, the finalizer would be stuck."""
    hook_name = f"{release.name}-grpo-operator"
    original = get_json(testbed, "validatingwebhookconfiguration", hook_name)["webhooks"][0]
    doc = example_job(name="held")
    doc["metadata"]["finalizers"] = ["test.grpo.dev/hold"]
    testbed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))  # Ignore: passes

    def set_hook(**fields: Any) -> None:
        testbed.kubectl("patch", "validatingwebhookconfiguration", hook_name, "--type=json",
                        "-p", json.dumps([{"op": "replace", "path": "/webhooks/0",
                                           "value": {**original, **fields}}]))

    def refused(*patch: str) -> bool:
        out = testbed.kubectl("patch", "grpojob", "held", "-n", ns, "--dry-run=server",
                              *patch, check=False)
        return out.returncode != 0 and "failed calling webhook" in out.stderr

    unhold = ("--type=json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')
    respec = ("--type=merge", "-p", '{"spec":{"memory":{"gradientCheckpointing":true}}}')
    try:
        set_hook(failurePolicy="Fail")
        wait_until("a spec change refused: no webhook answers", lambda: refused(*respec), 30)
        assert not refused(*unhold)
        testbed.kubectl("delete", "grpojob", "held", "-n", ns, "--wait=false")
        without = {k: v for k, v in original.items() if k != "matchConditions"}
        testbed.kubectl("patch", "validatingwebhookconfiguration", hook_name, "--type=json",
                        "-p", json.dumps([{"op": "replace", "path": "/webhooks/0",
                                           "value": {**without, "failurePolicy": "Fail"}}]))
        wait_until("without matchConditions the finalizer is stuck",
                   lambda: refused(*unhold), 30)
        set_hook(failurePolicy="Fail")
        wait_until("with them it is not", lambda: not refused(*unhold), 30)
        testbed.kubectl("patch", "grpojob", "held", "-n", ns, *unhold)
        wait_until("the deleted job gone", lambda: testbed.kubectl(
            "get", "grpojob", "held", "-n", ns, check=False).returncode != 0, 30)
    finally:
        set_hook()
        testbed.kubectl("patch", "grpojob", "held", "-n", ns, "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}', check=False)
