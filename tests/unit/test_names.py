"""No silent stalls from names: every job name the API server accepts either gets valid
children (every name and label the operator, and KubeRay after it, derives) or is refused
with the limit stated; a child the API server refuses shows in status with its message."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from grpo_api.job import load_manifest
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.crd import crd
from grpo_operator.kube import api_message
from grpo_operator.kube_api import ApiError
from grpo_operator.planner import plan_memory
from grpo_operator.reconcile import StoredStatus
from grpo_operator.reconcile.attempts import create_failed
from grpo_operator.reconcile.attempts import ensure_attempt as reconcile
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef, render_children
from grpo_operator.render.names import JOB_NAME_RULE, MAX_JOB_NAME, job_name_problem

pytestmark = pytest.mark.unit

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
TINY = load_manifest("examples/grpojob-tiny.yaml").spec
GPU = load_manifest("examples/grpojob-qwen25vl-7b-h100.yaml").spec
PLANS = ((TINY, plan_memory(TINY), 0), (GPU, plan_memory(GPU), 100))  # attempts 0 and max


def api_accepts(name: str) -> bool:
    """What the API server accepts as a namespaced custom object's name."""
    return len(name) <= 253 and bool(DNS1123_SUBDOMAIN.match(name))


def names_to_try() -> list[str]:
    out = ["a", "x1", "1job", "job.v2", "a.b.c", "Job", "job-", "-job", "j" * 253]
    for n in range(2, 254, 3):
        out += ["j" * n, "a" + "-b" * ((n - 1) // 2), "a" + "0" * (n - 1), "a" * (n - 2) + ".b"]
    return out


def labels_in(obj: Any) -> list[tuple[str, str]]:
    """Every label (key, value) anywhere in an object, pod templates included."""
    found: list[tuple[str, str]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "labels" and isinstance(v, dict):
                found += [(str(a), str(b)) for a, b in v.items()]
            else:
                found += labels_in(v)
    elif isinstance(obj, list):
        for v in obj:
            found += labels_in(v)
    return found


@pytest.mark.parametrize("name", names_to_try())
def test_every_accepted_name_gets_valid_children_or_a_stated_limit(name: str) -> None:
    if not api_accepts(name):
        return  # the API server refuses it itself
    problem = job_name_problem(name)
    if problem is not None:
        assert JOB_NAME_RULE in problem and str(MAX_JOB_NAME) in problem
        assert len(name) > MAX_JOB_NAME or not DNS1035_LABEL.match(name)
        return
    for spec, plan, attempt in PLANS:
        children = render_children(spec, plan, JobRef(name, "ns", "u"), attempt)
        for child in children:
            child_name = child["metadata"]["name"]
            assert api_accepts(child_name), (child["kind"], child_name)
            for key, value in labels_in(child):
                assert len(value) <= 63 and LABEL_VALUE.match(value), (key, value)
        rc = next(c for c in children if c["kind"] == "RayCluster")["metadata"]["name"]
        # KubeRay v1.6.1 ValidateRayClusterMetadata, then the names it derives from it.
        assert len(rc) <= 53 and DNS1035_LABEL.match(rc), rc
        for suffix in ("-head-svc", "-serve-svc"):
            assert len(rc + suffix) <= 63


def test_the_crd_states_the_same_rule() -> None:
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    (rule,) = root["x-kubernetes-validations"]
    assert rule["message"] == JOB_NAME_RULE and f"<= {MAX_JOB_NAME}" in rule["rule"]


def test_a_job_with_a_name_kuberay_would_refuse_fails_at_once_saying_why() -> None:
    """Jobs created before the CRD had its rule: Failed with the rule, no children."""
    spec = TINY.to_wire()
    d = reconcile(JobRef("x" * 49, "ns", "u"), Planner(spec).plan([], None), GRPOJobStatus(),
                  "2026-01-01T00:00:00Z").derive(StoredStatus(), 1, "2026-01-01T00:00:00Z")
    assert d.status["phase"] == "Failed" and not d.children
    assert d.events[0][:2] == ("Warning", "InvalidName") and JOB_NAME_RULE in d.events[0][2]


def test_a_refused_child_shows_in_status_and_events_with_the_servers_message() -> None:
    body = json.dumps({"kind": "Status", "message": 'configmaps "j-config-0" is forbidden: '
                       "exceeded quota: no-cm, requested: count/configmaps=1"})
    message = api_message(ApiError(403, "Forbidden", body))  # a refused create
    assert message.startswith('403 Forbidden: configmaps "j-config-0" is forbidden')
    d = create_failed("ConfigMap", "j-config-0", message).derive(StoredStatus(), 3,
                                                                 "2026-01-01T00:00:00Z")
    assert d.status["phase"] == "Pending"
    conds = {c["type"]: c for c in d.status["conditions"]}
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == "CreateFailed"
    assert "exceeded quota: no-cm" in conds["Progressing"]["message"]
    assert d.events == [("Warning", "CreateFailed", conds["Degraded"]["message"])]
