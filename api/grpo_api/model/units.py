"""Units of the memory model, once: budget.py and rollout_side.py both size bytes."""

from __future__ import annotations

GIB = 2**30
# Bytes per parameter of the actor's state in each training mode: planner/modes.py (STATE);
# the compute dtype (bf16 on GPUs) for gathered copies, the reference policy and LoRA's
# frozen base; bf16 for vLLM's weights.
BF16_B = 2
FP32_B = 4  # CPU jobs compute in float32; rank-0 init loads the checkpoint in float32
