"""Nodes as they are: where the operator may list Nodes, plans size pods for the
allocatable memory and CPUs of the smallest schedulable Node labelled with the job's GPU
product, and status.plan.nodeSource says so; elsewhere the catalog's figures, named as
assumed; the spec's own hostMemory / cpusPerNode win over both."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from grpo_api.catalog import GPU_CATALOG, GPU_PRODUCT_LABEL
from grpo_api.job import parse_spec
from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.node_shapes import NodeShape, catalog_with_nodes, node_shapes
from grpo_operator.planner import plan_memory
from grpo_operator.planner.budget import host_capacity_gib
from grpo_operator.reconcile import Observed
from grpo_operator.webhook import review_admission
from grpo_testbed.examples import example_job
from grpo_testbed.status_patch import apply_status_patch

pytestmark = pytest.mark.unit

H100 = GPU_CATALOG["H100-80GB"]
T0 = "2026-12-03T10:00:00.000Z"


def node(name: str, memory: str, cpu: str, label: str | None = H100.product_label,
         cordoned: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name,
                         "labels": {GPU_PRODUCT_LABEL: label} if label else {}},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"allocatable": {"memory": memory, "cpu": cpu}}}


def test_the_smallest_schedulable_node_of_each_type_is_its_shape() -> None:
    nodes = [node("a", "1900Gi", "190"), node("b", "1843Gi", "191500m"),
             node("cordoned", "100Gi", "8", cordoned=True),  # no new pod lands there
             node("cpu", "64Gi", "16", label=None),
             node("odd", "lots", "8"),  # unreadable: left out
             node("a100", "760Gi", "96", label=GPU_CATALOG["A100-40GB"].product_label)]
    shapes = node_shapes(nodes, GPU_CATALOG)
    assert shapes["H100-80GB"] == NodeShape(2, 1843.0, 190)
    assert shapes["A100-40GB"] == NodeShape(1, 760.0, 96)
    assert "cpu" not in shapes


def test_the_plan_counts_what_the_node_allocates_and_names_the_nodes() -> None:
    shapes = {"H100-80GB": NodeShape(3, 1000.0, 96)}
    catalog = catalog_with_nodes(GPU_CATALOG, shapes)
    spec = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]
    plan = plan_memory(parse_spec(spec), catalog)
    geo = plan.geometry
    # What the planner counts as the node's allocatable is the Node's own figure.
    assert host_capacity_gib(geo, True) == pytest.approx(1000.0)
    assert geo.cpus_per_node == 96
    assert plan.worker is not None and plan.worker.cpus == int(96 * 0.9)
    assert plan.worker.memory_gib <= 1000
    assert geo.node_source == (f"3 Node(s) labelled {GPU_PRODUCT_LABEL}={H100.product_label}; "
                               "the smallest allocates 1000.0 GiB and 96 CPUs")
    # A type no Node carries: the catalog's figures, named as assumed.
    a100 = catalog["A100-40GB"]
    assert a100.host_memory_gib == GPU_CATALOG["A100-40GB"].host_memory_gib
    assert "assumed: no schedulable Node is labelled" in a100.node_source
    # Nodes not read: the catalog as it is, and the plan says the figures are assumed.
    assert catalog_with_nodes(GPU_CATALOG, None) is GPU_CATALOG
    unread = plan_memory(parse_spec(spec))
    assert unread.geometry.node_source == "the catalog's figures, assumed (Nodes not read)"


def test_the_specs_own_figures_win() -> None:
    catalog = catalog_with_nodes(GPU_CATALOG, {"H100-80GB": NodeShape(3, 1000.0, 96)})
    spec = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]
    spec["resources"] |= {"hostMemory": "760Gi", "cpusPerNode": 64}
    geo = plan_memory(parse_spec(spec), catalog).geometry
    assert (geo.host_memory_gib, geo.cpus_per_node) == (760, 64)
    assert geo.node_source == "spec.resources.hostMemory and cpusPerNode"
    spec["resources"].pop("cpusPerNode")
    geo = plan_memory(parse_spec(spec), catalog).geometry
    assert geo.cpus_per_node == 96 and geo.node_source.startswith(
        "spec.resources.hostMemory, the rest: 3 Node(s) labelled")


def test_reconcile_and_admission_plan_for_the_nodes_they_are_given() -> None:
    doc = example_job("grpojob-qwen25vl-7b-h100.yaml", "j")
    doc["metadata"] |= {"namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "1"}
    doc["status"] = {}
    small = {"H100-80GB": NodeShape(2, 48.0, 16)}  # too little RAM for this job's ranks
    config = OperatorConfig(default_image="img:1")
    roomy = rec.reconcile(copy.deepcopy(doc), Observed(nodes={"H100-80GB": NodeShape(
        2, 1000.0, 96)}), rec.SpecChanged(), T0, config)
    status = apply_status_patch({}, roomy.status)
    assert status["plan"]["nodeSource"].startswith("2 Node(s) labelled")
    tight = rec.reconcile(copy.deepcopy(doc), Observed(nodes=small), rec.SpecChanged(), T0,
                          config)
    refused = apply_status_patch({}, tight.status)
    assert refused["phase"] == "Failed", refused
    failed = next(c for c in refused["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "Infeasible" and "host" in failed["message"], failed
    catalog = catalog_with_nodes(GPU_CATALOG, small)
    problem = review_admission(doc["spec"], None, catalog).problem
    assert problem and "memory planner refuses" in problem, problem
    assert review_admission(doc["spec"], None).problem is None  # the catalog's 2 TiB node
