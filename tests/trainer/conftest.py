"""Trainer tier fixtures: tiny real models built once, one local Ray for the session."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_trainer.testing.tiny_models import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_trainer.testing.tiny_models import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2.5-vl"))


@pytest.fixture(scope="session")
def tiny_vl_families(tiny_vlm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny model of every VLM family the trainer trains (Qwen2-VL, Qwen2.5-VL,
    Qwen3-VL), by model_type; Qwen2.5-VL is ``tiny_vlm``."""
    from grpo_trainer.testing.tiny_models import VL_FAMILIES, build_tiny_vl

    return {f: tiny_vlm if f == "qwen2_5_vl" else build_tiny_vl(tmp_path_factory.mktemp(f), f)
            for f in VL_FAMILIES}


@pytest.fixture(scope="session")
def local_ray_args() -> dict[str, Any]:
    """How the tier's local Ray is started (again, after a test that used another).
    "local": a cluster of our own even when another runs on the machine (without an
    address Ray joins the one in /tmp/ray/ray_current_cluster, and refuses num_cpus)."""
    return {"address": "local", "num_cpus": 4, "object_store_memory": 200 * 1024 * 1024,
            "include_dashboard": False}


@pytest.fixture(scope="session")
def ray_local(local_ray_args: dict[str, Any]) -> Iterator[None]:
    """A real local Ray with a small object store, shared by the tier's tests."""
    import ray

    ray.init(**local_ray_args)
    yield
    ray.shutdown()


@dataclass(frozen=True)
class LabelledCluster:
    """A Ray cluster whose nodes carry the disaggregated job's side labels."""

    address: str
    nodes: dict[str, str]  # side (grpo.dev/side's value) -> Ray node id


@pytest.fixture(scope="module")
def labelled_cluster(local_ray_args: dict[str, Any]) -> Iterator[LabelledCluster]:
    """A real multi-node Ray (``ray.cluster_utils.Cluster``, one raylet per node) as the
    operator starts a disaggregated job's: a head without labels, a node labelled
    grpo.dev/side=train and one labelled =rollout, 2 CPUs each; one per module."""
    import ray
    from ray.cluster_utils import Cluster

    from grpo_api.contract import RAY_SIDE_LABEL

    was_local = ray.is_initialized()  # the tier's shared local Ray: back after the module
    if was_local:
        ray.shutdown()
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        for side in ("train", "rollout"):
            cluster.add_node(num_cpus=2, labels={RAY_SIDE_LABEL: side})
        ray.init(address=cluster.address)
        nodes = {n["Labels"][RAY_SIDE_LABEL]: n["NodeID"] for n in ray.nodes()
                 if RAY_SIDE_LABEL in n.get("Labels", {})}
        yield LabelledCluster(cluster.address, nodes)
    finally:
        ray.shutdown()
        cluster.shutdown()
        if was_local:
            ray.init(**local_ray_args)
