"""The Helm chart, rendered by the pinned helm: lint, value sets, schema, RBAC, security.

Fast (helm template only, no cluster); the install itself is tests/cluster/test_chart.py.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from grpo_api import contract
from grpo_api.job import parse_spec
from grpo_api.job.memory_peaks import MemoryPeaks
from grpo_operator.planner import plan_memory
from grpo_operator.render import JobRef
from grpo_operator.render.children import render_children
from grpo_operator.render.trainer_config import METRICS_PORT, METRICS_PORT_NAME
from grpo_testbed.chart import (
    CHART,
    IMAGES,
    KUBE_VERSION,
    NS,
    helm,
    objects,
    one,
    render,
    set_args,
)
from grpo_testbed.examples import example_job
from grpo_trainer.driver.measured_peaks import DRIVER_RSS, GPU_READINGS, RANK_RSS, PeakTracker

pytestmark = pytest.mark.unit
# Planned peaks of every kind: the dashboard shows each beside its reading.
PEAKS = MemoryPeaks.model_validate({"gpuGiB": {"rollout": 1.0, "training": 1.0},
                                    "hostRankGiB": 1.0, "driverGiB": 1.0})


def gauge_name(key: str) -> str:
    """The Prometheus gauge the driver's MetricsLogger exports for a metric's key."""
    return "grpo_" + "".join(c if c.isalnum() else "_" for c in key)

ROOT = Path(__file__).resolve().parents[2]

Rule = tuple[str, str, str]  # (apiGroup, resource, verb)


# The operator's API usage (docs/deployment.md), one (group, resource, verb) per right.
NAMESPACED_RIGHTS: set[Rule] = {
    *{("grpo.dev", "grpojobs", v) for v in ("get", "list", "watch", "patch", "update")},
    *{("grpo.dev", "grpojobs/status", v) for v in ("get", "patch", "update")},
    *{("ray.io", "rayclusters", v)
      for v in ("get", "list", "watch", "create", "patch", "update", "delete")},
    *{("", r, v) for r in ("configmaps", "persistentvolumeclaims", "serviceaccounts")
      for v in ("get", "list", "watch", "create", "patch", "delete")},
    *{("", "pods", v) for v in ("get", "list", "watch", "create", "patch", "delete")},
    *{("", "resourcequotas", v) for v in ("get", "list")},
    *{("kueue.x-k8s.io", r, v) for r in ("workloads", "localqueues")
      for v in ("get", "list", "watch")},
    *{(g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch")},
    ("", "events", "list"),  # granted on to each job's trainer Role
    *{("rbac.authorization.k8s.io", r, v) for r in ("roles", "rolebindings")
      for v in ("get", "list", "watch", "create", "patch", "delete")},
}
CLUSTER_RIGHTS: set[Rule] = {
    *{("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("get", "list", "watch")},
    *{("", "namespaces", v) for v in ("get", "list", "watch")},
    *{("", "nodes", v) for v in ("get", "list")},  # rbac.readNodes: the Nodes as they are
}
PEERING_VERBS = ("get", "list", "watch", "patch")


def rights(rules: list[dict[str, Any]]) -> set[Rule]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def _fake_ca_and_cert() -> tuple[str, str, str]:
    """A self-signed cert the way a user would supply one (base64 PEM strings)."""
    import datetime

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "supplied")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    b64 = base64.b64encode
    return b64(pem).decode(), b64(pem).decode(), b64(key_pem).decode()


SUPPLIED_CA = _fake_ca_and_cert()[0]

VALUE_SETS: dict[str, dict[str, str]] = {
    "defaults": {},
    "watch-namespaces": {"watchNamespaces": "{team-a,team-b}"},
    "webhook-off": {"webhook.enabled": "false"},
    "servicemonitor-and-dashboard": {"metrics.serviceMonitor.enabled": "true",
                                     "metrics.serviceMonitor.labels.release": "prom",
                                     "metrics.podMonitor.enabled": "true",
                                     "metrics.podMonitor.labels.release": "prom",
                                     "dashboard.enabled": "true"},
    "supplied-certs": {"webhook.certificate.source": "secret",
                       "webhook.certificate.secretName": "my-tls",
                       "webhook.certificate.caBundle": SUPPLIED_CA},
    "no-peering-debug-catalog": {"leaderElection.enabled": "false", "replicaCount": "1",
                                 "logLevel": "debug",
                                 "gpuCatalog.H100-80GB.hostMemoryGiB": "1024"},
    "cert-manager": {"webhook.certificate.source": "certManager"},
    "cert-manager-cluster-issuer": {
        "webhook.certificate.source": "certManager",
        "webhook.certificate.certManager.issuerRef.name": "corp-ca",
        "webhook.certificate.certManager.issuerRef.kind": "ClusterIssuer"},
    # OpenShift-like: UIDs the platform assigns, a proxy and a CA bundle, the registry's
    # images (test_chart_images.py checks what each of these renders to).
    "platform-uid-proxy-ca": {
        "podSecurityContext.runAsUser": "null", "podSecurityContext.runAsGroup": "null",
        "podSecurityContext.fsGroup": "null", "trainerPods.runAsUser": "null",
        "extraEnv[0].name": "HTTPS_PROXY", "extraEnv[0].value": "http://proxy.example:3128",
        "extraVolumes[0].name": "corp-ca", "extraVolumes[0].configMap.name": "corp-ca",
        "extraVolumeMounts[0].name": "corp-ca",
        "extraVolumeMounts[0].mountPath": "/etc/grpo-operator/ca"},
    "hub-endpoints": {"hubEndpoints.mirror": "https://hf-mirror.internal/api",
                      "hubEndpoints.proxy": "http://hub-proxy.platform:8080"},
}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_strict_passes(name: str) -> None:
    proc = helm("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION,
                *set_args(VALUE_SETS[name]))
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("name", VALUE_SETS)
def test_renders_and_every_object_is_labelled_by_the_release(name: str) -> None:
    docs = render(VALUE_SETS[name])
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == (
        one(docs, "ServiceAccount")["metadata"]["name"])
    for d in docs:
        labels = d["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/instance") == "grpo", (d["kind"], d["metadata"])
        if d["kind"] in {"Deployment", "Service", "ConfigMap", "Secret", "ServiceAccount",
                         "ServiceMonitor"}:
            assert d["metadata"]["namespace"] == NS, d["kind"]


# (values, words the error must contain): a bad value fails with a message naming it.
INVALID: list[tuple[dict[str, str], tuple[str, ...]]] = [
    ({"replicaCount": "-1"}, ("/replicaCount", "minimum")),
    ({"leaderElection.lifetimeSeconds": "5"}, ("/leaderElection/lifetimeSeconds", "minimum")),
    ({"webhook.certificate.source": "vault"}, ("/webhook/certificate/source",)),
    ({"logLevel": "verbose"}, ("/logLevel",)),
    ({"image.pullPolicy": "Sometimes"}, ("/image/pullPolicy",)),
    ({"watchNamespace": "{a}"}, ("watchNamespace",)),  # a typo of watchNamespaces
    ({"watchNamespaces": "{Team_A}"}, ("/watchNamespaces/0",)),
    ({"metrics.port": "80"}, ("/metrics/port", "minimum")),
    ({"webhook.failurePolicy": "Maybe"}, ("/webhook/failurePolicy",)),
    ({"webhook.timeoutSeconds": "60"}, ("/webhook/timeoutSeconds",)),
    ({"webhook.certificate.source": "secret"}, ("/webhook/certificate/secretName",
                                                "/webhook/certificate/caBundle")),
    ({"gpuCatalog.H100-80GB.memoryGiB": "-1"}, ("/gpuCatalog/H100-80GB/memoryGiB",)),
    ({"gpuCatalog.H100-80GB.hbm": "80"}, ("hbm",)),
    ({"resources.limits.memory": "lots"}, ("/resources/limits/memory",)),
    ({"image.digest": "sha256:abc"}, ("/image/digest",)),
    ({"trainerImage": "Not An Image"}, ("/trainerImage",)),
    ({"global.imageRegistry": "https://registry.example.com"}, ("/global/imageRegistry",)),
    ({"trainerPods.runAsUser": "0"}, ("/trainerPods/runAsUser", "minimum")),
    ({"trainerPods.runAsUser": "nobody"}, ("/trainerPods/runAsUser",)),
    ({"podSecurityContext.runAsNonRoot": "false"}, ("/podSecurityContext/runAsNonRoot",)),
    ({"podSecurityContext.runAsNonRoot": "null"}, ("/podSecurityContext", "runAsNonRoot")),
    ({"podSecurityContext.runAsUser": "ten"}, ("/podSecurityContext/runAsUser",)),
    ({"podSecurityContext.runAsUsr": "1"}, ("runAsUsr",)),
    ({"securityContext.readOnlyRootFilesystem": "maybe"},
     ("/securityContext/readOnlyRootFilesystem",)),
    ({"extraEnv": "HTTPS_PROXY"}, ("/extraEnv",)),
    ({"extraEnv[0].name": "HTTPS_PROXY", "extraEnv[0].value": "3128"},
     ("/extraEnv/0/value",)),
    ({"extraEnv[0].value": "x"}, ("/extraEnv/0", "name")),
    ({"extraVolumes[0].name": "corp-ca"}, ("/extraVolumes/0", "minProperties")),
    ({"extraVolumeMounts[0].name": "corp-ca"}, ("/extraVolumeMounts/0", "mountPath")),
    ({"hubEndpoints.Mirror": "https://hf-mirror.internal"}, ("invalid propertyName 'Mirror'",)),
    ({"hubEndpoints.mirror": "ftp://hf-mirror.internal"}, ("/hubEndpoints/mirror",)),
]


@pytest.mark.parametrize(("values", "words"), INVALID, ids=[next(iter(v)) for v, _ in INVALID])
def test_schema_rejects_bad_values_with_a_message(values: dict[str, str],
                                                   words: tuple[str, ...]) -> None:
    proc = helm("template", "grpo", str(CHART), "--kube-version", KUBE_VERSION,
                *set_args(values), check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr


def test_servicemonitor_without_its_service_fails_with_a_message() -> None:
    proc = helm("template", "grpo", str(CHART), "--kube-version", KUBE_VERSION,
                *set_args({"metrics.serviceMonitor.enabled": "true",
                           "metrics.service.enabled": "false"}), check=False)
    assert proc.returncode != 0
    assert "needs metrics.service.enabled" in proc.stderr


def test_existing_service_account_must_be_named() -> None:
    proc = helm("template", "grpo", str(CHART), "--kube-version", KUBE_VERSION,
                *set_args({"serviceAccount.create": "false"}), check=False)
    assert proc.returncode != 0
    assert "serviceAccount.name is required" in proc.stderr
    docs = render({"serviceAccount.create": "false", "serviceAccount.name": "ops"})
    assert objects(docs, "ServiceAccount") == []
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ops", "namespace": NS}]


def test_too_old_kubernetes_is_refused() -> None:
    proc = helm("template", "grpo", str(CHART), "--kube-version", "1.27.0", check=False)
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr


# ---- RBAC -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", VALUE_SETS)
def test_rbac_has_no_wildcards_no_secrets_no_webhook_config_rights(name: str) -> None:
    docs = render(VALUE_SETS[name])
    for role in objects(docs, "ClusterRole") + objects(docs, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (role["metadata"]["name"], rule)
            assert "secrets" not in rule["resources"], role["metadata"]["name"]
            assert "admissionregistration.k8s.io" not in rule["apiGroups"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def operator_roles(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ClusterRole and Roles bound to the operator's ServiceAccount."""
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
             for b in objects(docs, "ClusterRoleBinding") + objects(docs, "RoleBinding")
             if any(s["kind"] == "ServiceAccount" and s["name"] == sa and s["namespace"] == NS
                    for s in b["subjects"])}
    cluster = [r for r in objects(docs, "ClusterRole")
               if ("ClusterRole", r["metadata"]["name"], None) in bound]
    roles = [r for r in objects(docs, "Role")
             if ("Role", r["metadata"]["name"], r["metadata"]["namespace"]) in bound]
    assert len(cluster) == 1
    return cluster[0], roles


def test_cluster_wide_rbac_is_exactly_the_operators_api_usage() -> None:
    cluster, roles = operator_roles(render())
    peering = {("kopf.dev", "clusterkopfpeerings", v) for v in PEERING_VERBS}
    assert rights(cluster["rules"]) == NAMESPACED_RIGHTS | CLUSTER_RIGHTS | peering
    assert roles == []


def test_the_operator_holds_every_right_it_grants_a_jobs_trainer() -> None:
    """RBAC refuses a Role with rights its creator lacks (no `escalate`): each rule of the
    trainer Role a job renders is one the chart gives the operator."""
    spec = parse_spec(example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"])
    role = next(c for c in render_children(spec, plan_memory(spec), JobRef("j", "ns", "u"), 0)
                if c["kind"] == "Role")
    granted = rights(role["rules"])
    assert ("", "events", "list") in granted  # the trainer keeps its attempts' events
    cluster, _ = operator_roles(render())
    assert granted <= rights(cluster["rules"]), granted - rights(cluster["rules"])


def _documented_rights() -> set[Rule]:
    """The RBAC table of docs/deployment.md as (group, resource, verb): a group or
    resource is a `quoted` name, the core group is written core."""
    doc = (ROOT / "docs/deployment.md").read_text()
    table = doc.split("| API group | resources | verbs | why |", 1)[1].split("\n\n", 1)[0]
    out: set[Rule] = set()
    for row in table.strip().splitlines()[1:]:  # after the |---| line
        group, resources, verbs = row.split("|")[1:4]
        groups = re.findall(r"`([^`]+)`", group) + ([""] if "core" in group else [])
        out |= {(g, r, v) for g in groups for r in re.findall(r"`([^`]+)`", resources)
                for v in verbs.split()}
    return out


def test_the_deployment_docs_rbac_table_is_what_the_chart_grants() -> None:
    peering = {("kopf.dev", r, v) for r in ("clusterkopfpeerings", "kopfpeerings")
               for v in PEERING_VERBS}
    # Granted only with jobNetworkPolicy.enabled (tests/unit/test_job_network_policy.py).
    policies = {("networking.k8s.io", "networkpolicies", v) for v in ("get", "create")}
    assert _documented_rights() == NAMESPACED_RIGHTS | CLUSTER_RIGHTS | peering | policies
    on, _ = operator_roles(render({"jobNetworkPolicy.enabled": "true"}))
    cluster_peering = {("kopf.dev", "clusterkopfpeerings", v) for v in PEERING_VERBS}
    assert rights(on["rules"]) == (NAMESPACED_RIGHTS | CLUSTER_RIGHTS | cluster_peering
                                   | policies)


def test_watched_namespaces_get_roles_and_only_cluster_scoped_rights_stay_cluster_wide() -> None:
    docs = render(VALUE_SETS["watch-namespaces"])
    cluster, roles = operator_roles(docs)
    assert rights(cluster["rules"]) == CLUSTER_RIGHTS
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    peering = {("kopf.dev", "kopfpeerings", v) for v in PEERING_VERBS}
    for role in roles:
        assert rights(role["rules"]) == NAMESPACED_RIGHTS | peering
    assert sorted(p["metadata"]["namespace"] for p in objects(docs, "KopfPeering")) == [
        "team-a", "team-b"]
    assert objects(docs, "ClusterKopfPeering") == []
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=team-a", "--namespace=team-b"]


def test_user_facing_aggregated_roles_let_editors_submit_grpojobs() -> None:
    docs = render()
    agg = {r["metadata"]["name"]: r for r in objects(docs, "ClusterRole")
           if "rbac.authorization.k8s.io/aggregate-to-edit" in r["metadata"]["labels"]}
    granted = set().union(*(rights(r["rules"]) for r in agg.values()))
    assert ("grpo.dev", "grpojobs", "create") in granted
    assert ("grpo.dev", "grpojobs/status", "patch") not in granted  # status is the operator's


# ---- Deployment -----------------------------------------------------------------------

def test_deployment_is_hardened() -> None:
    dep = one(render(), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    for kind in ("requests", "limits"):
        assert set(c["resources"][kind]) >= {"cpu", "memory"}
    probe = c["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert probe["port"] == "metrics" and ports["metrics"] == 8080
    assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])  # writable scratch
    assert "tolerations" not in pod  # stays off the tainted GPU nodes


def _args(values: dict[str, str] | None = None) -> list[str]:
    dep = one(render(values), "Deployment")
    return list(dep["spec"]["template"]["spec"]["containers"][0]["args"])


def test_deployment_flags_follow_values() -> None:
    assert _args() == [
        "--metrics-port=8080",
        f"--trainer-image={IMAGES['trainerImage']}",
        f"--trainer-pod-uid={contract.IMAGE_UID}",
        "--pod-create-deadline=300",
        "--hang-grace=300",
        "--watch-stale-after=150",
        "--no-read-public-hub",  # least privilege: nothing leaves the cluster by default
        "--peering=grpo-grpo-operator",
        "--peering-lifetime=15",
        "--webhook-port=9443",
        "--webhook-cert=/etc/grpo-operator/webhook/tls.crt",
        "--webhook-key=/etc/grpo-operator/webhook/tls.key",
    ]
    off = _args(VALUE_SETS["no-peering-debug-catalog"] | VALUE_SETS["webhook-off"])
    assert not [a for a in off if a.startswith(("--peering", "--webhook"))]
    assert "--verbose" in off
    assert "--no-read-public-hub" not in _args({"readPublicHub": True})
    assert not [a for a in _args() if a.startswith("--hub-endpoints")]  # none by default


def test_hub_endpoints_reach_the_operator_as_the_map_it_parses() -> None:
    from grpo_operator.hub_endpoints import parse_hub_endpoints

    (flag,) = [a for a in _args(VALUE_SETS["hub-endpoints"]) if a.startswith("--hub-endpoints")]
    assert parse_hub_endpoints(flag.split("=", 1)[1]) == {
        "mirror": "https://hf-mirror.internal/api", "proxy": "http://hub-proxy.platform:8080"}
    # The schema checks names and URLs as the operator and the CRD do.
    from grpo_api.job.hub import HUB_NAME_PATTERN, HUB_URL_PATTERN

    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    assert schema["hubEndpoints"]["propertyNames"]["pattern"] == HUB_NAME_PATTERN
    assert schema["hubEndpoints"]["additionalProperties"]["pattern"] == HUB_URL_PATTERN


def test_every_flag_the_chart_passes_is_one_grpo_operator_accepts() -> None:
    from grpo_operator.main import cli

    known = {o for p in cli.params for o in (*p.opts, *p.secondary_opts)}
    used = set()
    for name in VALUE_SETS:
        used |= {a.split("=", 1)[0] for a in _args(VALUE_SETS[name])}
    assert used <= known, f"grpo-operator lacks {used - known}"


def test_gpu_catalog_overrides_reach_the_operator_as_a_mounted_file() -> None:
    docs = render(VALUE_SETS["no-peering-debug-catalog"])
    cm = next(c for c in objects(docs, "ConfigMap") if c["metadata"]["name"].endswith("-config"))
    assert yaml.safe_load(cm["data"]["gpu-catalog.yaml"]) == {"H100-80GB": {"hostMemoryGiB": 1024}}
    c = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert env["GRPO_GPU_CATALOG"] in mounts
    assert yaml.safe_load(next(
        c for c in objects(render(), "ConfigMap") if c["metadata"]["name"].endswith("-config")
    )["data"]["gpu-catalog.yaml"]) == {}


# ---- versions and images agree with grpo_api.contract ------------------------------------

def test_chart_versions_and_default_images_come_from_the_contract() -> None:
    """The chart's defaults are the contract's images without their registry (nobody
    publishes them: global.imageRegistry names yours); with the contract's registry in
    global.imageRegistry the chart runs exactly the contract's images."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == contract.VERSION
    registry, operator = contract.DEFAULT_OPERATOR_IMAGE.split("/", 1)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert f"{values['image']['repository']}:{chart['appVersion']}" == operator
    assert f"{registry}/{values['trainerImage']}" == contract.DEFAULT_TRAINER_IMAGE
    assert values["trainerPods"]["runAsUser"] == contract.IMAGE_UID
    docs = render({"global.imageRegistry": registry}, images=False)
    c = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == contract.DEFAULT_OPERATOR_IMAGE
    assert f"--trainer-image={contract.DEFAULT_TRAINER_IMAGE}" in c["args"]


def test_chart_crds_are_the_generated_grpojob_crd_and_kopf_peering() -> None:
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == ["grpojob.yaml",
                                                                   "kopf-peering.yaml"]
    assert (CHART / "crds/grpojob.yaml").read_text() == (ROOT / "crds/grpojob.yaml").read_text()
    peering = {d["spec"]["names"]["plural"]: d for d in
               yaml.safe_load_all((CHART / "crds/kopf-peering.yaml").read_text())}
    assert {p: d["spec"]["scope"] for p, d in peering.items()} == {
        "clusterkopfpeerings": "Cluster", "kopfpeerings": "Namespaced"}
    for d in peering.values():
        status = d["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True


# ---- webhook --------------------------------------------------------------------------

def _webhooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [w for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
            for cfg in objects(docs, kind) for w in cfg["webhooks"]]


def test_generated_certificate_is_signed_by_the_ca_bundle_and_names_the_service() -> None:
    docs = render()
    secret = one(docs, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    svc = next(s for s in objects(docs, "Service") if s["metadata"]["name"].endswith("-webhook"))
    dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{svc['metadata']['name']}.{NS}.svc" in dns.get_values_for_type(x509.DNSName)
    hooks = _webhooks(docs)
    assert sorted(h["clientConfig"]["service"]["path"] for h in hooks) == [
        "/default-grpojob", "/validate-grpojob"]  # admission_review.WEBHOOKS
    for h in hooks:
        assert h["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
        assert h["clientConfig"]["service"]["name"] == svc["metadata"]["name"]
        assert h["sideEffects"] == "None" and h["failurePolicy"] == "Fail"
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"secretName": secret["metadata"]["name"], "defaultMode": 0o400} in [
        v.get("secret") for v in volumes]


def test_certificates_are_short_lived_and_renewed_well_before_they_expire() -> None:
    """A year, renewed 60 days before its end: the generated Secret records its end, for
    the upgrade that renews it; cert-manager gets the same duration and renewBefore."""

    secret = one(render(), "Secret")
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 364 <= lifetime.days <= 366
    ends = int(secret["metadata"]["annotations"]["grpo.dev/not-after-unix"])
    assert abs(ends - cert.not_valid_after_utc.timestamp()) < 120
    certs = objects(render({"webhook.certificate.source": "certManager"}), "Certificate")
    serving = next(c for c in certs if not c["spec"].get("isCA"))
    assert (serving["spec"]["duration"], serving["spec"]["renewBefore"]) == ("8760h", "1440h")


def test_supplied_certificate_is_used_and_none_is_generated() -> None:
    docs = render(VALUE_SETS["supplied-certs"])
    assert objects(docs, "Secret") == []
    assert {h["clientConfig"]["caBundle"] for h in _webhooks(docs)} == {SUPPLIED_CA}
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert any(v.get("secret", {}).get("secretName") == "my-tls" for v in volumes)


def test_webhook_off_renders_no_webhook_objects() -> None:
    docs = render(VALUE_SETS["webhook-off"])
    assert _webhooks(docs) == [] and objects(docs, "Secret") == []
    services = [s["metadata"]["name"] for s in objects(docs, "Service")]
    assert services == ["grpo-grpo-operator-metrics"]


def test_webhooks_only_see_watched_namespaces() -> None:
    for h in _webhooks(render(VALUE_SETS["watch-namespaces"])):
        (expr,) = h["namespaceSelector"]["matchExpressions"]
        assert expr == {"key": "kubernetes.io/metadata.name", "operator": "In",
                        "values": ["team-a", "team-b"]}


# ---- monitoring -----------------------------------------------------------------------

def test_servicemonitor_scrapes_the_metrics_service() -> None:
    docs = render(VALUE_SETS["servicemonitor-and-dashboard"])
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom"
    svc = next(s for s in objects(docs, "Service") if s["metadata"]["name"].endswith("-metrics"))
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]


def test_podmonitor_scrapes_every_jobs_driver_by_its_port_name() -> None:
    """Each job's Ray head (the driver serves /metrics there), by the port name the
    operator gives the head container, in every namespace or the watched ones."""
    pm = one(render(VALUE_SETS["servicemonitor-and-dashboard"]), "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "prom"
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    assert pm["spec"]["selector"] == {
        "matchLabels": {contract.ROLE_LABEL: contract.Role.HEAD.value},
        "matchExpressions": [{"key": contract.JOB_LABEL, "operator": "Exists"}]}
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == METRICS_PORT_NAME and endpoint["path"] == "/metrics"
    # What a job renders: the head's pod template carries the labels and the named port,
    # and no worker's does (their ranks serve no /metrics).
    spec = parse_spec(example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"])
    rc = next(c for c in render_children(spec, plan_memory(spec), JobRef("j", "ns", "u"), 0)
              if c["kind"] == "RayCluster")
    head = rc["spec"]["headGroupSpec"]["template"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= head["metadata"]["labels"].items()
    assert contract.JOB_LABEL in head["metadata"]["labels"]
    assert {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"} in \
        head["spec"]["containers"][0]["ports"]
    for group in rc["spec"]["workerGroupSpecs"]:
        labels = group["template"]["metadata"]["labels"]
        assert not pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    watched = one(render({**VALUE_SETS["servicemonitor-and-dashboard"],
                          **VALUE_SETS["watch-namespaces"]}), "PodMonitor")
    assert watched["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert not objects(render(), "PodMonitor")  # opt-in, as the ServiceMonitor


def test_dashboard_has_a_training_row_and_memory_measured_beside_the_plan() -> None:
    """Step time, tokens/s and reward per job, and each measured peak beside the plan's:
    every trainer gauge the dashboard reads is one the driver exports (grpo_ + its
    metric's key)."""
    docs = render(VALUE_SETS["servicemonitor-and-dashboard"])
    cm = next(c for c in objects(docs, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard"))
    dash = json.loads(cm["data"]["grpo-operator.json"])
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert any(r.startswith("Training") for r in rows), rows
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"])
             for p in dash["panels"] if p["type"] != "row"}
    for title, gauge in (("Step time", "time/step_s"),
                         ("Tokens per second", "throughput/tokens_per_s"),
                         ("Reward (mean)", "reward/mean")):
        assert gauge_name(gauge) in exprs[title], (title, exprs[title])
    gpu = exprs["GPU memory per stage: measured vs planned"]
    host = exprs["Host memory: measured vs planned"]
    for key in (*GPU_READINGS.values(), *PeakTracker(0, PEAKS).planned_metrics()):
        if "gpu" in key:
            assert gauge_name(key) in gpu, key
    for key in (RANK_RSS, DRIVER_RSS, "plan/host_rank_peak_bytes", "plan/driver_peak_bytes"):
        assert gauge_name(key) in host, key


def test_dashboard_configmap_shows_phases_reward_step_restarts_and_memory() -> None:
    docs = render(VALUE_SETS["servicemonitor-and-dashboard"])
    cm = next(c for c in objects(docs, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard"))
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["grpo-operator.json"])
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("by phase", "reward", "step", "restarts by reason", "memory"):
        assert topic in titles, titles
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    assert "grpo_operator_jobs" in exprs and "grpo_operator_restarts_total" in exprs
    default_maps = [c["metadata"]["name"] for c in objects(render(), "ConfigMap")]
    assert default_maps == ["grpo-grpo-operator-config"]  # the dashboard is opt-in
