"""The GRPOJob API: pydantic models (the CRD schema is generated from them)."""

from __future__ import annotations

from .base import ApiModel, quantity_bytes, quantity_gib
from .lora import LoraSpec
from .manifest import (
    GRPOJob,
    SpecError,
    load_documents,
    load_manifest,
    parse_manifest,
    parse_spec,
)
from .recovery import CheckpointSpec, RecoverySpec
from .resources import GpuName, MemorySpec, ResourcesSpec
from .spec import (
    AlgorithmSpec,
    DataSpec,
    GRPOJobSpec,
    ModelShape,
    ModelSpec,
    RewardSpec,
    TrainingSpec,
)
from .status import AttemptRecord, Condition, GRPOJobStatus, PlanStatus, ProgressStatus

__all__ = [
    "AlgorithmSpec",
    "ApiModel",
    "AttemptRecord",
    "CheckpointSpec",
    "Condition",
    "DataSpec",
    "GRPOJob",
    "GRPOJobSpec",
    "GRPOJobStatus",
    "GpuName",
    "LoraSpec",
    "MemorySpec",
    "ModelShape",
    "ModelSpec",
    "PlanStatus",
    "ProgressStatus",
    "RecoverySpec",
    "ResourcesSpec",
    "RewardSpec",
    "SpecError",
    "TrainingSpec",
    "load_documents",
    "load_manifest",
    "parse_manifest",
    "parse_spec",
    "quantity_bytes",
    "quantity_gib",
]
