"""spec.pods.*.initContainers, and the first example that builds its own model with one:
the step runs before the Ray container with that container's image, env, mounts,
resources and security; what would take the operator's names is refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from grpo_api.contract import CHECKPOINT_MOUNT
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.namespace_policy import NamespaceFacts
from grpo_operator.reconcile.attempts import ensure_attempt
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef
from grpo_operator.webhook import admission_problem
from grpo_testbed.examples import example_job

pytestmark = pytest.mark.unit

FIRST = example_job("grpojob-first.yaml", kwok=False)
HUB = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]
STEP = {"name": "prepare", "command": ["python", "-m", "prep"], "args": ["--to", "/data"],
        "env": [{"name": "PREP_LEVEL", "value": "2"}]}


def children(spec: dict[str, Any], image: str = "img:1") -> dict[str, dict[str, Any]]:
    d = ensure_attempt(JobRef("first", "ns", "u"), Planner(spec).plan([], None), GRPOJobStatus(),
                       "2026-01-01T00:00:00Z", image)
    assert d.children, d.status
    return {c["kind"]: c for c in d.children}


def pod(rc: dict[str, Any], role: str) -> dict[str, Any]:
    group = rc["spec"]["headGroupSpec"] if role == "head" else rc["spec"]["workerGroupSpecs"][0]
    return dict(group["template"]["spec"])


def test_the_first_example_builds_its_model_on_its_own_claim_before_ray_starts() -> None:
    spec = FIRST["spec"]
    kids = children(spec)
    head = pod(kids["RayCluster"], "head")
    (init,) = head["initContainers"]
    (ray,) = head["containers"]
    assert init["name"] == "make-tiny"
    assert init["image"] == ray["image"] == "img:1"  # the job's trainer image: it has grpo-train
    assert init["command"][:2] == ["grpo-train", "make-tiny"]
    out = init["command"][init["command"].index("--out") + 1]
    # The model and data it builds are where the spec reads them, on the checkpoint volume.
    assert spec["model"]["path"] == f"{out}/model" and "claimName" not in spec["model"]
    assert spec["data"]["train"] == f"{out}/train.parquet"
    assert out.startswith(CHECKPOINT_MOUNT + "/")
    for key in ("volumeMounts", "resources", "securityContext", "env"):
        assert init[key] == ray[key], key
    # The claim is the operator's own, of the default StorageClass; one pod: ReadWriteOnce.
    pvc = kids["PersistentVolumeClaim"]["spec"]
    assert pvc["accessModes"] == ["ReadWriteOnce"] and "storageClassName" not in pvc
    assert "workerGroupSpecs" not in kids["RayCluster"]["spec"]


def test_the_first_example_passes_pod_security_restricted_and_fits_a_small_node() -> None:
    restricted = NamespaceFacts("team", {"pod-security.kubernetes.io/enforce": "restricted"}, ())
    assert admission_problem(FIRST["spec"], None, namespace=restricted, name="first") is None
    limits = pod(children(FIRST["spec"])["RayCluster"], "head")["containers"][0]["resources"]
    assert limits["limits"] == {"cpu": "1", "memory": "7Gi"}, limits


def test_steps_run_after_the_hub_fetch_in_order_with_their_own_env_and_image() -> None:
    spec = copy.deepcopy(HUB)
    spec["pods"] = {"common": {"initContainers": [STEP]},
                    "head": {"initContainers": [{"name": "second", "image": "busybox:1",
                                                 "command": ["true"]}]}}
    rc = children(spec)["RayCluster"]
    head, worker = pod(rc, "head"), pod(rc, "worker")
    assert [c["name"] for c in head["initContainers"]] == ["hub-fetch", "prepare", "second"]
    assert [c["name"] for c in worker["initContainers"]] == ["prepare"]
    prepare = worker["initContainers"][0]
    assert prepare["image"] == "img:1" and prepare["args"] == ["--to", "/data"]
    assert prepare["env"][-1] == STEP["env"][0]
    assert prepare["env"][:-1] == worker["containers"][0]["env"]
    assert prepare["resources"] == worker["containers"][0]["resources"]
    assert head["initContainers"][2]["image"] == "busybox:1"


@pytest.mark.parametrize(("pods", "field"), [
    ({"head": {"initContainers": [{**STEP, "name": "hub-fetch"}]}},
     "spec.pods.head.initContainers[0].name: 'hub-fetch' is the operator's"),
    ({"workers": {"initContainers": [{**STEP, "name": "ray-worker"}]}},
     "spec.pods.workers.initContainers[0].name: 'ray-worker' is the operator's"),
    ({"common": {"initContainers": [{**STEP, "env": [{"name": "GRPO_ATTEMPT", "value": "9"}]}]}},
     "spec.pods.common.initContainers[0].env[0].name: GRPO_ATTEMPT is set by the operator"),
    ({"common": {"initContainers": [STEP]}, "head": {"initContainers": [STEP]}},
     "spec.pods.head.initContainers: 'prepare' is set twice"),
    ({"head": {"initContainers": [{**STEP, "resources": {}}]}},
     "spec.pods.head.initContainers[0].resources: unknown field"),
])
def test_what_would_take_the_operators_place_is_refused(pods: dict[str, Any],
                                                        field: str) -> None:
    spec = copy.deepcopy(HUB)
    spec["pods"] = pods
    problem = admission_problem(spec, None)
    assert problem is not None and field in problem, problem
