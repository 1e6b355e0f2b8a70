"""The trainer <-> operator contract: names both sides must agree on.

Torch-free on purpose: the operator imports it, and so does the trainer, so each
name lives here once.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import NewType

API_GROUP = "grpo.dev"
API_VERSION = "v1alpha1"
KIND = "GRPOJob"
PLURAL = "grpojobs"
SINGULAR = "grpojob"
SHORT_NAME = "gj"
JOB_LABEL = f"{API_GROUP}/job"  # on every child object
# On the checkpoint claim the operator creates: the uid of the job that holds it now (a
# job created again under the same name adopts it and relabels it).
JOB_UID_LABEL = f"{API_GROUP}/job-uid"
MAX_RESTARTS = 100  # spec.backoffLimit: attempts are numbered 0..100
# spec.recovery.stallTimeoutSeconds = trainer.stall_timeout_s by default: a 72B step
# (rollout, log-probs, update, weight sync) takes minutes, and the first step also starts
# the engines; half an hour without any stage ending is a hang, not a slow step.
STALL_TIMEOUT_S = 1800
# A measured step may vary (longer responses, a checkpoint or validation in the step), so
# a stall is only a stall well past it: five times the median step (the trainer's rule),
# and the operator's progress deadline uses the same multiple of its own step estimate.
STALL_STEP_MULTIPLE = 5.0
# The trainer's weight sync (param_gather) gathers this many bytes of full parameters per
# collective (a larger tensor alone); the planner counts the gather's buffers.
WEIGHT_SYNC_BUCKET_BYTES = 256 * 1024 * 1024
# The trainer's shared-prefix rows (and so its 4-D attention mask's last dimension) are
# padded to a multiple of this many tokens, and the planner's layout counts them so.
# SDPA's memory-efficient kernel (chosen on GPUs once a mask is given) copies any mask
# whose strides but the last are not multiples of 8 elements into a padded tensor, per
# layer, and keeps that copy for backward: ATen attention.cpp ``preprocess_mask``
# (``mem_eff_alignment = 8``, ``pad_bias``), the rule torch/_inductor/lowering.py
# ``sdpa_constraint`` restates (``ALIGNMENT = 8``).
PACKED_WIDTH_ALIGNMENT = 8


def packed_width(tokens: int) -> int:
    """A shared-prefix row of ``tokens`` as wide as the trainer lays it out: rounded up
    to ``PACKED_WIDTH_ALIGNMENT``."""
    return -(-tokens // PACKED_WIDTH_ALIGNMENT) * PACKED_WIDTH_ALIGNMENT


def dense_mask_bytes(rows: int, width: int, dtype_bytes: int) -> int:
    """The packed micro-batch's dense 4-D mask [rows, 1, width, width]."""
    return rows * width * width * dtype_bytes


def segment_layout_bytes(
    tokens: int, slots: list[tuple[int, int]], response_tokens: int, longest_prompt: int,
    dtype_bytes: int,
) -> int:
    """The same micro-batch's attention by segment (grpo_trainer.model.segment_attention)
    in bytes, its responses in ``slots``, (responses, longest) per group of similar
    lengths: each group's mask [N, 1, R, S] in the compute dtype, S = packed_width(P + R),
    and its int64 gathers of query slots [N, R] and keys [N, S]; two int64 places per
    response token; the rows' int32 segment ids (``tokens`` = rows x width). The trainer
    takes it where it is the smaller of the two; the planner counts the smaller worst
    case, one group of every response at the longest (no grouping holds more)."""
    total = response_tokens * 16 + tokens * 4
    for responses, longest in slots:
        keys = packed_width(longest_prompt + longest)
        total += responses * longest * keys * dtype_bytes + responses * (longest + keys) * 8
    return total


# Where, under the job's checkpoint dir, the trainer writes every rank's stacks on a
# stall (and where the attempt after a Hang has NCCL's flight recorder dump to).
STALLS_DIR = "stalls"
# The driver's index of the prompt rows (grpo_trainer.dataset.index), bytes a row: file,
# row and dataset index (int32 each), byte offset (int64), prompt tokens (int32), image
# and video counts (uint8), the loader's permutation (int64): 34, rounded up. The planner
# sizes the head by it (spec.data.rows); a unit test holds the index to it.
INDEX_BYTES_PER_ROW = 40
# The length pass's processes (the head's CPUs, at most this many): each imports the
# tokenizer and processor (transformers, torch): 0.95 GiB peak RSS measured
# (bench/bench_data.py, the tiny Qwen2.5-VL's processor), planned with a margin.
LENGTH_WORKERS_MAX = 16
LENGTH_WORKER_GIB = 1.25
# Below this many rows the pass runs in the driver alone: a pool process takes about 7 s
# to import torch and the processor, and the driver counts about 4,000 rows a second
# (bench/bench_data.py: 10,000 rows took 21 s in a pool of 2, 11 s in the driver).
LENGTH_POOL_MIN_ROWS = 100_000


def driver_done_marker(checkpoint_dir: str, job_uid: str, attempt: int) -> str:
    """The file the driver writes once it needs its ranks no more (after the save on
    SIGTERM, or any end it sees); the worker pods' preStop hook (grpo_trainer.liveness.prestop)
    waits for it, so Ray on the workers outlives the save. Per job uid: a job created
    again under the same name counts attempts from 0 again."""
    return f"{checkpoint_dir}/driver-done/{job_uid or 'local'}-{attempt}"


def driver_stop_request(checkpoint_dir: str, job_uid: str, attempt: int) -> str:
    """The file a worker pod's preStop hook writes when that pod alone is deleted (a
    drain, an eviction): its SIGTERM never reaches the driver, so the hook asks the
    driver to save its last finished step and stop, as on a SIGTERM of its own."""
    return f"{checkpoint_dir}/driver-stop/{job_uid or 'local'}-{attempt}"


ATTEMPT_LABEL = f"{API_GROUP}/attempt"  # on per-attempt children and the Ray pods
ROLE_LABEL = f"{API_GROUP}/role"  # on the Ray pods: a Role value
# Kueue's queue label (spec.queueName): on each attempt's RayCluster, set at creation only.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

CONFIG_PATH = "/etc/grpo/config.yaml"
CHECKPOINT_MOUNT = "/checkpoints"  # the job's dir is /checkpoints/<namespace>/<job>/
# Below the job's dir, what attempt n leaves (status.attempts[n].logs): attempts/<n>/<pod>.log,
# each Ray pod's output; attempts/<n>/events.log, its Kubernetes events (the trainer keeps
# them); attempts/<n>/stalls/, the stacks of a Hang and the collectives' dumps.
ATTEMPT_LOGS = "attempts"
ATTEMPT_EVENTS = "events.log"


def attempt_dir(checkpoint_dir: str, attempt: int) -> str:
    """Where attempt `attempt` of the job whose checkpoints are in `checkpoint_dir` keeps
    its logs, events and stall stacks."""
    return f"{checkpoint_dir}/{ATTEMPT_LOGS}/{attempt}"


def ray_cluster_name(job_name: str, attempt: int) -> str:
    """Attempt `attempt`'s RayCluster; its pods' names start with it and a dash."""
    return f"{job_name}-a{attempt}"
MODEL_MOUNT = "/models"  # spec.model.claimName, read-only
TERMINATION_LOG = "/dev/termination-log"
# The images' non-root user and group (`USER 10001:10001` in images/*/Dockerfile): the
# Ray pods run as it, so they pass Pod Security `restricted`.
IMAGE_UID = 10001
TERMINATION_MESSAGE_MAX_BYTES = 4096
PROGRESS_MIN_INTERVAL_S = 10.0
PROGRESS_FIELD_MANAGER = "grpo-trainer"


# Hub repos on the job's volume: the operator renders these paths, the head's hub fetch
# (grpo_trainer.hub_fetch) writes them.
def is_hub_id(text: str) -> bool:
    """owner/name (optionally @split or @revision): not a path, not a file."""
    repo = text.split("@", 1)[0]
    return (not repo.startswith(("/", ".", "~")) and repo.count("/") == 1
            and not repo.endswith((".parquet", ".jsonl", ".json")))


def hub_local_dir(root: str, kind: str, repo_id: str) -> str:
    """Where a hub repo of `kind` ("model" or "dataset") lands under `root`."""
    return f"{root}/{'models' if kind == 'model' else 'datasets'}/{repo_id}"


def s3_local_path(root: str, uri: str) -> str:
    """Where an s3:// data file or model prefix lands under `root` (the job's directory):
    s3/<bucket>/<key>."""
    return f"{root}/s3/{uri.removeprefix('s3://')}"


class CheckpointRetention(StrEnum):
    """spec.checkpoint.retention: what deleting the job does to its checkpoint claim
    (like a StatefulSet's persistentVolumeClaimRetentionPolicy)."""

    RETAIN = "Retain"  # kept, labelled JOB_LABEL/JOB_UID_LABEL; a job of the same name adopts it
    DELETE = "Delete"  # owned by the job: garbage collection deletes it with the job


class Role(StrEnum):
    """A Ray pod's part in the job (ROLE_LABEL)."""

    HEAD = "head"
    WORKER = "worker"
    ROLLOUT = "rollout"  # spec.rollout.placement disaggregated: the rollout worker group


# Ray node label (rayStartParams ``labels``) that says which side of a disaggregated job a
# Ray worker node serves: RAY_SIDE_TRAIN (FSDP ranks) or RAY_SIDE_ROLLOUT (rollout engines).
# The trainer places its ranks and engines by it; colocated jobs do not set it.
RAY_SIDE_LABEL = f"{API_GROUP}/side"
RAY_SIDE_TRAIN = "train"
RAY_SIDE_ROLLOUT = "rollout"

# Rank 0's node, when its pod asks for more host memory than the other workers' (rank 0
# alone reads the whole model at load): the worker group RANK0_GROUP of one pod carries
# the Ray node label RANK0_NODE_LABEL=true, and the trainer places rank 0's node's ranks
# there (placement.Gang).
RANK0_GROUP = "rank0"
RANK0_NODE_LABEL = f"{API_GROUP}/rank0"


class Phase(StrEnum):
    """GRPOJob status.phase, for humans; conditions carry the detail."""

    PENDING = "Pending"
    QUEUED = "Queued"  # Kueue holds the RayCluster suspended until it admits it
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ConditionType(StrEnum):
    """GRPOJob status.conditions types (the CRD's enum is generated from this)."""

    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    QUEUED = "Queued"  # Kueue has not admitted the attempt's RayCluster (Kueue's reason)
    MEMORY_GROWTH = "MemoryGrowth"  # from the trainer's leak detector (status.progress)
    HUB_FETCH = "HubFetch"  # from the head's hub fetch (status.progress.fetch)
    # A fabric job whose NCCL went over sockets (status.progress.transport)
    FABRIC_FALLBACK = "FabricFallback"
    # The trainer's measured peaks against the plan's (status.progress.measuredPeaks)
    MEMORY_PLAN = "MemoryPlan"
    # The newest checkpoint's upload to spec.checkpoint.store (status.progress.checkpointUpload)
    CHECKPOINT_UPLOAD = "CheckpointUpload"


# The operator rewrites these on every phase change; it keeps the others as they are.
PHASE_CONDITIONS = (
    ConditionType.READY, ConditionType.PROGRESSING, ConditionType.DEGRADED,
    ConditionType.SUSPENDED, ConditionType.SUCCEEDED, ConditionType.FAILED,
    ConditionType.QUEUED,
)


TERMINAL_PHASES = (Phase.SUCCEEDED, Phase.FAILED)
ATTEMPT_RUNNING = "Running"  # status.attempts[].outcome until the attempt ends


class ExitCode(IntEnum):
    """Trainer driver exit codes; the operator classifies failures by them."""

    FINISHED = 0
    ERROR = 1
    CONFIG_ERROR = 2  # never retried
    CUDA_OOM = 3
    HOST_OOM = 4  # host RAM or Ray's memory monitor
    WORKER_LOST = 5
    # No progress for trainer.stall_timeout_s: the driver wrote every rank's stacks to
    # <checkpoint dir>/attempts/<n>/stalls/ and ended the attempt (grpo_trainer.liveness.stall).
    HANG = 6
    # A checkpoint that is intact but cannot be loaded under this attempt's settings
    # (grpo_trainer.checkpointing.compat): never retried, the checkpoint is kept.
    CHECKPOINT_INCOMPATIBLE = 7
    # 128 + SIGTERM, what a process killed by it reports: the driver stopped on SIGTERM
    # after committing a checkpoint of its last finished step (grpo_trainer.liveness.sigterm).
    TERMINATED = 143


class FailureReason(StrEnum):
    """Failure classes the operator acts on; also the `reason` of the termination message."""

    SUCCEEDED = "Succeeded"
    HOST_OOM = "HostOOM"
    CUDA_OOM = "CudaOOM"
    RAY_OOM = "RayOOM"
    NODE_LOST = "NodeLost"
    # Not every node's ranks could be placed within resources.gang_timeout_s (exit 5).
    WORKERS_MISSING = "WorkersMissing"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    # The driver saw no progress for the stall timeout (exit 6); the detail names the rank
    # and the frame it is stuck in.
    HANG = "Hang"
    # The driver got SIGTERM and stopped after saving (exit 143); who sent it (a drain,
    # a preemption, suspend) is read from the pod, which the operator checks first.
    TERMINATED = "Terminated"
    CONFIG_ERROR = "ConfigError"
    # The newest committed checkpoint cannot be loaded with this attempt's settings (exit
    # 7); the detail names the step, the keys and why. Not retried: the same plan fails
    # the same way, and an older checkpoint or step 0 would lose trained steps.
    CHECKPOINT_INCOMPATIBLE = "CheckpointIncompatible"
    ERROR = "Error"


class Reason(StrEnum):
    """Every reason the operator writes: the GRPOJob's phase and condition reasons and its
    events' reasons. Users' alerts match these strings: never rename one. The attempt
    failure classes are FailureReason's (one string each); Kueue's own reasons pass
    through as KueueReason. docs/troubleshooting.md lists them (tested)."""

    # Pending / Starting / Running: the live attempt's cluster and pods
    CREATING_CLUSTER = "CreatingCluster"
    WAITING_FOR_PODS = "WaitingForPods"
    PODS_STARTING = "PodsStarting"
    CLUSTER_RUNNING = "ClusterRunning"
    UNSCHEDULABLE = "Unschedulable"
    CREATE_FAILED = "CreateFailed"
    POD_CREATE_REFUSED = "PodCreateRefused"
    # Pending before an attempt exists
    CLAIM_MISSING = "ClaimMissing"
    WAITING_FOR_PREVIOUS_JOB = "WaitingForPreviousJob"
    READING_MODEL_CONFIG = "ReadingModelConfig"
    MODEL_CONFIG_UNAVAILABLE = "ModelConfigUnavailable"
    # Queued: Kueue has no Workload yet; the fallbacks when Kueue gives no reason
    WAITING_FOR_WORKLOAD = "WaitingForWorkload"
    ADMISSION_CHECKS_PENDING = "AdmissionChecksPending"
    PENDING = "Pending"
    # Restarting
    WAITING_FOR_PREVIOUS_ATTEMPT = "WaitingForPreviousAttempt"
    # Suspended, Succeeded, Failed
    SUSPENDED_BY_USER = "SuspendedByUser"
    TRAINING_FINISHED = "TrainingFinished"
    INVALID_NAME = "InvalidName"
    INVALID_SPEC = "InvalidSpec"
    INFEASIBLE = "Infeasible"
    INTERNAL_ERROR = "InternalError"
    # How an attempt ended (Restarting or Failed, and the Warning event)
    HOST_OOM = FailureReason.HOST_OOM
    CUDA_OOM = FailureReason.CUDA_OOM
    RAY_OOM = FailureReason.RAY_OOM
    NODE_LOST = FailureReason.NODE_LOST
    WORKERS_MISSING = FailureReason.WORKERS_MISSING
    EVICTED = FailureReason.EVICTED
    PREEMPTED = FailureReason.PREEMPTED
    HANG = FailureReason.HANG
    TERMINATED = FailureReason.TERMINATED
    CONFIG_ERROR = FailureReason.CONFIG_ERROR
    CHECKPOINT_INCOMPATIBLE = FailureReason.CHECKPOINT_INCOMPATIBLE
    ERROR = FailureReason.ERROR
    # A condition that does not hold (its reason when False)
    NOT_READY = f"Not{ConditionType.READY}"
    NOT_PROGRESSING = f"Not{ConditionType.PROGRESSING}"
    NOT_DEGRADED = f"Not{ConditionType.DEGRADED}"
    NOT_SUSPENDED = f"Not{ConditionType.SUSPENDED}"
    NOT_SUCCEEDED = f"Not{ConditionType.SUCCEEDED}"
    NOT_FAILED = f"Not{ConditionType.FAILED}"
    NOT_QUEUED = f"Not{ConditionType.QUEUED}"
    # The MemoryGrowth and HubFetch conditions
    SUSTAINED_GROWTH = "SustainedGrowth"
    NO_GROWTH = "NoGrowth"
    FETCHING = "Fetching"
    FETCHED = "Fetched"
    FETCH_FAILED = "FetchFailed"
    # The MemoryPlan condition (and the Warning event when it turns Underestimated)
    WITHIN_PLAN = "WithinPlan"
    UNDERESTIMATED = "Underestimated"
    # The CheckpointUpload condition (and the Warning event when it turns UploadRetrying)
    UPLOADED = "Uploaded"
    UPLOAD_RETRYING = "UploadRetrying"
    # Events only
    PLANNED = "Planned"
    CREATED = "Created"
    RUNNING = "Running"
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    RESTARTED = "Restarted"
    RELEASED = "Released"
    PREVIOUS_ATTEMPT_LINGERS = "PreviousAttemptLingers"
    MEMORY_GROWTH = ConditionType.MEMORY_GROWTH
    CLAIM_ADOPTED = "ClaimAdopted"
    CLAIM_RETAINED = "ClaimRetained"
    # The FabricFallback condition (and its Warning event): NCCL between the nodes of a
    # job whose workers request a fabric went over TCP sockets, or over the fabric
    SOCKET_FALLBACK = "SocketFallback"
    FABRIC_IN_USE = "FabricInUse"


# Kueue's own reason for a Queued job (its Workload's QuotaReserved or Admitted reason,
# made CamelCase-safe): passed through, so not a Reason member.
KueueReason = NewType("KueueReason", str)


def not_reason(condition: ConditionType) -> Reason:
    """The reason of a phase condition that does not hold (NotReady, NotFailed...)."""
    return Reason(f"Not{condition}")


class RankStage(StrEnum):
    """What a rank was doing when it failed: the termination message's `stage` (`phase`
    from older trainer images) and an attempt's `failedStage`. A CudaOOM's ladder tries
    first what relieves that stage: a rollout OOM (vLLM's KV cache, its wake-up) is not
    helped by gradient checkpointing."""

    LOAD = "load"  # building the actor and the reference (checkpoint load, sharding)
    ROLLOUT = "rollout"  # the rollout engine: its start, wake-up, generation, validation
    TRAINING = "training"  # log-probs, the update, the optimizer step
    # vLLM's engine start found too little of its memory left for the KV cache (its
    # weights and profile took the rest of rollout.gpu_memory_utilization x card, or less
    # than one max-length sequence remains). Relieved by more memory for vLLM, never by
    # less: the ladder raises the utilisation the update's residency leaves room for.
    KV_CACHE = "kv_cache"


class Env(StrEnum):
    """Environment variables the operator injects and the trainer honours (env wins).

    Only what belongs to the process and the job's identity: the planned settings reach
    the trainer through one channel, the per-attempt config (grpo_api.knobs).
    """

    CHECKPOINT_DIR = "GRPO_CHECKPOINT_DIR"
    JOB_NAME = "GRPO_JOB_NAME"
    JOB_NAMESPACE = "GRPO_JOB_NAMESPACE"
    # The job's uid: its attempts fence the checkpoint directory; a job created again under
    # the same name (a new uid) takes over the directory its kept claim holds.
    JOB_UID = "GRPO_JOB_UID"
    ATTEMPT = "GRPO_ATTEMPT"
    FAULT_INJECT = "GRPO_FAULT_INJECT"  # test-only fault switch, documented in docs/
    TERMINATION_LOG = "GRPO_TERMINATION_LOG"  # where the driver writes it (tests: a file)


# An s3:// URI as spec.checkpoint.store and the trainer's checkpoint.store take it: a
# bucket name as S3 allows it (3-63 lowercase letters, digits, dots and hyphens), then an
# optional prefix.
S3_BUCKET_PATTERN = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
S3_URI_PATTERN = rf"^s3://{S3_BUCKET_PATTERN}(/.*)?$"
# spec.checkpoint.store.keysSecret's keys, the env names the Ray containers get them as:
# the AWS credential chain's own (obstore, boto3 and the AWS CLI read them).
STORE_KEY_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


# Pinned host blocks above this are allocated exactly and freed, not rounded up to a power
# of two and cached (torch's defaults: every block rounded and cached, 1.9x a 7B model's
# offloaded state). Set as both limits: torch reuses a cached block for any request of
# its power-of-two bucket, so only never-cached blocks may skip the rounding
# (operator planner/pinned.py, which counts the rounding of the smaller ones).
PINNED_EXACT_ABOVE_MB = 1
PYTORCH_CUDA_ALLOC_CONF = (
    "expandable_segments:True,"  # against GPU fragmentation
    f"pinned_max_round_threshold_mb:{PINNED_EXACT_ABOVE_MB},"
    f"pinned_max_cached_size_mb:{PINNED_EXACT_ABOVE_MB}"
)

# The Ray in the trainer image; the operator writes it into RayCluster.spec.rayVersion.
# images/trainer's lock and requirements/dev.lock must pin the same version (tested).
RAY_VERSION = "2.60.0"
VERSION = "0.1.0"
DEFAULT_TRAINER_IMAGE = f"ghcr.io/grpo-operator/trainer:{VERSION}"
DEFAULT_OPERATOR_IMAGE = f"ghcr.io/grpo-operator/operator:{VERSION}"
