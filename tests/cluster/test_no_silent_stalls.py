"""No silent stalls, with the real API server and the real KubeRay: a job name KubeRay
would refuse is refused at apply time with the limit; the longest accepted name gets a
RayCluster whose pods the real KubeRay creates; a child the API server refuses shows in
the job's status and events within seconds, with the server's own message."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from grpo_operator.render.names import MAX_JOB_NAME
from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed
from grpo_testbed.operator_process import OperatorProcess
from grpo_testbed.processes import wait_until

pytestmark = pytest.mark.cluster


def apply(tb: Testbed, ns: str, doc: dict[str, Any], check: bool = True) -> Any:
    return tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=check)


def get(tb: Testbed, ns: str, kind: str, selector: str = "") -> list[dict[str, Any]]:
    args = ["get", kind, "-n", ns, "-o", "json"] + (["-l", selector] if selector else [])
    return list(json.loads(tb.kubectl(*args).stdout)["items"])


def test_too_long_a_name_is_refused_and_the_longest_allowed_gets_real_pods(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    refused = apply(testbed, op_ns, example_job(name="n" * (MAX_JOB_NAME + 1)), check=False)
    assert refused.returncode != 0
    assert f"metadata.name must be at most {MAX_JOB_NAME} characters" in refused.stderr
    dotted = apply(testbed, op_ns, example_job(name="tiny.v2"), check=False)
    assert dotted.returncode != 0 and "DNS-1035" in dotted.stderr

    longest = "l" * MAX_JOB_NAME
    apply(testbed, op_ns, example_job(name=longest))
    wait_until("KubeRay's head pod for the longest name", lambda: bool(
        get(testbed, op_ns, "pods", f"grpo.dev/job={longest},grpo.dev/role=head")), 60)
    (rc,) = get(testbed, op_ns, "raycluster")
    assert rc["metadata"]["name"] == f"{longest}-a0"
    services = [s["metadata"]["name"] for s in get(testbed, op_ns, "services")]
    assert any(s.startswith(longest) for s in services), services


def test_a_refused_child_is_in_status_and_events_within_seconds(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    # A real refusal: a quota that allows no more ConfigMaps in the namespace.
    testbed.kubectl("create", "quota", "no-configmaps", "-n", op_ns,
                    "--hard=count/configmaps=0")
    apply(testbed, op_ns, example_job(name="quota"))
    t0 = time.monotonic()

    def degraded() -> dict[str, Any] | None:
        job = json.loads(testbed.kubectl("get", "grpojob", "quota", "-n", op_ns,
                                         "-o", "json").stdout)
        conds = {c["type"]: c for c in job.get("status", {}).get("conditions") or []}
        d = conds.get("Degraded")
        return d if d and d["reason"] == "CreateFailed" else None

    wait_until("CreateFailed condition", lambda: degraded() is not None, 20)
    assert time.monotonic() - t0 < 20
    message = (degraded() or {})["message"]
    assert "creating ConfigMap quota-config-0 failed: 403 Forbidden" in message
    assert "exceeded quota: no-configmaps" in message  # the API server's own words
    events = testbed.kubectl("get", "events", "-n", op_ns, "--field-selector",
                             "involvedObject.name=quota,reason=CreateFailed").stdout
    assert "exceeded quota" in events

    testbed.kubectl("delete", "quota", "no-configmaps", "-n", op_ns)
    wait_until("RayCluster after the quota is gone",
               lambda: bool(get(testbed, op_ns, "raycluster")), 60)
