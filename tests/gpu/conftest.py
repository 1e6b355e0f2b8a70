"""GPU tier fixtures: the trainer on CUDA with vLLM rollouts, tiny real models, one local
Ray per run (the driver starts it and the test shuts it down). The tiny models
(`gpu_lm`, `gpu_vlm`) are in tests/conftest.py, beside the vLLM tier's.

Never in CI: the `gpu` marker is deselected by `make test` (`-m "not gpu"`). On a machine
without CUDA every test here skips and says so; with CUDA but without vLLM or Ray it
fails with the install hint, since a GPU machine is where they must run.
"""

from __future__ import annotations

import importlib.util
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Trained = tuple[dict[int, dict[str, Any]], Any]


@pytest.fixture
def gpus() -> int:
    """CUDA GPUs on this machine; skips the test where there are none."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("gpu tier: no CUDA GPU here (torch.cuda.is_available() is False)")
    missing = [m for m in ("vllm", "ray") if importlib.util.find_spec(m) is None]
    assert not missing, (
        f"gpu tier needs {', '.join(missing)}: install the gpu extra: "
        "uv pip install -e '.[trainer,gpu]'"
    )
    return int(torch.cuda.device_count())


def _cuda_config(
    model: Path, data: Path, ranks: int, tp: int = 1, **sections: dict[str, Any]
) -> dict[str, Any]:
    from grpo_testkit.configs import text_config

    base: dict[str, dict[str, Any]] = {
        "rollout": {"engine": "vllm", "gpu_memory_utilization": 0.3,
                    "tensor_parallel_size": tp},
        "actor": {"dtype": "bfloat16"},
        "resources": {"num_workers": ranks, "gpus_per_worker": 1},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return text_config(model, data, **base)


@pytest.fixture
def cuda_config() -> Callable[..., dict[str, Any]]:
    """``cuda_config(model, data, ranks, tp=1, **sections)``: the text task's config
    (testing.configs) on ``ranks`` GPUs, bf16 compute, vLLM rollouts sharded over ``tp``
    ranks; ``sections`` merge into it."""
    return _cuda_config


@pytest.fixture
def train(gpus: int) -> Callable[..., Trained]:
    """``train(raw, checkpointer=False, before=None)``: one run in this process with its
    own local Ray. Returns the metric lines by step (val metrics too) and what
    ``before(trainer)`` returned; ``before`` is called after the workers start (and a
    checkpoint, if any, is loaded), before the first step."""

    def run(
        raw: dict[str, Any],
        checkpointer: bool = False,
        before: Callable[[Any], Any] | None = None,
    ) -> Trained:
        import ray

        from grpo_trainer.checkpointing import make_checkpointer
        from grpo_trainer.cluster.ray_bootstrap import init_ray
        from grpo_trainer.config import build_config
        from grpo_trainer.driver.driver import GRPOTrainer
        from grpo_trainer.driver.metrics import MetricsLogger

        cfg = build_config(raw, environ={})
        out = io.StringIO()
        init_ray(cfg)
        trainer = GRPOTrainer(
            cfg,
            checkpointer=make_checkpointer(cfg) if checkpointer else None,
            metrics=MetricsLogger(cfg.metrics, cfg.trainer.total_steps or 0, stream=out),
        )
        seen = None
        try:
            if before is not None:
                trainer.start()
                seen = before(trainer)
            trainer.run()
        finally:
            trainer.close()
            ray.shutdown()
        lines = [json.loads(x) for x in out.getvalue().splitlines() if x.startswith("{")]
        return {m["step"]: m for m in lines}, seen

    return run
