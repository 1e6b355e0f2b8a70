"""GRPOJob.spec.checkpoint and .restartPolicy: where checkpoints go and what happens
after a failure."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, WithJsonSchema, model_validator

from ..contract import MAX_RESTARTS, STALL_TIMEOUT_S, CheckpointRetention, FailureReason
from .base import DNS_LABEL_PATTERN, QUANTITY_PATTERN, ApiModel, cel_rule
from .store import ObjectStoreSpec


class CheckpointSpec(ApiModel):
    """Where checkpoints go: an existing claim, or a new PVC of a size; with ``store``, the
    checkpoints themselves go to an S3-compatible store, and a claim, if any, keeps the
    job's other files (attempts' logs, events and stall stacks, the data index, the hub
    cache); without one each pod has its own disk and the attempts' files go to the store
    too."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel_rule(
                    "has(self.store) ? !(has(self.claimName) && has(self.size)) "
                    ": has(self.claimName) != has(self.size)",
                    "set exactly one of checkpoint.claimName (existing PVC) or "
                    "checkpoint.size (new PVC); with checkpoint.store, at most one (neither: "
                    "no claim, each pod stages on its own disk)",
                ),
                cel_rule(
                    "!has(self.storageClass) || has(self.size)",
                    "checkpoint.storageClass applies only to a new PVC (set size, not claimName)",
                    ".storageClass",
                ),
            ]
        }
    )

    claim_name: str | None = Field(
        None, pattern=DNS_LABEL_PATTERN, description=(
            "Existing PVC; every Ray pod writes to it, so ReadWriteMany unless the head "
            "runs alone (cpu, nodes 0)."
        ),
    )
    size: str | None = Field(
        None, pattern=QUANTITY_PATTERN, description="Size of a new PVC the operator creates."
    )
    storage_class: str | None = Field(
        None, pattern=DNS_LABEL_PATTERN, description="StorageClass of the new PVC."
    )
    interval_steps: int = Field(5, ge=1, description="Save every N steps.")
    keep: int = Field(2, ge=1, le=100, description="Complete checkpoints kept (newest N).")
    async_save: bool = Field(
        False,
        description=(
            "true: a save blocks the step only while the state is copied into a host "
            "buffer, written in the background; each rank keeps that buffer (its fp32 "
            "weights and Adam state), which the plan budgets in host RAM."
        ),
    )
    retention: CheckpointRetention = Field(
        CheckpointRetention.RETAIN,
        strict=False,  # the wire spells the enum as its string
        description=(
            "What deleting the job does to its checkpoint claim (as a StatefulSet's "
            "persistentVolumeClaimRetentionPolicy). Retain: the claim and its checkpoints "
            "stay (the operator's claim is labelled grpo.dev/job and grpo.dev/job-uid); a "
            "job created again under the same name adopts it and resumes from its newest "
            "complete checkpoint. Delete: the claim is owned by the job and deleted with it."
        ),
    )
    store: ObjectStoreSpec | None = Field(
        None,
        description=(
            "Keep the checkpoints and the exported model in an S3-compatible object store "
            "(AWS S3, GCS's S3 interoperability, MinIO, Ceph RGW, SeaweedFS) under "
            "<uri>/<namespace>/<job>/. Each save is staged on the claim (without one, on "
            "each pod's own disk), uploaded in the background and its staged files dropped; "
            "a resume fetches what it needs."
        ),
    )
    delete_claim_with_job: bool = Field(
        False,
        description=(
            "Deprecated: true is retention: Delete (kept so stored jobs still parse)."
        ),
    )

    @property
    def effective_retention(self) -> CheckpointRetention:
        """retention, with the deprecated deleteClaimWithJob: true read as Delete."""
        return CheckpointRetention.DELETE if self.delete_claim_with_job else self.retention

    @property
    def has_claim(self) -> bool:
        """False only for a job whose checkpoints go to the store with no claim at all."""
        return self.claim_name is not None or self.size is not None

    @model_validator(mode="after")
    def _claim_xor_size(self) -> Self:
        if self.claim_name is not None and self.size is not None:
            raise ValueError("set exactly one of claimName (an existing PVC) or size (a new PVC)")
        if not self.has_claim and self.store is None:
            raise ValueError("set exactly one of claimName (an existing PVC) or size (a new "
                             "PVC), or store (an S3 store; no claim needed)")
        if self.storage_class is not None and self.size is None:
            raise ValueError("storageClass: applies only to a new PVC (set size)")
        return self


class BackoffSpec(ApiModel):
    """Exponential restart backoff: initialSeconds x 2^restarts, capped."""

    initial_seconds: int = Field(30, ge=0, le=86400, description="Delay before restart 1.")
    max_seconds: int = Field(600, ge=0, le=86400, description="Cap on the delay.")


RestartPolicy = Literal["OnFailure", "Never"]
DEFAULT_BACKOFF_LIMIT = 3


def backoff_limit_field() -> Any:
    return Field(DEFAULT_BACKOFF_LIMIT, ge=0, le=MAX_RESTARTS, description=(
        "Restarts before the job Fails, as a Kubernetes Job's backoffLimit (each restart "
        "resumes from the last complete checkpoint). restartPolicy Never: none."))


# Untyped and open in the CRD: manifests written before the rename hold restartPolicy as
# an object (renames.py moves its keys to backoffLimit and recovery); the webhook and the
# models check the value.
OpenRestartPolicy = Annotated[RestartPolicy, WithJsonSchema(
    {"x-kubernetes-preserve-unknown-fields": True})]


def restart_policy_field() -> Any:
    return Field("OnFailure", description=(
                     "OnFailure (default): a failed attempt restarts from the last complete "
                     "checkpoint, up to backoffLimit times (after an OOM with a safer "
                     "memory setting: recovery.remediate); Never: the first failure fails "
                     "the job. The object form of older manifests (maxRestarts, backoff, "
                     "...) still applies: its keys move to backoffLimit and recovery."))


# Which failure classes each restart budget covers (spec.recovery.restartBudgets): an
# attempt's outcome (contract.FailureReason) counts toward its class's budget when the job
# sets one, and toward backoffLimit otherwise. Preempted (Kueue) counts toward none.
RESTART_CLASSES: dict[str, tuple[FailureReason, ...]] = {
    "memory": (FailureReason.CUDA_OOM, FailureReason.HOST_OOM, FailureReason.RAY_OOM),
    "nodeLost": (FailureReason.NODE_LOST, FailureReason.WORKERS_MISSING,
                 FailureReason.EVICTED, FailureReason.TERMINATED),
    "hang": (FailureReason.HANG,),
    "error": (FailureReason.ERROR,),
}


def _budget(words: str) -> Any:
    return Field(None, ge=0, le=MAX_RESTARTS, description=(
        f"Restarts after {words}, counted apart from backoffLimit. Unset: they count toward "
        "backoffLimit."))


class RestartBudgets(ApiModel):
    """Restarts per failure class, so that one class (a flaky node, a busy cluster) does
    not spend the restarts meant for another (a bug in the reward code)."""

    memory: int | None = _budget("an out-of-memory failure (CudaOOM, HostOOM, RayOOM; each "
                                 "with the next safer setting)")
    node_lost: int | None = _budget("a lost node or pod (NodeLost, WorkersMissing, Evicted, "
                                    "Terminated by a drain)")
    hang: int | None = _budget("a hang (Hang: no progress for the stall timeout)")
    error: int | None = _budget("any other error of the job's code (Error)")

    def limit(self, budget: str) -> int | None:
        return {"memory": self.memory, "nodeLost": self.node_lost, "hang": self.hang,
                "error": self.error}[budget]


class RecoverySpec(ApiModel):
    """How failures are found and how a failed attempt restarts."""

    restart_budgets: RestartBudgets = Field(
        default_factory=lambda: RestartBudgets.model_validate({}),
        description="Restarts per failure class, apart from backoffLimit (unset: the class "
        "counts toward backoffLimit). restartPolicy Never: none.",
    )

    backoff: BackoffSpec = Field(
        default_factory=lambda: BackoffSpec.model_validate({}),
        description="Delay between restarts.",
    )
    stall_timeout_seconds: int = Field(
        STALL_TIMEOUT_S, ge=0, le=7 * 86400,
        description=(
            "No training step or stage ends for this long (or for 5 x the measured step "
            "time, if longer): the trainer writes every rank's stacks to the checkpoint "
            "claim (attempts/<n>/stalls/) and the attempt ends as Hang. 0: never."
        ),
    )
    remediate: bool = Field(
        True, description="After an OOM, restart with the next safer memory setting."
    )
    allow_precision_change: bool = Field(
        False,
        description=(
            "true: after a CUDA OOM the remediation ladder may switch a mixed-precision job "
            "to bf16 training (before it offloads anything; it resumes from the mixed "
            "checkpoint). false (default): the job always trains in training.precision."
        ),
    )
