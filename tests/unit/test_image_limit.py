"""The image limit from the data (issue 49, item 4): each row's images are counted when the
data is loaded; a row with more than ``data.max_images_per_prompt`` (spec.data.
maxImagesPerPrompt, at most MAX_IMAGES_PER_PROMPT) is dropped or refused by
``data.overlong_prompts``, named by file, row and count; vLLM's ``limit_mm_per_prompt`` is
the most a loaded row has, and the planner sizes a prompt's vision activations by the
same setting."""

from __future__ import annotations

import json
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_api.catalog import GPU_CATALOG as CATALOG
from grpo_api.model.shape import known_family
from grpo_api.trainer_config import MAX_IMAGES_PER_PROMPT, Config, DataConfig
from grpo_operator.planner.layout import image_tokens, images_per_prompt, micro_batch, prompt_tokens
from grpo_operator.planner.types import Settings
from grpo_testkit.tiny_configs import tiny_config
from grpo_trainer.config_error import ConfigError
from grpo_trainer.dataset import PromptDataset, sized_for_media
from grpo_trainer.rollout.build import vllm_config
from grpo_trainer.rollout.vllm_engine import VLLMEngineConfig, engine_kwargs

pytestmark = pytest.mark.unit


def _jsonl(path: Path, counts: list[int]) -> Path:
    """One row per count, with that many images (paths to one PNG: only its header is read
    at load)."""
    from grpo_testkit.datasets import png

    (path.parent / "p.png").write_bytes(png((1, 2, 3), (8, 8)))
    rows = [{"problem": "<image>" * n + f"row {i}", "answer": "1", "images": ["p.png"] * n}
            for i, n in enumerate(counts)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_over_the_limit_are_dropped_and_each_is_named_with_its_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = _jsonl(tmp_path / "a.jsonl", [1, 5, 0, 3])
    ds = PromptDataset([str(f)], DataConfig(train_files=["x"], max_images_per_prompt=4))
    assert [r.row for r in ds.records] == [0, 2, 3]
    (line,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert line.startswith("dropped 1 of 4 prompts of data.train_files (data.overlong_prompts "
                           "(spec.data.overlongPrompts): drop): ")
    assert (f"{f} row 1: the prompt has 5 images, more than the 4 of data.max_images_per_prompt "
            f"(spec.data.maxImagesPerPrompt) (at most {MAX_IMAGES_PER_PROMPT})") in line


def test_rows_over_the_limit_fail_the_run_when_asked_naming_file_row_count_and_fix(
    tmp_path: Path,
) -> None:
    f = _jsonl(tmp_path / "a.jsonl", [1, 2, 3])
    cfg = DataConfig(train_files=["x"], max_images_per_prompt=2, overlong_prompts="fail")
    with pytest.raises(ConfigError) as err:
        PromptDataset([str(f)], cfg, "data.val_files")
    assert err.value.field == "data.max_images_per_prompt"
    assert str(err.value) == (
        f"data.max_images_per_prompt: {f} row 2: the prompt has 3 images, more than the 2 of "
        "data.max_images_per_prompt (spec.data.maxImagesPerPrompt) (at most "
        f"{MAX_IMAGES_PER_PROMPT}); raise it (at most {MAX_IMAGES_PER_PROMPT}) or split the "
        "row, or set data.overlong_prompts (spec.data.overlongPrompts) to drop to leave such "
        "prompts out")


def test_the_documented_maximum_applies_by_default_and_cannot_be_raised(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "a.jsonl", [MAX_IMAGES_PER_PROMPT, MAX_IMAGES_PER_PROMPT + 1])
    with pytest.raises(ConfigError, match=rf"row 1: the prompt has {MAX_IMAGES_PER_PROMPT + 1}"):
        PromptDataset([str(f)], DataConfig(train_files=["x"], overlong_prompts="fail"))
    with pytest.raises(ValueError, match="max_images_per_prompt"):
        DataConfig(train_files=["x"], max_images_per_prompt=MAX_IMAGES_PER_PROMPT + 1)
    only_over = _jsonl(tmp_path / "b.jsonl", [MAX_IMAGES_PER_PROMPT + 1])
    with pytest.raises(ConfigError, match=r"every prompt has too many images: .*b\.jsonl row 0"):
        PromptDataset([str(only_over)], DataConfig(train_files=["x"]))


def test_vllms_limit_is_the_most_images_a_loaded_row_has(tmp_path: Path) -> None:
    """Train and val rows both reach the engines; text-only data still gets 1 (vLLM then
    builds the vision tower every weight sync writes)."""
    train = PromptDataset([str(_jsonl(tmp_path / "t.jsonl", [1, 5, 2]))],
                          DataConfig(train_files=["x"]))
    val = PromptDataset([str(_jsonl(tmp_path / "v.jsonl", [7]))], DataConfig(train_files=["x"]))
    assert train.most("images") == 5 and val.most("images") == 7
    cfg = Config.model_validate({"model": {"path": "/m"}, "data": {"train_files": ["x"]}})
    sized = sized_for_media(cfg, train, val)
    assert sized.data.max_images_per_prompt == 7
    assert sized_for_media(cfg).data.max_images_per_prompt == 1

    # The model's config (a tiny Qwen2.5-VL's, as transformers builds it) and what
    # vllm_config reads of the rank's tokenizer side.
    hf = tiny_config("qwen2_5_vl")
    tokens: Any = types.SimpleNamespace(encoder=types.SimpleNamespace(bounds=None))
    engine = vllm_config(sized, hf, torch.float32, tokens, 2, tp=1, sleep=False, lora_rank=0)
    assert engine.max_images_per_prompt == 7
    for on_cpu in (False, True):
        kwargs = engine_kwargs(engine, on_cpu=on_cpu, sleep_mode=False, distributed=False)
        assert kwargs["limit_mm_per_prompt"] == {"image": 7, "video": 0}


def test_an_engine_config_without_the_data_allows_the_documented_maximum() -> None:
    bare = VLLMEngineConfig("m", "bfloat16", 1, 64, 4, 0.5, 0, 0, False)
    assert bare.max_images_per_prompt == MAX_IMAGES_PER_PROMPT
    assert replace(bare, max_images_per_prompt=5).max_images_per_prompt == 5


@pytest.mark.parametrize(("images", "prompt", "expected"), [
    (1, 32768, 1),  # the default: one image at maxPixels per prompt, as planned before
    # EasyR1's lengths: an image of maxPixels (1280 tokens) and a 2048-token prompt hold
    # 1.6 images' worth of image tokens: the prompt's length bounds them.
    (4, 2048, 2048 / 1280),
    (MAX_IMAGES_PER_PROMPT, 32768, MAX_IMAGES_PER_PROMPT),  # a long prompt: the setting does
])
def test_the_planner_sizes_a_prompts_images_by_the_spec(
    images: int, prompt: int, expected: float
) -> None:
    """The operator never sees the data: spec.data.maxImagesPerPrompt says how many images
    a prompt has at most (the trainer enforces it at load), and a prompt's vision
    activations are planned for that many within the prompt's length."""
    from grpo_api.job import parse_spec
    from grpo_operator.planner.core import geometry
    from grpo_testbed.examples import example_job

    spec = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]
    spec["data"] = {**spec["data"], "maxPromptLength": prompt, "maxResponseLength": 1024,
                    "maxPixels": 1003520, "maxImagesPerPrompt": images}
    _, shape = known_family("Qwen/Qwen2.5-VL-7B-Instruct") or ("", None)
    assert shape is not None
    geo = replace(geometry(parse_spec(spec), CATALOG, shape, "known", 1), global_batch_size=320)
    assert geo.max_images_per_prompt == images
    assert prompt_tokens(geo) == prompt and image_tokens(geo) == 1280
    assert images_per_prompt(geo) == pytest.approx(expected)
    # By samples: each row's prompt brings that many; by tokens, no more than the budget holds.
    st = Settings(rank0_init=False, offload_params=False, offload_optimizer=False,
                  gradient_checkpointing=False, micro_batch_size=4,
                  rollout_gpu_memory_utilization=0.5, rollout_n=5, ray_object_store_gib=2)
    by_samples = micro_batch(geo, st)
    assert by_samples.images == pytest.approx(2 * expected)  # 4 samples span 2 groups of 5
    budget = 4 * prompt
    by_tokens = micro_batch(geo, replace(st, micro_batch_tokens=budget))
    assert by_tokens.images * image_tokens(geo) <= budget


def test_the_setting_reaches_the_trainer_config_within_its_bound() -> None:
    from grpo_api.job import parse_spec
    from grpo_operator.planner import plan_memory
    from grpo_operator.render import JobRef
    from grpo_operator.render.trainer_config import trainer_config
    from grpo_testbed.examples import example_job

    spec = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]
    assert parse_spec(spec).data.max_images_per_prompt == 1  # the plan's one image a prompt
    spec["data"] = {**spec["data"], "maxImagesPerPrompt": 5}
    parsed = parse_spec(spec)
    cfg = trainer_config(parsed, plan_memory(parsed), JobRef("j", "ns", "u"))
    assert Config.model_validate(cfg).data.max_images_per_prompt == 5
    spec["data"]["maxImagesPerPrompt"] = MAX_IMAGES_PER_PROMPT + 1
    with pytest.raises(ValueError, match="maxImagesPerPrompt"):
        parse_spec(spec)
