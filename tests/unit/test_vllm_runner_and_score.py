"""vLLM's model runner, chosen on purpose (issue 49, item 6), and ``VLLMEngine.score``
without a temperature vLLM would ignore (item 7). A stand-in vLLM records what the engine
was started with; tests/vllm/test_image_limit_and_runner.py pins the choice against
vLLM's own ``VllmConfig.use_v2_model_runner``."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest
import torch

from grpo_trainer.algorithm.samples import EncodedPrompt
from grpo_trainer.data import Record
from grpo_trainer.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig

pytestmark = pytest.mark.unit
RUNNER = "VLLM_USE_V2_MODEL_RUNNER"


def _stand_in_vllm(monkeypatch: pytest.MonkeyPatch, seen: dict[str, Any]) -> None:
    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            seen["env"] = {k: os.environ.get(k) for k in (RUNNER, "VLLM_ENABLE_V1_MULTIPROCESSING")}
            self.llm_engine = types.SimpleNamespace(reset_encoder_cache=lambda: None)

    platform = types.SimpleNamespace(is_cpu=lambda: True, is_sleep_mode_available=lambda: False)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    monkeypatch.setitem(sys.modules, "vllm.platforms",
                        types.SimpleNamespace(current_platform=platform))
    monkeypatch.setattr("grpo_trainer.rollout.vllm_engine.remove_stale_vllm_segments",
                        lambda: None)
    # Whatever the test sets, monkeypatch puts the environment back as it was.
    monkeypatch.setenv(RUNNER, "unset below")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")


def test_every_engine_starts_on_the_v1_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Left to vLLM 0.32 the runner follows what is installed: Model Runner V2 on any GPU
    (Triton present), V1 on the CPU build the vLLM tier runs (vllm/config/vllm.py,
    ``VllmConfig.use_v2_model_runner``). Every engine, the ranks' and those apart, starts
    through VLLMEngine, which chooses V1 before vLLM reads its environment."""
    seen: dict[str, Any] = {}
    _stand_in_vllm(monkeypatch, seen)
    monkeypatch.delenv(RUNNER)
    VLLMEngine(VLLMEngineConfig("m", "bfloat16", 1, 64, 4, 0.5, 0, 0, False))
    assert seen["env"] == {RUNNER: "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def test_a_runner_the_pods_env_chose_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """spec.pods env may try V2 on purpose; the in-process engine core is not optional."""
    seen: dict[str, Any] = {}
    _stand_in_vllm(monkeypatch, seen)
    monkeypatch.setenv(RUNNER, "1")
    VLLMEngine(VLLMEngineConfig("m", "bfloat16", 1, 64, 4, 0.5, 0, 0, False))
    assert seen["env"] == {RUNNER: "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def test_score_takes_no_temperature_and_returns_the_response_tokens_log_probs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's prompt log-probs skip the sampling processors whatever the request's
    temperature (vllm/v1/worker/gpu_model_runner.py ``_get_prompt_logprobs_dict``:
    ``compute_logprobs`` of the raw logits, "processed_* and raw_* yield the same scores
    here"): a temperature argument was silently ignored, so none is taken."""
    requested: list[dict[str, Any]] = []

    def sampling_params(**kwargs: Any) -> dict[str, Any]:
        requested.append(kwargs)
        return kwargs

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=sampling_params))
    prompt = EncodedPrompt(Record(0, "q", "a"), torch.tensor([5, 6]), raw_prompt_ids=[5, 6])
    response = [7, 8]

    def generate(inputs: list[dict[str, Any]], params: Any, **_: Any) -> list[Any]:
        ids = inputs[0]["prompt_token_ids"]
        lps = [None] + [{t: types.SimpleNamespace(logprob=-0.1 * t)} for t in ids[1:]]
        return [types.SimpleNamespace(prompt_token_ids=ids, prompt_logprobs=lps)]

    engine = object.__new__(VLLMEngine)
    engine.adapters = None
    engine.llm = types.SimpleNamespace(generate=generate)  # type: ignore[assignment]
    (scores,) = engine.score([prompt], [response])
    assert scores.tolist() == pytest.approx([-0.7, -0.8])
    assert requested == [{"max_tokens": 1, "prompt_logprobs": 0, "logprobs": 0}]
    with pytest.raises(TypeError):
        engine.score([prompt], [response], 0.7)  # type: ignore[call-arg]
