"""Names of a job's children: one function each, so handlers and tests agree.

Every name here derives from the job's name, so the job's name carries their limits.
The tightest is KubeRay's (v1.6.1, `utils.ValidateRayClusterMetadata`): a RayCluster
name must be a DNS-1035 label of at most 53 characters (63 minus its longest service
suffix, "-serve-svc"); otherwise KubeRay only records an event on the RayCluster and
the job would wait for pods that never come. The RayCluster is `<job>-a<attempt>`, so a
job name is a DNS-1035 label of at most 53 - len("-a100") = 48 characters. The CRD
refuses other names (a CEL rule with this message); every other child name and label
value is then valid too (tests/unit/test_names.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from grpo_api.contract import CHECKPOINT_MOUNT, MAX_RESTARTS, attempt_dir, ray_cluster_name
from grpo_api.job.recovery import CheckpointSpec

KUBERAY_MAX_CLUSTER_NAME = 53  # KubeRay v1.6.1 utils.MaxRayClusterNameLength
MAX_JOB_NAME = KUBERAY_MAX_CLUSTER_NAME - len(f"-a{MAX_RESTARTS}")
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"  # DNS-1035 label
JOB_NAME_RULE = (
    f"metadata.name must be at most {MAX_JOB_NAME} characters of lowercase letters, digits "
    "and '-', starting with a letter and ending with a letter or digit (a DNS-1035 label): "
    "the operator names the job's RayCluster <name>-a<attempt>, and KubeRay accepts only "
    f"DNS-1035 labels of at most {KUBERAY_MAX_CLUSTER_NAME} characters"
)


def job_name_problem(name: str) -> str | None:
    """Why a job of this name cannot get valid children (JOB_NAME_RULE), or None."""
    if len(name) <= MAX_JOB_NAME and re.match(JOB_NAME_PATTERN, name):
        return None
    return f"{name!r}: {JOB_NAME_RULE}"


@dataclass(frozen=True)
class JobRef:
    """Identity of a GRPOJob: enough to name and own its children."""

    name: str
    namespace: str
    uid: str


def checkpoint_claim(job: JobRef, claim_name: str | None) -> str:
    return claim_name or f"{job.name}-checkpoints"


def job_claim(job: JobRef, checkpoint: CheckpointSpec) -> str | None:
    """The checkpoint claim the job's pods mount; None for a job with checkpoint.store and
    no claim (each pod stages on its own disk)."""
    return checkpoint_claim(job, checkpoint.claim_name) if checkpoint.has_claim else None


def store_prefix(job: JobRef, uri: str) -> str:
    """The job's own prefix in spec.checkpoint.store: `<uri>/<namespace>/<job>`, as its
    directory on a claim."""
    return f"{uri.rstrip('/')}/{job.namespace}/{job.name}"


def config_map(job: JobRef, attempt: int) -> str:
    return f"{job.name}-config-{attempt}"


def ray_cluster(job: JobRef, attempt: int) -> str:
    return ray_cluster_name(job.name, attempt)


def trainer_account(job: JobRef) -> str:
    return f"{job.name}-trainer"


def checkpoint_dir(job: JobRef) -> str:
    return f"{CHECKPOINT_MOUNT}/{job.namespace}/{job.name}"


def attempt_logs_dir(job: JobRef, attempt: int) -> str:
    """Where each of an attempt's Ray pods keeps its output (`<pod name>.log`), beside the
    checkpoints: the pods' own logs go with the pods."""
    return attempt_dir(checkpoint_dir(job), attempt)


def attempt_logs(job: JobRef, attempt: int, checkpoint: CheckpointSpec) -> str:
    """status.attempts[].logs: `<claim>:<path in the claim>`, as the trainer's messages
    name a place on a claim; without a claim, where the store keeps them."""
    claim = job_claim(job, checkpoint)
    if claim is None:
        assert checkpoint.store is not None  # the spec's rule: a store, or a claim
        return attempt_dir(store_prefix(job, checkpoint.store.uri), attempt)
    return f"{claim}:{attempt_logs_dir(job, attempt).removeprefix(CHECKPOINT_MOUNT + '/')}"


def model_reader(job: JobRef) -> str:
    """The pod that reads the model's config.json once (reconcile/model_config.py)."""
    return f"{job.name}-model-config"


def network_policy(job: JobRef) -> str:
    return f"{job.name}-ray-pods"
