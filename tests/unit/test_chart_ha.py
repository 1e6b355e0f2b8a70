"""The chart's high availability, rendered by the pinned helm: two replicas that all
serve the webhooks while one reconciles, updates with no window without a webhook, a
disruption budget, and webhook certificates from cert-manager.

On the real API server: tests/cluster/test_chart.py and tests/cluster/test_ha.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from grpo_testbed.chart import NS, objects, one, render, template

pytestmark = pytest.mark.unit

STANDALONE = {"leaderElection.enabled": "false", "replicaCount": "1"}
CERT_MANAGER = {"webhook.certificate.source": "certManager"}
SELECTOR = {"app.kubernetes.io/name": "grpo-operator", "app.kubernetes.io/instance": "grpo",
            "app.kubernetes.io/component": "operator"}


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(one(docs, "Deployment")["spec"]["template"]["spec"])


def test_default_is_two_replicas_updated_with_always_a_ready_webhook() -> None:
    docs = render()
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    c = pod_spec(docs)["containers"][0]
    assert c["readinessProbe"]["tcpSocket"] == {"port": "webhook"}  # ready = serving
    assert "--peering=grpo-grpo-operator" in c["args"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
           for e in c["env"]}
    assert env["POD_ID"] == "metadata.name"  # Kopf names each peer by its pod
    assert not [a for a in c["args"] if a.startswith("--priority")]  # derived per replica


def test_two_replicas_get_a_disruption_budget_and_spread_across_nodes() -> None:
    docs = render()
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["metadata"]["namespace"] == NS
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": SELECTOR}}
    labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert SELECTOR.items() <= labels.items()
    (term,) = pod_spec(docs)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {"topologyKey": "kubernetes.io/hostname",
                                       "labelSelector": {"matchLabels": SELECTOR}}


def test_a_users_affinity_replaces_the_default_spread() -> None:
    mine = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["ops"]}]}]}}}
    docs = render({"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
                   "nodeSelectorTerms[0].matchExpressions[0].key": "pool",
                   "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
                   "nodeSelectorTerms[0].matchExpressions[0].operator": "In",
                   "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
                   "nodeSelectorTerms[0].matchExpressions[0].values[0]": "ops"})
    assert pod_spec(docs)["affinity"] == mine


def test_one_replica_has_no_budget_and_standalone_stops_the_old_pod_first() -> None:
    one_replica = render({"replicaCount": "1"})
    assert objects(one_replica, "PodDisruptionBudget") == []
    assert "affinity" not in pod_spec(one_replica)
    assert one(one_replica, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"
    alone = render(STANDALONE)
    assert one(alone, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert objects(alone, "PodDisruptionBudget") == []


def test_replicas_without_leader_election_are_refused_naming_the_field_and_fix() -> None:
    proc = template({"leaderElection.enabled": "false"}, check=False)  # replicaCount 2
    assert proc.returncode != 0
    for words in ("replicaCount: 2 replicas need leaderElection.enabled=true",
                  "set leaderElection.enabled=true, or replicaCount=1"):
        assert words in proc.stderr, proc.stderr


def test_peering_lifetime_reaches_the_operator() -> None:
    args = pod_spec(render({"leaderElection.lifetimeSeconds": "30"}))["containers"][0]["args"]
    assert "--peering-lifetime=30" in args


# ---- cert-manager -----------------------------------------------------------------------

def webhook_configs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return (objects(docs, "ValidatingWebhookConfiguration")
            + objects(docs, "MutatingWebhookConfiguration"))


def test_cert_manager_issues_the_mounted_secret_and_injects_its_ca() -> None:
    docs = render(CERT_MANAGER)
    assert objects(docs, "Secret") == []  # cert-manager writes it
    certs = {c["metadata"]["name"]: c for c in objects(docs, "Certificate")}
    serving = certs["grpo-grpo-operator-webhook"]
    svc = next(s for s in objects(docs, "Service") if s["metadata"]["name"].endswith("-webhook"))
    name = svc["metadata"]["name"]
    assert serving["spec"]["dnsNames"] == [name, f"{name}.{NS}", f"{name}.{NS}.svc",
                                           f"{name}.{NS}.svc.cluster.local"]
    volumes = pod_spec(docs)["volumes"]
    assert {"secretName": serving["spec"]["secretName"], "defaultMode": 0o400} in [
        v.get("secret") for v in volumes]
    for cfg in webhook_configs(docs):
        assert cfg["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NS}/grpo-grpo-operator-webhook"}
        for hook in cfg["webhooks"]:
            assert "caBundle" not in hook["clientConfig"]  # the injector's to fill
    # The chart's own CA chain: self-signed Issuer -> CA Certificate -> CA Issuer.
    issuers = {i["metadata"]["name"]: i["spec"] for i in objects(docs, "Issuer")}
    ca = certs["grpo-grpo-operator-webhook-ca"]["spec"]
    assert ca["isCA"] is True
    assert issuers[ca["issuerRef"]["name"]] == {"selfSigned": {}}
    assert issuers[serving["spec"]["issuerRef"]["name"]] == {
        "ca": {"secretName": ca["secretName"]}}


def test_cert_manager_with_a_named_issuer_makes_no_ca_of_its_own() -> None:
    docs = render({**CERT_MANAGER, "webhook.certificate.certManager.issuerRef.name": "corp-ca",
                   "webhook.certificate.certManager.issuerRef.kind": "ClusterIssuer"})
    assert objects(docs, "Issuer") == []
    (cert,) = objects(docs, "Certificate")
    assert cert["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer",
                                         "group": "cert-manager.io"}


def test_other_certificate_sources_render_nothing_of_cert_manager() -> None:
    for docs in (render(), render({"webhook.enabled": "false"}),
                 render({**CERT_MANAGER, "webhook.enabled": "false"})):
        assert objects(docs, "Certificate") == objects(docs, "Issuer") == []
        for cfg in webhook_configs(docs):
            assert "annotations" not in cfg["metadata"]


# ---- admission never blocks finalizer removal or deletes -------------------------------

def test_the_validating_webhook_sees_only_creates_and_spec_changes() -> None:
    """Deletes never reach it (not in its rules), and an update that keeps the spec
    (a finalizer removed) is not sent: with no replica answering, failurePolicy Fail
    would refuse it. tests/cluster/test_chart.py proves it on the API server."""
    (cfg,) = objects(render(), "ValidatingWebhookConfiguration")
    (hook,) = cfg["webhooks"]
    (rule,) = hook["rules"]
    assert rule["operations"] == ["CREATE", "UPDATE"] and rule["resources"] == ["grpojobs"]
    assert hook["matchConditions"] == [{
        "name": "spec-changed",
        "expression": "request.operation != 'UPDATE' || object.spec != oldObject.spec"}]
    (mcfg,) = objects(render(), "MutatingWebhookConfiguration")
    assert [r["operations"] for h in mcfg["webhooks"] for r in h["rules"]] == [["CREATE"]]
