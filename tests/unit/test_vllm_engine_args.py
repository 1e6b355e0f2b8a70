"""vLLM's engine arguments and sleep level: decided from the config alone, so the CUDA
branch (which no CPU test can start) is pinned here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from grpo_trainer.media.images import PixelBounds
from grpo_trainer.rollout.vllm_engine import VLLMEngineConfig, engine_kwargs, sleep_level

pytestmark = pytest.mark.unit

FULL = VLLMEngineConfig(
    model_path="/models/qwen2.5-vl-72b",
    dtype="bfloat16",
    tensor_parallel_size=4,
    max_model_len=4096,
    max_num_seqs=64,
    gpu_memory_utilization=0.55,
    cpu_kv_cache_bytes=1 << 30,
    seed=1,
    enable_sleep_mode=True,
)
LORA = replace(FULL, lora_rank=64)


def cuda(cfg: VLLMEngineConfig) -> dict[str, object]:
    return engine_kwargs(cfg, on_cpu=False, sleep_mode=True, distributed=True)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_cuda_engines_never_build_vllms_custom_all_reduce(tp: int) -> None:
    """Each rank actor sees one GPU: vLLM's custom all-reduce would map its TP peers to
    device ids it cannot see (IndexError at start-up). NCCL all-reduces instead."""
    kwargs = cuda(replace(FULL, tensor_parallel_size=tp))
    assert kwargs["disable_custom_all_reduce"] is True
    assert kwargs["tensor_parallel_size"] == tp
    assert kwargs["distributed_executor_backend"] == "external_launcher"


def test_full_fine_tuning_discards_the_weights_asleep() -> None:
    """Every sync rewrites every parameter (tests/vllm: test_a_sync_rewrites_every_
    parameter_vllm_holds), so sleep level 2 drops them instead of copying them to the host
    and back each step. Placeholder weights at start-up are not used: vLLM's dummy loader
    also randomises buffers no sync carries."""
    assert sleep_level(FULL) == 2
    assert "load_format" not in cuda(FULL)


def test_lora_keeps_its_base_asleep() -> None:
    """Only the adapters travel at a sync: the base must survive each sleep (level 1)."""
    kwargs = cuda(LORA)
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 64
    assert sleep_level(LORA) == 1


def test_cuda_sizes_by_utilisation_and_cpu_by_kv_bytes() -> None:
    gpu = cuda(FULL)
    assert gpu["gpu_memory_utilization"] == 0.55 and gpu["enable_sleep_mode"] is True
    assert "kv_cache_memory_bytes" not in gpu and "enforce_eager" not in gpu
    cpu = engine_kwargs(FULL, on_cpu=True, sleep_mode=False, distributed=True)
    assert cpu["kv_cache_memory_bytes"] == 1 << 30 and cpu["enforce_eager"] is True
    assert "gpu_memory_utilization" not in cpu and cpu["enable_sleep_mode"] is False


def test_tensor_parallel_needs_the_trainers_process_group() -> None:
    with pytest.raises(ValueError, match=r"torch\.distributed"):
        engine_kwargs(FULL, on_cpu=False, sleep_mode=True, distributed=False)
    alone = engine_kwargs(
        replace(FULL, tensor_parallel_size=1), on_cpu=False, sleep_mode=True, distributed=False
    )
    assert "distributed_executor_backend" not in alone


VLM = replace(FULL, image_bounds=PixelBounds(min_pixels=3136, max_pixels=1003520, factor=28))


def test_a_vlm_engine_resizes_to_the_trainers_pixel_bounds() -> None:
    """vLLM applies the checkpoint processor's own limit (Qwen2/2.5-VL: 12,845,056 pixels)
    unless ``mm_processor_kwargs`` says otherwise: vllm/model_executor/models/qwen2_vl.py:
    952-978 (``_get_vision_size``: the processor's ``size`` overridden by ``min_pixels`` /
    ``max_pixels``), used for every image (:1017-1024) and for the dummy image of the
    start-up encoder profile (:1079-1110). The trainer hands over images it already resized
    to these bounds, so vLLM's resize leaves them alone (tests/vllm: the token counts
    agree). On both platforms: the CPU tests run this very path."""
    for on_cpu in (False, True):
        kwargs = engine_kwargs(VLM, on_cpu=on_cpu, sleep_mode=not on_cpu, distributed=True)
        assert kwargs["mm_processor_kwargs"] == {"min_pixels": 3136, "max_pixels": 1003520}
    assert "mm_processor_kwargs" not in cuda(FULL)  # a text model has no image processor


def test_vllm_budgets_its_encoder_for_images_not_videos() -> None:
    """The trainer sends no videos. A modality left out of ``limit_mm_per_prompt`` gets 999
    a prompt (vllm/config/multimodal.py:702-706), and the encoder's cache budget and its
    start-up profile go to the modality with the most tokens an item
    (multimodal/encoder_budget.py:73-138, 184-188; v1/worker/gpu_model_runner.py's
    profile_run): a video, sized by max_model_len, instead of the largest image the pixel
    bounds allow. tests/vllm checks the budget the CPU engine ends up with. Images: the
    most a loaded prompt has (tests/unit/test_image_limit.py)."""
    for on_cpu in (False, True):
        kwargs = engine_kwargs(replace(VLM, max_images_per_prompt=5), on_cpu=on_cpu,
                               sleep_mode=not on_cpu, distributed=True)
        assert kwargs["limit_mm_per_prompt"] == {"image": 5, "video": 0}


def test_a_vlm_engine_keeps_no_processed_images_in_host_ram() -> None:
    """vLLM's multimodal processor cache (vllm/config/multimodal.py:357,
    ``mm_processor_cache_gb`` = 4 by default) keeps processed images for reuse, in two
    mirrored halves with an in-process engine (multimodal/cache/factories.py:23-87: an LRU
    sender in the renderer, a receiver in the engine core): up to 8 GiB of host RAM per
    rank that no plan counts (ROLL#80: a host "leak" on Qwen2.5-VL). 0 turns both off
    (factories.py:32-33); tests/vllm checks that the engine then has neither."""
    for on_cpu in (False, True):
        kwargs = engine_kwargs(VLM, on_cpu=on_cpu, sleep_mode=not on_cpu, distributed=True)
        assert kwargs["mm_processor_cache_gb"] == 0


def test_cuda_graphs_leave_the_gpu_while_vllm_sleeps() -> None:
    """vLLM 0.32's ``sleep_mode_offload_cudagraph`` (vllm/config/model.py:380, default
    False; vllm/engine/arg_utils.py:781) puts captured graphs into the cuMem pool when
    sleep mode is on with the cumem backend and graphs are captured
    (vllm/config/vllm.py:688-700, ``use_cumem_cudagraph_pool``); a sleep then copies that
    pool to pinned host RAM at every level and frees it on the GPU
    (device_allocator/sleep_mode_backend.py:127-137: tags "runtime" and "cudagraph";
    device_allocator/cumem.py:265-276). Without it the graphs (0.5-2 GiB) stay on the GPU
    through the update. CUDA with sleep mode only: the CPU engine runs eager."""
    for cfg in (FULL, LORA, VLM):
        assert cuda(cfg)["sleep_mode_offload_cudagraph"] is True
    assert "sleep_mode_offload_cudagraph" not in engine_kwargs(
        FULL, on_cpu=False, sleep_mode=False, distributed=True
    )
    cpu = engine_kwargs(FULL, on_cpu=True, sleep_mode=False, distributed=True)
    assert "sleep_mode_offload_cudagraph" not in cpu and cpu["enforce_eager"] is True
