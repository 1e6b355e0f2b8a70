"""GRPO Operator: reconciles GRPOJob resources into KubeRay clusters."""

__version__ = "0.1.0"
