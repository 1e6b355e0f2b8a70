"""Where each rank runs: one Ray placement group per node, reserved as a gang.

The pure part (``plan_layout``, ``Layout``, ``cuda_device_index``, ``missing_detail``)
decides the layout from the config: ``nodes`` x ``ranks_per_node`` ranks, rank ``r`` on
node ``r // ranks_per_node`` as its local rank (and bundle) ``r % ranks_per_node``, so
a node holds consecutive ranks and every vLLM tensor-parallel group (consecutive ranks)
lies inside one node. The Ray part (``Gang``) reserves one STRICT_PACK placement group
per node, each on a node that holds no other group (and not on the head node when
``resources.ranks_on_head`` is false). While fewer Ray nodes are alive than the gang still
needs, it waits, with no deadline: their pods are waiting for capacity (the operator shows
why, Pending/Unschedulable), which is not a failure and must not cost a restart. Once
enough have joined, ``resources.gang_timeout_s`` counts: a gang still incomplete then
(nodes smaller than a node's ranks) raises ``WorkersMissingError`` naming what Ray sees.
A node whose pod runs but whose Ray never joins leaves the attempt Running and silent,
which the operator's progress deadline ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_api.contract import RAY_SIDE_LABEL
from grpo_api.trainer_config import Config

from ..config_error import ConfigError
from ..errors import WorkersMissingError

log = logging.getLogger(__name__)

HEAD_RESOURCE = "node:__internal_head__"  # Ray gives the head node this resource
NODE_ID_LABEL = "ray.io/node-id"  # every Ray node carries its id as this label
POLL_S = 2.0  # how often a gang waiting for nodes looks at who joined
JOIN_REPORT_S = 60.0  # how often that wait is logged


# -- the pure part ------------------------------------------------------------------------
@dataclass(frozen=True)
class RankPlace:
    rank: int
    node: int  # which node's placement group (0 .. nodes-1)
    local_rank: int  # rank on its node; also its bundle index in the node's group


@dataclass(frozen=True)
class Layout:
    nodes: int
    ranks_per_node: int
    bundle: Mapping[str, float]  # Ray resources of one rank (one bundle)
    tensor_parallel: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def place(self, rank: int) -> RankPlace:
        if not 0 <= rank < self.world_size:
            raise IndexError(f"rank {rank} outside a world of {self.world_size}")
        node, local = divmod(rank, self.ranks_per_node)
        return RankPlace(rank, node, local)

    @property
    def places(self) -> tuple[RankPlace, ...]:
        return tuple(self.place(r) for r in range(self.world_size))

    def node_bundles(self) -> list[dict[str, float]]:
        """One node's placement group: a bundle per rank on it."""
        return [dict(self.bundle) for _ in range(self.ranks_per_node)]

    def tp_groups(self) -> list[list[int]]:
        tp = self.tensor_parallel
        return [list(range(first, first + tp)) for first in range(0, self.world_size, tp)]


def rank_bundle(gpus_per_worker: float, cpus_per_worker: float) -> dict[str, float]:
    bundle = {"CPU": float(cpus_per_worker)}
    if gpus_per_worker > 0:
        bundle["GPU"] = float(gpus_per_worker)
    return bundle


def plan_layout(
    nodes: int, ranks_per_node: int, bundle: Mapping[str, float], tensor_parallel: int
) -> Layout:
    """The layout, or a ConfigError naming the fields when a TP group would span nodes."""
    if nodes < 1 or ranks_per_node < 1:
        raise ConfigError(
            "resources.nodes", f"need at least 1 node and 1 rank per node, got {nodes} x "
            f"{ranks_per_node}"
        )
    if ranks_per_node % tensor_parallel:
        raise ConfigError(
            "rollout.tensor_parallel_size",
            f"{tensor_parallel} must divide resources.ranks_per_node ({ranks_per_node}): a "
            "tensor-parallel group is consecutive ranks and must lie inside one node; use a "
            f"divisor of {ranks_per_node}, or more ranks per node",
        )
    return Layout(nodes, ranks_per_node, dict(bundle), tensor_parallel)


def layout_for(cfg: Config) -> Layout:
    res = cfg.resources
    return plan_layout(
        res.nodes,
        res.node_ranks,
        rank_bundle(res.gpus_per_worker, res.cpus_per_worker),
        cfg.rollout.tensor_parallel_size,
    )


def side_labels(cfg: Config, side: str) -> dict[str, str] | None:
    """The Ray node labels a disaggregated job's ``side`` (RAY_SIDE_TRAIN: the ranks,
    RAY_SIDE_ROLLOUT: the engines) is placed by; a colocated job places by none."""
    if cfg.rollout.placement != "disaggregated":
        return None
    return {RAY_SIDE_LABEL: side}


def engine_layout(cfg: Config) -> Layout:
    """The rollout engines' nodes: ``engines_per_node`` engines (bundles) on each of
    ``rollout.disaggregated.nodes``."""
    dis = cfg.rollout.disaggregated
    if dis is None:
        raise ConfigError("rollout.disaggregated", "the engines' layout needs it set")
    return plan_layout(dis.nodes, dis.engines_per_node,
                       rank_bundle(dis.gpus_per_engine, dis.cpus_per_engine), 1)


def cuda_device_index(assigned: Sequence[Any], visible: str | None, local_rank: int) -> int:
    """This rank's torch CUDA index: the GPU Ray reserved for its bundle.

    ``assigned`` is ``ray.get_gpu_ids()`` (physical ids on the node); ``visible`` is the
    process's CUDA_VISIBLE_DEVICES. Ray normally masks it to the assigned GPU (index 0);
    with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES the process sees the node's GPUs
    and the index is the assigned id's position among them. Outside Ray (in-process
    workers) nothing is assigned and the local rank picks the GPU, as with torchrun.
    """
    if not assigned:
        return local_rank
    gpu = str(assigned[0])
    if visible is None or not visible.strip():
        return int(gpu)
    ids = [v.strip() for v in visible.split(",")]
    if gpu not in ids:
        raise RuntimeError(
            f"Ray assigned GPU {gpu} but CUDA_VISIBLE_DEVICES is {visible!r}: cannot tell "
            "which device this rank owns"
        )
    return ids.index(gpu)


@dataclass(frozen=True)
class NodeView:
    """One alive Ray node as the gang-wait report shows it."""

    node_id: str
    address: str
    is_head: bool
    resources: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)


def _short(node_id: str) -> str:
    return node_id[:8]


def _fmt_resources(res: Mapping[str, float]) -> str:
    keys = [k for k in ("CPU", "GPU") if k in res] + sorted(
        k for k in res if k not in ("CPU", "GPU", "memory", "object_store_memory")
        and not k.startswith("node:") and not k.startswith("accelerator_type:")
    )
    return ", ".join(f"{k} {res[k]:g}" for k in keys) or "no CPU or GPU"


def missing_detail(
    layout: Layout,
    reserved: Sequence[str],
    timeout_s: float,
    alive: Sequence[NodeView],
    *,
    ranks_on_head: bool,
) -> str:
    """The WorkersMissing message: how many nodes were placed, and what Ray sees."""
    where = "on a node of its own" + ("" if ranks_on_head else ", not the head node")
    lines = [
        f"only {len(reserved)} of {layout.nodes} nodes placed within {timeout_s:g} s of "
        f"enough nodes joining: each "
        f"node needs {layout.ranks_per_node} ranks x {{{_fmt_resources(layout.bundle)}}} "
        f"packed {where}; {layout.nodes - len(reserved)} node(s) missing.",
        f"Ray sees {len(alive)} alive node(s):",
    ]
    holding = {node: i for i, node in enumerate(reserved)}
    for n in sorted(alive, key=lambda v: (not v.is_head, v.address, v.node_id)):
        role = "head" if n.is_head else "worker"
        if n.node_id in holding:
            use = f"holds node {holding[n.node_id]}'s ranks"
        elif n.is_head and not ranks_on_head:
            use = "no ranks here (head)"
        else:
            use = "no ranks placed here"
        lines.append(
            f"  {role} {n.address} ({_short(n.node_id)}): {_fmt_resources(n.resources)}; {use}"
        )
    return "\n".join(lines)


def nodes_to_join(alive: Sequence[NodeView], holding: Sequence[str], groups_left: int, *,
                  ranks_on_head: bool, labels: Mapping[str, str] | None = None) -> int:
    """How many more Ray nodes must join before the groups left can be placed: alive
    nodes that hold no group, are not the head (unless ranks go there) and carry the
    side's labels. While any are missing the gang waits without a deadline."""
    want = dict(labels or {})
    free = [n for n in alive
            if n.node_id not in holding and (ranks_on_head or not n.is_head)
            and all(n.labels.get(k) == v for k, v in want.items())]
    return max(0, groups_left - len(free))


def exclusion_selector(avoid: Sequence[str], labels: Mapping[str, str] | None = None
                       ) -> dict[str, str] | None:
    """A Ray label selector that keeps a bundle off the nodes in ``avoid`` and on nodes
    carrying ``labels`` (a disaggregated job's side, RAY_SIDE_LABEL)."""
    selector = dict(labels or {})
    if avoid:
        # No spaces: Ray would take them as part of the node id.
        selector[NODE_ID_LABEL] = f"!in({','.join(avoid)})"
    return selector or None


# -- the Ray part ------------------------------------------------------------------------
def alive_nodes() -> list[NodeView]:
    import ray

    return [
        NodeView(
            str(n["NodeID"]),
            str(n.get("NodeManagerAddress", "?")),
            HEAD_RESOURCE in n.get("Resources", {}),
            dict(n.get("Resources", {})),
            {str(k): str(v) for k, v in (n.get("Labels") or {}).items()},
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]


class Gang:
    """One STRICT_PACK placement group per node, reserved one after another on distinct
    nodes (each group excludes the nodes that already hold one, so a big node cannot take
    two nodes' ranks), all within one deadline. ``labels``: only on Ray nodes carrying
    them (``rollout.placement: disaggregated`` puts the ranks on the nodes labelled
    RAY_SIDE_LABEL=train and the rollout engines, a gang of their own, on =rollout).
    ``first_labels``: also carried by the first group's node, which holds rank 0 (the
    operator's rank0 worker group, whose pod has the memory of rank 0's model load)."""

    def __init__(self, layout: Layout, *, ranks_on_head: bool,
                 labels: Mapping[str, str] | None = None,
                 first_labels: Mapping[str, str] | None = None) -> None:
        self.layout = layout
        self.ranks_on_head = ranks_on_head
        self.labels = dict(labels or {})
        self.first_labels = dict(first_labels or {})
        self.groups: list[Any] = []
        self.node_ids: list[str] = []  # the Ray node holding each group

    def reserve(self, timeout_s: float) -> None:
        """Every node's group: waits while nodes are missing, then at most `timeout_s`."""
        from ray.util.placement_group import placement_group, placement_group_table

        lay = self.layout
        head = [] if self.ranks_on_head else [n.node_id for n in alive_nodes() if n.is_head]
        log.info(
            "placing %d node(s) x %d ranks {%s}%s; once enough nodes joined, within %g s",
            lay.nodes,
            lay.ranks_per_node,
            _fmt_resources(lay.bundle),
            "" if self.ranks_on_head else ", none on the head node",
            timeout_s,
        )
        deadline: list[float] = []  # set once enough nodes are alive; kept across groups
        for i in range(lay.nodes):
            labels = self.group_labels(i)
            selector = exclusion_selector([*head, *self.node_ids], labels)
            pg = placement_group(
                lay.node_bundles(),
                strategy="STRICT_PACK",
                bundle_label_selector=[selector] * lay.ranks_per_node if selector else None,
            )
            self.groups.append(pg)
            self._wait(pg, timeout_s, deadline, labels)
            self.node_ids.append(str(placement_group_table(pg)["bundles_to_node_id"][0]))
        log.info(
            "ranks placed: %s",
            "; ".join(
                f"node {i} = {_short(n)}: ranks {i * lay.ranks_per_node}-"
                f"{(i + 1) * lay.ranks_per_node - 1}"
                for i, n in enumerate(self.node_ids)
            ),
        )

    def group_labels(self, index: int) -> dict[str, str]:
        """The Ray node labels the node of group `index` must carry."""
        return self.labels | (self.first_labels if index == 0 else {})

    def _wait(self, pg: Any, timeout_s: float, deadline: list[float],
              labels: Mapping[str, str]) -> None:
        """Until `pg` (its node carrying `labels`) is placed. While nodes are missing: no
        deadline, a log line a minute. Then `timeout_s` from when enough were first
        alive (`deadline`)."""
        import ray

        lay, ready_ref = self.layout, pg.ready()
        started = last_report = time.monotonic()
        while True:
            left = deadline[0] - time.monotonic() if deadline else POLL_S
            ready, _ = ray.wait([ready_ref], timeout=max(0.0, min(POLL_S, left)))
            if ready:
                return
            alive, now = alive_nodes(), time.monotonic()
            short = max(nodes_to_join(alive, self.node_ids, lay.nodes - len(self.node_ids),
                                      ranks_on_head=self.ranks_on_head, labels=self.labels),
                        nodes_to_join(alive, self.node_ids, 1,
                                      ranks_on_head=self.ranks_on_head, labels=labels))
            if short:
                deadline.clear()  # a node left again: waiting for capacity once more
                if now - last_report >= JOIN_REPORT_S:
                    last_report = now
                    log.info("waiting for %d more Ray node(s) to join (%d of %d nodes placed, "
                             "%.0f s so far): their pods are not running yet, e.g. no node "
                             "has free GPUs; the job's status says why", short,
                             len(self.node_ids), lay.nodes, now - started)
                continue
            if not deadline:
                deadline.append(now + timeout_s)
            elif now >= deadline[0]:
                detail = missing_detail(lay, self.node_ids, timeout_s, alive,
                                        ranks_on_head=self.ranks_on_head)
                if labels:
                    detail += "\nonly nodes labelled " + ", ".join(
                        f"{k}={v}" for k, v in sorted(labels.items())) + " qualify"
                self.release()
                raise WorkersMissingError(detail)

    def actor_options(self, rank: int) -> dict[str, Any]:
        """``.options(...)`` that put ``rank``'s actor on its bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        place = self.layout.place(rank)
        return {
            "num_cpus": self.layout.bundle.get("CPU", 0),
            "num_gpus": self.layout.bundle.get("GPU", 0),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.groups[place.node], placement_group_bundle_index=place.local_rank
            ),
        }

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.groups:
            try:
                remove_placement_group(pg)
            except Exception as err:  # Ray already gone: nothing left to release
                log.debug("removing placement group: %s", err)
        self.groups, self.node_ids = [], []
