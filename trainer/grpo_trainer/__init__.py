"""GRPO trainer: the FSDP + rollout-engine GRPO loop the operator launches."""

__version__ = "0.1.0"
