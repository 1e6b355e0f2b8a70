"""The trainer-status policy: a job's ServiceAccounts may change `status.progress` only.

The rule is generated from the status model and rendered into the chart's
ValidatingAdmissionPolicy; the API server's verdict on it is tests/cluster/test_chart.py
(a trainer token's phase patch refused, its progress patch taken) and, from a real head
pod, tests/e2e/test_first_job.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grpo_operator.crd import crd
from grpo_operator.status_policy import (
    RULE_PATH,
    TRAINER_FIELD,
    operator_owned_fields,
    rule_text,
    write_rule,
)
from grpo_testbed.chart import NS, objects, one, render

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
POLICY = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"


def test_checked_in_rule_matches_generated() -> None:
    assert (ROOT / RULE_PATH).read_text() == rule_text(), (
        f"{RULE_PATH} is stale: run `grpo crd --write`")


def test_write_rule_writes_the_chart_file(tmp_path: Path) -> None:
    assert write_rule(tmp_path).read_text() == rule_text()


def test_the_rule_guards_every_status_field_of_the_crd_but_progress() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    status_fields = set(schema["properties"]["status"]["properties"])
    assert set(operator_owned_fields()) == status_fields - {TRAINER_FIELD}
    rule = rule_text()
    for field in status_fields - {TRAINER_FIELD}:
        assert f"object.status.{field} == oldObject.status.{field}" in rule, field
        assert f"!has(object.status.{field})" in rule, field
    assert f".{TRAINER_FIELD}" not in rule


def _policy(values: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = render(values or {})
    return one(docs, POLICY), one(docs, BINDING)


def test_the_chart_exempts_its_own_service_account_only() -> None:
    policy, binding = _policy()
    (cond,) = policy["spec"]["matchConditions"]
    operator = f"system:serviceaccount:{NS}:grpo-grpo-operator"
    assert f"request.userInfo.username != '{operator}'" in cond["expression"]
    assert "startsWith('system:serviceaccount:')" in cond["expression"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["grpojobs/status"] and rule["operations"] == ["UPDATE"]
    (validation,) = policy["spec"]["validations"]
    assert validation["expression"] == rule_text()
    assert validation["reason"] == "Forbidden"
    assert "status.progress" in validation["message"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}


def test_a_named_service_account_is_the_one_exempted() -> None:
    policy, _ = _policy({"serviceAccount.create": "false", "serviceAccount.name": "ops"})
    (cond,) = policy["spec"]["matchConditions"]
    assert f"!= 'system:serviceaccount:{NS}:ops'" in cond["expression"]


def test_watched_namespaces_scope_the_binding() -> None:
    _, binding = _policy({"watchNamespaces": "{team-a,team-b}"})
    (expr,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr == {"key": "kubernetes.io/metadata.name", "operator": "In",
                    "values": ["team-a", "team-b"]}


def test_the_policy_can_be_left_out() -> None:
    docs = render({"rbac.trainerStatusPolicy": "false"})
    assert objects(docs, POLICY) == [] and objects(docs, BINDING) == []
