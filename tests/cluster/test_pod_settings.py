"""spec.pods arrives on the pods the real KubeRay creates (kwok runs them in name only, so
the pod objects are what is checked), and the API server refuses an override of the
operator's settings through the webhook, naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed
from grpo_testbed.operator_process import OperatorProcess
from grpo_testbed.processes import wait_until

pytestmark = pytest.mark.cluster

PODS = {
    "common": {
        "env": [{"name": "HF_TOKEN",
                 "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}],
        "envFrom": [{"configMapRef": {"name": "tracking"}}],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "imagePullSecrets": [{"name": "registry-creds"}],
        "priorityClassName": "grpo-test-training",
        "serviceAccountName": "storage-reader",
        "labels": {"cost-centre": "research"},
        "annotations": {"example.com/owner": "rl-team"},
        "securityContext": {"runAsUser": 1000, "runAsNonRoot": True, "fsGroup": 2000},
    },
    "workers": {
        "env": [{"name": "NCCL_IB_HCA", "value": "mlx5"}],  # a literal: no valueFrom default
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl",
                         "effect": "NoSchedule"}],
        "nodeSelector": {"type": "kwok"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In",
                 "values": ["p4d.24xlarge"]}]}]}}},
    },
}


def pods(tb: Testbed, ns: str, selector: str) -> list[dict[str, Any]]:
    out = tb.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout
    return list(json.loads(out)["items"])


def test_every_pod_setting_arrives_on_the_real_pods(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    testbed.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                   "metadata": {"name": "grpo-test-training"}, "value": 1000})
    testbed.kubectl("create", "serviceaccount", "storage-reader", "-n", op_ns)
    doc = example_job("grpojob-qwen25vl-7b-a100-40gb.yaml", "settings", pods=PODS)
    testbed.kubectl("apply", "-n", op_ns, "-f", "-", input=yaml.safe_dump(doc))
    def scheduled() -> bool:
        found = pods(testbed, op_ns, "grpo.dev/job=settings")
        return len(found) >= 2 and all(p["spec"].get("nodeName") for p in found)

    wait_until("head and worker pods from KubeRay, scheduled", scheduled, 90)
    for pod in pods(testbed, op_ns, "grpo.dev/job=settings"):
        role = pod["metadata"]["labels"]["grpo.dev/role"]
        spec, c = pod["spec"], pod["spec"]["containers"][0]
        assert pod["metadata"]["labels"]["cost-centre"] == "research", role
        assert pod["metadata"]["annotations"]["example.com/owner"] == "rl-team", role
        assert PODS["common"]["env"][0] in c["env"], role
        assert c["envFrom"] == PODS["common"]["envFrom"], role
        assert {"name": "scratch", "mountPath": "/scratch"} in [
            {k: m[k] for k in ("name", "mountPath")} for m in c["volumeMounts"]], role
        assert any(v["name"] == "scratch" and "emptyDir" in v for v in spec["volumes"]), role
        assert spec["imagePullSecrets"] == [{"name": "registry-creds"}], role
        assert spec["priorityClassName"] == "grpo-test-training", role
        assert spec["priority"] == 1000, role  # resolved by the API server's admission
        assert spec["serviceAccountName"] == "storage-reader", role
        # The user's fields win; the operator's other Pod Security defaults stay.
        assert spec["securityContext"] == {
            **PODS["common"]["securityContext"], "runAsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"}}, role
        if role == "worker":
            assert spec["nodeSelector"]["type"] == "kwok"
            assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
            assert {t.get("key") for t in spec["tolerations"]} >= {"nvidia.com/gpu",
                                                                   "dedicated"}
            assert spec["affinity"] == PODS["workers"]["affinity"]
            assert {"name": "NCCL_IB_HCA", "value": "mlx5"} in c["env"]
            assert spec["nodeName"].startswith("a100-40gb")  # and it still schedules
    binding = json.loads(testbed.kubectl("get", "rolebinding", "settings-trainer", "-n", op_ns,
                                         "-o", "json").stdout)
    assert "storage-reader" in {s["name"] for s in binding["subjects"]}


def test_an_override_of_the_operators_settings_is_refused_at_apply(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    doc = example_job(name="override", pods={"workers": {
        "env": [{"name": "GRPO_OFFLOAD_PARAMS", "value": "true"}]}})
    out = testbed.kubectl("apply", "-n", op_ns, "-f", "-", input=yaml.safe_dump(doc),
                          check=False)
    assert out.returncode != 0
    assert "spec.pods.workers.env[0].name: GRPO_OFFLOAD_PARAMS is set by the operator" in (
        out.stderr)
