"""Rendering a GRPOJob's children from (spec, plan, attempt): pure functions."""

from __future__ import annotations

from .children import job_env, render_children, render_ray_cluster
from .names import JobRef
from .trainer_config import trainer_config

__all__ = ["JobRef", "job_env", "render_children", "render_ray_cluster", "trainer_config"]
