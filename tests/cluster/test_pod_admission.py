"""Pod admission with the real API server and the real KubeRay: the Ray pods pass Pod
Security `restricted`; a refusal the webhook cannot foresee shows in the job within
seconds and fails the attempt after the operator's deadline; what the namespace's level
or GPU quota would refuse is refused at `kubectl apply`, naming the namespace's rule."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed
from grpo_testbed.operator_process import OperatorProcess
from grpo_testbed.processes import wait_until

pytestmark = pytest.mark.cluster

ENFORCE = "pod-security.kubernetes.io/enforce"
GPU_EXAMPLE = "grpojob-qwen25vl-7b-h100.yaml"  # a hub model (hub-fetch init container)
DEADLINE_S = 10


def apply(tb: Testbed, ns: str, doc: dict[str, Any], check: bool = True) -> Any:
    return tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=check)


def status(tb: Testbed, ns: str, name: str) -> dict[str, Any]:
    out = tb.kubectl("get", "grpojob", name, "-n", ns, "-o", "json").stdout
    return dict(json.loads(out).get("status") or {})


def condition(tb: Testbed, ns: str, name: str, kind: str) -> dict[str, Any]:
    return next((c for c in status(tb, ns, name).get("conditions") or []
                 if c["type"] == kind), {})


def wait_for(what: str, tb: Testbed, op: OperatorProcess, ns: str, name: str,
             ok: Any, timeout: float = 90) -> dict[str, Any]:
    """Wait until ok(status); on timeout fail with the status and the operator's log."""
    try:
        wait_until(what, lambda: ok(status(tb, ns, name)), timeout)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {status(tb, ns, name)}\n"
                             f"operator log:\n{op.log_tail()}") from None
    return status(tb, ns, name)


def test_restricted_namespace_runs_the_7b_example(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    testbed.kubectl("label", "namespace", op_ns, f"{ENFORCE}=restricted",
                    f"{ENFORCE}-version=latest")
    apply(testbed, op_ns, example_job(GPU_EXAMPLE, "strict"))
    wait_for("strict Running", testbed, operator, op_ns, "strict",
             lambda s: s.get("phase") == "Running")
    pods = json.loads(testbed.kubectl("get", "pods", "-n", op_ns, "-l", "grpo.dev/job=strict",
                                      "-o", "json").stdout)["items"]
    assert {p["metadata"]["labels"]["grpo.dev/role"] for p in pods} == {"head", "worker"}
    for p in pods:
        assert p["spec"]["securityContext"]["runAsNonRoot"] is True
        for c in [*(p["spec"].get("initContainers") or []), *p["spec"]["containers"]]:
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.fixture
def short_deadline_operator(grpo_crd: Testbed, ns: str, tmp_path: Path
                            ) -> Iterator[OperatorProcess]:
    """An operator for the test's namespace only, failing refused attempts after 10 s."""
    op = OperatorProcess(grpo_crd, tmp_path, webhook=False, namespaces=(ns,),
                         extra_args=("--pod-create-deadline", str(DEADLINE_S))).start()
    yield op
    op.stop()


def test_a_pod_refused_by_a_limitrange_shows_at_once_then_fails_the_attempt(
        testbed: Testbed, short_deadline_operator: OperatorProcess, ns: str) -> None:
    # A refusal no webhook of ours can foresee: LimitRanger's admission of the pod.
    testbed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "small-pods"},
        "spec": {"limits": [{"type": "Container", "max": {"memory": "1Gi"}}]}}))
    apply(testbed, ns, example_job(name="capped"))
    op = short_deadline_operator

    def refused(s: dict[str, Any]) -> bool:
        d = next((c for c in s.get("conditions") or [] if c["type"] == "Degraded"), {})
        return d.get("reason") == "PodCreateRefused"

    wait_for("PodCreateRefused", testbed, op, ns, "capped", refused, 60)
    degraded = condition(testbed, ns, "capped", "Degraded")
    assert degraded["status"] == "True"
    assert "KubeRay cannot create the head pod of RayCluster capped-a0" in degraded["message"]
    assert "maximum memory usage per Container is 1Gi" in degraded["message"]  # LimitRanger's
    events = testbed.kubectl("get", "events", "-n", ns, "--field-selector",
                             "involvedObject.name=capped,reason=PodCreateRefused").stdout
    assert "maximum memory usage" in events

    final = wait_for("capped Failed", testbed, op, ns, "capped",
                     lambda s: s.get("phase") == "Failed", 60)
    failed = next(c for c in final["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PodCreateRefused"
    assert "maximum memory usage per Container" in failed["message"]
    assert final["attempts"][-1]["outcome"] == "Error"
    wait_until("RayCluster deleted", lambda: testbed.kubectl(
        "get", "raycluster", "capped-a0", "-n", ns, check=False).returncode != 0, 60)


def test_hostpath_in_a_baseline_namespace_is_refused_at_apply(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    testbed.kubectl("label", "namespace", op_ns, f"{ENFORCE}=baseline")
    doc = example_job(name="host", pods={"common": {
        "volumes": [{"name": "scratch", "hostPath": {"path": "/mnt/scratch"}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}})
    out = apply(testbed, op_ns, doc, check=False)
    assert out.returncode != 0
    assert "spec.pods.common.volumes[0].hostPath: hostPath volumes are forbidden" in out.stderr
    assert f"namespace {op_ns} enforces Pod Security 'baseline'" in out.stderr
    del doc["spec"]["pods"]
    apply(testbed, op_ns, doc)  # the same job without it is admitted


def test_a_gpu_quota_smaller_than_the_job_is_refused_at_apply(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    testbed.kubectl("create", "quota", "team-gpus", "-n", op_ns,
                    "--hard=requests.nvidia.com/gpu=4")
    out = apply(testbed, op_ns, example_job(GPU_EXAMPLE, "wide"), check=False)
    assert out.returncode != 0
    assert "needs 8 GPU(s)" in out.stderr
    assert f"ResourceQuota team-gpus in namespace {op_ns} leaves 4 (hard 4, used 0)" in \
        out.stderr
