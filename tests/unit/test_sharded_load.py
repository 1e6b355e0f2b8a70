"""Sharded init reads tensors in file order from the safetensors header's offsets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_trainer.model.sharded_load import safetensors_layout

pytestmark = pytest.mark.unit


def test_layout_matches_what_safetensors_reads(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors = {"b": torch.arange(12, dtype=torch.bfloat16).reshape(6, 2), "a": torch.ones(3)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    start, layout = safetensors_layout(path)
    raw = path.read_bytes()
    begin, end, shape = layout["b"]
    data = torch.frombuffer(bytearray(raw[start + begin : start + end]), dtype=torch.bfloat16)
    with safe_open(path, framework="pt") as f:
        assert torch.equal(data.reshape(shape), f.get_tensor("b"))
    assert layout["a"][2] == [3]
