"""Thin Kubernetes edge: create-if-absent, get, list and delete by kind.

Everything here is I/O and nothing else; callers decide what to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from functools import cache, partial
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from grpo_api.catalog import GPU_PRODUCT_LABEL
from grpo_api.contract import API_GROUP, API_VERSION, PLURAL

RAY_GROUP, RAY_VERSION_API, RAY_PLURAL = "ray.io", "v1", "rayclusters"


def load_config(kubeconfig: str | None = None) -> None:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig)


@cache
def _api() -> client.ApiClient:
    return client.ApiClient()  # one connection pool for every call


# Built once: the client's API classes are costly to reach (lazy module imports).
@cache
def _core() -> client.CoreV1Api:
    return client.CoreV1Api(_api())


@cache
def _rbac() -> client.RbacAuthorizationV1Api:
    return client.RbacAuthorizationV1Api(_api())


@cache
def _custom() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(_api())


def warm_up() -> None:
    """Import the client's API modules now: their first use takes seconds of CPU under
    the import lock, which would otherwise stall the first reconciles."""
    _creators()
    client.V1Pod, client.V1PersistentVolumeClaim  # noqa: B018 - lazy model imports


@cache
def _creators() -> dict[str, Callable[[str, dict[str, Any]], Any]]:
    core, rbac, custom = _core(), _rbac(), _custom()
    networking = client.NetworkingV1Api(_api())
    return {
        "ConfigMap": lambda ns, b: core.create_namespaced_config_map(ns, b),
        "Pod": lambda ns, b: core.create_namespaced_pod(ns, b),
        "PersistentVolumeClaim": lambda ns, b: core.create_namespaced_persistent_volume_claim(
            ns, b),
        "ServiceAccount": lambda ns, b: core.create_namespaced_service_account(ns, b),
        "Role": lambda ns, b: rbac.create_namespaced_role(ns, b),
        "RoleBinding": lambda ns, b: rbac.create_namespaced_role_binding(ns, b),
        "NetworkPolicy": lambda ns, b: networking.create_namespaced_network_policy(ns, b),
        "RayCluster": lambda ns, b: custom.create_namespaced_custom_object(
            RAY_GROUP, RAY_VERSION_API, ns, RAY_PLURAL, b),
    }


def create_if_absent(obj: dict[str, Any]) -> bool:
    """Create; an existing object of that name is left as it is. True if created."""
    ns = obj["metadata"]["namespace"]
    try:
        _creators()[obj["kind"]](ns, obj)
        return True
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise


def api_message(exc: ApiException) -> str:
    """The API server's own words for a refusal (the Status body's message), with the
    HTTP status, e.g. "403 Forbidden: configmaps "x" is forbidden: exceeded quota: ..."."""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        message = ""
    return f"{exc.status} {exc.reason}: {message}" if message else f"{exc.status} {exc.reason}"


def _unless_missing(call: Callable[[], Any]) -> Any | None:
    """The call's result, or None when the object does not exist (404)."""
    try:
        return call()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def get_ray_cluster(namespace: str, name: str) -> dict[str, Any] | None:
    return cast(dict[str, Any] | None, _unless_missing(lambda: _custom(
    ).get_namespaced_custom_object(RAY_GROUP, RAY_VERSION_API, namespace, RAY_PLURAL, name)))


KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
# Kueue labels each Workload with the UID of the job object it stands for.
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def workload_of(namespace: str, owner_uid: str) -> dict[str, Any] | None:
    """The Kueue Workload standing for the object with `owner_uid` (a RayCluster), or
    None (not created yet, or Kueue not installed)."""
    found = _unless_missing(lambda: _custom().list_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads",
        label_selector=f"{KUEUE_JOB_UID_LABEL}={owner_uid}"))
    items = [w for w in (found or {}).get("items") or []
             if any(r.get("uid") == owner_uid
                    for r in w.get("metadata", {}).get("ownerReferences") or [])]
    return cast(dict[str, Any], items[0]) if items else None


def cluster_queue_of(namespace: str, local_queue: str) -> str | None:
    """The ClusterQueue a LocalQueue feeds, or None if the LocalQueue does not exist."""
    lq = _unless_missing(lambda: _custom().get_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", local_queue))
    return str(lq["spec"]["clusterQueue"]) if lq else None


def kueue_served() -> bool:
    """Whether the API server serves Kueue's LocalQueues (Kueue is installed)."""
    groups = client.ApisApi(_api()).get_api_versions().groups or []
    return any(g.name == KUEUE_GROUP and any(v.version == KUEUE_VERSION for v in g.versions)
               for g in groups)


def read_discovery(group_versions: Collection[str]
                   ) -> tuple[set[str], dict[str, set[str]]]:
    """What `/apis` lists (as "group/version"), and the plurals each of `group_versions`
    serves where `/apis` lists it: the two documents Kopf's start-up scan reads."""
    groups = client.ApisApi(_api()).get_api_versions().groups or []
    listed = {v.group_version for g in groups for v in g.versions or []}
    plurals: dict[str, set[str]] = {}
    for gv in group_versions:
        if gv in listed:
            group, version = gv.split("/", 1)
            found = _unless_missing(partial(_custom().get_api_resources, group, version))
            plurals[gv] = {r.name for r in (found.resources if found else None) or []}
    return listed, plurals


def delete_ray_cluster(namespace: str, name: str) -> bool:
    """True if it was there to delete."""
    return _unless_missing(lambda: _custom().delete_namespaced_custom_object(
        RAY_GROUP, RAY_VERSION_API, namespace, RAY_PLURAL, name)) is not None


def patch_claim(namespace: str, claim: str, patch: dict[str, Any]) -> None:
    """Merge-patch a claim's metadata (its owners and labels: checkpoint retention); a
    resourceVersion in the patch makes it fail with 409 if the claim changed meanwhile."""
    _core().patch_namespaced_persistent_volume_claim(claim, namespace, patch)


def get_pod(namespace: str, name: str) -> dict[str, Any] | None:
    pod = _unless_missing(lambda: _core().read_namespaced_pod(name, namespace))
    return None if pod is None else cast(dict[str, Any], _api().sanitize_for_serialization(pod))


def delete_pod(namespace: str, name: str) -> bool:
    """True if it was there to delete."""
    return _unless_missing(lambda: _core().delete_namespaced_pod(name, namespace)) is not None


def list_gpu_nodes() -> list[dict[str, Any]]:
    """The Nodes labelled with a GPU product (node_shapes.py); ApiException when the
    operator may not list Nodes (a namespaced install without readNodes)."""
    nodes = _core().list_node(label_selector=GPU_PRODUCT_LABEL)
    return [_api().sanitize_for_serialization(n) for n in nodes.items]


def list_pods(namespace: str, selector: str) -> list[dict[str, Any]]:
    pods = _core().list_namespaced_pod(namespace, label_selector=selector)
    return [_api().sanitize_for_serialization(p) for p in pods.items]


def namespace_terminating(namespace: str) -> bool:
    """Whether the namespace is being deleted (or gone). Unreadable counts as live: a
    restart that then fails to create is reported; a restart skipped is lost."""
    try:
        ns = _core().read_namespace(namespace)
    except ApiException as exc:
        return exc.status == 404
    deleting = ns.metadata is not None and ns.metadata.deletion_timestamp is not None
    return deleting or (ns.status is not None and ns.status.phase == "Terminating")


def namespace_labels(namespace: str) -> dict[str, str]:
    """The namespace's labels ({} if it does not exist yet)."""
    ns = _unless_missing(lambda: _core().read_namespace(namespace))
    return dict((ns.metadata.labels or {}) if ns is not None and ns.metadata else {})


def resource_quotas(namespace: str, resource: str) -> list[tuple[str, str, str]]:
    """(name, hard, used) of every ResourceQuota in the namespace that limits `resource`."""
    out = []
    for q in _core().list_namespaced_resource_quota(namespace).items:
        hard = (q.spec.hard if q.spec else None) or {}
        if resource in hard:
            used = ((q.status.used if q.status else None) or {}).get(resource, "0")
            name = q.metadata.name if q.metadata else ""
            out.append((str(name), str(hard[resource]), str(used)))
    return out


def get_claim(namespace: str, name: str) -> dict[str, Any] | None:
    pvc = _unless_missing(lambda: _core().read_namespaced_persistent_volume_claim(
        name, namespace))
    return None if pvc is None else cast(dict[str, Any], _api().sanitize_for_serialization(pvc))


def get_job(namespace: str, name: str) -> dict[str, Any] | None:
    return cast(dict[str, Any] | None, _unless_missing(lambda: _custom(
    ).get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)))


class Conflict(Exception):
    """The job changed since it was read; read it again and decide again."""


def patch_job_status(namespace: str, name: str, status: dict[str, Any],
                     resource_version: str | None = None) -> None:
    """Merge-patch status; with resource_version, only if nobody wrote in between."""
    body: dict[str, Any] = {"status": status}
    if resource_version:
        body["metadata"] = {"resourceVersion": resource_version}
    try:
        _custom().patch_namespaced_custom_object_status(
            API_GROUP, API_VERSION, namespace, PLURAL, name, body)
    except ApiException as exc:
        if exc.status == 409:
            raise Conflict(name) from exc
        raise
