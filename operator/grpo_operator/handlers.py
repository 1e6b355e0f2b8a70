"""Kopf handlers, named <resource>_<event>. Each gathers the job and what its event
needs, calls `reconcile.reconcile` once and applies the Action it returns; no decisions
and no state live here."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NoReturn

import kopf

from grpo_api.contract import (
    API_GROUP,
    API_VERSION,
    ATTEMPT_LABEL,
    JOB_LABEL,
    KIND,
    KUEUE_QUEUE_LABEL,
    PLURAL,
    Phase,
    Reason,
)

from . import hub_config, kube, metrics, node_cache
from . import reconcile as rec
from .config import OperatorConfig, from_memo
from .hub_endpoints import readable
from .kube_api import ApiError
from .reconcile import Action, Event, Observed
from .render import JobRef, names

log = logging.getLogger("grpo_operator")
# A pod and a cluster event of one job at once: the loser of the status write reads the
# job again and decides again; this many times before Kopf retries the event later.
_DECIDE_TRIES = 8


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _reconcile(job: dict[str, Any], observed: Observed, event: Event, now: str,
               config: OperatorConfig) -> Action:
    """`reconcile.reconcile` with the GPU Nodes as they are, and how often it ran the
    planner recorded (at most once)."""
    observed = replace(observed, nodes=node_cache.shapes(config.catalog))
    action = rec.reconcile(job, observed, event, now, config)
    kind = type(event).__name__
    metrics.PLANS_PER_DECISION.labels(event=kind).observe(action.plans)
    if action.plans:
        meta = job.get("metadata") or {}
        log.debug("%s/%s: %s planned %d time(s)", meta.get("namespace"), meta.get("name"),
                  kind, action.plans)
    return action


def _post(job: Any, kind: str, reason: Reason, message: str) -> None:
    """A Kubernetes event on the job (Kopf posts them in the background). kopf.event, not
    kopf.info: those follow settings.posting.level, which keeps Kopf's own chatter out."""
    kopf.event(job, type=kind, reason=reason, message=message)


def _apply(job: dict[str, Any], action: Action, config: OperatorConfig) -> None:
    """Status first, only over the resourceVersion the action was decided from (raises
    kube.Conflict and does nothing else when the job changed); then the children, the
    release of a cluster, events and metrics. A child the API server refuses is decided
    on like any event (`_create_failed`)."""
    meta = job["metadata"]
    namespace, name = str(meta.get("namespace") or "default"), str(meta["name"])
    if action.status:
        kube.patch_job_status(namespace, name, action.status, str(meta.get("resourceVersion")
                                                                  or ""))
    for child in action.children:
        try:
            created = kube.create_if_absent(child)
        except ApiError as exc:
            _create_failed(job, child, exc, config)
        if created:
            _post(job, "Normal", Reason.CREATED, f"{child['kind']} {child['metadata']['name']}")
    if action.claim_change:
        kube.patch_claim(namespace, action.claim_change.name, action.claim_change.patch)
    if action.delete_pod:
        kube.delete_pod(namespace, action.delete_pod)
    if action.delete_ray_cluster and kube.delete_ray_cluster(namespace,
                                                             action.delete_ray_cluster):
        _post(job, "Normal", Reason.RELEASED, f"deleted RayCluster {action.delete_ray_cluster} "
              "(GPUs released; checkpoint volume and status kept)")
    for kind, reason, message in action.events:
        _post(job, kind, reason, message)
    if action.restart_reason:
        metrics.RESTARTS.labels(reason=action.restart_reason).inc()
    if action.recovered_after is not None:
        metrics.TIME_TO_RECOVER.observe(action.recovered_after)


def _create_failed(job: dict[str, Any], child: dict[str, Any], exc: ApiError,
                   config: OperatorConfig) -> NoReturn:
    """A child the API server refused (quota, admission, RBAC): `reconcile` decides the
    status (CreateFailed) and Warning event, applied like any Action on the job as it is
    now (the status above moved it on); then Kopf tries again. Without this the job would
    sit in CreatingCluster, silent."""
    metrics.API_ERRORS.labels(operation="create").inc()
    meta = job["metadata"]
    fresh = kube.get_job(str(meta.get("namespace") or "default"), str(meta["name"])) or job
    event = rec.CreateFailed(str(child["kind"]), str(child["metadata"]["name"]),
                             kube.api_message(exc))
    action = _reconcile(fresh, Observed(), event, _now(), config)
    _apply(fresh, action, config)
    why, delay = action.retry or (str(event), 10.0)
    raise kopf.TemporaryError(why, delay=delay)


def _job(body: kopf.Body) -> dict[str, Any]:
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, **dict(body)}


@kopf.on.create(API_GROUP, API_VERSION, PLURAL)
@kopf.on.resume(API_GROUP, API_VERSION, PLURAL)
@kopf.on.update(API_GROUP, API_VERSION, PLURAL, field="spec")
def grpojob_reconcile(body: kopf.Body, namespace: str | None, memo: kopf.Memo,
                      **_: Any) -> None:
    t0 = time.monotonic()
    try:
        ns = namespace or "default"
        name = str(body["metadata"]["name"])
        ref = JobRef(name, ns, "")  # names only
        # What to read comes from the stored spec as it is: reconcile parses it.
        raw_spec = dict(body.get("spec") or {})
        status = rec.read_status(body.get("status")).status
        ckpt = raw_spec.get("checkpoint") or {}
        # No claim to read for a job with checkpoint.store and neither claimName nor size.
        claim = (names.checkpoint_claim(ref, ckpt.get("claimName"))
                 if ckpt.get("claimName") or ckpt.get("size") or not ckpt.get("store") else None)
        model_claim = (raw_spec.get("model") or {}).get("claimName")
        # A new job's name may be an earlier job's whose pods are still going away.
        fresh = not status.attempts
        observed = Observed(claim=kube.get_claim(ns, claim) if claim else None,
                            model_claim=kube.get_claim(ns, model_claim) if model_claim else None,
                            pods=kube.list_pods(ns, f"{JOB_LABEL}={name}") if fresh else [])
        config = from_memo(memo)
        read = readable(raw_spec, config.hub_endpoints)
        if read is not None and rec.operator_reads_hub(read, status, config.read_public_hub):
            observed = replace(observed, hub=hub_config.read(rec.hub_url(read)))
        elif read is not None and rec.to_read(read, status) == "pod":
            observed = replace(observed,
                               model_reader=kube.get_pod(ns, names.model_reader(ref)))
        action = _reconcile(_job(body), observed, rec.SpecChanged(), _now(), config)
        _apply(_job(body), action, config)
        if action.retry:
            raise kopf.TemporaryError(action.retry[0], delay=action.retry[1])
    except kube.Conflict as exc:
        raise kopf.TemporaryError("status changed meanwhile; deciding again", delay=0.2) from exc
    except ApiError as exc:
        metrics.API_ERRORS.labels(operation="reconcile").inc()
        raise kopf.TemporaryError(f"API error {exc.status}: {exc.reason}", delay=5) from exc
    finally:
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - t0)


def _restart_pending(body: kopf.Body, **_: Any) -> bool:
    return rec.restart_pending(_job(body))


@kopf.timer(API_GROUP, API_VERSION, PLURAL, interval=0.25, when=_restart_pending)
def grpojob_restart(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Starts the next attempt once its backoff has passed (a timer, so an operator
    restart during the backoff neither loses nor repeats it)."""
    job, config, now = _job(body), from_memo(memo), _now()
    namespace, name = str(body["metadata"].get("namespace")), str(body["metadata"]["name"])
    # Once due, the next attempt waits for the earlier attempts' pods to be gone.
    pods = (kube.list_pods(namespace, f"{JOB_LABEL}={name}") if rec.restart_due(job, now)
            else [])
    try:
        _apply(job, _reconcile(job, Observed(pods=pods), rec.BackoffTimer(), now, config),
               config)
    except kube.Conflict:
        return  # the next tick decides again on the fresh object


def _progress_watched(body: kopf.Body, **_: Any) -> bool:
    return rec.progress_watched(_job(body))


@kopf.timer(API_GROUP, API_VERSION, PLURAL, interval=rec.PROGRESS_CHECK_INTERVAL_S,
            when=_progress_watched)
def grpojob_progress(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Ends a Running attempt whose driver reported nothing for its deadline (a timer:
    a stuck driver sends no event)."""
    job = _job(body)
    try:
        _apply(job, _reconcile(job, Observed(), rec.ProgressTimer(), _now(), from_memo(memo)),
               from_memo(memo))
    except kube.Conflict:
        return  # the next tick decides again on the fresh object


@kopf.on.event(API_GROUP, API_VERSION, PLURAL)
def grpojob_event(type: str, body: kopf.Body, namespace: str | None, name: str,
                  memo: kopf.Memo, **_: Any) -> None:
    """Keeps the jobs-by-phase gauge current and lets `reconcile` see the trainer's
    progress reports (the MemoryGrowth and HubFetch conditions)."""
    key = (namespace or "", name)
    if type == "DELETED":
        metrics.JOB_PHASES.pop(key, None)
        return
    job, config = _job(body), from_memo(memo)
    metrics.JOB_PHASES[key] = str((job.get("status") or {}).get("phase") or Phase.PENDING)
    try:
        _apply(job, _reconcile(job, Observed(), rec.JobChanged(), _now(), config), config)
    except kube.Conflict:
        return  # a newer version of the job is on its way here; decide on that one


def _decide_fresh(namespace: str, job_name: str, event: Event, config: OperatorConfig,
                  gather: Callable[[dict[str, Any]], Observed] = lambda _: Observed()) -> None:
    """Read the job, decide, apply; on a conflict (another event of the job was written
    first) read and decide again, so no stale decision overwrites a newer one."""
    for _ in range(_DECIDE_TRIES):
        job = kube.get_job(namespace, job_name)
        if job is None:
            return
        try:
            _apply(job, _reconcile(job, gather(job), event, _now(), config), config)
            return
        except kube.Conflict:
            continue
    raise kopf.TemporaryError(f"{job_name}: status kept changing under us", delay=1)


# Pod events only, no pod finalizers: KubeRay deletes a head pod whose container
# ended right after the kubelet reports it, and that status update reaches us first.
# A finalizer would make namespace and job deletion wait on the operator.
def _pod_matters(type: str, body: kopf.Body, **_: Any) -> bool:
    # A Kopf filter runs in the event loop: the many pod events that cannot change a job
    # cost no worker thread and no API call.
    return rec.pod_matters(rec.PodChanged(dict(body), deleted=type == "DELETED"))


@kopf.on.event("v1", "pods", labels={JOB_LABEL: kopf.PRESENT}, when=_pod_matters)
def pod_event(type: str, body: kopf.Body, namespace: str | None, labels: kopf.Labels,
              memo: kopf.Memo, **_: Any) -> None:
    ns, event = namespace or "", rec.PodChanged(dict(body), deleted=type == "DELETED")
    selector = f"{JOB_LABEL}={labels[JOB_LABEL]},{ATTEMPT_LABEL}={labels.get(ATTEMPT_LABEL)}"

    # Read once, not per conflict retry: only a pod going away asks about its namespace.
    going = event.deleted or bool(body.get("metadata", {}).get("deletionTimestamp"))
    terminating = going and kube.namespace_terminating(ns)

    def gather(job: dict[str, Any]) -> Observed:
        observed = Observed(pods=kube.list_pods(ns, selector) if rec.pod_needs_pods(job, event)
                            else [], namespace_terminating=terminating)
        if not rec.pod_needs_cluster(job, event):
            return observed
        rc = kube.get_ray_cluster(ns, str(job["status"]["rayCluster"]["name"]))
        uid = str((rc or {}).get("metadata", {}).get("uid") or "")
        return replace(observed, ray_cluster=rc,
                       workload=kube.workload_of(ns, uid) if uid else None)

    try:
        _decide_fresh(ns, labels[JOB_LABEL], event, from_memo(memo), gather)
    except ApiError:
        metrics.API_ERRORS.labels(operation="observe").inc()
        raise


@kopf.on.event("ray.io", "v1", "rayclusters", labels={JOB_LABEL: kopf.PRESENT})
def raycluster_event(type: str, body: kopf.Body, namespace: str | None, labels: kopf.Labels,
                     memo: kopf.Memo, **_: Any) -> None:
    """KubeRay writes the cluster's status as its pods come up: the job's phase follows
    it at once (no polling, one read of the job per cluster change)."""
    if type == "DELETED":
        return  # deleted by us (attempt ended, suspend) or with the job
    _decide_on_cluster(namespace or "", labels[JOB_LABEL], dict(body), from_memo(memo))


def _owned_by_ray_cluster(body: kopf.Body, **_: Any) -> bool:
    return any(r.get("kind") == "RayCluster" for r in body.get("metadata", {}).get(
        "ownerReferences") or [])


@kopf.on.event(kube.KUEUE_GROUP, kube.KUEUE_VERSION, "workloads", when=_owned_by_ray_cluster)
def workload_event(type: str, body: kopf.Body, namespace: str | None, memo: kopf.Memo,
                   **_: Any) -> None:
    """Kueue's view of a queued job's cluster changes (quota short, admitted, evicted)
    without the cluster changing: decide on the cluster again with Kueue's words. No
    Kueue installed: Kopf watches nothing here."""
    if type == "DELETED":
        return
    ns = namespace or ""
    owner = next(r for r in body["metadata"]["ownerReferences"] if r.get("kind") == "RayCluster")
    rc = kube.get_ray_cluster(ns, str(owner["name"]))
    job_name = ((rc or {}).get("metadata", {}).get("labels") or {}).get(JOB_LABEL)
    if rc is not None and job_name:
        _decide_on_cluster(ns, str(job_name), rc, from_memo(memo), dict(body))


def _decide_on_cluster(ns: str, job_name: str, rc: dict[str, Any],
                       config: OperatorConfig, workload: dict[str, Any] | None = None) -> None:
    labels = rc.get("metadata", {}).get("labels") or {}
    selector = f"{JOB_LABEL}={job_name},{ATTEMPT_LABEL}={labels.get(ATTEMPT_LABEL)}"

    def gather(job: dict[str, Any]) -> Observed:
        observed = Observed(pods=kube.list_pods(ns, selector)
                            if rec.cluster_needs_pods(job, rc) else [])
        if not rec.cluster_needs_workload(job, rc):
            return observed
        queue = str(labels[KUEUE_QUEUE_LABEL])
        return replace(observed, cluster_queue=kube.cluster_queue_of(ns, queue),
                       workload=workload or kube.workload_of(ns, str(rc["metadata"]["uid"])))

    try:
        _decide_fresh(ns, job_name, rec.ClusterChanged(rc), config, gather)
    except ApiError:
        metrics.API_ERRORS.labels(operation="observe").inc()
        raise


def _refusal_pending(body: kopf.Body, **_: Any) -> bool:
    return rec.refusal_pending(_job(body))


@kopf.timer(API_GROUP, API_VERSION, PLURAL, interval=5, when=_refusal_pending)
def grpojob_refused(body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo,
                    **_: Any) -> None:
    """While KubeRay's pod creates are refused it writes nothing new on the RayCluster, so
    no cluster event would come when the refusal's deadline passes: this timer decides
    on the cluster again (only while the job shows PodCreateRefused)."""
    ns = namespace or ""
    rc_name = ((body.get("status") or {}).get("rayCluster") or {}).get("name")
    rc = kube.get_ray_cluster(ns, str(rc_name)) if rc_name else None
    if rc is not None:
        _decide_on_cluster(ns, name, rc, from_memo(memo))
