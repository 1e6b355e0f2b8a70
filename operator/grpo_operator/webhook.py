"""Admission: refuse invalid or infeasible jobs at `kubectl apply` time, with the
planner's numbers; refuse changes to fields that cannot change mid-job; and refuse
what the job's namespace would refuse its pods (Pod Security level, GPU quota), which
would otherwise only show once KubeRay tries to create them."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpo_api.catalog import GPU_CATALOG, GpuType
from grpo_api.contract import KUEUE_QUEUE_LABEL
from grpo_api.job import GRPOJobSpec, SpecError, parse_spec
from grpo_api.job.renames import RenameConflict, rename_warnings, with_new_names
from grpo_api.job.status import GRPOJobStatus

from . import hub_config, kube, node_cache
from .admission_review import fields_patch
from .config import OperatorConfig
from .hub_endpoints import NO_HUB_ENDPOINTS, readable, with_endpoint_url
from .job_defaults import AT_CREATION, INHERITED_ANNOTATION, with_job_defaults
from .kube_api import ApiError, Unreachable
from .namespace_policy import (
    GPU_QUOTA,
    GpuQuota,
    NamespaceFacts,
    gpu_quota_problem,
    pod_security_problem,
    template_gpus,
    templates,
)
from .node_shapes import catalog_with_nodes
from .planner import InfeasibleError
from .reconcile import (
    HubAnswer,
    admission_input,
    admission_warning,
    hub_url,
    operator_reads_hub,
    planned,
    read_status,
)
from .reconcile.retention import recreate_advice
from .render import JobRef, render_ray_cluster
from .ttl_cache import TtlCache

log = logging.getLogger("grpo_operator")

# What a running job is: changing these would make its checkpoints meaningless.
IMMUTABLE_SECTIONS = ("model", "data", "reward", "algorithm", "trainer", "training", "lora",
                      "resources", "checkpoint")
# queueName is fixed too (queue_problem: Kueue's label). The rest may change on a live job
# and applies at the next attempt (docs/configuration.md, "What can change on a live job").
MUTABLE_SECTIONS = tuple(
    (f.alias or name) for name, f in GRPOJobSpec.model_fields.items()
    if name not in IMMUTABLE_SECTIONS and name != "queue_name")


def _advice(old_raw_spec: dict[str, Any]) -> str:
    """What re-creating the live job does to its checkpoints (a refusal's words): its
    stored spec, parsed for this message only."""
    try:
        return recreate_advice(parse_spec(old_raw_spec))
    except SpecError:
        return recreate_advice(None)


def queue_problem(raw_spec: dict[str, Any], old_raw_spec: dict[str, Any] | None,
                  kueue_installed: bool) -> str | None:
    """spec.queueName: Kueue must be there to admit the job (else its cluster would run
    at once, unqueued), and the queue is fixed at creation (Kueue's label is immutable
    on an admitted cluster; the operator never rewrites it)."""
    queue = raw_spec.get("queueName")
    if old_raw_spec is not None and old_raw_spec.get("queueName") != queue:
        return ("spec.queueName cannot change after the job is created (Kueue's queue label "
                "is fixed on the job's RayCluster); delete the job and create it again with "
                f"the new queue ({_advice(old_raw_spec)})")
    if queue and old_raw_spec is None and not kueue_installed:
        return (f"spec.queueName: {queue!r} names a Kueue LocalQueue, but Kueue is not "
                "installed in this cluster (no kueue.x-k8s.io/v1beta2 API); install Kueue "
                "with the ray.io/raycluster integration, or remove spec.queueName to run at "
                "once")
    return None


def queue_from_label(labels: Mapping[str, Any], raw_spec: Mapping[str, Any]) -> str | None:
    """The queue a new job's Kueue label names, to record as spec.queueName (None: no
    label, or spec.queueName is set and has the say)."""
    label = labels.get(KUEUE_QUEUE_LABEL)
    return str(label) if label and not raw_spec.get("queueName") else None


def queue_label_problem(labels: Mapping[str, Any], raw_spec: Mapping[str, Any],
                        old_labels: Mapping[str, Any] | None) -> str | None:
    """The Kueue label on a GRPOJob is its queue, as on Kueue's own jobs: recorded as
    spec.queueName at creation (the mutating webhook), refused when the two disagree.
    An update that leaves the label as it was is not this rule's (a job labelled before
    the operator recorded labels may still lose its finalizer; queue_problem keeps
    spec.queueName fixed)."""
    label = labels.get(KUEUE_QUEUE_LABEL)
    queue = raw_spec.get("queueName")
    if not label or label == queue:
        return None
    if old_labels is not None and old_labels.get(KUEUE_QUEUE_LABEL) == label:
        return None
    if queue:
        return (f"metadata.labels[{KUEUE_QUEUE_LABEL}] {label!r} and spec.queueName "
                f"{queue!r} name different queues: keep one of them")
    return (f"metadata.labels[{KUEUE_QUEUE_LABEL}] {label!r} was added after the job was "
            "created, and a job's queue is fixed then; delete the job and create it again "
            "with the label (or spec.queueName)")


@dataclass(frozen=True)
class AdmissionReview:
    """The webhook's answer: why to refuse (None: admit), and what kubectl prints beside
    an admitted spec."""

    problem: str | None
    warnings: list[str]


def review_admission(raw_spec: dict[str, Any], old_raw_spec: dict[str, Any] | None,
                     catalog: Mapping[str, GpuType] = GPU_CATALOG,
                     namespace: NamespaceFacts | None = None,
                     name: str = "job", kueue_installed: bool = True,
                     hub: HubAnswer | None = None,
                     old_status: GRPOJobStatus | None = None,
                     hub_endpoints: Mapping[str, str] = NO_HUB_ENDPOINTS) -> AdmissionReview:
    """admission_problem and admission_warnings from one parse of the spec (pure)."""
    problem, spec = _problem(raw_spec, old_raw_spec, catalog, namespace, name,
                             kueue_installed, hub, old_status, hub_endpoints)
    if problem:
        return AdmissionReview(problem, [])
    if spec is not None:  # the hub as read: its URL, in what the warning says
        raw_spec = with_endpoint_url(raw_spec, hub_endpoints)
    return AdmissionReview(None, admission_warnings(raw_spec, hub, spec))


def admission_problem(raw_spec: dict[str, Any], old_raw_spec: dict[str, Any] | None,
                      catalog: Mapping[str, GpuType] = GPU_CATALOG,
                      namespace: NamespaceFacts | None = None,
                      name: str = "job", kueue_installed: bool = True,
                      hub: HubAnswer | None = None,
                      old_status: GRPOJobStatus | None = None,
                      hub_endpoints: Mapping[str, str] = NO_HUB_ENDPOINTS) -> str | None:
    """Why the API server should refuse this spec, or None (pure). With `namespace`,
    also what that namespace would refuse the job's pods (checked on the pods as
    rendered for the first attempt); its GPU quota only on create (a live job's own pods
    count as used). `hub`: the operator's read of a public hub model's config.json;
    `old_status`: the live job's status, read (its config.json as read); `hub_endpoints`: the
    hubs a job may name (reconcile/hub_endpoint.py)."""
    return _problem(raw_spec, old_raw_spec, catalog, namespace, name, kueue_installed, hub,
                    old_status, hub_endpoints)[0]


def _problem(raw_spec: dict[str, Any], old_raw_spec: dict[str, Any] | None,
             catalog: Mapping[str, GpuType], namespace: NamespaceFacts | None, name: str,
             kueue_installed: bool, hub: HubAnswer | None,
             old_status: GRPOJobStatus | None,
             hub_endpoints: Mapping[str, str]) -> tuple[str | None, GRPOJobSpec | None]:
    """admission_problem's answer, and the spec as parsed (once) when it parsed."""
    if old_raw_spec is not None and old_raw_spec == raw_spec:
        return None, None  # metadata/finalizer updates are never blocked by a newer planner
    queue = queue_problem(raw_spec, old_raw_spec, kueue_installed)
    if queue:
        return queue, None
    if old_raw_spec is not None:
        try:  # compared by their new names: a manifest moved to them changes nothing
            new_names, old_names = with_new_names(raw_spec), with_new_names(old_raw_spec)
        except RenameConflict as exc:
            return str(exc), None
        changed = [k for k in IMMUTABLE_SECTIONS
                   if old_names.get(k) != new_names.get(k)]
        if changed:
            # Re-created under this name, a job resumes this one's checkpoints (Retain):
            # right for new data or resources, not for another model or LoRA setting
            # (other tensors: the trainer refuses another model's checkpoints).
            how = ("under another name (a job created again under this one would find this "
                   "one's checkpoints, of another model or LoRA setting)"
                   if {"model", "lora"} & set(changed)
                   else f"or delete this one and create it again ({_advice(old_raw_spec)})")
            return (f"spec.{', spec.'.join(changed)} cannot change after the job is created "
                    f"(checkpoints depend on them); create a new GRPOJob instead, {how}. "
                    f"spec.{', spec.'.join(MUTABLE_SECTIONS)} may change and take effect at "
                    "the next attempt"), None
    try:
        spec = parse_spec(raw_spec)
        raw_spec = with_endpoint_url(raw_spec, hub_endpoints)
        spec = parse_spec(raw_spec) if spec.hub.endpoint else spec
    except SpecError as exc:
        return str(exc), None
    model, plan_now = admission_input(raw_spec, hub, old_status)
    if not plan_now:  # planned once config.json is read (admission_warning says so)
        return None, spec
    try:
        plan = planned(spec, catalog=catalog, model=model)
    except SpecError as exc:
        return str(exc), None
    except (InfeasibleError, ValueError) as exc:
        return f"the memory planner refuses this job: {exc}", None
    if namespace is None:
        return None, spec
    rc = render_ray_cluster(spec, plan, JobRef(name, namespace.name, ""), 0)
    security = pod_security_problem(raw_spec.get("pods") or {}, templates(rc), namespace)
    quota = gpu_quota_problem(template_gpus(rc), namespace) if old_raw_spec is None else None
    return "; ".join(p for p in (security, quota) if p) or None, spec


# A namespace's labels and quotas, read once per this many seconds: a burst of creates
# in one namespace (a sweep, a pipeline) made two API reads per admission, most of its
# time (docs/benchmarks.md, "Admission"). A label or quota changed is seen by the
# admissions after this; the API server's own quota admission still holds the pods.
NAMESPACE_FACTS_TTL_S = 5.0
_namespace_facts: TtlCache[str, NamespaceFacts | None] = TtlCache(NAMESPACE_FACTS_TTL_S)


def read_namespace_facts(namespace: str) -> NamespaceFacts | None:
    """The namespace's Pod Security labels and GPU quotas; None when they cannot be read
    (then only the spec itself is checked: a refusal the webhook cannot see still shows
    in the job's status once KubeRay tries to create the pods)."""
    try:
        return NamespaceFacts(namespace, kube.namespace_labels(namespace), tuple(
            GpuQuota(*q) for q in kube.resource_quotas(namespace, GPU_QUOTA)))
    except (ApiError, Unreachable) as exc:
        log.warning("admission: cannot read namespace %s or its quotas (%s); checking the "
                    "spec only", namespace, kube.failure_message(exc))
        return None


def namespace_facts(namespace: str) -> NamespaceFacts | None:
    """``read_namespace_facts``, at most once per ``NAMESPACE_FACTS_TTL_S`` a namespace."""
    return _namespace_facts.get(namespace, lambda: read_namespace_facts(namespace))


def kueue_installed() -> bool:
    """Whether Kueue's API is served; True when discovery fails (Kueue then shows a
    missing queue in the job's status instead)."""
    try:
        return kube.kueue_served()
    except (ApiError, Unreachable) as exc:
        log.warning("admission: cannot list API groups (%s); not checking for Kueue",
                    kube.failure_message(exc))
        return True



def admission_warnings(raw_spec: dict[str, Any], hub: HubAnswer | None = None,
                       spec: GRPOJobSpec | None = None) -> list[str]:
    """What kubectl should print beside an accepted spec: deprecated fields set, and a
    config.json not read yet (pure). `spec`: the spec as parsed, when the caller did."""
    try:
        parsed = spec or parse_spec(raw_spec)
        found = [*rename_warnings(raw_spec), *parsed.deprecation_warnings()]
    except SpecError:
        return []  # refused anyway, with its own message
    model = admission_warning(raw_spec, hub)
    return [*found, model] if model else found


def review_request(raw_spec: dict[str, Any], old: dict[str, Any] | None,
                   operation: str | None, name: str | None, namespace: str | None,
                   config: OperatorConfig) -> AdmissionReview:
    """Gather what the review needs (the namespace's rules, Kueue, the hub's config.json),
    then review: on an admission thread."""
    old_raw_spec = dict(old.get("spec") or {}) if operation == "UPDATE" and old else None
    # Read once, here: the hub decision below and the plan's input (admission_input).
    old_status = read_status(old.get("status") if old_raw_spec is not None and old
                             else None).status
    changed = old_raw_spec != raw_spec
    # Checked as reconcile will run it: with the platform's defaults for its namespace.
    raw_spec = with_job_defaults(raw_spec, config.job_defaults, namespace or "").raw_spec
    if old_raw_spec is not None:
        old_raw_spec = with_job_defaults(old_raw_spec, config.job_defaults,
                                         namespace or "").raw_spec
    facts = namespace_facts(namespace) if namespace and changed else None
    kueue = kueue_installed() if raw_spec.get("queueName") and old_raw_spec is None else True
    read = readable(raw_spec, config.hub_endpoints)  # an unlisted hub: refused, unread
    hub = (hub_config.read(hub_url(read)) if read is not None and changed and operator_reads_hub(
        read, old_status, config.read_public_hub) else None)
    catalog = catalog_with_nodes(config.catalog, node_cache.shapes(config.catalog))
    return review_admission(raw_spec, old_raw_spec, catalog, facts, name or "job",
                            kueue, hub, old_status, config.hub_endpoints)


def validate(body: Mapping[str, Any], old: Mapping[str, Any] | None, operation: str | None,
             namespace: str, config: OperatorConfig) -> AdmissionReview:
    """The validating webhook's answer to one request: the Kueue label, then
    review_request (it reads the namespace, Kueue's API and the hub: run it on an
    admission thread, admission_process.py)."""
    meta = body.get("metadata") or {}
    raw_spec = dict(body.get("spec") or {})
    old_labels = None if old is None else (old.get("metadata") or {}).get("labels") or {}
    label = queue_label_problem(meta.get("labels") or {}, raw_spec, old_labels)
    if label:
        return AdmissionReview(label, [])
    return review_request(raw_spec, dict(old) if old else None, operation, meta.get("name"),
                          namespace, config)


@dataclass(frozen=True)
class CreationDefaults:
    """What a new job's spec and annotations get at creation (the mutating webhook)."""

    spec: dict[str, str]
    annotations: dict[str, str]


def creation_defaults(raw_spec: Mapping[str, Any], labels: Mapping[str, Any],
                      namespace: str, config: OperatorConfig) -> CreationDefaults:
    """The trainer image a job runs, recorded so an operator upgrade or a new default
    does not change it: its own, else the platform's for its namespace, else the
    operator's; and its queue: its Kueue label's, else the platform's (pure). The
    fields taken from the platform's defaults are named in an annotation, for
    status.plan.inherited."""
    spec: dict[str, str] = {}
    queue = queue_from_label(labels, raw_spec)
    if queue:
        spec["queueName"] = queue
    inherited = with_job_defaults({**raw_spec, **spec}, config.job_defaults, namespace)
    origins = {f: inherited.origins[f"spec.{f}"] for f in AT_CREATION
               if f"spec.{f}" in inherited.origins}
    spec |= {f: inherited.raw_spec[f] for f in origins}
    if not raw_spec.get("image") and "image" not in spec:
        spec["image"] = config.default_image
    annotations = ({INHERITED_ANNOTATION: json.dumps(
        {f"spec.{f}": source for f, source in origins.items()}, sort_keys=True)}
        if origins else {})
    return CreationDefaults(spec, annotations)


def default_patch(body: Mapping[str, Any], namespace: str,
                  config: OperatorConfig) -> list[dict[str, Any]]:
    """The mutating webhook's answer to a create: creation_defaults as a JSON patch (pure:
    nothing to wait for)."""
    meta = body.get("metadata") or {}
    found = creation_defaults(body.get("spec") or {}, meta.get("labels") or {}, namespace,
                              config)
    return fields_patch(body, found.spec, found.annotations)
