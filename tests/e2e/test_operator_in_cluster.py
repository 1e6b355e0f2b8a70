"""The operator as the chart deploys it, running on the testbed's real node: its image,
its ServiceAccount, its webhook Service (the API server calls the pod behind it), and the
API server reached from inside the pod through the `kubernetes` Service."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from grpo_testbed.examples import example_job
from grpo_testbed.images import OPERATOR, TRAINER_GPU
from grpo_testbed.launcher import Testbed
from grpo_testbed.node.runtime import NODE_NAME
from grpo_testbed.processes import wait_until
from grpo_testbed.tiny_job import CHART

pytestmark = pytest.mark.e2e

RELEASE = "grpo"
REPOSITORY, TAG = OPERATOR.tag.rsplit(":", 1)


@pytest.fixture(scope="module")
def release(real_tb: Testbed) -> Iterator[str]:
    """`helm install` with the chart's defaults but the image built here; --wait means the
    Deployment is Available: the pod started from the image and passed its probes."""
    ns = real_tb.namespace("grpo-system")
    real_tb.helm("install", RELEASE, str(CHART), "-n", ns, "--set",
                 f"image.repository={REPOSITORY}", "--set", f"image.tag={TAG}",
                 # A full reference, as the chart requires: the GPU trainer's name (not on the
                 # node); the GPU jobs here are planned and rendered, their pods never start.
                 "--set", f"trainerImage={TRAINER_GPU.tag}",
                 "--set", "image.pullPolicy=Never", "--set", "leaderElection.enabled=false",
                 "--set", "replicaCount=1",
                 "--set", "readPublicHub=false",  # nothing leaves the testbed
                 "--wait", "--timeout", "240s")
    yield ns
    real_tb.helm("uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "120s", check=False)
    real_tb.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
def job_ns(real_tb: Testbed) -> Iterator[str]:
    name = real_tb.namespace("jobs")
    yield name
    real_tb.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_the_operator_pod_runs_from_its_image_on_the_real_node(
        real_tb: Testbed, release: str) -> None:
    pods = real_tb.get_json("pods", "-n", release)["items"]
    (pod,) = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["spec"]["containers"][0]["image"] == OPERATOR.tag
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] and status["restartCount"] == 0, status


def test_the_in_cluster_webhook_refuses_an_infeasible_job(
        real_tb: Testbed, release: str, job_ns: str) -> None:
    doc = example_job("grpojob-qwen2vl-72b-h100.yaml", "toobig",
                      resources={"gpuType": "A100-40GB", "nodes": 1, "gpusPerNode": 1})
    out = real_tb.kubectl("apply", "-n", job_ns, "-f", "-", input=yaml.safe_dump(doc),
                          check=False)
    assert out.returncode != 0
    assert "memory planner refuses" in out.stderr and "GiB" in out.stderr, out.stderr


def test_the_in_cluster_operator_reconciles_a_job_into_a_raycluster(
        real_tb: Testbed, release: str, job_ns: str) -> None:
    doc = example_job("grpojob-qwen25vl-7b-h100.yaml", "seven")
    real_tb.kubectl("apply", "-n", job_ns, "-f", "-", input=yaml.safe_dump(doc))

    def planned() -> bool:
        job = real_tb.get_json("grpojob", "seven", "-n", job_ns)
        return bool(job.get("status", {}).get("plan")) and bool(
            real_tb.get_json("rayclusters", "-n", job_ns)["items"])

    wait_until("status.plan and a RayCluster from the in-cluster operator", planned, 120)
    # kubectl logs reaches the operator's container on the node.
    logs = real_tb.kubectl("logs", "-n", release, "deploy/grpo-grpo-operator").stdout
    assert "Handler 'grpojob_reconcile' succeeded" in logs, logs[-2000:]
    assert "Traceback" not in logs and "Forbidden" not in logs, logs[-4000:]


def test_with_read_public_hub_off_a_model_no_table_knows_is_refused_saying_so(
        real_tb: Testbed, release: str, job_ns: str) -> None:
    """The chart's readPublicHub: false reaches the operator: it GETs nothing, and a hub
    model it cannot size is refused at apply naming the setting and the fix."""
    doc = example_job("grpojob-qwen25vl-7b-h100.yaml", "custom")
    doc["spec"]["model"]["path"] = "acme/vl-sft-2"
    out = real_tb.kubectl("apply", "-n", job_ns, "-f", "-", input=yaml.safe_dump(doc),
                          check=False)
    assert out.returncode != 0
    assert "does not read the public hub" in out.stderr, out.stderr
    assert "spec.model.shape" in out.stderr and "spec.hub.endpoint" in out.stderr, out.stderr
