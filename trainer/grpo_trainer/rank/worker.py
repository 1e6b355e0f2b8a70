"""One FSDP2 rank: rollout on its share of prompts, log-prob recomputation, the update.

Plain class so tests and the benchmark can use it in-process; ``driver.py`` wraps
it as a Ray actor. Samples stay on the rank that generated them (pixel values
never travel back to the driver); the driver only sends advantages.

``setup`` builds the rank's ``RankState`` (rank_state.py) and hands it to the update
(policy_update.py) and the checkpoint I/O (checkpointing/rank.py); neither imports this
module or reads the worker. What stays here is the rollout side: tokenizer, engine, samples.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from grpo_api.contract import RankStage
from grpo_api.trainer_config import Config

from ..algorithm.balance import hand_over
from ..algorithm.samples import EncodedPrompt, Sample, load_rollout_tokens, summary
from ..checkpointing.rank import RankCheckpointer
from ..cluster.devices import (
    job_collective_timeout_s,
    probe_cuda,
    process_group_backend,
    rank_device_type,
)
from ..cluster.placement import cuda_device_index
from ..cluster.rank_env import NCCL_LOG_DIR, first_collective
from ..data import Record
from ..dataset import RowRef, encode_rows, overlong, read_records
from ..errors import rank_stage
from ..faults import RankFaults
from ..model.modeling import stream_full_params
from ..model.rank_state import RankState, World, build_rank_state
from ..rank_api import RankApi
from ..rollout.base import RolloutEngine
from ..rollout.build import build_rank_engine
from ..rollout.sampling import greedy_spec, to_samples, training_spec
from ..rollout.weight_bus import WeightGroupSpec, WeightSender
from .gpu_memory import GpuMemoryMeter
from .policy_update import PolicyUpdate
from .weight_sync import rollout_weights, sync_rollout_weights

log = logging.getLogger(__name__)


def _ray_gpu_ids() -> list[Any]:
    """The GPUs Ray reserved for this actor's bundle; none outside a Ray worker."""
    import ray

    return list(ray.get_gpu_ids()) if ray.is_initialized() else []


def _ray_node_id() -> str | None:
    import ray

    return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else None


class Worker:
    """One rank: its rollout side (tokenizer, engine, this step's samples) and, from
    ``setup`` on, its ``RankState``, which the update and the checkpointer work on."""

    state: RankState  # set by setup
    policy: PolicyUpdate
    checkpoints: RankCheckpointer

    def __init__(
        self, cfg: Config, rank: int, world_size: int, local_rank: int | None = None
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        # The rank on its node (the bundle in its node's placement group); without one,
        # what the layout would give it (spawned ranks on one host: the rank itself).
        per_node = cfg.resources.node_ranks
        self.local_rank = rank % per_node if local_rank is None else local_rank
        # What torchrun would set; vLLM's external launcher and user code read them.
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(self.local_rank),
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(per_node),
        )
        if cfg.resources.trains_on_cuda:  # NCCL_DEBUG_FILE's directory (rank_env.py)
            os.makedirs(NCCL_LOG_DIR, exist_ok=True)
        self.samples: list[Sample] = []
        self.weights = WeightSender(rank)  # disaggregated rollouts: rank 0's end
        self.faults = RankFaults(cfg.trainer.fault_inject, rank, world_size)
        torch.set_num_threads(max(1, int(cfg.resources.cpus_per_worker)))

    # -- setup ---------------------------------------------------------------
    def open_rendezvous(self) -> tuple[str, int]:
        """Rank 0: the process group's store, listening on a port the OS picks when it
        binds and held from then on; the driver hands (address, port) to every rank.
        A port picked by bind-then-close could be taken by Ray, vLLM or the object store
        on a busy node before the store bound it again."""
        import ray

        self._store = dist.TCPStore("0.0.0.0", 0, self.world_size, is_master=True,
                                    timeout=self._timeout(), wait_for_workers=False)
        return ray.util.get_node_ip_address(), int(self._store.port)

    def _place(self) -> tuple[torch.device, str, timedelta]:
        """This rank's device, process-group backend and collective timeout (devices.py).
        A rank given GPUs computes on CUDA or fails (exit 2): never on the CPU unnoticed."""
        res = self.cfg.resources
        device_type = rank_device_type(res, probe_cuda() if res.trains_on_cuda else None)
        device = (
            torch.device(
                "cuda",
                cuda_device_index(
                    _ray_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"), self.local_rank
                ),
            )
            if device_type == "cuda"
            else torch.device("cpu")
        )
        return device, process_group_backend(device_type), self._timeout()

    def _timeout(self) -> timedelta:
        return timedelta(seconds=job_collective_timeout_s(
            self.cfg.model.path, self.cfg.resources.collective_timeout_s))

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        # Here, not in __init__: Ray hands a method's ConfigError to the driver (exit 2),
        # while one raised in an actor's constructor arrives as a dead actor (NodeLost).
        device, backend, timeout = self._place()
        if device.type == "cuda":
            # Before the process group: the rank sees every GPU of its node (rank_env.py),
            # so NCCL and vLLM must find this one as the current device from the start.
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            store = getattr(self, "_store", None)
            if store is None:  # not rank 0 (or a rank run without the driver)
                store = dist.TCPStore(master_addr, master_port, self.world_size,
                                      is_master=self.rank == 0, timeout=timeout)
            dist.init_process_group(backend, store=store, rank=self.rank,
                                    world_size=self.world_size, timeout=timeout)
        transport = first_collective(device)  # a missing network fails here, by name
        self.gpu_memory = GpuMemoryMeter(device)
        world = World(self.rank, self.world_size, dist.group.WORLD)
        with rank_stage(RankStage.LOAD):
            self.state = build_rank_state(self.cfg, device, world)
        self.tokens = load_rollout_tokens(self.cfg, self.state.actor.config)
        self.policy = PolicyUpdate(self.state, self.tokens.pad_id)
        self.checkpoints = RankCheckpointer(self.state)
        self.tp_group = self._rollout_group(timeout)
        if self.cfg.rollout.placement == "colocated":  # else the engines are apart
            with rank_stage(RankStage.ROLLOUT):  # vLLM's start: its memory check, its pool
                self.engine = self._build_engine()
        n_params = sum(p.numel() for p in self.state.actor.parameters())
        return {
            "rank": self.rank,
            "backend": backend,
            "local_params": n_params,
            "node_id": _ray_node_id(),
            "local_rank": self.local_rank,
            "device": str(device),
            "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")},
            "transport": transport,
        }

    def _rollout_group(self, timeout: timedelta) -> Any:
        """This rank's tensor-parallel rollout group: consecutive ranks, as vLLM builds
        its TP groups over the world. Every rank creates every group (a collective)."""
        tp = self.cfg.rollout.tensor_parallel_size
        if tp == 1:
            return None
        mine = None
        for first in range(0, self.world_size, tp):
            # new_group takes its backend's default timeout, not the world's.
            group = dist.new_group(list(range(first, first + tp)), timeout=timeout)
            if first <= self.rank < first + tp:
                mine = group
        return mine

    def _tp_union(self, items: Sequence[Any]) -> tuple[list[Any], slice]:
        """Every rank of this TP group's ``items`` in rank order, and where ours are.

        The ranks of a group drive one sharded engine, so each call into it must get the
        same inputs on every rank of the group (vLLM's external launcher runs identical
        schedulers); a rank's own results are the ``slice`` of the union."""
        if self.tp_group is None:
            return list(items), slice(0, len(items))
        tp = self.cfg.rollout.tensor_parallel_size
        parts: list[list[Any]] = [[] for _ in range(tp)]
        dist.all_gather_object(parts, items, group=self.tp_group)
        start = sum(len(p) for p in parts[: self.rank % tp])
        return [x for p in parts for x in p], slice(start, start + len(items))

    @rank_stage(RankStage.ROLLOUT)
    def score(self, responses: list[list[int]] | None = None) -> list[torch.Tensor]:
        """The rollout engine's log-probs of this rank's samples' response tokens (or of
        ``responses`` to the same prompts), at temperature 1 (``VLLMEngine.score``): checks
        that the engine holds the actor's weights. A collective over the TP group, like
        ``generate``."""
        from ..rollout.vllm_engine import VLLMEngine

        if not isinstance(self.engine, VLLMEngine):
            raise TypeError("score needs rollout.engine 'vllm'")
        resp = responses or [s.response_ids.tolist() for s in self.samples]
        pairs, own = self._tp_union(list(zip([s.prompt for s in self.samples], resp, strict=True)))
        scores = self.engine.score([p for p, _ in pairs], [r for _, r in pairs])
        return scores[own]

    def _build_engine(self) -> RolloutEngine:
        return build_rank_engine(self.cfg, self.state, self.tokens, self.world_size)

    # -- rollout ---------------------------------------------------------------
    @rank_stage(RankStage.ROLLOUT)
    def generate(self, records: Sequence[RowRef | Record], step: int) -> list[dict[str, Any]]:
        """``rollout.n`` responses per prompt (a ref, read here, or a record); keeps the
        samples, returns their text."""
        self.faults.at("generate", step)
        self.gpu_memory.start_rollout()
        cfg = self.cfg
        # A TP group's ranks run one engine on the same prompts: the group's records,
        # in rank order; each rank keeps the samples of its own records.
        everything, own = self._tp_union(records)  # refs: a few numbers each
        prompts = encode_rows(self.tokens.encoder.encode, read_records(everything, cfg.data))
        for p in prompts:  # the driver left such prompts out (or refused them) at load
            if (n := p.input_ids.numel()) > cfg.data.max_prompt_length:
                raise RuntimeError(overlong(p.record.where, n, cfg.data.max_prompt_length))
        self.engine.wake()
        st = self.state
        sync_rollout_weights(self.engine, st.actor, st.compute_dtype, cfg.actor.lora)
        spec = training_spec(cfg, step, self.rank, everything, self.tokens.suppress_ids)
        groups = self.engine.generate(prompts, spec) if prompts else []
        self.gpu_memory.sleep(self.engine)
        self.samples = to_samples(prompts[own], groups[own], self.tokens.tokenizer)
        return [summary(s) for s in self.samples]

    @rank_stage(RankStage.ROLLOUT)
    def generate_greedy(self, chunks: Sequence[Sequence[RowRef | Record]], step: int
                        ) -> list[dict[str, Any]]:
        """Validation (validation.py): one greedy response per record, chunk by chunk, with
        the current weights. Keeps nothing, and restores the RNG it may touch, so the
        training trajectory is the same with or without it."""
        st = self.state
        cuda = [st.device] if st.device.type == "cuda" else []
        out: list[dict[str, Any]] = []
        with torch.random.fork_rng(devices=cuda):
            self.engine.wake()
            sync_rollout_weights(self.engine, st.actor, st.compute_dtype, self.cfg.actor.lora)
            for chunk in chunks:  # the same number on every rank: TP groups call together
                everything, own = self._tp_union(chunk)
                prompts = encode_rows(self.tokens.encoder.encode,
                                      read_records(everything, self.cfg.data))
                spec = greedy_spec(self.cfg, step, self.rank, everything,
                                   self.tokens.suppress_ids)
                groups = self.engine.generate(prompts, spec) if prompts else []
                out += [summary(s)
                        for s in to_samples(prompts[own], groups[own], self.tokens.tokenizer)]
            self.gpu_memory.sleep(self.engine)
        return out

    def load_samples(self, items: list[tuple[Record, list[int]]]) -> list[dict[str, Any]]:
        """Test seam: install given (prompt, response tokens) instead of generating.
        Consecutive items of one record share its encoded prompt, as a group does."""
        self.samples = []
        prompt: EncodedPrompt | None = None
        for record, ids in items:
            if prompt is None or prompt.record != record:
                prompt = self.tokens.encoder.encode(record)
            resp = torch.tensor(ids, dtype=torch.long)
            self.samples.append(Sample(prompt, resp, torch.zeros(len(ids)), True, ""))
        return [summary(s) for s in self.samples]

    # -- disaggregated rollouts: samples from the engines, weights to them -------------
    def receive_samples(self, parts: list[tuple[int, Any, int, int]]) -> list[int]:
        """This step's samples from the engines that drew them: ``(engine, samples ref,
        first group, end group)`` each (rollout/routing.py); straight from the engines'
        object stores, never through the driver. The engines whose samples are lost (their
        Ray node died with its object store after they were drawn): the driver has them
        drawn again and calls this again; this rank then holds nothing."""
        import ray
        from ray.exceptions import ObjectLostError

        n = self.cfg.rollout.n
        samples, lost = [], []
        for engine, ref, first, end in parts:
            try:
                samples += ray.get(ref)[first * n : end * n]
            except ObjectLostError:
                lost.append(engine)
        self.samples = [] if lost else samples
        return lost

    def open_weight_store(self) -> tuple[str, int]:
        """Rank 0: the weight group's store (rollout/weight_bus.py), held for the run."""
        import ray

        return ray.util.get_node_ip_address(), self.weights.open(self._timeout().total_seconds())

    def join_weight_group(self, spec: WeightGroupSpec) -> None:
        self.weights.join(spec)

    def push_weights(self) -> dict[str, Any]:
        """The full weights to the engines (every rank gathers, rank 0 broadcasts)."""
        st = self.state
        stream = rollout_weights(st.actor, st.compute_dtype, self.cfg.actor.lora)
        return self.weights.push(stream)

    # -- update: policy_update.py; groups exchanged before it: balance.py ------------
    def hand_over(self, groups: list[int]) -> list[list[Sample]]:
        """These groups leave for another rank's update (the driver moves them)."""
        self.samples, leaving = hand_over(self.samples, groups, self.cfg.rollout.n)
        return leaving

    def take(self, groups: list[list[Sample]]) -> None:
        """Groups another rank generated, trained here this step (after our own)."""
        self.samples += [s for group in groups for s in group]

    @rank_stage(RankStage.TRAINING)
    def update(self, advantages: list[float], step: int) -> dict[str, float]:
        """The step's policy update on this rank's samples, given their advantages."""
        self.faults.at("update", step)
        self.faults.leak(step)
        if len(advantages) != len(self.samples):
            raise ValueError(f"{len(advantages)} advantages for {len(self.samples)} samples")
        for s, a in zip(self.samples, advantages, strict=True):
            s.advantage = float(a)
        return {**self.policy.run(self.samples, step), **self._memory()}

    def _memory(self) -> dict[str, float]:
        """This rank's memory after the update (the driver reports the max over ranks)."""
        import psutil

        mem = {"memory/host_rss_bytes": float(psutil.Process().memory_info().rss)}
        return {**mem, **self.gpu_memory.metrics()}

    # -- checkpoints: collective over ranks; the logic is in checkpointing/rank.py --
    def save_checkpoint(self, path: str, async_save: bool = False) -> dict[str, Any]:
        return self.checkpoints.save(path, async_save)

    def finish_checkpoint(self, wait: bool = True) -> dict[str, Any] | None:
        return self.checkpoints.finish(wait)

    def load_checkpoint(self, verify: dict[str, list[Any]], path: str) -> dict[str, Any]:
        return self.checkpoints.load(path, verify)

    # -- stall probe and SIGTERM (stall_monitor.py, sigterm.py): Ray actors only ---
    def arm_signals(self) -> dict[str, Any]:
        """Dump stacks on the probe's signal, and outlive a SIGTERM until the driver's
        save is committed; returns what the probe needs to find this rank."""
        from ..liveness.sigterm import defer_in_rank
        from ..liveness.stall_monitor import install_stack_dump

        defer_in_rank(self.rank)
        return {"pid": os.getpid(), "node_id": _ray_node_id(),
                "stacks_file": install_stack_dump(self.rank)}

    # -- introspection (tests, checkpoint seam) ---------------------------------
    def full_params(self) -> dict[str, torch.Tensor]:
        """Full fp32 parameters (collective: call on every rank); rank 0's copy is used."""
        return {n: t.clone() for n, t in stream_full_params(self.state.actor, torch.float32)}

    def rollout_log_prob_gap(self) -> float:
        """Max |rollout log-prob - actor log-prob| over this rank's response tokens."""
        vals = [
            (s.old_log_probs - s.rollout_log_probs).abs().max().item()
            for s in self.samples
            if s.old_log_probs is not None and s.response_ids.numel()
        ]
        return max(vals) if vals else 0.0

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


if TYPE_CHECKING:  # mypy: a Worker has every method the driver calls, as rank_api says
    _CALLED_AS: type[RankApi] = Worker
