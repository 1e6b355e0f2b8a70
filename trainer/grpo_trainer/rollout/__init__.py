"""Rollout engines behind one interface: transformers ``generate`` (CPU, tests) and vLLM (GPUs)."""

from .base import Generation, RolloutEngine, SamplingSpec

__all__ = ["Generation", "RolloutEngine", "SamplingSpec"]
