"""Kopf handlers, named <resource>_<event>. They only gather state, call the pure
functions in `jobs`, `reconcile` and `render`, and apply the result idempotently."""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any, NoReturn

import kopf
from kubernetes.client.exceptions import ApiException

from . import jobs, kube, metrics
from .catalog import GPU_CATALOG, GpuType
from .contract import API_GROUP, API_VERSION, JOB_LABEL, PLURAL
from .reconcile.classify import classify_pod
from .reconcile.status import (
    ATTEMPT_LABEL,
    HEAD_ROLE,
    MEMORY_GROWTH,
    ROLE_LABEL,
    attempt_phase,
    hub_fetch_conditions,
    memory_growth_conditions,
)
from .render import JobRef, names

log = logging.getLogger("grpo_operator")
SETTINGS: dict[str, str] = {"default_image": ""}  # set by main from its flags
# The effective GPU catalog (built-in + the chart's gpuCatalog); main replaces the contents.
CATALOG: dict[str, GpuType] = dict(GPU_CATALOG)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _post(body: Any, events: list[tuple[str, str, str]]) -> None:
    for kind, reason, message in events:
        (kopf.warn if kind == "Warning" else kopf.info)(body, reason=reason, message=message)


def _apply(body: Any, namespace: str, decision: jobs.Decision) -> None:
    for child in decision.children:
        try:
            created = kube.create_if_absent(child)
        except ApiException as exc:
            _create_failed(body, namespace, child, exc)
        if created:
            kopf.info(body, reason="Created",
                      message=f"{child['kind']} {child['metadata']['name']}")
    if decision.delete_ray_cluster and kube.delete_ray_cluster(namespace,
                                                               decision.delete_ray_cluster):
        kopf.info(body, reason="Released",
                  message=f"deleted RayCluster {decision.delete_ray_cluster} (GPUs released; "
                          "checkpoint volume and status kept)")
    _post(body, decision.events)


def _create_failed(body: Any, namespace: str, child: dict[str, Any],
                   exc: ApiException) -> NoReturn:
    """A child the API server refused: status and a Warning event now (jobs.create_failed),
    then a retry. Without this the job would sit in CreatingCluster, silent."""
    meta = body["metadata"]
    failed = jobs.create_failed(dict(body.get("status") or {}), child["kind"],
                                child["metadata"]["name"], kube.api_message(exc),
                                int(meta.get("generation") or 0), _now())
    kube.patch_job_status(namespace, meta["name"], failed.status)  # reported, not decided on
    _post(body, failed.events)
    metrics.API_ERRORS.labels(operation="create").inc()
    raise kopf.TemporaryError(failed.events[0][2], delay=jobs.CREATE_RETRY_SECONDS)


def _claim_problem(spec: dict[str, Any], namespace: str) -> str | None:
    claim = (spec.get("checkpoint") or {}).get("claimName")
    return jobs.claim_problem(spec, namespace, kube.get_claim(namespace, claim)
                              if claim else None)


@kopf.on.create(API_GROUP, API_VERSION, PLURAL)
@kopf.on.resume(API_GROUP, API_VERSION, PLURAL)
@kopf.on.update(API_GROUP, API_VERSION, PLURAL, field="spec")
def grpojob_reconcile(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta,
                      name: str, namespace: str | None, uid: str, patch: kopf.Patch,
                      **_: Any) -> None:
    t0 = time.monotonic()
    namespace = namespace or "default"
    try:
        generation = int(meta.get("generation") or 0)
        problem = _claim_problem(dict(spec), namespace)
        if problem:
            patch.status["phase"] = "Pending"
            kopf.warn(body, reason="ClaimMissing", message=problem)
            raise kopf.TemporaryError(problem, delay=15)
        decision = jobs.reconcile(JobRef(name, namespace, uid), dict(spec), dict(status),
                                  generation, _now(), SETTINGS["default_image"], CATALOG)
        _apply(body, namespace, decision)
        ckpt = dict(spec.get("checkpoint") or {})
        if ckpt.get("claimName") and ckpt.get("deleteClaimWithJob"):
            # The user asked for their claim to go with the job: garbage collection
            # deletes it once the job is gone.
            kube.add_owner(namespace, ckpt["claimName"], {
                "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "GRPOJob",
                "name": name, "uid": uid, "blockOwnerDeletion": False})
        if decision.status:
            # Pod events may have moved the status on meanwhile: write only over what
            # this decision was made from, else decide again on the fresh object.
            kube.patch_job_status(namespace, name, decision.status,
                                  str(meta.get("resourceVersion") or ""))
    except kube.Conflict as exc:
        raise kopf.TemporaryError("status changed meanwhile; deciding again", delay=0.2) from exc
    except ApiException as exc:
        metrics.API_ERRORS.labels(operation="reconcile").inc()
        raise kopf.TemporaryError(f"API error {exc.status}: {exc.reason}", delay=5) from exc
    finally:
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - t0)


FAILED_AT: dict[tuple[str, str], float] = {}  # for the time-to-recover histogram
_REPLACED: set[str] = set()  # worker pods already counted (names are unique per pod)


def _restart_pending(status: kopf.Status, **_: Any) -> bool:
    return bool(status.get("nextAttempt"))


@kopf.timer(API_GROUP, API_VERSION, PLURAL, interval=0.25, when=_restart_pending)
def grpojob_restart(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta,
                    name: str, namespace: str | None, uid: str, **_: Any) -> None:
    """Starts the next attempt once its backoff has passed (a timer, so an operator
    restart during the backoff neither loses nor repeats it)."""
    namespace = namespace or "default"
    decision = jobs.start_next_attempt(JobRef(name, namespace, uid), dict(spec), dict(status),
                                       int(meta.get("generation") or 0), _now(),
                                       SETTINGS["default_image"], CATALOG)
    if decision is None:
        return
    try:
        # Status first, with the resourceVersion read: two timers or an operator restart
        # cannot both start the attempt. Then its children (create-if-absent).
        kube.patch_job_status(namespace, name, decision.status,
                              str(meta.get("resourceVersion") or ""))
    except kube.Conflict:
        return  # the next tick decides again on the fresh object
    _apply(body, namespace, decision)
    failed = FAILED_AT.pop((namespace, name), None)
    if failed is not None:
        metrics.TIME_TO_RECOVER.observe(time.monotonic() - failed)


@kopf.on.event(API_GROUP, API_VERSION, PLURAL)
def grpojob_event(type: str, namespace: str | None, name: str, status: kopf.Status,
                  body: kopf.Body, **_: Any) -> None:
    """Keeps the jobs-by-phase gauge current; turns the trainer's memory-growth report
    into the MemoryGrowth condition (and a Warning event when it appears)."""
    if type == "DELETED":
        metrics.JOB_PHASES.pop((namespace or "", name), None)
        return
    metrics.JOB_PHASES[(namespace or "", name)] = str(status.get("phase") or "Pending")
    meta = body.get("metadata", {})
    generation, now = int(meta.get("generation") or 0), _now()
    grown = memory_growth_conditions(status.get("progress"), status.get("conditions"),
                                     generation, now)
    fetched = hub_fetch_conditions(status.get("progress"), grown or status.get("conditions"),
                                   generation, now)
    new = fetched or grown
    if new is None:
        return
    try:
        kube.patch_job_status(namespace or "", name, {"conditions": new},
                              str(meta["resourceVersion"]))
    except kube.Conflict:
        return  # a newer version of the job is on its way here; decide on that one
    growth = next((c for c in grown or [] if c["type"] == MEMORY_GROWTH), None)
    if growth is not None and growth["status"] == "True":
        _post(dict(body), [("Warning", MEMORY_GROWTH, growth["message"])])


def _observe(namespace: str, job_name: str, pod: dict[str, Any], deleted: bool) -> None:
    # Pod events of one job arrive concurrently; each decision is written only if the
    # job did not change since it was read, else it is made again on fresh state.
    for _ in range(8):
        try:
            _observe_once(namespace, job_name, pod, deleted)
            return
        except kube.Conflict:
            continue
    raise kopf.TemporaryError(f"{job_name}: status kept changing under us", delay=1)


def _observe_once(namespace: str, job_name: str, pod: dict[str, Any], deleted: bool) -> None:
    job = kube.get_job(namespace, job_name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return  # the job is going away: its pods go with it, nothing to record
    status = dict(job.get("status") or {})
    if status.get("phase") in (*jobs.TERMINAL, "Suspended", "Restarting"):
        return
    attempt = int(status.get("attempt") or 0)
    labels = pod.get("metadata", {}).get("labels", {})
    if labels.get(ATTEMPT_LABEL) != str(attempt):
        return  # a pod of an earlier attempt, being cleaned up
    generation = int(job["metadata"].get("generation") or 0)
    rv = str(job["metadata"]["resourceVersion"])
    if labels.get(ROLE_LABEL) == HEAD_ROLE:
        outcome = classify_pod(pod, deleted=deleted)
        if outcome:
            decision = jobs.finish_attempt(status, outcome, generation, _now(),
                                           dict(job.get("spec") or {}), CATALOG)
            if decision.status:
                kube.patch_job_status(namespace, job_name, decision.status, rv)
                _apply(job, namespace, decision)
                if decision.status.get("phase") == "Restarting":
                    metrics.RESTARTS.labels(reason=outcome.reason.value).inc()
                    FAILED_AT[(namespace, job_name)] = time.monotonic()
            return
    elif not deleted and not pod["metadata"].get("deletionTimestamp"):
        ended = classify_pod(pod)
        if ended is not None:
            decision = jobs.worker_replaced(status, pod["metadata"]["name"], ended.message)
            # Counted once per pod: KubeRay's delete of it is not a second ending.
            if pod["metadata"]["name"] not in _REPLACED:
                kube.patch_job_status(namespace, job_name, decision.status, rv)
                _REPLACED.add(pod["metadata"]["name"])
                _apply(job, namespace, decision)
    # Named from the attempt, not from status.rayCluster: pod events can beat the
    # reconcile's first status write, and must not report "creating" for a live cluster.
    rc_name = names.ray_cluster(JobRef(job_name, namespace, ""), attempt)
    rc = kube.get_ray_cluster(namespace, rc_name)
    pods = kube.list_pods(namespace, f"{JOB_LABEL}={job_name},{ATTEMPT_LABEL}={attempt}")
    workers = int((status.get("plan") or {}).get("nodes") or 0)
    view = attempt_phase(rc, pods, workers)
    change = jobs.observed_status(view, status, generation, _now())
    if change:
        kube.patch_job_status(namespace, job_name, change, rv)
        if view.phase == "Running":
            _post(job, [("Normal", "Running", view.message)])


# Pod events only, no pod finalizers: KubeRay deletes a head pod whose container
# ended right after the kubelet reports it, and that status update reaches us first.
# A finalizer would make namespace and job deletion wait on the operator.
@kopf.on.event("v1", "pods", labels={JOB_LABEL: kopf.PRESENT})
def pod_event(type: str, body: kopf.Body, namespace: str | None, labels: kopf.Labels,
              **_: Any) -> None:
    try:
        _observe(namespace or "", labels[JOB_LABEL], dict(body), deleted=type == "DELETED")
    except ApiException:
        metrics.API_ERRORS.labels(operation="observe").inc()
        raise
