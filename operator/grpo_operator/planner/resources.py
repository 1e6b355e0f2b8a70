"""Pod resources, Ray object store size and the env the operator injects."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from grpo_api.catalog import GPU_PRODUCT_LABEL, GPU_RESOURCE
from grpo_api.contract import (
    PYTORCH_CUDA_ALLOC_CONF,
    RANK0_GROUP,
    RAY_SIDE_LABEL,
    RAY_SIDE_ROLLOUT,
    RAY_SIDE_TRAIN,
    Role,
)

from .budget import (
    GIB,
    HOST_HEADROOM,
    RAY_MEMORY_USAGE_THRESHOLD,
    SYSTEM_RESERVED_FRACTION,
    host_capacity_gib,
)
from .head import driver_gib, head_cpus
from .network import plan_network
from .types import Budget, Geometry, PodResources, Settings

RAY_DEFAULT_STORE_FRACTION = 0.3  # Ray: 30% of available memory ...
RAY_DEFAULT_STORE_CAP_GIB = 200e9 / GIB  # ... capped at 200 GB (ray_constants)
STORE_STEP_COPIES = 4  # a step's batch may sit in the store a few times (driver, shards)
STORE_MIN_GIB = 2.0
WORKER_CPU_FRACTION = 0.9  # of the worker's share of its node's CPUs: the rest for daemons
SHM_EXTRA_GIB = 2.0  # /dev/shm beyond the object store: NCCL, torch data-loader queues
TOKEN_BYTES = 24  # per token in flight: ids, masks, old/ref log-probs, advantages


def ray_default_store_gib(host_gib: float) -> float:
    return min(host_gib * RAY_DEFAULT_STORE_FRACTION, RAY_DEFAULT_STORE_CAP_GIB)


def step_data_gib(geo: Geometry, rollout_n: int) -> float:
    """A step's data through Ray: tokens, and each prompt's decoded media (RGB) at most,
    which samples from engines apart carry (colocated ranks read their own rows)."""
    tokens = geo.rollout_batch_size * rollout_n * geo.sequence_length * TOKEN_BYTES
    pixels = (geo.max_images_per_prompt * geo.max_pixels
              + geo.max_videos_per_prompt * geo.max_frames * geo.video_max_pixels)
    return (tokens + geo.rollout_batch_size * pixels * 3) / GIB


def object_store_gib(geo: Geometry, rollout_n: int) -> float:
    """What the job moves through Ray, not Ray's 30%-of-RAM default (field note 2)."""
    want = max(STORE_MIN_GIB, STORE_STEP_COPIES * step_data_gib(geo, rollout_n))
    return round(min(want, ray_default_store_gib(geo.host_memory_gib)), 1)


def _pod_memory(need: float, geo: Geometry, at_allocatable: bool) -> int:
    """Whole GiB, never above the pod's share of the node's allocatable (budget's
    host_capacity_gib): rounding up past it would make the pod unschedulable beside the
    jobs that share its node, and the "pod memory to node allocatable" rung a step down."""
    allocatable = math.floor(host_capacity_gib(geo, True))
    if at_allocatable:
        return allocatable
    return min(allocatable, math.ceil(max(need / HOST_HEADROOM, need + 4)))


def rank0_apart(geo: Geometry, st: Settings, budget: Budget) -> bool:
    """Whether rank 0's node gets a pod of its own (RANK0_GROUP): with two or more
    training nodes, when the others need less memory than rank 0's, which alone reads the
    whole model at load (rank0Init). Not once the pods ask for the node's allocatable
    (the HostOOM rung): then every pod asks for the same."""
    at = st.pod_memory_at_allocatable
    return geo.nodes >= 2 and (_pod_memory(budget.peak_host_other_gib, geo, at)
                               < _pod_memory(budget.peak_host_gib, geo, at))


def pod_need_gib(geo: Geometry, st: Settings, budget: Budget, role: str) -> float:
    """Host memory the model predicts for one pod of `role` (head, worker, or
    RANK0_GROUP: rank 0's worker when it has a pod of its own, rank0_apart)."""
    if role == RANK0_GROUP or geo.nodes == 0:  # a head without workers runs the ranks
        return budget.peak_host_gib
    if role == Role.WORKER:
        return (budget.peak_host_other_gib if rank0_apart(geo, st, budget)
                else budget.peak_host_gib)
    return driver_gib(geo) + st.ray_object_store_gib


@dataclass(frozen=True)
class Pods:
    """One attempt's Ray pods: the head, the training workers and, when its node needs
    more memory than theirs, rank 0's worker apart (`rank0`, one pod; then `worker` has
    the other nodes - 1)."""

    head: PodResources
    worker: PodResources | None
    rank0: PodResources | None = None


def build_pods(geo: Geometry, st: Settings, budget: Budget) -> Pods:
    store = st.ray_object_store_gib
    head_need = pod_need_gib(geo, st, budget, "head")
    head_mem = _pod_memory(head_need, geo, st.pod_memory_at_allocatable and geo.nodes == 0)
    head = PodResources(
        role=Role.HEAD.value,
        replicas=1,
        gpus=0,
        cpus=head_cpus(geo),
        memory_gib=head_mem,
        shm_gib=min(math.ceil(store + SHM_EXTRA_GIB), max(1, head_mem // 2)),
    )
    if geo.nodes == 0:
        return Pods(head, None)
    worker = _worker(geo, st, budget, pod_need_gib(geo, st, budget, Role.WORKER))
    if not rank0_apart(geo, st, budget):
        return Pods(head, worker)
    rank0 = _worker(geo, st, budget, pod_need_gib(geo, st, budget, RANK0_GROUP))
    return Pods(head, replace(worker, replicas=geo.nodes - 1),
                replace(rank0, role=RANK0_GROUP, replicas=1))


def _worker(geo: Geometry, st: Settings, budget: Budget, need: float) -> PodResources:
    """A training worker pod that needs `need` GiB of host memory."""
    store = st.ray_object_store_gib
    mem = _pod_memory(need, geo, st.pod_memory_at_allocatable)
    return PodResources(
        devices=dict(geo.devices),
        capabilities=plan_network(geo).capabilities,
        role=Role.WORKER.value,
        replicas=geo.nodes,
        gpus=geo.gpus_per_node if geo.is_gpu else 0,
        cpus=max(1, int(geo.cpus_per_node * geo.node_share * WORKER_CPU_FRACTION)),
        memory_gib=mem,
        shm_gib=min(math.ceil(store + SHM_EXTRA_GIB), max(1, mem // 2)),
        node_selector={GPU_PRODUCT_LABEL: geo.product_label} if geo.is_gpu else {},
        tolerations=(
            ({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},)
            if geo.is_gpu
            else ()
        ),
    )


def ray_start_params(geo: Geometry, st: Settings, rollout: bool = False) -> dict[str, str]:
    """The worker groups' `ray start` parameters (the training workers', or with
    `rollout` the rollout workers'); none for the rollout group of a colocated job."""
    if rollout and geo.rollout is None:
        return {}
    return {"object-store-memory": str(int(st.ray_object_store_gib * GIB))}


def ray_node_labels(geo: Geometry, rollout: bool = False, head: bool = False
                    ) -> dict[str, str]:
    """A disaggregated job's Ray node labels for a worker group: its side
    (RAY_SIDE_LABEL), which the trainer places its ranks and engines by. KubeRay (v1.5
    on) takes them in the group's top-level `labels` and passes them to `ray start
    --labels`; it refuses rayStartParams' `labels`. None for a colocated job. The head's
    (`head`) only when it runs the ranks itself (a cpu job with resources.nodes 0)."""
    if geo.rollout is None or (head and geo.nodes > 0):
        return {}
    return {RAY_SIDE_LABEL: RAY_SIDE_ROLLOUT if rollout else RAY_SIDE_TRAIN}


def build_rollout_pod(geo: Geometry, st: Settings, budget: Budget) -> PodResources | None:
    """A disaggregated job's rollout worker pod: its GPU type's node, all of its share of
    the node's CPUs, the host memory its budget predicts (stage_terms.rollout_host) and the
    training workers' devices (spec.resources.devices). None when colocated."""
    side, rb = geo.rollout, budget.rollout_side
    if side is None or rb is None:
        return None
    need = rb.peak_host_gib  # stage_terms.rollout_host
    allocatable = math.floor(side.host_memory_gib * (1 - SYSTEM_RESERVED_FRACTION)
                             * side.node_share)
    mem = (allocatable if st.rollout_pod_memory_at_allocatable
           else min(allocatable, math.ceil(max(need / HOST_HEADROOM, need + 4))))
    return PodResources(
        # spec.resources.devices on both sides: the weight push after every update is
        # NCCL from rank 0 to the engines, over the fabric the job's NCCL_NET names.
        devices=dict(geo.devices),
        capabilities=plan_network(geo).capabilities,
        role=Role.ROLLOUT.value,
        replicas=side.nodes,
        gpus=side.gpus_per_node if side.is_gpu else 0,  # on cpu: its engines, not GPUs
        cpus=max(1, int(side.cpus_per_node * side.node_share * WORKER_CPU_FRACTION)),
        memory_gib=mem,
        shm_gib=min(math.ceil(st.ray_object_store_gib + SHM_EXTRA_GIB), max(1, mem // 2)),
        node_selector={GPU_PRODUCT_LABEL: side.product_label} if side.is_gpu else {},
        tolerations=(({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},)
                     if side.is_gpu else ()),
    )


def at_least(new: PodResources | None, old: PodResources | None) -> PodResources | None:
    """`new` with no limit below `old`'s: a restart keeps what the last attempt had (a
    rung that lowers the need does not shrink the pod; headroom is what it buys)."""
    if new is None or old is None:
        return new
    return replace(
        new,
        memory_gib=max(new.memory_gib, old.memory_gib),
        shm_gib=max(new.shm_gib, old.shm_gib),
        cpus=max(new.cpus, old.cpus),
        gpus=max(new.gpus, old.gpus),
    )


def build_env(geo: Geometry, st: Settings) -> dict[str, str]:
    """What Ray, NCCL, the allocator and the tokenizers read from the environment, before
    or beside the trainer's config; the planned settings travel in that config only."""
    env = {
        # Ray's memory monitor kills workers above this fraction; the plan stays below
        # 90% of the pod limit, so Ray's default is kept rather than raised.
        "RAY_memory_usage_threshold": str(RAY_MEMORY_USAGE_THRESHOLD),
        # Caps Ray's default object store (30% of RAM) at the planned size on every node,
        # also for any `ray start` that does not get --object-store-memory.
        "RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": str(int(st.ray_object_store_gib * GIB)),
        # Forked data-loader workers + HF fast tokenizers deadlock with parallelism on.
        "TOKENIZERS_PARALLELISM": "false",
    }
    if geo.is_gpu:
        env["PYTORCH_CUDA_ALLOC_CONF"] = PYTORCH_CUDA_ALLOC_CONF  # against fragmentation
        env["NCCL_DEBUG"] = "WARN"
        # FSDP: free comm buffers as soon as the stream is done (lower peaks).
        env["TORCH_NCCL_AVOID_RECORD_STREAMS"] = "1"
        # NCCL's cuMem buffers (its default since 2.19) and vLLM's sleep mode, which
        # unmaps its own cuMem pool, do not mix; with cuMem off NCCL also keeps out of
        # NVIDIA/nccl#1906. vLLM 0.32 does not set this itself (only its sharded RDT
        # weight-transfer server forwards it), so the operator does.
        env["NCCL_CUMEM_ENABLE"] = "0"
        env |= plan_network(geo).env  # the fabric the workers' devices connect to
    else:
        threads = max(1, geo.cpus_per_node // max(1, geo.ranks_per_node))
        env["OMP_NUM_THREADS"] = str(threads)  # one rank per process must not oversubscribe
    return env
