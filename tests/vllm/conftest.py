"""vLLM tier: its tiny models (`vllm_lm`, `vllm_vlm`, `vllm_lora_lm`) are in tests/conftest.py,
beside the GPU tier's, with the head_dim vLLM's CPU attention takes."""
