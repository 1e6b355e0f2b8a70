"""Multi-node placement on a real multi-node Ray cluster (``ray.cluster_utils.Cluster``:
one raylet per node, all on this machine), 2 nodes x 2 fake GPUs, 4 gloo ranks on CPU
(``resources.fake_gpus``: without it a rank given a GPU that finds no CUDA exits 2).

One cluster serves the whole module, in order: an uninterrupted 2 x 2 run places ranks
0-1 on one worker node and 2-3 on the other, never on the head (which has CPUs and GPUs
to spare, so only ``ranks_on_head: false`` keeps ranks off it), and is the reference;
asking for 3 ranks on nodes of 2 GPUs ends with WorkersMissing (exit 5) at the gang
deadline; removing a
worker node during step 2 (its rewards wait for the removal) ends the run with NodeLost
(exit 5) instead of hanging; the next attempt resumes on a new 1 x 4 node and ends with
the reference's weights, bit for bit. Last, a gang missing a node waits for it well past
its deadline (pods waiting for capacity are not a failure) and is placed once it joins;
and rank 0's node is the one labelled for it (its pod has the memory of the model load).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from grpo_api.contract import RANK0_NODE_LABEL, ExitCode
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_testkit.ray_nodes import kill_node
from grpo_testkit.rewards import HOLD_CHECKPOINTS, HOLD_LIMIT_S, HOLD_RELEASE
from grpo_trainer.checkpointing.dcp import DCPCheckpointer, read_tracker
from grpo_trainer.checkpointing.export import load_model_tensors
from grpo_trainer.cluster.placement import Gang, layout_for
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.run import run_training

pytestmark = pytest.mark.trainer
STEPS = 3


@dataclass
class Multinode:
    cluster: Any
    model: Path
    data: Path
    tmp: Path
    head_id: str
    state: dict[str, Any] = field(default_factory=dict)  # what earlier tests leave behind

    def config(self, nodes: int, per_node: int, ckpt: Path, **extra: Any) -> dict[str, Any]:
        world = nodes * per_node
        resources = {
            "num_workers": world,
            "nodes": nodes,
            "ranks_per_node": per_node,
            "ranks_on_head": False,
            "gpus_per_worker": 1,
            "fake_gpus": True,
            "ray_address": self.cluster.address,
            **extra,
        }
        return text_config(
            self.model,
            self.data,
            resources=resources,
            trainer={"total_steps": STEPS, "rollout_batch_size": world},
            checkpoint={"dir": str(ckpt), "interval_steps": 1, "keep": STEPS},
        )

    def write(self, name: str, cfg: dict[str, Any]) -> Path:
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path


@pytest.fixture(scope="module")
def multinode(
    tiny_lm: Path, tmp_path_factory: pytest.TempPathFactory, local_ray_args: dict[str, Any]
) -> Iterator[Multinode]:
    import ray
    from ray.cluster_utils import Cluster

    was_local = ray.is_initialized()  # the tier's shared local Ray: back after this module
    if was_local:
        ray.shutdown()
    cuda = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    # The head has room for ranks too: only ranks_on_head=false keeps them off it.
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "num_gpus": 2, "include_dashboard": False},
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2, num_gpus=2)
        ray.init(address=cluster.address)
        head = [n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n["Resources"]]
        tmp = tmp_path_factory.mktemp("multinode")
        yield Multinode(cluster, tiny_lm, write_text_task(tmp / "t.jsonl"), tmp, head[0])
    finally:
        ray.shutdown()
        cluster.shutdown()
        if cuda is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = cuda
        if was_local:
            ray.init(**local_ray_args)


def test_ranks_fill_worker_nodes_in_order_and_the_run_is_the_reference(
    multinode: Multinode,
) -> None:
    ckpt = multinode.tmp / "reference"
    cfg = build_config(multinode.config(2, 2, ckpt), environ={})
    trainer = GRPOTrainer(cfg, checkpointer=DCPCheckpointer(cfg))
    try:
        trainer.start()
        assert trainer.group is not None
        info = trainer.group.info
        nodes = [i["node_id"] for i in info]
        assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2]
        assert multinode.head_id not in nodes  # the driver's node runs no rank
        # Consecutive pairs (what a tensor-parallel group of 2 is) share a node.
        assert [i["local_rank"] for i in info] == [0, 1, 0, 1]
        assert [i["env"] for i in info] == [
            {"RANK": str(r), "LOCAL_RANK": str(r % 2), "WORLD_SIZE": "4"} for r in range(4)
        ]
        # Ray handed each rank a fake GPU, and the config says so: CPU and gloo.
        assert {(i["device"], i["backend"]) for i in info} == {("cpu", "gloo")}
        trainer.run()
    finally:
        trainer.close()
    assert read_tracker(ckpt).step == STEPS  # type: ignore[union-attr]
    multinode.state["reference"] = load_model_tensors(ckpt / f"step-{STEPS}")


def test_a_gpu_rank_that_finds_no_cuda_exits_2_instead_of_training_on_the_cpu(
    multinode: Multinode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same job without ``fake_gpus``: its ranks hold GPUs from Ray, torch finds no
    CUDA (as on a node whose driver is too old for the image): ConfigError from the
    ranks, through Ray, naming the field and what torch saw; nothing trained."""
    term = multinode.tmp / "nocuda-termination-log"
    monkeypatch.setenv("GRPO_TERMINATION_LOG", str(term))
    ckpt = multinode.tmp / "nocuda"
    raw = multinode.config(2, 2, ckpt, fake_gpus=False)
    code = run_training(str(multinode.write("nocuda", raw)))
    msg = json.loads(term.read_text())
    assert code == ExitCode.CONFIG_ERROR, msg
    assert msg["reason"] == "ConfigError" and msg["step"] is None, msg
    detail = msg["detail"]
    assert "resources.gpus_per_worker" in detail and "no usable CUDA device" in detail
    assert "Found no NVIDIA driver" in detail and "never falls back" in detail, detail
    assert read_tracker(ckpt) is None


def test_nodes_too_small_for_a_nodes_ranks_end_the_attempt_at_the_gang_deadline(
    multinode: Multinode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Enough nodes joined (2 workers for 2 nodes), but each has 2 GPUs for 3 ranks:
    gang_timeout_s counts from there, and the attempt ends WorkersMissing."""
    term = multinode.tmp / "gang-termination-log"
    monkeypatch.setenv("GRPO_TERMINATION_LOG", str(term))
    raw = multinode.config(2, 3, multinode.tmp / "gang", gang_timeout_s=10)
    code = run_training(str(multinode.write("gang", raw)))
    assert code == ExitCode.WORKER_LOST
    msg = json.loads(term.read_text())
    assert msg["reason"] == "WorkersMissing" and msg["step"] is None
    detail = msg["detail"]
    assert "only 0 of 2 nodes placed within 10 s of enough nodes joining" in detail, detail
    assert "each node needs 3 ranks x {CPU 1, GPU 1}" in detail, detail
    assert "Ray sees 3 alive node(s)" in detail and "no ranks here (head)" in detail
    assert detail.count("no ranks placed here") == 2


@pytest.mark.timeout(600)
def test_a_node_removed_mid_step_ends_the_attempt_as_node_lost(
    multinode: Multinode, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = multinode.tmp / "lost"
    term = multinode.tmp / "lost-termination-log"
    release = multinode.tmp / "lost-node-removed"
    monkeypatch.setenv("GRPO_TERMINATION_LOG", str(term))
    monkeypatch.setenv("GRPO_ATTEMPT", "0")
    # Step 2's rewards wait for the node's removal: the step cannot finish first.
    monkeypatch.setenv(HOLD_CHECKPOINTS, str(ckpt))
    monkeypatch.setenv(HOLD_RELEASE, str(release))
    cfg = multinode.config(2, 2, ckpt)
    cfg["reward"] = {
        "type": "function",
        "function": "grpo_testkit.rewards:reward_held_after_a_checkpoint",
        "timeout_s": HOLD_LIMIT_S + 60,
    }
    path = multinode.write("lost", cfg)
    victim = next(iter(multinode.cluster.worker_nodes))
    stop = threading.Event()

    def remove_after_step_1() -> None:
        while not stop.is_set():
            if read_tracker(ckpt) is not None:
                kill_node(multinode.cluster, victim)
                release.touch()
                return
            time.sleep(0.1)

    killer = threading.Thread(target=remove_after_step_1, daemon=True)
    killer.start()
    try:
        code = run_training(str(path))
    finally:
        stop.set()
        killer.join()
    msg = json.loads(term.read_text())
    assert code == ExitCode.WORKER_LOST, msg
    committed = msg["lastCheckpointStep"]
    assert msg["reason"] == "NodeLost" and committed == 1, msg
    assert msg["step"] == 2, msg
    assert read_tracker(ckpt).step == committed  # type: ignore[union-attr]
    multinode.state["lost"] = ckpt
    multinode.state["lost_at"] = committed


def test_the_next_attempt_resumes_on_a_1x4_node_to_the_reference_weights(
    multinode: Multinode, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = multinode.state["lost"]
    multinode.cluster.add_node(num_cpus=4, num_gpus=4)
    cfg = build_config(multinode.config(1, 4, ckpt), environ={"GRPO_ATTEMPT": "1"})
    trainer = GRPOTrainer(cfg, checkpointer=DCPCheckpointer(cfg))
    try:
        trainer.start()
        # From the last checkpoint the lost attempt committed.
        assert trainer.step == multinode.state["lost_at"]
        assert trainer.group is not None
        info = trainer.group.info
        assert len({i["node_id"] for i in info}) == 1
        assert multinode.head_id not in {i["node_id"] for i in info}
        assert [i["local_rank"] for i in info] == [0, 1, 2, 3]
        trainer.run()
    finally:
        trainer.close()
    final = load_model_tensors(ckpt / f"step-{STEPS}")
    reference = multinode.state["reference"]
    assert final.keys() == reference.keys()
    for name, tensor in final.items():
        assert torch.equal(tensor, reference[name]), name


def reserve_in_background(gang: Gang, timeout_s: float
                          ) -> tuple[threading.Thread, list[BaseException]]:
    """`gang.reserve` on a thread of its own, started; what it raised lands in the list."""
    errors: list[BaseException] = []

    def reserve() -> None:
        try:
            gang.reserve(timeout_s)
        except BaseException as err:
            errors.append(err)

    waiting = threading.Thread(target=reserve, daemon=True)
    waiting.start()
    return waiting, errors


def test_a_gang_missing_a_node_waits_past_its_deadline_and_is_placed_when_it_joins(
    multinode: Multinode,
) -> None:
    """3 nodes asked of 2 worker nodes: no WorkersMissing at gang_timeout_s (its pod would
    be waiting for capacity: the operator shows that, Pending/Unschedulable, and no
    restart is spent); a third node joins and the gang is complete."""
    cfg = build_config(multinode.config(3, 2, multinode.tmp / "wait", gang_timeout_s=2))
    gang = Gang(layout_for(cfg), ranks_on_head=False)
    waiting, errors = reserve_in_background(gang, cfg.resources.gang_timeout_s)
    waiting.join(5 * cfg.resources.gang_timeout_s)
    assert waiting.is_alive() and not errors, errors  # still waiting, past the deadline
    assert len(gang.node_ids) == 2
    node = multinode.cluster.add_node(num_cpus=2, num_gpus=2)
    try:
        waiting.join(120)
        assert not waiting.is_alive() and not errors, errors
        assert len(set(gang.node_ids)) == 3 and multinode.head_id not in gang.node_ids
    finally:
        gang.release()
        multinode.cluster.remove_node(node)


def test_rank_0s_node_is_the_one_labelled_for_it_and_the_gang_waits_for_it(
    multinode: Multinode,
) -> None:
    """The operator gives rank 0's node a pod of its own (more host memory: rank 0 alone
    reads the whole model) whose Ray node carries RANK0_NODE_LABEL. With only unlabelled
    workers alive, the gang waits for it past its deadline; once it joins, ranks 0-1 are
    placed there and ranks 2-3 on another node."""
    import ray

    labels = {RANK0_NODE_LABEL: "true"}
    cfg = build_config(multinode.config(2, 2, multinode.tmp / "rank0", gang_timeout_s=2,
                                        rank0_node_labels=labels))
    gang = Gang(layout_for(cfg), ranks_on_head=False,
                first_labels=cfg.resources.rank0_node_labels)
    waiting, errors = reserve_in_background(gang, cfg.resources.gang_timeout_s)
    waiting.join(5 * cfg.resources.gang_timeout_s)
    assert waiting.is_alive() and not errors, errors  # two free nodes, neither rank 0's
    assert gang.node_ids == []
    node = multinode.cluster.add_node(num_cpus=2, num_gpus=2, labels=labels)
    try:
        waiting.join(120)
        assert not waiting.is_alive() and not errors, errors
        (rank0_node,) = [n["NodeID"] for n in ray.nodes()
                         if n["Alive"] and n.get("Labels", {}).get(RANK0_NODE_LABEL)]
        assert gang.node_ids[0] == rank0_node
        assert gang.node_ids[1] not in {rank0_node, multinode.head_id}
    finally:
        gang.release()
        multinode.cluster.remove_node(node)
