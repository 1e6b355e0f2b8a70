"""Where a job's model shape comes from, and reading its config.json once (pure).

`spec.model.shape` is the override. Otherwise a new job's config.json is read once and
kept in status.modelConfig, which every attempt's plan uses (so a hub that goes away,
or a revision that moves, never changes a running job's plan):
- a public hub repo: the operator GETs `<endpoint>/<repo>/resolve/<revision>/config.json`
  (handler: hub_config.read, cached), at admission and here;
- a model on a claim or in the store (s3://), or a private hub repo: a pod of the job's
  trainer image reads it
  (render/model_reader.py) and the operator reads the pod's termination message; the job
  waits in Pending (ReadingModelConfig) meanwhile;
- any other path: the known-family table, as before.
A model the table knows is planned from the table when its config.json cannot be read,
and the plan and a Warning event say so; any other model waits (hub unreachable: the
read is retried) or fails (no config.json, an architecture the trainer does not train),
naming the error and the fix.

What to read is decided on the spec as stored (`raw_spec`): by the handler before any
parse, and by admission for specs that may not parse; reading it takes the parsed spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from grpo_api.contract import IMAGE_UID, Reason, is_hub_id
from grpo_api.job import GRPOJobSpec
from grpo_api.job.data import is_s3
from grpo_api.job.status import GRPOJobStatus, ModelConfigStatus
from grpo_api.model.shape import known_family
from grpo_api.model_config import ReaderReport, hub_config_url

from ..render import JobRef, names
from ..render.model_reader import render_model_reader
from .conditions import JobEvent, unschedulable
from .phases import Finding, has_ended
from .status import StatusFacts, StatusRecord

READ_POLL_SECONDS = 2.0  # how often a waiting job looks at its reader pod
RETRY_SECONDS = 30.0  # a hub that could not be reached is asked again after this

How = Literal["shape", "hub", "pod", "path"]


@dataclass(frozen=True)
class HubAnswer:
    """The operator's GET of a public hub repo's config.json (hub_config.read)."""

    url: str
    config: dict[str, Any] | None = None
    error: str | None = None
    retry: bool = False  # the error may pass (no answer, a 5xx)


@dataclass(frozen=True)
class PlanInput:
    """What plan_memory gets besides the spec: config.json and where it was read, or,
    without one, why none was (grpo_api.model.shape.resolve_shape)."""

    config: dict[str, Any] | None
    source: str


def how_read(raw_spec: dict[str, Any]) -> How:
    model = raw_spec.get("model") or {}
    if model.get("shape"):
        return "shape"
    if model.get("claimName") or is_s3(str(model.get("path") or "")):
        return "pod"  # a claim, or the store with the job's keys: read where the pods read
    if is_hub_id(str(model.get("path") or "")):
        # The token is in the job's Secret: a pod that gets it from the Secret reads.
        return "pod" if (raw_spec.get("hub") or {}).get("tokenSecret") else "hub"
    return "path"


PUBLIC_HUB_OFF = ("this operator does not read the public hub (--no-read-public-hub, the "
                  "chart's readPublicHub: false); spec.hub.endpoint names a hub it reads")


def operator_reads_hub(raw_spec: dict[str, Any], status: GRPOJobStatus,
                       read_public_hub: bool) -> bool:
    """Whether the operator GETs this job's config.json itself now: a hub model not read
    yet, from the endpoint the job names, or from the public hub where the operator may
    reach it (--read-public-hub). Otherwise the job plans as without a hub (the table)."""
    return to_read(raw_spec, status) == "hub" and (
        read_public_hub or bool((raw_spec.get("hub") or {}).get("endpoint")))


def hub_url(raw_spec: dict[str, Any]) -> str:
    model, hub = raw_spec.get("model") or {}, raw_spec.get("hub") or {}
    return hub_config_url(hub.get("endpoint"), str(model.get("path")), model.get("revision"))


def to_read(raw_spec: dict[str, Any], status: GRPOJobStatus) -> How | None:
    """What the handler must gather for this decision: "hub" (the operator's GET),
    "pod" (the reader pod), or None: read already, the shape is given, or the job was
    planned before (by an operator that did not read config.json: its plan stays)."""
    if status.read_model_config is not None or status.attempts or has_ended(status):
        return None
    how = how_read(raw_spec)
    return how if how in ("hub", "pod") else None


_SOURCE_WORDS = {"hub": "hub config.json", "claim": "claim config.json",
                 "store": "store config.json"}


def read_source(source: str, location: str | None) -> str:
    """Where config.json was read, as the plan's modelSource words it."""
    return f"{_SOURCE_WORDS[source]} ({location})"


def recorded(status: GRPOJobStatus) -> PlanInput | None:
    """The plan input status.modelConfig holds; None: nothing read (plan as before)."""
    read = status.read_model_config
    if read is None:
        return None
    if read.source == "table":
        return PlanInput(None, read.message or "no config.json read")
    return PlanInput(read.config, read_source(read.source, read.location))


def admission_input(raw_spec: dict[str, Any], hub: HubAnswer | None,
                    old_status: GRPOJobStatus | None = None) -> tuple[PlanInput | None, bool]:
    """(plan input, whether to plan now) at admission. A recorded read (an update of a
    live job) or the operator's own GET of a public repo plan as reconcile will; so does
    the hub's definite answer (no such repo: refused) and, for a model the table knows,
    any failed read. Otherwise the job is admitted unplanned: planned in reconcile once
    the hub answers or the reader pod has read config.json."""
    if old_status is not None and (done := recorded(old_status)) is not None:
        return done, True
    how = how_read(raw_spec)
    known = known_family(str((raw_spec.get("model") or {}).get("path") or ""))
    if how == "hub":
        if hub is None:  # not read: the operator reads no public hub
            return PlanInput(None, PUBLIC_HUB_OFF), True
        if hub.config is not None:
            return PlanInput(hub.config, f"hub config.json ({hub.url})"), True
        note = PlanInput(None, f"hub config.json unreadable: {hub.error}")
        return note, known is not None or not hub.retry
    if how == "pod":
        return PlanInput(None, f"{where_read(raw_spec)} is read once the job exists"), bool(known)
    return None, True


def admission_warning(raw_spec: dict[str, Any], hub: HubAnswer | None) -> str | None:
    """What kubectl prints beside an admitted job whose config.json was not read."""
    how = how_read(raw_spec)
    if how == "pod":
        return (f"spec.model: {where_read(raw_spec)} is read by a pod of the job's image once "
                "the job exists; the plan, or why it cannot run, shows in its status then")
    if how != "hub" or hub is None or hub.error is None:
        return None
    known = known_family(str((raw_spec.get("model") or {}).get("path") or ""))
    if known is not None:
        return f"spec.model: {hub.error}; planned from the known table ({known[0]})"
    return (f"spec.model: {hub.error}; the job waits ({Reason.MODEL_CONFIG_UNAVAILABLE}) "
            f"until the hub answers. Fix: {_fix(raw_spec)}")


def where_read(raw_spec: dict[str, Any]) -> str:
    """Where the job's config.json is read: claim <name>:<path>/config.json, or the hub URL
    (`grpo plan` names it the same way)."""
    model = raw_spec.get("model") or {}
    if model.get("claimName"):
        return f"claim {model['claimName']}:{str(model.get('path')).rstrip('/')}/config.json"
    if is_s3(str(model.get("path") or "")):
        return f"{str(model['path']).rstrip('/')}/config.json"
    return hub_url(raw_spec)


def _fix(raw_spec: dict[str, Any]) -> str:
    if how_read(raw_spec) == "hub" or (raw_spec.get("hub") or {}).get("tokenSecret"):
        return ("set spec.model.shape, or make the hub reachable from the cluster "
                "(spec.hub.endpoint for a mirror)")
    return "set spec.model.shape, or put config.json in the model's directory"


@dataclass(frozen=True)
class Waiting:
    """The job cannot be planned yet: what it shows, the reader pod to create, and when to
    decide again (None: it failed for good)."""

    found: Finding
    create: list[dict[str, Any]] = field(default_factory=list)
    retry_seconds: float | None = None


@dataclass
class ModelStep:
    """What reading config.json adds to this decision."""

    # status.modelConfig, once read
    fields: StatusRecord = field(default_factory=lambda: StatusRecord())
    events: list[JobEvent] = field(default_factory=list)
    delete_pod: str | None = None  # the reader pod, done
    waiting: Waiting | None = None  # set: this decision instead of a plan


def _record(source: str, location: str, config: dict[str, Any] | None, now: str,
            message: str | None = None) -> StatusRecord:
    text = (config or {}).get("text_config") or {}
    arch = (config or {}).get("model_type") or text.get("model_type")
    read: dict[str, Any] = {"source": source, "location": location, "read_at": now}
    if config is not None:
        read |= {"config": config, "architecture": arch}
    if message:
        read["message"] = message[:4000]
    # Not validated: config.json is the hub's or the claim's, written as it was read.
    return {"read_model_config": ModelConfigStatus.model_construct(**read)}


def _unreadable(raw_spec: dict[str, Any], error: str, retry: bool, now: str,
                delete_pod: str | None = None) -> ModelStep:
    """config.json could not be read: the table when it knows the name, else wait (an
    error that may pass) or fail (the model's own)."""
    path = str((raw_spec.get("model") or {}).get("path") or "")
    where = where_read(raw_spec)
    known = known_family(path)
    if known is not None:
        note = f"{where} unreadable: {error}"
        message = (f"planned {path} from the known table ({known[0]}): {note}; the plan is "
                   "as good as the table's entry for this model")
        return ModelStep(_record("table", where, None, now, note),
                         [("Warning", Reason.MODEL_CONFIG_UNAVAILABLE, message)], delete_pod)
    if retry:
        found = Finding(Reason.MODEL_CONFIG_UNAVAILABLE,
                        f"cannot read {where}: {error}; retrying every {RETRY_SECONDS:g} s. "
                        f"Fix: {_fix(raw_spec)}")
        return ModelStep(events=[("Warning", Reason.MODEL_CONFIG_UNAVAILABLE, found.message)],
                         delete_pod=delete_pod, waiting=Waiting(found, [], RETRY_SECONDS))
    found = Finding(Reason.CONFIG_ERROR,
                    f"spec.model.path: cannot read {where}: {error}; {_fix(raw_spec)}")
    return ModelStep(events=[("Warning", Reason.CONFIG_ERROR, found.message)],
                     delete_pod=delete_pod, waiting=Waiting(found))


def read_step(job: JobRef, raw_spec: dict[str, Any], spec: GRPOJobSpec,
              status: GRPOJobStatus, hub: HubAnswer | None, reader: dict[str, Any] | None,
              now: str, default_image: str = "",
              pod_uid: int | None = IMAGE_UID) -> ModelStep:
    """This decision's part of reading config.json (`hub`, `reader`: what the handler
    gathered for to_read; `reader` None: no reader pod yet; `pod_uid`: the reader pod's
    UID, as the Ray pods')."""
    how = to_read(raw_spec, status)
    if how == "hub":
        if hub is None:  # not read: planned as without a hub (the table)
            return ModelStep()
        if hub.config is not None:
            return ModelStep(_record("hub", hub.url, hub.config, now))
        return _unreadable(raw_spec, str(hub.error), hub.retry, now)
    if how != "pod":
        return ModelStep()
    in_store = is_s3(spec.model.path)
    url = None if spec.model.claim_name or in_store else hub_url(raw_spec)
    name = names.model_reader(job)
    if reader is None:
        found = Finding(Reason.READING_MODEL_CONFIG,
                        f"pod {name} reads {where_read(raw_spec)} before the job is planned")
        pod = render_model_reader(spec, job, url, default_image, pod_uid)
        return ModelStep(waiting=Waiting(found, [pod], READ_POLL_SECONDS))
    ended = _terminated(reader)
    if ended is None:
        why = unschedulable(reader) or _waiting_reason(reader)
        found = Finding(Reason.READING_MODEL_CONFIG,
                        f"pod {name} reads {where_read(raw_spec)}" + (f": {why}" if why else ""))
        return ModelStep(waiting=Waiting(found, [], READ_POLL_SECONDS))
    try:
        report = ReaderReport.model_validate_json(str(ended.get("message") or ""))
    except ValidationError:
        return _unreadable(raw_spec, (
            f"pod {name} ended (exit {ended.get('exitCode')}, {ended.get('reason')}) without "
            f"a report: {str(ended.get('message') or '').strip()[-500:]}; a trainer image "
            "older than the operator lacks `python -m grpo_api.model_config`: set spec.image "
            "to a current one"), False, now, name)
    if report.config is not None:
        source = "hub" if url else "store" if in_store else "claim"
        return ModelStep(_record(source, where_read(raw_spec), report.config, now),
                         delete_pod=name)
    return _unreadable(raw_spec, str(report.error), report.retry, now, name)


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        ended = (c.get("state") or {}).get("terminated")
        if ended:
            return dict(ended)
    return None


def _waiting_reason(pod: dict[str, Any]) -> str | None:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") not in (None, "ContainerCreating"):
            return f"{waiting['reason']}: {waiting.get('message') or ''}".strip(": ")
    return None


def waiting_facts(step: ModelStep) -> StatusFacts:
    """What a job whose config.json is being read, or could not be, shows."""
    assert step.waiting is not None
    return StatusFacts(step.waiting.found, record=step.fields)
