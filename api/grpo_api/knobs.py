"""The planned settings, each declared once: its plan name and its spec name.

The planner resolves every knob into its `Settings` (grpo_operator.planner.types); from
this table the operator derives which knobs a spec pins, status.plan and the planner's
reasons (which name each knob as users write it). Which trainer config path a knob sets
is declared with every other trainer path's source, once, in grpo_api.job.trainer
(SOURCES); the per-attempt trainer config is the one channel a planned setting travels
to the trainer (no env var carries it too). tests/unit/test_knobs.py checks every name
here against the models that hold it, so a knob added to a model but not here (or here
with a typo) fails there; no other module spells a knob's name (test_trainer_sources).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Knob:
    """One planned setting and every name it goes by."""

    setting: str  # the planner's Settings field, and status.plan's field (snake_case)
    spec: str  # its name as users write it: spec.<section>.<spec>, status.plan.<spec>
    pinnable: bool = True  # False: not in spec.memory, the planner never chooses it
    in_status: bool = True  # a field of status.plan (PlanStatus)
    # True: not a choice but what the planner derives from the choices (a Budget field
    # of the plan, not a Settings one); no spec field pins it.
    derived: bool = False
    section: str = "memory"  # the spec section that holds it (spec.memory for the pinnable)

    @property
    def spec_path(self) -> str:
        """Where the spec sets it, as an error message names it; for a derived knob, which
        no field pins, the spec section it is derived from."""
        return f"spec.{self.section}" if self.derived else f"spec.{self.section}.{self.spec}"

    def trainer_value(self, value: Any) -> Any:
        """The planned value as the trainer config spells it."""
        if self == RANK0_INIT:  # a strategy name in the trainer (InitStrategy)
            return "rank0" if value else "sharded"
        if self == MICRO_BATCH_TOKENS:  # 0: by samples, the trainer's None
            return value or None
        return value


RANK0_INIT = Knob("rank0_init", "rank0Init")
OFFLOAD_PARAMS = Knob("offload_params", "offloadParams")
OFFLOAD_OPTIMIZER = Knob("offload_optimizer", "offloadOptimizer")
GRADIENT_CHECKPOINTING = Knob("gradient_checkpointing", "gradientCheckpointing")
MICRO_BATCH_SIZE = Knob("micro_batch_size", "microBatchSize")
# The update's micro-batches by tokens (0: by microBatchSize samples, when the spec pins
# that): what the planner chooses and the CudaOOM ladder halves.
MICRO_BATCH_TOKENS = Knob("micro_batch_tokens", "microBatchTokens")
ROLLOUT_GPU_MEMORY_UTILIZATION = Knob("rollout_gpu_memory_utilization",
                                      "rolloutGpuMemoryUtilization")
# The algorithm's, not a memory knob: the planner passes it through and no rung of the
# recovery ladder changes it (planner/ladder.py says why).
ROLLOUT_N = Knob("rollout_n", "rolloutN", pinnable=False, section="algorithm")
# The training mode's precision: the spec's, which the CudaOOM ladder may switch from
# mixed to bf16 only when spec.recovery.allowPrecisionChange allows it.
PRECISION = Knob("precision", "precision", pinnable=False, section="training")
# Ray's object store: reaches Ray through its own env and start params, not the trainer.
RAY_OBJECT_STORE = Knob("ray_object_store_gib", "rayObjectStoreMemory", in_status=False)
# Ranks that share one vLLM engine: derived from the memory vLLM gets (a restart that
# lowers it can raise TP, and the remediation note says so).
ROLLOUT_TENSOR_PARALLEL = Knob("rollout_tensor_parallel", "rolloutTensorParallel",
                               pinnable=False, derived=True, section="rollout")

KNOBS: tuple[Knob, ...] = (
    RANK0_INIT, OFFLOAD_PARAMS, OFFLOAD_OPTIMIZER, GRADIENT_CHECKPOINTING, MICRO_BATCH_SIZE,
    MICRO_BATCH_TOKENS, ROLLOUT_GPU_MEMORY_UTILIZATION, ROLLOUT_N, PRECISION, RAY_OBJECT_STORE,
    ROLLOUT_TENSOR_PARALLEL,
)

PINNABLE: Mapping[str, str] = {k.setting: k.spec for k in KNOBS if k.pinnable}
"""Settings field -> spec.memory field, for the knobs a spec may pin."""
