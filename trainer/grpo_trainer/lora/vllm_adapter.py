"""The actor's adapter as a vLLM LoRA request, replaced at every weight sync.

vLLM loads LoRA adapters from PEFT directories. Each sync writes the adapters (a few
MB to a few hundred: never the base) to a fresh directory under a private temporary
root, registers them under a new adapter id (a reused id would be served from vLLM's
adapter cache, stale), and drops the previous one; the directory is removed once vLLM
has loaded it. Requests then carry ``request``. Re-adding at every sync also covers
an engine that lost its adapters in sleep mode.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from grpo_api.trainer_config import LoraConfig

from .peft_format import write_adapter_dir


class AdapterSlot:
    def __init__(self, base_model: str) -> None:
        self.base_model = base_model
        self.request: Any = None  # vllm.lora.request.LoRARequest once an adapter is in
        self._id = 0

    def replace(self, llm: Any, tensors: Mapping[str, torch.Tensor], lora: LoraConfig) -> None:
        from vllm.lora.request import LoRARequest

        self._id += 1
        root = Path(tempfile.mkdtemp(prefix="grpo-lora-"))
        try:
            path = write_adapter_dir(root / "adapter", lora, tensors, self.base_model)
            request = LoRARequest(f"actor-{self._id}", self._id, str(path))
            if self.request is not None:
                llm.llm_engine.remove_lora(self.request.lora_int_id)
            if not llm.llm_engine.add_lora(request):
                raise RuntimeError(f"vLLM refused the actor's adapter ({path})")
            self.request = request
        finally:
            shutil.rmtree(root, ignore_errors=True)
