"""One disaggregated rollout engine (``rollout.placement: disaggregated``): a Ray actor on
a rollout node with a full copy of the policy in the compute dtype, in the hf engine
(hf.py) or vLLM (vllm_engine.py, never asleep), and the ranks' prompt encoder. It
receives the weights from rank 0 after every update (weight_bus.py) and records the
policy version it holds; every sample it draws carries that version (offpolicy.py
weights the stale ones).

Plain class so tests can use it in-process; engine_group.py wraps it as a Ray actor.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from grpo_api.contract import RankStage
from grpo_api.trainer_config import Config

from ..algorithm.samples import Sample, load_rollout_tokens, summary
from ..cluster.rank_env import NCCL_LOG_DIR, engine_on_cuda, report_transport
from ..data import Record
from ..dataset import RowRef, encode_rows, overlong, read_records
from ..errors import rank_stage
from ..faults import parse_fault
from ..rank_api import GreedyGenerator
from .base import RolloutEngine
from .hf import HFGenerateEngine
from .sampling import greedy_spec, to_samples, training_spec
from .weight_bus import (
    PUSH_TIMEOUT_MIN_S,
    WeightGroupSpec,
    abandon,
    group_device,
    join_group,
    receive_weights,
    released,
)

log = logging.getLogger(__name__)


def engine_device(cfg: Config) -> torch.device:
    """An engine given GPUs generates on its (first) GPU; test clusters' fake GPUs and
    engines without GPUs on the host."""
    if not engine_on_cuda(cfg):
        return torch.device("cpu")
    import ray

    from ..cluster.placement import cuda_device_index

    ids = list(ray.get_gpu_ids()) if ray.is_initialized() else []
    return torch.device("cuda", cuda_device_index(ids, os.environ.get("CUDA_VISIBLE_DEVICES"), 0))


class EngineWorker:
    """Engine ``index`` of ``rollout.disaggregated.engines``: samples as rank ``index``
    would (the same seeds), with the weights it was last sent. ``incarnation``: how
    many times the engine was started again before this one (engine_group.py)."""

    def __init__(self, cfg: Config, index: int, incarnation: int = 0) -> None:
        self.cfg = cfg
        self.index = index
        self.incarnation = incarnation
        self.version: int | None = None  # None: no complete weights received yet
        self.pg: Any = None
        self.timeout_min_s = PUSH_TIMEOUT_MIN_S
        self.reported = False  # the NCCL transport to rank 0, logged once
        dis = cfg.rollout.disaggregated
        if engine_on_cuda(cfg):  # NCCL_DEBUG_FILE's directory (rank_env.engine_env)
            os.makedirs(NCCL_LOG_DIR, exist_ok=True)
        # As many threads as the engine has CPUs: a colocated rank generates with its own
        # (cpus_per_worker); equal counts sample equal numbers on the CPU.
        torch.set_num_threads(max(1, int(dis.cpus_per_engine if dis else 1)))

    def setup(self) -> dict[str, Any]:
        """Load the model and the tokenizer; where this engine runs (tests kill its pid)."""
        from ..model.modeling import load_full
        from ..model.precision import DTYPES

        cfg = self.cfg
        self.device = engine_device(cfg)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dtype = DTYPES[cfg.actor.dtype]
        if cfg.rollout.engine == "vllm":
            self.engine = self._vllm(dtype)
        else:
            with rank_stage(RankStage.LOAD):
                model = load_full(cfg.model, dtype).to(self.device)
            self.tokens = load_rollout_tokens(cfg, model.config)
            self.engine = HFGenerateEngine(model, self.tokens.pad_id, self.tokens.eos_ids,
                                           cfg.rollout.hf_sampler)
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {"index": self.index, "pid": os.getpid(), "node_id": node,
                "device": str(self.device)}

    def _vllm(self, dtype: torch.dtype) -> RolloutEngine:
        """vLLM on this engine's GPU, in this process (TP 1: the config refuses more,
        grpo_api.trainer_config.ENGINE_APART_TENSOR_PARALLEL), never asleep: nothing else
        uses it. The full weights arrive after every update (LoRA's merged into them), so
        no adapter slot."""
        from transformers import AutoConfig

        from .build import vllm_config
        from .vllm_engine import VLLMEngine

        cfg = self.cfg
        hf_config = AutoConfig.from_pretrained(cfg.model.path,
                                               trust_remote_code=cfg.model.trust_remote_code)
        self.tokens = load_rollout_tokens(cfg, hf_config)
        dis = cfg.rollout.disaggregated
        assert dis is not None
        with rank_stage(RankStage.LOAD):
            return VLLMEngine(vllm_config(
                cfg, hf_config, dtype, self.tokens, cfg.trainer.rollout_batch_size // dis.engines,
                tp=cfg.rollout.tensor_parallel_size, sleep=False, lora_rank=0))

    def join_weight_group(self, spec: WeightGroupSpec) -> None:
        """Join a new incarnation of the weight group as rank ``index + 1``."""
        self.pg = None
        released()
        self.pg = join_group(spec, self.index + 1)
        self.bus_device = group_device(spec.backend)
        self.timeout_min_s = spec.push_timeout_min_s

    def receive_weights(self, version: int) -> dict[str, Any]:
        """Load the weights rank 0 broadcasts; from now on samples are ``version``'s. A
        broadcast cut short (rank 0 closed the group: another engine died) leaves the
        weights half-loaded and the version unset until the next complete one."""
        self.version = None
        error = ""
        try:
            stream = receive_weights(self.pg, self.bus_device, self.timeout_min_s)
            self.engine.load_weights(
                (name, t.to(self.device)) for name, t in self._faulty(stream, version))
        except Exception as err:  # outside this block nothing refers to the group
            error = str(err)[:500] or type(err).__name__  # text: see WeightSender.push
            log.warning("engine %d: the weight broadcast broke off: %s", self.index, error)
        if error:
            abandon(self.pg, self.bus_device)
            self.pg = None
            released()
            return {"ok": False, "error": error}
        self.version = version
        if not self.reported and self.bus_device.type == "cuda":
            # The first push built NCCL's communicator: the transport it chose to rank 0
            # (the first attempt logs NCCL's INIT/NET lines: rank_env.engine_env).
            self.reported = True
            report_transport(f"rollout engine {self.index}")
        return {"ok": True, "version": version}

    def _faulty(self, stream: Iterator[tuple[str, torch.Tensor]], version: int
                ) -> Iterator[tuple[str, torch.Tensor]]:
        """``stream``, or, under the ``engine_exit_mid_push`` fault (faults.py), the last
        engine's first incarnation dying after the first tensor of policy n's push."""
        fault = parse_fault(self.cfg.trainer.fault_inject)
        dis = self.cfg.rollout.disaggregated
        due = (fault == ("engine_exit_mid_push", version) and self.incarnation == 0
               and dis is not None and self.index == dis.engines - 1)
        for item in stream:
            yield item
            if due:
                log.error("INJECTED FAULT (GRPO_FAULT_INJECT): engine %d exits mid-push",
                          self.index)
                os._exit(1)

    @rank_stage(RankStage.ROLLOUT)
    def generate(self, records: Sequence[RowRef | Record], step: int
                 ) -> tuple[list[dict[str, Any]], list[Sample]]:
        """``rollout.n`` samples per record for ``step`` (their summaries for the driver,
        the samples for the ranks, which fetch them from this node's object store)."""
        if self.version is None:
            raise RuntimeError(f"engine {self.index} holds no complete weights")
        cfg = self.cfg
        prompts = encode_rows(self.tokens.encoder.encode, read_records(records, cfg.data))
        for p in prompts:  # the driver left such prompts out (or refused them) at load
            if (n := p.input_ids.numel()) > cfg.data.max_prompt_length:
                raise RuntimeError(overlong(p.record.where, n, cfg.data.max_prompt_length))
        spec = training_spec(cfg, step, self.index, records, self.tokens.suppress_ids)
        groups = self.engine.generate(prompts, spec) if prompts else []
        samples = to_samples(prompts, groups, self.tokens.tokenizer, self.version)
        return [summary(s) for s in samples], samples

    @rank_stage(RankStage.ROLLOUT)
    def generate_greedy(self, chunks: Sequence[Sequence[RowRef | Record]], step: int
                        ) -> list[dict[str, Any]]:
        """Validation (validation.py) with the weights last sent: one greedy response per
        record, as rank ``index`` gives colocated. Keeps nothing."""
        out: list[dict[str, Any]] = []
        for chunk in chunks:
            prompts = encode_rows(self.tokens.encoder.encode, read_records(chunk, self.cfg.data))
            spec = greedy_spec(self.cfg, step, self.index, chunk, self.tokens.suppress_ids)
            groups = self.engine.generate(prompts, spec) if prompts else []
            out += [summary(s) for s in to_samples(prompts, groups, self.tokens.tokenizer)]
        return out

    def info(self) -> dict[str, Any]:
        return {"index": self.index, "pid": os.getpid(), "version": self.version}


if TYPE_CHECKING:  # mypy: validation calls an engine apart as it calls a rank (rank_api)
    _CALLED_AS: type[GreedyGenerator] = EngineWorker
