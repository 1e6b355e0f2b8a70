"""Tier markers follow the directory a test lives in, so `-m unit` etc. always work; the
tiny models the rollout engines' tiers share (`vllm`, `gpu`); how the trainer and vLLM
tiers start Ray, and a Ray cluster with a disaggregated job's labelled nodes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TIERS = ("unit", "trainer", "vllm", "cluster", "e2e", "images", "gpu")
_DIR_TIER = {"unit": "unit", "trainer": "trainer", "vllm": "vllm", "cluster": "cluster",
             "e2e": "e2e", "images": "images", "gpu": "gpu"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        own = {m.name for m in item.iter_markers() if m.name in TIERS}
        rel = Path(str(item.fspath)).relative_to(root)
        tier = _DIR_TIER.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if tier and tier not in own and "gpu" not in own:
            item.add_marker(getattr(pytest.mark, tier))


# The engine tiers' tiny models (grpo_testkit.tiny_models), one session copy each.
# vLLM's CPU attention refuses head_dim 16 (the trainer tier's tiny models): 4 heads of 32.
VLLM_CPU_HIDDEN = 128
# On CUDA head_dim 64 (4 heads of 256): within every vLLM CUDA attention backend's sizes.
GPU_HIDDEN = 256


def _tiny(factory: pytest.TempPathFactory, kind: str, name: str, hidden: int,
          **kw: float) -> Path:
    from grpo_testkit.tiny_models import build_tiny_qwen2, build_tiny_qwen2_5_vl

    build = build_tiny_qwen2 if kind == "lm" else build_tiny_qwen2_5_vl
    return Path(build(factory.mktemp(name), hidden=hidden, **kw))


@pytest.fixture(scope="session")
def vllm_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "lm", "vllm-qwen2", VLLM_CPU_HIDDEN)


@pytest.fixture(scope="session")
def vllm_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "vlm", "vllm-qwen2.5-vl", VLLM_CPU_HIDDEN)


@pytest.fixture(scope="session")
def vllm_lora_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Weights at scale 0.1: at 0.02 the frozen head leaves LoRA too little room to
    learn the text task (``build_tiny_qwen2``)."""
    return _tiny(tmp_path_factory, "lm", "vllm-lora-qwen2", VLLM_CPU_HIDDEN, init_std=0.1)


@pytest.fixture(scope="session")
def gpu_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "lm", "gpu-qwen2", GPU_HIDDEN)


@pytest.fixture(scope="session")
def gpu_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "vlm", "gpu-qwen2.5-vl", GPU_HIDDEN)


# -- Ray for the trainer and vLLM tiers ----------------------------------------------
@pytest.fixture(scope="session")
def local_ray_args() -> dict[str, Any]:
    """How the tier's local Ray is started (again, after a test that used another).
    "local": a cluster of our own even when another runs on the machine (without an
    address Ray joins the one in /tmp/ray/ray_current_cluster, and refuses num_cpus)."""
    return {"address": "local", "num_cpus": 4, "object_store_memory": 200 * 1024 * 1024,
            "include_dashboard": False}


@dataclass(frozen=True)
class LabelledCluster:
    """A Ray cluster whose nodes carry the disaggregated job's side labels."""

    address: str
    nodes: dict[str, str]  # side (grpo.dev/side's value) -> Ray node id
    cluster: Any  # ray.cluster_utils.Cluster: remove_node / add_node for a node's loss


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
    # A node killed (test_disaggregated_staleness) is declared dead after 2 missed 1 s
    # health checks, not Ray's default 5 x 3 s.
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False,
                                      "_system_config": {"health_check_period_ms": 1000,
                                                         "health_check_failure_threshold": 2}})
    try:
        for side in ("train", "rollout"):
            cluster.add_node(num_cpus=2, labels={RAY_SIDE_LABEL: side})
        ray.init(address=cluster.address)
        nodes = {n["Labels"][RAY_SIDE_LABEL]: n["NodeID"] for n in ray.nodes()
                 if RAY_SIDE_LABEL in n.get("Labels", {})}
        yield LabelledCluster(cluster.address, nodes, cluster)
    finally:
        ray.shutdown()
        cluster.shutdown()
        if was_local:
            ray.init(**local_ray_args)
