"""How many of a disaggregated job's nodes generate, and how many train (pure).

A step of a disaggregated job with maxStaleness >= 1 takes as long as the slower side
(the rollout engines generate step t+1 while the training GPUs update on step t) plus
the weight sync; with maxStaleness 0 the sides take turns. The split that keeps the
trainer busy balances generation on R nodes against the update on T = N - R nodes.

Both sides' seconds come from the step's tokens (rollout batch x n x (prompt + response
lengths)) and a per-GPU rate for each, derived from one published step:

- EasyR1 v0.3.0, assets/baselines.md, "Performance Baselines": Qwen2.5-VL-7B-Instruct
  on Geometry3k, 8 x H100 80GB, AMP, vLLM TP 2, utilisation 0.6: 180 s per step at
  1200 tokens per second per GPU (prompt and response tokens of the step).
- Generation's share of that step is not published there. Assumed: one half (NeMo-RL's
  GRPO timing example, NVIDIA-NeMo/RL#1052: exposed generation 48.9% of the step, the
  update and log-probs 44.8%); the weight sync 1.2% (marin-community/marin#8653's
  per-step breakdown: sync_weights 1.2%).
- Generation ends with a tail: the longest responses still decode while most of the
  batch is done, and more GPUs do not shorten it. Assumed: TAIL_SHARE of the reference
  generation (the straggler tail that verl's and AReaL's asynchronous modes hide behind
  the update), scaled by the response length; colocated, every GPU waits through it,
  disaggregated (maxStaleness >= 1) the update runs beside it. Without it, linear
  scaling would make the best split exactly as fast as colocated.
- Other models scale by parameters (both rates ~ 1 / parameters), other GPU types by
  the catalog's dense BF16 TFLOPS against H100's (a rough proxy: decoding is bounded
  by memory bandwidth, which the catalog does not hold).
- The reference run's responses and prompts filled FILL of their maximum lengths
  (1200 x 8 x 180 tokens over 512 x 5 x (2048 + 2048)); the seconds here assume the
  same, the split does not depend on it (both sides scale alike).

bench/bench_async_split.py simulates the same constants (imported, not copied).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_api.catalog import GPU_CATALOG
from grpo_api.model.shape import KNOWN_MODELS

REFERENCE_MODEL = "qwen2.5-vl-7b"  # Qwen2.5-VL-7B-Instruct, as the planner sizes it
REFERENCE_PARAMETERS = float(KNOWN_MODELS[REFERENCE_MODEL].parameters)
REFERENCE_GPU = "H100-80GB"
REFERENCE_GPU_TFLOPS = GPU_CATALOG[REFERENCE_GPU].bf16_tflops
REFERENCE_GPUS = 8
REFERENCE_STEP_S = 180.0
REFERENCE_TOKENS_PER_GPU_S = 1200.0
# EasyR1's default step: rollout batch, n, max prompt and response lengths.
REFERENCE_BATCH, REFERENCE_N = 512, 5
REFERENCE_PROMPT_LENGTH = REFERENCE_RESPONSE_LENGTH = 2048
REFERENCE_MAX_TOKENS = REFERENCE_BATCH * REFERENCE_N * (
    REFERENCE_PROMPT_LENGTH + REFERENCE_RESPONSE_LENGTH)
GENERATION_SHARE = 0.5  # assumed (see above)
WEIGHT_SYNC_SHARE = 0.012  # assumed (see above)
TAIL_SHARE = 0.3  # assumed (see above): of the reference step's generation seconds

_REFERENCE_TOKENS = REFERENCE_TOKENS_PER_GPU_S * REFERENCE_GPUS * REFERENCE_STEP_S
FILL = _REFERENCE_TOKENS / REFERENCE_MAX_TOKENS
# Tokens of the step (at their max lengths) per second per reference GPU, each side;
# generation's rate is that of its parallel part (the tail apart).
GENERATION_RATE = REFERENCE_MAX_TOKENS / (
    (1 - TAIL_SHARE) * GENERATION_SHARE * REFERENCE_STEP_S * REFERENCE_GPUS)
TAIL_S = TAIL_SHARE * GENERATION_SHARE * REFERENCE_STEP_S  # for the reference model
UPDATE_RATE = REFERENCE_MAX_TOKENS / (
    (1 - GENERATION_SHARE - WEIGHT_SYNC_SHARE) * REFERENCE_STEP_S * REFERENCE_GPUS)
SYNC_S = WEIGHT_SYNC_SHARE * REFERENCE_STEP_S  # for the reference model


@dataclass(frozen=True)
class StepWork:
    """One step's work in reference-GPU seconds, each side, and the sync's seconds."""

    generation_gpu_s: float  # the parallel part
    update_gpu_s: float
    sync_s: float
    tail_s: float = 0.0  # generation's tail on a reference GPU, whatever the GPU count

    def generation_s(self, gpus: int, speed: float = 1.0) -> float:
        return (self.generation_gpu_s / gpus + self.tail_s) / speed

    def colocated_s(self, gpus: int, gpu_speed: float = 1.0) -> float:
        """Every GPU generates (through the tail), then every GPU trains, then the sync."""
        return (self.generation_s(gpus, gpu_speed)
                + self.update_gpu_s / (gpus * gpu_speed) + self.sync_s)

    def disaggregated_s(self, rollout_gpus: int, train_gpus: int, overlap: bool,
                        rollout_speed: float = 1.0, train_speed: float = 1.0) -> float:
        """R GPUs generate, T train: side by side (overlap, maxStaleness >= 1) or in
        turn (maxStaleness 0); then the sync."""
        gen = self.generation_s(rollout_gpus, rollout_speed)
        upd = self.update_gpu_s / (train_gpus * train_speed)
        return (max(gen, upd) if overlap else gen + upd) + self.sync_s


def step_work(step_tokens: int, parameters: float, response_length: int) -> StepWork:
    """The step's tokens (rollout batch x n x (prompt + response lengths)) as work; the
    tail grows with the longest response."""
    scale = parameters / REFERENCE_PARAMETERS
    return StepWork(step_tokens / GENERATION_RATE * scale,
                    step_tokens / UPDATE_RATE * scale, SYNC_S * scale,
                    TAIL_S * scale * response_length / REFERENCE_RESPONSE_LENGTH)


def gpu_speed(bf16_tflops: float) -> float:
    """A GPU type's rates against the reference GPU's (the rough TFLOPS proxy)."""
    return bf16_tflops / REFERENCE_GPU_TFLOPS if bf16_tflops > 0 else 1.0


@dataclass(frozen=True)
class Split:
    """A proposed split of N nodes: rollout_nodes generate, the rest train."""

    rollout_nodes: int
    train_nodes: int
    step_s: float
    colocated_step_s: float
    generation_s: float  # on the rollout nodes
    update_s: float  # on the training nodes

    @property
    def speedup(self) -> float:
        return self.colocated_step_s / self.step_s

    def reason(self, work: StepWork, gpus_per_node: int, overlap: bool) -> str:
        how = "side by side (maxStaleness >= 1)" if overlap else "in turn (maxStaleness 0)"
        return (
            f"{self.rollout_nodes} of {self.rollout_nodes + self.train_nodes} nodes generate: "
            f"the step's work, {work.generation_gpu_s:.0f} GPU-s of generation (and a "
            f"{work.tail_s:.0f} s tail) and {work.update_gpu_s:.0f} GPU-s of update (EasyR1's "
            f"Qwen2.5-VL-7B step on 8 x H100, {REFERENCE_STEP_S:.0f} s, scaled by parameters "
            f"and GPU TFLOPS; generation {GENERATION_SHARE:.0%} of it, assumed), is "
            f"balanced {how}: "
            f"generation {self.generation_s:.0f} s on {self.rollout_nodes * gpus_per_node} "
            f"GPUs, update {self.update_s:.0f} s on {self.train_nodes * gpus_per_node}; a step "
            f"~{self.step_s:.0f} s against ~{self.colocated_step_s:.0f} s colocated "
            f"(x{self.speedup:.2f}; seconds assume the reference run's {FILL:.0%} fill of the "
            "max lengths)"
            + ("; slower than colocated on these nodes: consider placement colocated, or "
               "rollout GPUs besides these (disaggregated.nodes)" if self.speedup < 1 else ""))


def splits(nodes: int, gpus_per_node: int, work: StepWork, overlap: bool,
           speed: float = 1.0) -> list[Split]:
    """Every split of `nodes` nodes of one type (each side at least one), fastest step
    first; of equal steps, the one with fewer rollout nodes (more memory to train)."""
    out = []
    colocated = work.colocated_s(nodes * gpus_per_node, speed)
    for r in range(1, nodes):
        t = nodes - r
        out.append(Split(
            r, t, work.disaggregated_s(r * gpus_per_node, t * gpus_per_node, overlap,
                                       speed, speed),
            colocated,
            work.generation_s(r * gpus_per_node, speed),
            work.update_gpu_s / (t * gpus_per_node * speed)))
    return sorted(out, key=lambda s: (round(s.step_s, 6), s.rollout_nodes))
