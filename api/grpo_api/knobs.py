"""The planned settings, each declared once: its spec name, its plan name, its trainer path.

The planner resolves every knob into its `Settings` (grpo_operator.planner.types); from
this table the operator derives which knobs a spec pins, status.plan and the knobs'
entries in the per-attempt trainer config, which is the one channel a planned setting
travels to the trainer (no env var carries it too). tests/unit/test_knobs.py checks
every name here against the models that hold it, so a knob added to a model but not
here (or here with a typo) fails there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Knob:
    """One planned setting and every name it goes by."""

    setting: str  # the planner's Settings field, and status.plan's field (snake_case)
    spec: str  # its spec field's name, in spec.<section>
    trainer: str | None  # dotted path in the trainer config; None: Ray's, not the trainer's
    pinnable: bool = True  # False: not in spec.memory, the planner never chooses it
    in_status: bool = True  # a field of status.plan (PlanStatus)
    # True: not a choice but what the planner derives from the choices (a Budget field
    # of the plan, not a Settings one); no spec field pins it.
    derived: bool = False
    section: str = "memory"  # the spec section that holds it (spec.memory for the pinnable)

    @property
    def spec_path(self) -> str:
        """Where the spec sets it, as an error message names it."""
        return f"spec.{self.section}.{self.spec}"

    def trainer_value(self, value: Any) -> Any:
        """The planned value as the trainer config spells it."""
        if self.setting == "rank0_init":  # a strategy name in the trainer (InitStrategy)
            return "rank0" if value else "sharded"
        return value


KNOBS: tuple[Knob, ...] = (
    Knob("rank0_init", "rank0Init", "actor.init_strategy"),
    Knob("offload_params", "offloadParams", "actor.offload_params"),
    Knob("offload_optimizer", "offloadOptimizer", "actor.offload_optimizer"),
    Knob("gradient_checkpointing", "gradientCheckpointing", "actor.gradient_checkpointing"),
    Knob("micro_batch_size", "microBatchSize", "actor.micro_batch_size"),
    Knob("rollout_gpu_memory_utilization", "rolloutGpuMemoryUtilization",
         "rollout.gpu_memory_utilization"),
    # The algorithm's, not a memory knob: the planner passes it through and no rung of
    # the recovery ladder changes it (planner/ladder.py says why).
    Knob("rollout_n", "rolloutN", "rollout.n", pinnable=False, section="algorithm"),
    # The training mode's precision: the spec's, which the CudaOOM ladder may switch from
    # mixed to bf16 only when spec.restartPolicy.allowPrecisionChange allows it.
    Knob("precision", "precision", "actor.precision", pinnable=False, section="training"),
    # Ray's object store: reaches Ray through its own env and start params, not the trainer.
    Knob("ray_object_store_gib", "rayObjectStoreMemory", None, in_status=False),
    # Ranks that share one vLLM engine: derived from the memory vLLM gets (a restart that
    # lowers it can raise TP, and the remediation note says so).
    Knob("rollout_tensor_parallel", "rolloutTensorParallel", "rollout.tensor_parallel_size",
         pinnable=False, derived=True, section="rollout"),
)

PINNABLE: Mapping[str, str] = {k.setting: k.spec for k in KNOBS if k.pinnable}
"""Settings field -> spec.memory field, for the knobs a spec may pin."""
