"""The platform's per-job NetworkPolicy (the chart's jobNetworkPolicy): the job's Ray pods
accept traffic from the job's own pods and the listed peers only, and with egress rules
send only to the job's pods, DNS and those rules. The cluster tier creates it for a real
job under the chart's RBAC (tests/cluster/test_chart.py). And every RayCluster asks for
Ray's token authentication, so what the pods do accept asks for the token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from grpo_api.job import parse_spec
from grpo_operator.reconcile.planning import planned
from grpo_operator.render import JobRef, render_children
from grpo_operator.render.network_policy import JobNetworkPolicy, parse_job_network_policy
from grpo_testbed.chart import objects, one, render

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpojob-tiny.yaml"
JOB = JobRef("tiny", "team-a", "uid-1")
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
API_SERVER = {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 443}]}


def children(policy: JobNetworkPolicy | None) -> list[dict[str, Any]]:
    spec = parse_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])
    return render_children(spec, planned(spec), JOB, 0, network_policy=policy)


def pods_of(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rc = one(docs, "RayCluster")["spec"]
    return [rc["headGroupSpec"]["template"],
            *(g["template"] for g in rc.get("workerGroupSpecs") or [])]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


@pytest.mark.parametrize("example", sorted(EXAMPLE.parent.glob("grpojob-*.yaml")),
                         ids=lambda p: p.stem)
def test_every_ray_cluster_asks_kuberay_for_token_authentication(example: Path) -> None:
    """A Ray head serves its dashboard and Jobs API, and each node its agent, to anyone
    who reaches them unless Ray's token authentication is on: every RayCluster asks
    KubeRay for it (which needs rayVersion >= 2.52.0; KubeRay refuses the cluster
    otherwise)."""
    spec = parse_spec(yaml.safe_load(example.read_text())["spec"])
    rc = one(render_children(spec, planned(spec), JOB, 0), "RayCluster")["spec"]
    assert rc["authOptions"] == {"mode": "token"}
    assert tuple(int(x) for x in rc["rayVersion"].split(".")) >= (2, 52, 0)


def test_without_the_setting_no_policy_is_made() -> None:
    assert not objects(children(None), "NetworkPolicy")


def test_the_job_pods_accept_only_their_own_job_and_the_listed_peers() -> None:
    docs = children(JobNetworkPolicy(ingress_from=(PROMETHEUS,)))
    policy = one(docs, "NetworkPolicy")
    assert policy["metadata"]["name"] == "tiny-ray-pods"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # gone with the job
    spec = policy["spec"]
    # It selects every Ray pod of the job (every attempt's), and nothing of another job.
    for pod in pods_of(docs):
        assert selects(spec["podSelector"], pod["metadata"]["labels"])
    assert not selects(spec["podSelector"], {"grpo.dev/job": "other"})
    assert spec["policyTypes"] == ["Ingress"]  # egress left open without rules
    (rule,) = spec["ingress"]
    assert rule["from"] == [{"podSelector": spec["podSelector"]}, PROMETHEUS]
    assert "egress" not in spec
    # Made before the pods it guards.
    kinds = [d["kind"] for d in docs]
    assert kinds.index("NetworkPolicy") < kinds.index("RayCluster")


def test_egress_rules_close_egress_to_the_job_dns_and_those_rules() -> None:
    spec = one(children(JobNetworkPolicy(egress=(API_SERVER,))), "NetworkPolicy")["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    own, dns, extra = spec["egress"]
    assert own == {"to": [{"podSelector": spec["podSelector"]}]}
    assert {p["port"] for p in dns["ports"]} == {53} and dns["to"] == [{"namespaceSelector": {}}]
    assert extra == API_SERVER
    # An empty list is a closed egress, not an open one.
    closed = one(children(JobNetworkPolicy(egress=())), "NetworkPolicy")["spec"]
    assert closed["policyTypes"] == ["Ingress", "Egress"] and len(closed["egress"]) == 2


@pytest.mark.parametrize(("text", "words"), [
    ("{", "not JSON"),
    ("[]", "a JSON object is needed"),
    ('{"ingress": []}', "unknown keys ingress"),
    ('{"ingressFrom": {"podSelector": {}}}', "ingressFrom must be a list of objects"),
    ('{"egress": ["10.0.0.0/8"]}', "egress must be a list of objects"),
])
def test_a_bad_setting_is_refused_naming_the_flag_and_the_key(text: str, words: str) -> None:
    with pytest.raises(ValueError, match="--job-network-policy") as err:
        parse_job_network_policy(text)
    assert words in str(err.value)


def test_grpo_operator_refuses_a_bad_setting_at_start() -> None:
    from grpo_operator.main import cli

    result = CliRunner().invoke(cli, ["--job-network-policy", '{"egress": "none"}'])
    assert result.exit_code == 2
    assert "--job-network-policy" in result.output and "egress must be a list" in result.output


def test_the_chart_passes_its_values_and_grants_only_what_the_policy_needs() -> None:
    off = render()
    dep = one(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert not [a for a in dep["args"] if a.startswith("--job-network-policy")]
    rules = [r for d in objects(off, "ClusterRole") for r in d.get("rules") or []]
    assert not [r for r in rules if "networkpolicies" in r["resources"]]

    on = render({"jobNetworkPolicy.enabled": "true",
                 "jobNetworkPolicy.ingressFrom[0].namespaceSelector.matchLabels.team": "mon"})
    dep = one(on, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    (arg,) = [a for a in dep["args"] if a.startswith("--job-network-policy=")]
    policy = parse_job_network_policy(arg.split("=", 1)[1])
    assert policy == JobNetworkPolicy(
        ingress_from=({"namespaceSelector": {"matchLabels": {"team": "mon"}}},), egress=None)
    rules = [r for d in objects(on, "ClusterRole") for r in d.get("rules") or []]
    (granted,) = [r for r in rules if "networkpolicies" in r["resources"]]
    assert granted["apiGroups"] == ["networking.k8s.io"]
    assert sorted(granted["verbs"]) == ["create", "get"]  # the job owns it: GC deletes it
    assert json.loads(arg.split("=", 1)[1])["egress"] is None
