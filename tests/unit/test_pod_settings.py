"""spec.pods: settings reach the rendered Ray pods added to the operator's own; whatever
would override the operator's is refused with the field named."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from grpo_api.job import load_manifest
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.reconcile.attempts import ensure_attempt as reconcile
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef
from grpo_operator.webhook import admission_problem

pytestmark = pytest.mark.unit

GPU_JOB = load_manifest("examples/grpojob-qwen25vl-7b-h100.yaml").spec.to_wire()
HF_TOKEN = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
PODS: dict[str, Any] = {
    "common": {
        "env": [HF_TOKEN],
        "envFrom": [{"secretRef": {"name": "tracking-keys"}}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
        "imagePullSecrets": [{"name": "registry"}],
        "priorityClassName": "training",
        "serviceAccountName": "storage-reader",
        "labels": {"cost-centre": "research"},
        "annotations": {"example.com/team": "rl"},
        "securityContext": {"runAsUser": 1000, "fsGroup": 1000},
    },
    "head": {"nodeSelector": {"node-pool": "cpu"}},
    "workers": {
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl",
                         "effect": "NoSchedule"}],
        "nodeSelector": {"node-pool": "h100-spot"},
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                              "labelSelector": {"matchLabels": {"a": "b"}}}}]}},
        "env": [{"name": "NCCL_IB_HCA", "value": "mlx5"}],
    },
}


def with_pods(pods: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(GPU_JOB)
    spec["pods"] = pods
    return spec


def children(spec: dict[str, Any]) -> list[dict[str, Any]]:
    d = reconcile(JobRef("j", "ns", "u"), Planner(spec).plan([], None), GRPOJobStatus(),
                  "2026-01-01T00:00:00Z", "img")
    assert d.children, d.status
    return d.children


def test_every_setting_reaches_its_pods_next_to_the_operators() -> None:
    kids = children(with_pods(PODS))
    rc = next(c for c in kids if c["kind"] == "RayCluster")["spec"]
    head = rc["headGroupSpec"]["template"]
    worker = rc["workerGroupSpecs"][0]["template"]
    for tpl in (head, worker):
        pod, c = tpl["spec"], tpl["spec"]["containers"][0]
        assert tpl["metadata"]["labels"]["cost-centre"] == "research"
        assert tpl["metadata"]["labels"]["grpo.dev/job"] == "j"  # the operator's stay
        assert tpl["metadata"]["annotations"] == {"example.com/team": "rl"}
        assert HF_TOKEN in c["env"] and any(e["name"] == "GRPO_JOB_NAME" for e in c["env"])
        assert c["envFrom"] == [{"secretRef": {"name": "tracking-keys"}}]
        assert {"name": "data", "mountPath": "/data", "readOnly": True} in c["volumeMounts"]
        assert {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}} in (
            pod["volumes"])
        assert {v["name"] for v in pod["volumes"]} >= {"checkpoints", "config", "dshm"}
        assert pod["imagePullSecrets"] == [{"name": "registry"}]
        assert pod["priorityClassName"] == "training"
        assert pod["serviceAccountName"] == "storage-reader"
        # The user's fields win over the operator's non-root defaults, field by field.
        assert pod["securityContext"] == {
            "runAsUser": 1000, "fsGroup": 1000, "runAsGroup": 10001, "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"}}
        assert c["resources"]["limits"]["memory"].endswith("Gi")  # still the planner's
    assert head["spec"]["nodeSelector"] == {"node-pool": "cpu"}
    assert worker["spec"]["nodeSelector"] == {"node-pool": "h100-spot",
                                              "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    tolerations = worker["spec"]["tolerations"]
    assert tolerations[0]["key"] == "nvidia.com/gpu" and tolerations[1]["key"] == "dedicated"
    assert "podAntiAffinity" in worker["spec"]["affinity"] and "affinity" not in head["spec"]
    w_env = worker["spec"]["containers"][0]["env"]
    assert {"name": "NCCL_IB_HCA", "value": "mlx5"} in w_env
    binding = next(c for c in kids if c["kind"] == "RoleBinding")
    assert {s["name"] for s in binding["subjects"]} == {"j-trainer", "storage-reader"}


@pytest.mark.parametrize(
    ("pods", "message"),
    [
        ({"head": {"env": [{"name": "GRPO_OFFLOAD_PARAMS", "value": "true"}]}},
         "spec.pods.head.env[0].name: GRPO_OFFLOAD_PARAMS is set by the operator"),
        ({"workers": {"env": [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "x"}]}},
         "spec.pods.workers.env[0].name: PYTORCH_CUDA_ALLOC_CONF is set by the operator"),
        ({"workers": {"env": [{"name": "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
                               "value": "1"}]}},
         "spec.pods.workers.env[0].name: RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES would "
         "stop Ray masking every actor's devices, the trainer's probes and helpers too; "
         "the trainer relies on that"),
        ({"common": {"env": [HF_TOKEN, {"name": "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",
                                        "value": "1"}]}},
         "spec.pods.common.env[1].name: RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES would "
         "stop Ray masking"),
        ({"common": {"volumes": [{"name": "dshm", "emptyDir": {}}]}},
         "spec.pods.common.volumes[0].name: 'dshm' is the operator's volume"),
        ({"common": {"volumes": [{"name": "v", "emptyDir": {}}],
                     "volumeMounts": [{"name": "v", "mountPath": "/etc"}]}},
         "spec.pods.common.volumeMounts[0].mountPath: /etc would hide or shadow the "
         "operator's mount at /etc/grpo"),
        ({"workers": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100"}}},
         "spec.pods.workers.nodeSelector.nvidia.com/gpu.product: the GPU type is "
         "spec.resources.gpuType"),
        ({"common": {"labels": {"grpo.dev/job": "other"}}},
         "spec.pods.common.labels.grpo.dev/job: the grpo.dev/ prefix is the operator's"),
        ({"head": {"resources": {"limits": {"memory": "1Ti"}}}},
         "spec.pods.head: resources: the operator owns it (GPU, CPU and memory are the "
         "planner's"),
        ({"head": {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}},
         "spec.pods.head: volumeMount 'nope' at /x names no volume"),
        ({"common": {"env": [HF_TOKEN]}, "head": {"env": [HF_TOKEN]}},
         "spec.pods.head.env: 'HF_TOKEN' is set twice"),
        ({"common": {"volumes": [{"name": "v"}]}},
         "volume 'v': set exactly one volume source"),
    ],
)
def test_overriding_the_operator_is_refused_naming_the_field(
    pods: dict[str, Any], message: str
) -> None:
    problem = admission_problem(with_pods(pods), None)
    assert problem is not None and message in problem, problem

