"""The network between worker nodes: fabric devices on the workers, the env NCCL needs
for them, the capability RDMA needs, and a warning when a multi-node job has none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.catalog import FABRICS
from grpo_api.job import parse_spec
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.catalog_file import CatalogError, merge_catalog
from grpo_operator.planner import Plan, plan_memory
from grpo_operator.reconcile.attempts import ensure_attempt
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef
from grpo_operator.webhook import admission_problem

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


# An image of the user's own: one built FROM the trainer image with the EFA installer.
EFA_IMAGE = "registry.example.com/me/trainer-efa:1"


def job(devices: dict[str, int] | None = None, nodes: int = 8, image: str | None = None,
        **pods: Any) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(
        (ROOT / "examples/grpojob-qwen2vl-72b-h100.yaml").read_text())["spec"]
    spec["resources"] = {"gpuType": "H100-80GB", "nodes": nodes, "gpusPerNode": 8}
    if image is not None:
        spec["image"] = image
    if devices is not None:
        spec["resources"]["devices"] = devices
    if pods:
        spec["pods"] = pods
    return spec


def plan(spec: dict[str, Any]) -> Plan:
    return plan_memory(parse_spec(spec))


def network(p: Plan) -> str:
    return next(d.reason for d in p.decisions if d.knob == "network")


def containers(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    kids = ensure_attempt(JobRef("j", "ns", "u"), Planner(spec).plan([], None), GRPOJobStatus(),
                          "2026-11-24T00:00:00Z").children
    rc = next(c for c in kids if c["kind"] == "RayCluster")["spec"]
    return (rc["headGroupSpec"]["template"]["spec"]["containers"][0],
            rc["workerGroupSpecs"][0]["template"]["spec"]["containers"][0])


def test_infiniband_devices_go_on_the_workers_with_nccl_env_and_ipc_lock() -> None:
    spec = job({"rdma/ib": 1})
    p = plan(spec)
    assert p.env["NCCL_IB_DISABLE"] == "0"
    # NCCL may use IB only: without its verbs stack the first collective fails by name
    # (`Error: network IB not found.`) instead of training over TCP sockets.
    assert p.env["NCCL_NET"] == "IB" and "fails the first collective" in network(p)
    assert "FI_PROVIDER" not in p.env and "NCCL_SOCKET_IFNAME" not in p.env
    assert p.worker is not None and p.worker.devices == {"rdma/ib": 1}
    assert p.worker.capabilities == ("IPC_LOCK",)
    assert p.head.devices == {} and p.head.capabilities == ()
    assert "NCCL between nodes over InfiniBand" in network(p)
    head, worker = containers(spec)
    for side in ("requests", "limits"):
        assert worker["resources"][side]["rdma/ib"] == "1"
        assert worker["resources"][side]["nvidia.com/gpu"] == "8"
        assert "rdma/ib" not in head["resources"][side]


def test_efa_devices_get_libfabric_env() -> None:
    spec = job({"vpc.amazonaws.com/efa": 32}, image=EFA_IMAGE)
    p = plan(spec)
    assert p.env["FI_PROVIDER"] == "efa" and p.env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert p.env["NCCL_NET"] == "AWS Libfabric"
    assert "NCCL_IB_DISABLE" not in p.env and "NCCL_PROTO" not in p.env
    assert p.worker is not None and p.worker.capabilities == ("IPC_LOCK",)
    assert "AWS EFA" in network(p) and "the GPU catalog says infiniband" in network(p)
    _, worker = containers(spec)
    assert worker["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"


def test_a_multi_node_job_without_its_fabric_is_warned_of_tcp() -> None:
    p = plan(job())
    why = network(p)
    assert why.startswith("WARNING: 8 worker nodes of H100-80GB")
    assert "NCCL falls back to TCP sockets" in why and "{rdma/ib: 1}" in why
    assert "NCCL_IB_DISABLE" not in p.env
    assert p.worker is not None and p.worker.capabilities == () and not p.worker.devices


def test_one_worker_node_needs_no_fabric() -> None:
    p = plan(job(nodes=1) | {"training": {"rolloutBatchSize": 64, "globalBatchSize": 64}}
             | {"model": {"path": "Qwen/Qwen2.5-VL-7B-Instruct"}})
    assert not [d for d in p.decisions if d.knob == "network"]


def test_what_spec_pods_sets_for_the_fabric_is_left_to_it() -> None:
    mine = {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "0"}
    spec = job({"vpc.amazonaws.com/efa": 4}, image=EFA_IMAGE, workers={"env": [mine]})
    p = plan(spec)
    assert "FI_EFA_USE_DEVICE_RDMA" not in p.env and p.env["FI_PROVIDER"] == "efa"
    assert "FI_EFA_USE_DEVICE_RDMA as spec.pods sets" in network(p)
    assert admission_problem(spec, None) is None  # not refused as the operator's env
    _, worker = containers(spec)
    assert [e for e in worker["env"] if e["name"] == "FI_EFA_USE_DEVICE_RDMA"] == [mine]


@pytest.mark.parametrize(("devices", "message"), [
    ({"efa": 1}, "spec.resources.devices: 'efa' is not an extended resource name"),
    ({"nvidia.com/gpu": 8}, "'nvidia.com/gpu': GPUs come from resources.gpuType"),
    ({"kubernetes.io/x": 1}, "the kubernetes.io domain and requests. are reserved"),
    ({"rdma/ib": 0}, "spec.resources.devices.rdma/ib: Input should be greater than or equal"),
])
def test_the_webhook_refuses_what_is_not_an_extended_resource(
        devices: dict[str, int], message: str) -> None:
    problem = admission_problem(job(devices), None)
    assert problem is not None and message in problem, problem


def test_devices_need_worker_pods() -> None:
    tiny = yaml.safe_load((ROOT / "examples/grpojob-tiny.yaml").read_text())["spec"]
    tiny["resources"]["devices"] = {"rdma/ib": 1}
    problem = admission_problem(tiny, None)
    assert problem is not None and "spec.resources: devices: go on worker pods" in problem


def test_the_charts_catalog_sets_or_clears_a_types_fabric() -> None:
    catalog = merge_catalog({"H100-80GB": {"fabric": "efa"}, "A100-80GB": {"fabric": "none"}})
    assert catalog["H100-80GB"].fabric == "efa" and catalog["A100-80GB"].fabric is None
    with pytest.raises(CatalogError, match=r"gpuCatalog\.H100-80GB\.fabric"):
        merge_catalog({"H100-80GB": {"fabric": "roce"}})
    p = plan_memory(parse_spec(job()), merge_catalog({"H100-80GB": {"fabric": "none"}}))
    assert "no fabric in the GPU catalog for H100-80GB" in network(p)
    schema = json.loads((ROOT / "charts/grpo-operator/values.schema.json").read_text())
    fabric = schema["properties"]["gpuCatalog"]["additionalProperties"]["properties"]["fabric"]
    assert set(fabric["enum"]) == {*FABRICS, "none"}


def test_an_rdma_job_adds_ipc_lock_and_a_baseline_namespace_refuses_it_at_apply() -> None:
    """The fabric's capability reaches the worker container (render/security.py), and
    the webhook says which namespace level refuses it before KubeRay is refused."""
    from grpo_api.job import parse_spec
    from grpo_operator.namespace_policy import NamespaceFacts
    from grpo_operator.reconcile.planning import planned
    from grpo_operator.render import render_children

    raw_spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples"
                                / "grpojob-qwen2vl-72b-h100.yaml").read_text())["spec"]
    assert raw_spec["resources"]["devices"] == {"rdma/ib": 1}
    spec = parse_spec(raw_spec)
    plan = planned(spec)
    rc = next(c for c in render_children(spec, plan, JobRef("j", "ns", "u"), 0)
              if c["kind"] == "RayCluster")
    worker = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert worker["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"], "drop": ["ALL"]}
    level = "pod-security.kubernetes.io/enforce"
    assert admission_problem(raw_spec, None, namespace=NamespaceFacts(
        "ns", {level: "privileged"})) is None
    problem = admission_problem(raw_spec, None,
                                namespace=NamespaceFacts("ns", {level: "baseline"}))
    assert problem is not None and "IPC_LOCK" in problem and "baseline" in problem, problem
    # The fix names the level RDMA needs (docs/deployment.md, "RDMA jobs").
    assert ("kubectl label namespace ns pod-security.kubernetes.io/enforce=privileged "
            "--overwrite") in problem, problem


@pytest.mark.parametrize("image", [None, "ghcr.io/grpo-operator/trainer:0.1.0",
                                   "ghcr.io/grpo-operator/trainer@sha256:" + "a" * 64,
                                   "localhost/grpo-operator/trainer:0.1.0",
                                   "registry.example.com:5000/ml/grpo-operator/trainer:0.1.0",
                                   "grpo-operator/trainer:0.1.0"])
def test_efa_on_the_project_image_is_refused_at_apply(image: str | None) -> None:
    """The trainer image has no aws-ofi-nccl (neither Debian nor PyPI packages it), so
    NCCL could not reach EFA and would train over TCP: the webhook says so, and what
    image would serve."""
    problem = admission_problem(job({"vpc.amazonaws.com/efa": 32}, image=image), None)
    assert problem is not None, image
    assert "spec.resources.devices: the workers request efa devices" in problem
    assert "aws-ofi-nccl" in problem and "set spec.image" in problem
    # The same job on an image of the user's own, or over InfiniBand, is admitted.
    assert admission_problem(job({"vpc.amazonaws.com/efa": 32}, image=EFA_IMAGE), None) is None
    assert admission_problem(job({"rdma/ib": 1}, image=image), None) is None
