"""Trainer tier fixtures: tiny real models built once, one local Ray for the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_testkit.tiny_models import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_testkit.tiny_models import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2.5-vl"))


@pytest.fixture(scope="session")
def tiny_vl_families(tiny_vlm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny model of every VLM family the trainer trains (Qwen2-VL, Qwen2.5-VL,
    Qwen3-VL), by model_type; Qwen2.5-VL is ``tiny_vlm``."""
    from grpo_testkit.tiny_models import VL_FAMILIES, build_tiny_vl

    return {f: tiny_vlm if f == "qwen2_5_vl" else build_tiny_vl(tmp_path_factory.mktemp(f), f)
            for f in VL_FAMILIES}


@pytest.fixture(scope="session")
def ray_local(local_ray_args: dict[str, Any]) -> Iterator[None]:
    """A real local Ray with a small object store, shared by the tier's tests."""
    import ray

    ray.init(**local_ray_args)
    yield
    ray.shutdown()
