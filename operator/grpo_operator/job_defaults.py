"""The platform's job defaults: what every job in a namespace inherits (pure).

A platform team sets them once in the chart's `jobDefaults` (`--job-defaults`): the
trainer image, tolerations, node selector, priority class, the checkpoint claim's
StorageClass, the fabric devices, the Kueue queue; for every namespace, and per namespace
under `namespaces.<name>` (a field there wins over the same field for all). A job's own
fields always win: a scalar the job sets is kept, a node-selector or device key the job
sets is kept, tolerations are added to the job's (a toleration only widens where a pod
may go). Admission, reconcile and `grpo plan` apply them to the spec as written, before
it is parsed, so all three accept and plan the same job; `status.plan.inherited` names
each field that came from them and where.

Two fields are fixed when the job is created, as their own fields are (the mutating
webhook records them in the spec): the image (an operator upgrade, or a new default,
does not change a running job's image) and the queue (Kueue's label on a cluster cannot
change). The rest are read at each attempt, as spec.pods is: a changed default reaches a
job at its next attempt.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, ValidationError

from grpo_api.catalog import CPU_GPU_TYPE
from grpo_api.job.base import DNS_LABEL_PATTERN, SUBDOMAIN_PATTERN, ApiModel
from grpo_api.job.pods import Toleration
from grpo_api.job.resources import DeviceCounts

FLAG = "--job-defaults"
VALUE = "jobDefaults"  # the chart's value, and the source status.plan.inherited names
INHERITED_ANNOTATION = "grpo.dev/inherited"  # what the mutating webhook recorded
# The fields recorded in the spec at creation (the mutating webhook), by wire path.
AT_CREATION = ("image", "queueName")


class JobDefaultsEntry(ApiModel):
    """Defaults for the jobs of every namespace, or of one."""

    image: str | None = Field(None, min_length=1, description="spec.image.")
    tolerations: list[Toleration] | None = Field(
        None, description="Added to spec.pods.common.tolerations.")
    node_selector: dict[str, str] | None = Field(
        None, description="spec.pods.common.nodeSelector keys the job does not set.")
    priority_class_name: str | None = Field(
        None, pattern=SUBDOMAIN_PATTERN, description="spec.pods.common.priorityClassName.")
    storage_class: str | None = Field(
        None, pattern=DNS_LABEL_PATTERN,
        description="spec.checkpoint.storageClass of a claim the operator creates.")
    devices: DeviceCounts | None = Field(
        None, description="spec.resources.devices keys the job does not set (GPU jobs).")
    queue_name: str | None = Field(
        None, pattern=DNS_LABEL_PATTERN, max_length=63, description="spec.queueName.")


class JobDefaults(JobDefaultsEntry):
    """The chart's `jobDefaults`: the fields for every namespace, and `namespaces`."""

    namespaces: dict[str, JobDefaultsEntry] = Field(
        default_factory=dict, description="Per namespace: a field here wins over the same "
        "field for every namespace.")


NO_JOB_DEFAULTS = JobDefaults.model_validate({})


def parse_job_defaults(text: str) -> JobDefaults:
    """The flag's JSON object; ValueError naming the field and the fix."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{FLAG}: not JSON ({err}); give an object such as "
                         '{"priorityClassName": "training"}') from None
    try:
        return JobDefaults.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{VALUE}.{where}: {first['msg']} (the chart's {VALUE}, "
                         f"{FLAG})") from None


_Put = Callable[[dict[str, Any], str, str, str], None]


@dataclass(frozen=True)
class Inherited:
    """A spec with the defaults applied, and the wire path of each field they set ->
    where it came from (jobDefaults, or jobDefaults.namespaces.<name>)."""

    raw_spec: dict[str, Any]
    origins: dict[str, str] = field(default_factory=dict)


def _layers(defaults: JobDefaults, namespace: str) -> list[tuple[str, JobDefaultsEntry]]:
    """The entries that apply, the one that wins first."""
    own = defaults.namespaces.get(namespace)
    mine = [(f"{VALUE}.namespaces.{namespace}", own)] if own is not None else []
    return [*mine, (VALUE, defaults)]


def _value(layers: list[tuple[str, JobDefaultsEntry]], name: str) -> tuple[str, Any] | None:
    for source, entry in layers:
        value = getattr(entry, name)
        if value is not None:
            return source, value
    return None


def _wire(value: Any) -> Any:
    if isinstance(value, list):
        return [v.to_wire() if isinstance(v, ApiModel) else v for v in value]
    return copy.deepcopy(value)


def with_job_defaults(raw_spec: Mapping[str, Any], defaults: JobDefaults,
                      namespace: str) -> Inherited:
    """`raw_spec` (a copy) with the defaults for `namespace` in every field it leaves
    unset; the job's own fields win."""
    spec = copy.deepcopy(dict(raw_spec))
    layers = _layers(defaults, namespace)
    origins: dict[str, str] = {}

    def scalar(section: dict[str, Any], key: str, name: str, path: str) -> None:
        found = _value(layers, name)
        if found is not None and section.get(key) is None:
            section[key] = _wire(found[1])
            origins[path] = found[0]

    def keyed(section: dict[str, Any], key: str, name: str, path: str) -> None:
        if not isinstance(section.get(key) or {}, dict):
            return  # refused by the parser
        merged: dict[str, Any] = {}
        for source, entry in reversed(layers):  # the winning layer last
            for k, v in (getattr(entry, name) or {}).items():
                merged[k] = (source, v)
        own = dict(section.get(key) or {})
        for k, (source, v) in merged.items():
            if k not in own:
                own[k] = v
                origins[f"{path}.{k}"] = source
        if own:
            section[key] = own

    scalar(spec, "image", "image", "spec.image")
    scalar(spec, "queueName", "queue_name", "spec.queueName")
    if isinstance(spec.get("pods", {}), dict):  # any other: refused by the parser
        _pod_defaults(spec, layers, origins, scalar, keyed)
    checkpoint = spec.get("checkpoint")
    if isinstance(checkpoint, dict) and checkpoint.get("size") and not checkpoint.get(
            "claimName"):
        scalar(checkpoint, "storageClass", "storage_class", "spec.checkpoint.storageClass")
    resources = spec.get("resources")
    if isinstance(resources, dict) and _runs_workers(resources):
        keyed(resources, "devices", "devices", "spec.resources.devices")
    return Inherited(spec, origins)


def _pod_defaults(spec: dict[str, Any], layers: list[tuple[str, JobDefaultsEntry]],
                  origins: dict[str, str], scalar: _Put, keyed: _Put) -> None:
    """The pod settings, under spec.pods.common (kept out of the spec when none apply)."""
    pods = dict(spec.get("pods") or {})
    common = pods.get("common")
    if not isinstance(common, dict) and common is not None:
        return  # refused by the parser
    common = dict(common or {})
    if not any(isinstance(pods.get(role), dict) and pods[role].get("priorityClassName")
               for role in ("common", "head", "workers")):
        scalar(common, "priorityClassName", "priority_class_name",
               "spec.pods.common.priorityClassName")
    keyed(common, "nodeSelector", "node_selector", "spec.pods.common.nodeSelector")
    tolerations = _value(layers, "tolerations")
    if tolerations is not None and isinstance(common.get("tolerations") or [], list):
        own = list(common.get("tolerations") or [])
        added = [t for t in _wire(tolerations[1]) if t not in own]
        if added:
            common["tolerations"] = [*added, *own]
            origins["spec.pods.common.tolerations"] = tolerations[0]
    if common:
        spec["pods"] = {**pods, "common": common}


def _runs_workers(resources: Mapping[str, Any]) -> bool:
    """Devices go on worker pods: a GPU job's (a cpu job's only when it has workers)."""
    gpu = resources.get("gpuType", resources.get("gpu"))
    return gpu != CPU_GPU_TYPE or bool(resources.get("nodes"))


def recorded_origins(annotations: Mapping[str, Any]) -> dict[str, str]:
    """What the mutating webhook recorded as inherited at creation (its annotation);
    empty when absent or not a JSON object of strings (a hand edit)."""
    try:
        found = json.loads(str(annotations.get(INHERITED_ANNOTATION) or "{}"))
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): str(v) for k, v in found.items() if isinstance(v, str)}
