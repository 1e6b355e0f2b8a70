"""Optimizers of our own (the stock ones cover mixed precision)."""

from .kahan_adamw import BF16AdamW, Compensation, local_shard

__all__ = ["BF16AdamW", "Compensation", "local_shard"]
