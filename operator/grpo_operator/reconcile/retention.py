"""The checkpoint claim outlives its job (pure): spec.checkpoint.retention.

`Retain` (the default), like a StatefulSet's persistentVolumeClaimRetentionPolicy: the
claim the operator creates has no owner, so deleting the job keeps it and its
checkpoints; it is labelled with the job's name and uid. A job created again under the
same name finds it by its name (`<job>-checkpoints`), adopts it (relabels it with its own
uid) and its trainer resumes from the newest complete checkpoint there (a claim holding
another model's checkpoints is refused by the trainer at start, naming both models).
`Delete`: the job owns the claim (a controller reference for the operator's, a plain one
for a claim the spec names) and garbage collection deletes it with the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_api.contract import (
    API_GROUP,
    API_VERSION,
    CHECKPOINT_MOUNT,
    JOB_LABEL,
    JOB_UID_LABEL,
    KIND,
    CheckpointRetention,
    Reason,
)
from grpo_api.job import GRPOJobSpec
from grpo_api.job.status import ExportStatus

from ..render import JobRef, names
from .classify import Exported
from .conditions import JobEvent

# What a failure message that sends the user to delete and re-create the job says about
# the checkpoints (it must never cost them silently).
RETAIN_ADVICE = (
    "with checkpoint.retention Retain (the default) deleting the job keeps its checkpoint "
    "claim (kubectl get pvc -l grpo.dev/job=<job name>), and a job created again under the "
    "same name adopts it and resumes from its newest complete checkpoint if it trains the "
    "same model"
)
DELETE_ADVICE = (
    "checkpoint.retention is Delete: deleting the job deletes its checkpoint claim and "
    "every checkpoint on it, so a job created again starts at step 0"
)


def recreate_advice(spec: GRPOJobSpec | None) -> str:
    """What deleting and re-creating this job does to its checkpoints, in words (None: a
    spec that does not parse, which changes no claim)."""
    delete = spec is not None and \
        spec.checkpoint.effective_retention is CheckpointRetention.DELETE
    return DELETE_ADVICE if delete else RETAIN_ADVICE


@dataclass(frozen=True)
class ClaimChange:
    """A merge patch of an existing checkpoint claim's metadata (applied only over the
    resourceVersion it was decided from), and the event that says why."""

    name: str
    patch: dict[str, Any]
    event: JobEvent | None = None


def _owner(job: JobRef, controller: bool) -> dict[str, Any]:
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "name": job.name,
            "uid": job.uid, "controller": controller, "blockOwnerDeletion": controller}


def _job_refs(refs: list[dict[str, Any]], job: JobRef) -> list[dict[str, Any]]:
    """References to a GRPOJob of this name: this one, or an earlier one of that name."""
    return [r for r in refs if r.get("kind") == KIND and r.get("name") == job.name
            and str(r.get("apiVersion", "")).startswith(f"{API_GROUP}/")]


def claim_change(spec: GRPOJobSpec, job: JobRef,
                 pvc: dict[str, Any] | None) -> ClaimChange | None:
    """How the existing checkpoint claim (`pvc`, None when absent: it is created as
    rendered) must change to serve this job under its retention, or None.

    The operator's claim: labelled with this job's name and uid; owned by this job with
    Delete, by no GRPOJob of this name with Retain (an earlier job's reference would let
    garbage collection delete it). A claim the spec names is the user's: only Delete
    changes it, adding this job as a (non-controller) owner."""
    if pvc is None:
        return None
    retention = spec.checkpoint.effective_retention
    meta = pvc.get("metadata") or {}
    name = str(meta.get("name") or names.checkpoint_claim(job, spec.checkpoint.claim_name))
    refs = list(meta.get("ownerReferences") or [])
    version = {"resourceVersion": meta["resourceVersion"]} if meta.get("resourceVersion") \
        else {}
    if spec.checkpoint.claim_name:
        if retention is CheckpointRetention.RETAIN or any(
                r.get("uid") == job.uid for r in refs):
            return None
        return ClaimChange(name, {"metadata": {
            **version, "ownerReferences": [*refs, _owner(job, controller=False)]}})
    labels = meta.get("labels") or {}
    earlier = labels.get(JOB_UID_LABEL)
    mine = _job_refs(refs, job)
    ours: list[dict[str, Any]] = []
    if retention is CheckpointRetention.DELETE:
        ours = [r for r in mine if r.get("uid") == job.uid] or [_owner(job, controller=True)]
    owners = [r for r in refs if r not in mine] + ours
    if labels.get(JOB_LABEL) == job.name and earlier == job.uid and owners == refs:
        return None
    patch: dict[str, Any] = {"metadata": {**version, "labels": {JOB_LABEL: job.name,
                                                                JOB_UID_LABEL: job.uid}}}
    if owners != refs:
        patch["metadata"]["ownerReferences"] = owners
    event = None
    if earlier and earlier != job.uid:
        event = ("Normal", Reason.CLAIM_ADOPTED,
                 f"adopted checkpoint claim {name}, kept from an earlier job {job.name} "
                 f"(uid {earlier}): this job resumes from its newest complete checkpoint "
                 f"(checkpoint.retention {retention.value})")
    elif not ours and any(r.get("uid") == job.uid for r in mine):
        # A claim created before retention existed (always owned): kept from now on.
        event = ("Normal", Reason.CLAIM_RETAINED,
                 f"checkpoint claim {name} no longer belongs to the job: deleting the job "
                 "keeps it and its checkpoints (checkpoint.retention Retain)")
    return ClaimChange(name, patch, event)


def export_status(exported: Exported, claim: str | None) -> ExportStatus:
    """status.export from the trainer's report of its export (a path in the pod): the
    path is given inside the claim, where a user who mounts the claim elsewhere finds it;
    an export to spec.checkpoint.store is reported as its URI."""
    if exported.path.startswith("s3://"):
        return ExportStatus(claim_name=None, path=None, uri=exported.path, step=exported.step)
    if claim is None:  # not from a trainer of this operator: said as the trainer said it
        return ExportStatus(claim_name=None, path=exported.path, uri=None, step=exported.step)
    path = exported.path.removeprefix(f"{CHECKPOINT_MOUNT}/").lstrip("/") or exported.path
    return ExportStatus(claim_name=claim, path=path, uri=None, step=exported.step)
