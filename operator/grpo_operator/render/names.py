"""Names of a job's children: one function each, so handlers and tests agree."""

from __future__ import annotations

from dataclasses import dataclass

from ..contract import CHECKPOINT_MOUNT


@dataclass(frozen=True)
class JobRef:
    """Identity of a GRPOJob: enough to name and own its children."""

    name: str
    namespace: str
    uid: str


def checkpoint_claim(job: JobRef, claim_name: str | None) -> str:
    return claim_name or f"{job.name}-checkpoints"


def config_map(job: JobRef, attempt: int) -> str:
    return f"{job.name}-config-{attempt}"


def ray_cluster(job: JobRef, attempt: int) -> str:
    return f"{job.name}-a{attempt}"


def trainer_account(job: JobRef) -> str:
    return f"{job.name}-trainer"


def checkpoint_dir(job: JobRef) -> str:
    return f"{CHECKPOINT_MOUNT}/{job.namespace}/{job.name}"
