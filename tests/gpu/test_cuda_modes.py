"""GPU tier: the training modes, validation and resume on CUDA, with vLLM rollouts.

The CPU tiers run each of these on gloo and vLLM's CPU backend (tests/trainer,
tests/vllm). Here the same configs meet what no CPU build has: NCCL, parameter and
optimizer offload beside an NCCL process group (FSDP2's CPUOffloadPolicy), bf16 weights
synced into vLLM's CUDA engine and its sleep mode, LoRA adapters served by vLLM, greedy
validation over a TP group, and a resume from a checkpoint. Two ranks where the machine
has two GPUs (vLLM sharded over both where a test says TP), else one.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]

STEPS = 3
Config = Callable[..., dict[str, Any]]
Train = Callable[..., tuple[dict[int, dict[str, Any]], Any]]


def _ranks(gpus: int) -> int:
    return min(2, gpus)


def _trained_in_sync(history: dict[int, dict[str, Any]], steps: range) -> None:
    """Every step ran, its losses are finite, and vLLM sampled from the actor's weights
    of that step (bf16 on both sides: a few 1e-3 apart, as in test_vllm_rollout.py)."""
    assert [s for s in sorted(history) if s > 0] == list(steps)
    for s in steps:
        m = history[s]
        for key in ("actor/pg_loss", "actor/grad_norm", "reward/mean"):
            assert math.isfinite(m[key]), (s, key, m[key])
        assert m["rollout/logprob_abs_diff_mean"] < 0.05, (s, m)


@pytest.fixture(scope="module")
def wide_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 75M parameters: its actor state (1.2 GB in mixed precision) stands well clear
    of the few MB that CUDA graphs and NCCL buffers move between runs."""
    from grpo_testkit.tiny_models import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("gpu-wide"), hidden=1024, layers=8)


def test_offloaded_params_and_optimizer_train_beside_nccl(
    gpus: int, wide_lm: Path, tmp_path: Path, cuda_config: Config, train: Train
) -> None:
    from grpo_testkit.datasets import write_text_task

    data = write_text_task(tmp_path / "t.jsonl")
    ranks, steps = _ranks(gpus), {"total_steps": STEPS}
    plain, _ = train(cuda_config(wide_lm, data, ranks, trainer=steps))
    off, _ = train(cuda_config(
        wide_lm, data, ranks, trainer=steps,
        actor={"offload_params": True, "offload_optimizer": True},
    ))
    _trained_in_sync(plain, range(1, STEPS + 1))
    # Gradient clipping and the weight sync gather host-resident shards: the process
    # group must carry CPU tensors as well as CUDA ones.
    _trained_in_sync(off, range(1, STEPS + 1))
    # Between steps the shards and the Adam moments are in host RAM, not on the GPU.
    on_gpu = "memory/gpu_allocated_bytes"
    assert off[STEPS][on_gpu] < plain[STEPS][on_gpu] - 0.5 * 2**30, (off[STEPS], plain[STEPS])


def test_bf16_text_and_vlm_train_and_checkpoint_in_bf16(
    gpus: int, gpu_lm: Path, gpu_vlm: Path, tmp_path: Path, cuda_config: Config, train: Train
) -> None:
    import torch

    from grpo_testkit.datasets import write_text_task, write_vision_task
    from grpo_trainer.checkpointing.export import load_model_tensors

    ranks = _ranks(gpus)
    runs = {
        "text": cuda_config(gpu_lm, write_text_task(tmp_path / "t.jsonl"), ranks, tp=ranks),
        "vlm": cuda_config(gpu_vlm, write_vision_task(tmp_path / "v.parquet"), ranks),
    }
    for name, raw in runs.items():
        raw["actor"]["precision"] = "bf16"
        raw["trainer"]["total_steps"] = STEPS
        raw["checkpoint"] = {"dir": str(tmp_path / name), "interval_steps": STEPS}
        history, _ = train(raw, checkpointer=True)
        _trained_in_sync(history, range(1, STEPS + 1))
        tensors = load_model_tensors(tmp_path / name / f"step-{STEPS}")
        assert tensors and {t.dtype for t in tensors.values()} == {torch.bfloat16}, name


def test_lora_trains_with_vllm_serving_the_adapter(
    gpus: int, gpu_lm: Path, tmp_path: Path, cuda_config: Config, train: Train
) -> None:
    from grpo_testkit.datasets import write_text_task
    from grpo_trainer.checkpointing.export import load_model_tensors

    raw = cuda_config(
        gpu_lm, write_text_task(tmp_path / "t.jsonl"), _ranks(gpus),
        trainer={"total_steps": STEPS},
        actor={"lr": 5e-2, "lora": {"rank": 8, "alpha": 16.0}},
        algorithm={"kl_coef": 1e-3},
        checkpoint={"dir": str(tmp_path / "ckpt"), "interval_steps": STEPS},
    )
    history, _ = train(raw, checkpointer=True)
    _trained_in_sync(history, range(1, STEPS + 1))
    # The reference is the model with its adapters off: B starts at zero, so the first
    # step's KL is zero (up to the attention kernel a no-grad forward may pick), and the
    # trained adapter moves it.
    assert history[1]["actor/kl"] == pytest.approx(0.0, abs=1e-4)
    assert history[STEPS]["actor/kl"] > 0
    tensors = load_model_tensors(tmp_path / "ckpt" / f"step-{STEPS}")
    assert tensors and all(".lora_A." in k or ".lora_B." in k for k in tensors)


def test_validation_scores_every_val_prompt_once_over_a_tp_group(
    gpus: int, gpu_lm: Path, tmp_path: Path, cuda_config: Config, train: Train
) -> None:
    from grpo_testkit.datasets import write_text_task

    rows = 5  # uneven over 2 ranks: 3 + 2, both ranks driving one engine
    ranks = _ranks(gpus)
    raw = cuda_config(
        gpu_lm, write_text_task(tmp_path / "train.jsonl"), ranks, tp=ranks,
        trainer={"total_steps": 2, "val_interval_steps": 1},
    )
    raw["data"]["val_files"] = [str(write_text_task(tmp_path / "val.jsonl", rows=rows))]
    history, _ = train(raw)
    assert sorted(history) == [0, 1, 2]
    for step in (0, 1, 2):
        assert history[step]["val/samples"] == rows, step
        assert 0.0 <= history[step]["val/reward_mean"] <= 1.0, step
    _trained_in_sync(history, range(1, 3))


def test_resume_loads_the_checkpoint_exactly_and_continues(
    gpus: int, gpu_lm: Path, tmp_path: Path, cuda_config: Config, train: Train
) -> None:
    import torch

    from grpo_testkit.datasets import write_text_task
    from grpo_trainer.checkpointing.export import load_model_tensors
    from grpo_trainer.checkpointing.files import atomic_write
    from grpo_trainer.checkpointing.tracker import Tracker

    data = write_text_task(tmp_path / "t.jsonl")

    def config(ckpt: Path) -> dict[str, Any]:
        return cuda_config(
            gpu_lm, data, _ranks(gpus), trainer={"total_steps": 4},
            checkpoint={"dir": str(ckpt), "interval_steps": 2, "keep": 2},
        )

    reference, _ = train(config(tmp_path / "ref"), checkpointer=True)
    # What a run that died during step 3 leaves behind: step 2, committed.
    ckpt = tmp_path / "resumed"
    ckpt.mkdir()
    shutil.copytree(tmp_path / "ref" / "step-2", ckpt / "step-2")
    atomic_write(ckpt / "latest", Tracker(step=2, dir="step-2").model_dump_json().encode())

    def loaded(trainer: Any) -> tuple[int, dict[str, torch.Tensor]]:
        from grpo_trainer.rank.worker import Worker

        return trainer.step, trainer.group.call(Worker.full_params)[0]

    resumed, (step, params) = train(config(ckpt), checkpointer=True, before=loaded)
    assert step == 2  # it did not start again at step 1
    saved = load_model_tensors(ckpt / "step-2")
    assert params.keys() <= saved.keys()
    for name, value in params.items():  # the GPUs hold what was saved, bit for bit
        assert torch.equal(value.cpu(), saved[name].to(value.dtype)), name
    _trained_in_sync(resumed, range(3, 5))
    for s in (3, 4):  # the scheduler resumed where it was
        assert resumed[s]["actor/lr"] == reference[s]["actor/lr"], s
