"""vLLM for real (CPU build): a prompt with more than the 4 images vLLM used to be limited to
generates (issue 49, item 4), and the model runner is the one chosen on purpose (item 6)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from grpo_testkit.datasets import png
from grpo_testkit.dist import run_ranks
from grpo_testkit.image_limit_check import generate_from_the_data
from grpo_trainer.rollout.vllm_engine import VLLM_ENV_DEFAULTS

pytestmark = pytest.mark.timeout(900)
RUNNER = "VLLM_USE_V2_MODEL_RUNNER"


def test_a_five_image_prompt_generates(vllm_vlm: Path, tmp_path: Path) -> None:
    """vLLM refused it at every generate ("At most 4 image(s) may be provided in one
    prompt"): the limit is now the most images a loaded row has. Images at the tiny
    processor's bounds (28 x 28 pixels, 1 token each) keep the prompt short."""
    images = [png((40 * i, 200 - 30 * i, 90), (28 + 4 * i, 28)) for i in range(5)]
    data = tmp_path / "five.jsonl"
    for i, pic in enumerate(images):
        (tmp_path / f"{i}.png").write_bytes(pic)
    rows = [{"problem": "<image>" * 5 + "How many pictures?", "answer": "5",
             "images": [f"{i}.png" for i in range(5)]},
            {"problem": "<image>What colour?", "answer": "red", "images": ["0.png"]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config: dict[str, Any] = {
        "model": {"path": str(vllm_vlm)},
        "data": {"train_files": [str(data)], "max_prompt_length": 128,
                 "image_min_pixels": 28 * 28, "image_max_pixels": 2 * 28 * 28},
        "rollout": {"engine": "vllm", "n": 2, "max_new_tokens": 4},
        "actor": {"dtype": "float32"},
        "resources": {"num_workers": 1},
        "trainer": {"rollout_batch_size": 2},
    }
    (result,) = run_ranks(generate_from_the_data, 1, {"config": config}, timeout_s=900)
    assert result["limit"] == 5 and result["images"] == [5, 1]
    assert [len(gens) for gens in result["generated"]] == [2, 2]
    assert all(len(g) > 0 for gens in result["generated"] for g in gens)
    # The runner the CPU tier exercises: V1's (the GPU runs it too: VLLM_ENV_DEFAULTS).
    assert result["runner"] == "vllm.v1.worker.cpu_model_runner"


def test_vllm_would_pick_runner_v2_on_a_gpu_and_the_engines_environment_picks_v1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vllm/config/vllm.py, ``VllmConfig.use_v2_model_runner``: VLLM_USE_V2_MODEL_RUNNER
    first; unset, V2 wherever Triton works and none of V2's unsupported features is asked
    for (none of them is here), else V1. On this CPU build Triton has no CPU backend
    (triton_utils/importing.py: HAS_TRITON False), so the CPU tier runs V1 whatever the
    environment; on a GPU HAS_TRITON is True and vLLM alone would take V2."""
    import vllm.config.vllm as vllm_config_module

    use_v2 = vars(vllm_config_module.VllmConfig)["use_v2_model_runner"].fget
    config = types.SimpleNamespace(  # what the property reads of a VllmConfig
        attention_config=types.SimpleNamespace(hisparse_config=None),
        watermark_config=None,
        _get_v2_model_runner_unsupported_features=lambda: [],
    )
    monkeypatch.setenv(RUNNER, "unset below")  # monkeypatch restores the environment
    monkeypatch.delenv(RUNNER)
    assert vllm_config_module.HAS_TRITON is False and use_v2(config) is False  # this build
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)  # as on a GPU
    assert use_v2(config) is True
    for name, value in VLLM_ENV_DEFAULTS.items():
        monkeypatch.setenv(name, value)
    assert use_v2(config) is False
