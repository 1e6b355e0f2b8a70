"""Thin Kubernetes edge: create-if-absent, get, list and delete by kind.

Everything here is I/O and nothing else; callers decide what to do. The answers are the
API server's JSON as it wrote it (as Kopf's event bodies are), through the operator's own
client (kube_api.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Any, cast

from grpo_api.catalog import GPU_PRODUCT_LABEL
from grpo_api.contract import API_GROUP, API_VERSION, PLURAL

from .kube_api import (
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    ApiError,
    Credentials,
    KubeClient,
    load_credentials,
)

RAY_GROUP, RAY_VERSION_API, RAY_PLURAL = "ray.io", "v1", "rayclusters"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
# Kueue labels each Workload with the UID of the job object it stands for.
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"

_client: KubeClient | None = None


def load_config(kubeconfig: str | None = None) -> Credentials:
    """Credentials from `kubeconfig` (else in-cluster), and the client every call here
    uses; the same credentials are Kopf's (main.operator_login)."""
    global _client
    creds = load_credentials(kubeconfig)
    if _client is None or _client.creds != creds:
        _client = KubeClient(creds)
    return creds


def _api() -> KubeClient:
    if _client is None:
        load_config()
    assert _client is not None
    return _client


def _path(kind: str, namespace: str, name: str | None = None) -> str:
    """The API path of a namespaced built-in `kind` (its collection, or one object)."""
    prefix, plural = _BUILT_IN[kind]
    return f"{prefix}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


def _custom(group: str, version: str, namespace: str, plural: str,
            name: str | None = None) -> str:
    return (f"/apis/{group}/{version}/namespaces/{namespace}/{plural}"
            + (f"/{name}" if name else ""))


_BUILT_IN: dict[str, tuple[str, str]] = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Pod": ("/api/v1", "pods"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "ResourceQuota": ("/api/v1", "resourcequotas"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
}


def warm_up() -> None:
    """Open the client now (credentials read, TLS set up) rather than on the first
    reconcile."""
    _api()


def create_if_absent(obj: dict[str, Any]) -> bool:
    """Create; an existing object of that name is left as it is. True if created."""
    ns = obj["metadata"]["namespace"]
    path = (_custom(RAY_GROUP, RAY_VERSION_API, ns, RAY_PLURAL) if obj["kind"] == "RayCluster"
            else _path(obj["kind"], ns))
    try:
        _api().request("POST", path, obj, parse=False)  # the answer is not read
        return True
    except ApiError as exc:
        if exc.status == 409:
            return False
        raise


def api_message(exc: ApiError) -> str:
    """The API server's own words for a refusal (the Status body's message), with the
    HTTP status, e.g. "403 Forbidden: configmaps "x" is forbidden: exceeded quota: ..."."""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        message = ""
    return f"{exc.status} {exc.reason}: {message}" if message else f"{exc.status} {exc.reason}"


def failure_message(exc: Exception) -> str:
    """What a failed call says: the API server's words (api_message), else the error
    itself (no answer at all: refused, timed out)."""
    return api_message(exc) if isinstance(exc, ApiError) else repr(exc)


def _unless_missing(call: Callable[[], Any]) -> Any | None:
    """The call's result, or None when the object does not exist (404)."""
    try:
        return call()
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def _get(path: str, **query: str) -> dict[str, Any] | None:
    """The object (or list) at `path`, or None when it does not exist."""
    return cast(dict[str, Any] | None,
                _unless_missing(lambda: _api().request("GET", path, query=query or None)))


def get_ray_cluster(namespace: str, name: str) -> dict[str, Any] | None:
    return _get(_custom(RAY_GROUP, RAY_VERSION_API, namespace, RAY_PLURAL, name))


def workload_of(namespace: str, owner_uid: str) -> dict[str, Any] | None:
    """The Kueue Workload standing for the object with `owner_uid` (a RayCluster), or
    None (not created yet, or Kueue not installed)."""
    found = _get(_custom(KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads"),
                 labelSelector=f"{KUEUE_JOB_UID_LABEL}={owner_uid}")
    items = [w for w in (found or {}).get("items") or []
             if any(r.get("uid") == owner_uid
                    for r in w.get("metadata", {}).get("ownerReferences") or [])]
    return cast(dict[str, Any], items[0]) if items else None


def cluster_queue_of(namespace: str, local_queue: str) -> str | None:
    """The ClusterQueue a LocalQueue feeds, or None if the LocalQueue does not exist."""
    lq = _get(_custom(KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", local_queue))
    return str(lq["spec"]["clusterQueue"]) if lq else None


def _group_versions() -> set[str]:
    """What `/apis` lists, as "group/version"."""
    groups = (_api().request("GET", "/apis") or {}).get("groups") or []
    return {str(v.get("groupVersion")) for g in groups for v in g.get("versions") or []}


def kueue_served() -> bool:
    """Whether the API server serves Kueue's LocalQueues (Kueue is installed)."""
    return f"{KUEUE_GROUP}/{KUEUE_VERSION}" in _group_versions()


def read_discovery(group_versions: Collection[str]
                   ) -> tuple[set[str], dict[str, set[str]]]:
    """What `/apis` lists (as "group/version"), and the plurals each of `group_versions`
    serves where `/apis` lists it: the two documents Kopf's start-up scan reads."""
    listed = _group_versions()
    plurals: dict[str, set[str]] = {}
    for gv in group_versions:
        if gv in listed:
            found = _get(f"/apis/{gv}")
            plurals[gv] = {str(r.get("name")) for r in (found or {}).get("resources") or []}
    return listed, plurals


def _delete(path: str) -> bool:
    """True if it was there to delete."""
    try:
        _api().request("DELETE", path, parse=False)
        return True
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise


def delete_ray_cluster(namespace: str, name: str) -> bool:
    """True if it was there to delete."""
    return _delete(_custom(RAY_GROUP, RAY_VERSION_API, namespace, RAY_PLURAL, name))


def patch_claim(namespace: str, claim: str, patch: dict[str, Any]) -> None:
    """Patch a claim's metadata (its owners and labels: checkpoint retention), a strategic
    merge as for every built-in kind; a resourceVersion in the patch makes it fail with
    409 if the claim changed meanwhile."""
    _api().request("PATCH", _path("PersistentVolumeClaim", namespace, claim), patch,
                   content_type=STRATEGIC_MERGE_PATCH, parse=False)


def get_pod(namespace: str, name: str) -> dict[str, Any] | None:
    return _get(_path("Pod", namespace, name))


def delete_pod(namespace: str, name: str) -> bool:
    """True if it was there to delete."""
    return _delete(_path("Pod", namespace, name))


def list_gpu_nodes() -> list[dict[str, Any]]:
    """The Nodes labelled with a GPU product (node_shapes.py); ApiError when the operator
    may not list Nodes (a namespaced install without readNodes)."""
    nodes = _api().request("GET", "/api/v1/nodes", query={"labelSelector": GPU_PRODUCT_LABEL})
    return list((nodes or {}).get("items") or [])


def list_pods(namespace: str, selector: str) -> list[dict[str, Any]]:
    pods = _api().request("GET", _path("Pod", namespace), query={"labelSelector": selector})
    return list((pods or {}).get("items") or [])


def namespace_terminating(namespace: str) -> bool:
    """Whether the namespace is being deleted (or gone). Unreadable counts as live: a
    restart that then fails to create is reported; a restart skipped is lost."""
    try:
        ns = _api().request("GET", f"/api/v1/namespaces/{namespace}") or {}
    except ApiError as exc:
        return exc.status == 404
    deleting = bool((ns.get("metadata") or {}).get("deletionTimestamp"))
    return deleting or (ns.get("status") or {}).get("phase") == "Terminating"


def namespace_labels(namespace: str) -> dict[str, str]:
    """The namespace's labels ({} if it does not exist yet)."""
    ns = _get(f"/api/v1/namespaces/{namespace}") or {}
    return dict((ns.get("metadata") or {}).get("labels") or {})


def resource_quotas(namespace: str, resource: str) -> list[tuple[str, str, str]]:
    """(name, hard, used) of every ResourceQuota in the namespace that limits `resource`."""
    out = []
    found = _api().request("GET", _path("ResourceQuota", namespace)) or {}
    for q in found.get("items") or []:
        hard = (q.get("spec") or {}).get("hard") or {}
        if resource in hard:
            used = ((q.get("status") or {}).get("used") or {}).get(resource, "0")
            name = (q.get("metadata") or {}).get("name") or ""
            out.append((str(name), str(hard[resource]), str(used)))
    return out


def get_claim(namespace: str, name: str) -> dict[str, Any] | None:
    return _get(_path("PersistentVolumeClaim", namespace, name))


def get_job(namespace: str, name: str) -> dict[str, Any] | None:
    return _get(_custom(API_GROUP, API_VERSION, namespace, PLURAL, name))


class Conflict(Exception):
    """The job changed since it was read; read it again and decide again."""


def patch_job_status(namespace: str, name: str, status: dict[str, Any],
                     resource_version: str | None = None) -> None:
    """Merge-patch status; with resource_version, only if nobody wrote in between."""
    body: dict[str, Any] = {"status": status}
    if resource_version:
        body["metadata"] = {"resourceVersion": resource_version}
    try:
        _api().request("PATCH", _custom(API_GROUP, API_VERSION, namespace, PLURAL, name)
                       + "/status", body, content_type=MERGE_PATCH, parse=False)
    except ApiError as exc:
        if exc.status == 409:
            raise Conflict(name) from exc
        raise


def _webhook_configuration_path(kind: str, name: str | None = None) -> str:
    plural = {"ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
              "MutatingWebhookConfiguration": "mutatingwebhookconfigurations"}[kind]
    return f"/apis/admissionregistration.k8s.io/v1/{plural}" + (f"/{name}" if name else "")


def set_webhooks(configuration: dict[str, Any]) -> None:
    """Create a webhook configuration, or set the webhooks of the one of its name (the
    operator's managed ones, --webhook-manage)."""
    kind, name = configuration["kind"], configuration["metadata"]["name"]
    try:
        _api().request("POST", _webhook_configuration_path(kind), configuration, parse=False)
    except ApiError as exc:
        if exc.status != 409:
            raise
        _api().request("PATCH", _webhook_configuration_path(kind, name),
                       {"webhooks": configuration["webhooks"]}, content_type=MERGE_PATCH,
                       parse=False)
