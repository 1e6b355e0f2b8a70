"""GRPOJob.spec.lora: train a LoRA adapter on the language model instead of every weight.

Top-level, beside `model`, because it changes what is trained (EasyR1 keeps it under
`worker.actor.model.lora`, i.e. with the model); `spec.training.precision` says how the
trained weights are stored. Absent: full fine-tuning. The names follow EasyR1's and
PEFT's (`rank`, `alpha`, `target_modules`, `exclude_modules`); the trainer config spells
them as `grpo_api.trainer_config.LoraConfig`.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from .base import ApiModel

ALL_LINEAR = "all-linear"
# The linear layers of a Qwen2/Qwen2.5/Qwen3 decoder layer that PEFT's all-linear adapts
# (lm_head is never adapted); the planner sizes adapters on these.
LM_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_EXCLUDE = r".*visual.*"  # the vision tower: vLLM applies LoRA to the LM only

_MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_.]*$|^all-linear$"


class LoraSpec(ApiModel):
    """A LoRA adapter (PEFT): W + (alpha / rank) B A on each target linear; the base
    weights stay frozen in bf16, the reference policy is the model with the adapter off."""

    rank: int = Field(
        32,
        ge=1,
        le=1024,
        description=(
            "Adapter rank r (EasyR1's lora.rank; verl advises >= 32 for RL, with about 10x "
            "the full fine-tuning learning rate)."
        ),
    )
    alpha: float = Field(
        64.0, gt=0, description="Scale numerator: the update is multiplied by alpha / rank."
    )
    target_modules: list[str] = Field(
        default=[ALL_LINEAR],  # a plain default (pydantic copies it) so the CRD carries it
        min_length=1,
        description=(
            "Module names (suffixes) to adapt, e.g. [q_proj, v_proj], or [all-linear] "
            "(default): every linear layer of the language model (q, k, v, o, gate, up, "
            "down projections; not lm_head)."
        ),
        json_schema_extra={"items": {
            "type": "string", "pattern": _MODULE_NAME, "description": "A module name."}},
    )
    exclude_modules: str = Field(
        DEFAULT_EXCLUDE,
        description=(
            "Regular expression of module names never adapted; default .*visual.* keeps "
            "the vision tower frozen (vLLM applies LoRA to the language model only). "
            "Empty: exclude nothing."
        ),
    )

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, targets: list[str]) -> list[str]:
        bad = [t for t in targets if not re.match(_MODULE_NAME, t)]
        if bad:
            raise ValueError(
                f"{', '.join(map(repr, bad))} not a module name; write "
                "names such as q_proj, v_proj, or all-linear"
            )
        if ALL_LINEAR in targets and len(targets) > 1:
            raise ValueError(
                "all-linear already adapts every linear layer; give it alone "
                "or list the module names instead"
            )
        return targets

    @field_validator("exclude_modules")
    @classmethod
    def _exclude_is_a_regex(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(
                f"{pattern!r} is not a regular expression ({exc}); e.g. "
                f"{DEFAULT_EXCLUDE}"
            ) from None
        return pattern

    @property
    def all_linear(self) -> bool:
        return self.target_modules == [ALL_LINEAR]

    def adapts(self, module: str) -> bool:
        """Whether a module of this name (e.g. model.layers.0.mlp.up_proj) gets an
        adapter, as PEFT decides it: a listed suffix (or any linear for all-linear),
        unless excludeModules matches the whole name."""
        if self.exclude_modules and re.fullmatch(self.exclude_modules, module):
            return False
        leaf = module.rsplit(".", 1)[-1]
        return self.all_linear or leaf in self.target_modules
