"""Sharded init's pure parts: which rows a rank holds and which file bytes those are."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_trainer.sharded_load import byte_range, safetensors_layout

pytestmark = pytest.mark.unit


def test_rows_of_a_dim0_shard_are_one_contiguous_byte_range() -> None:
    # 10 rows of 4 bf16 values (8 bytes a row) starting at byte 100: rows 6..10.
    assert byte_range(100, 180, [10, 4], (slice(6, 10), slice(0, 4))) == (148, 180)
    # An empty last chunk reads nothing.
    assert byte_range(100, 180, [10, 4], (slice(10, 10), slice(0, 4))) == (180, 180)


def test_a_region_that_is_not_whole_rows_falls_back_to_the_whole_tensor() -> None:
    assert byte_range(100, 180, [10, 4], (slice(0, 10), slice(0, 2))) == (100, 180)
    assert byte_range(100, 104, [], ()) == (100, 104)  # a scalar


def test_layout_matches_what_safetensors_reads(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors = {"b": torch.arange(12, dtype=torch.bfloat16).reshape(6, 2), "a": torch.ones(3)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    start, layout = safetensors_layout(path)
    raw = path.read_bytes()
    begin, end = byte_range(*layout["b"], (slice(3, 6), slice(0, 2)))
    rows = torch.frombuffer(bytearray(raw[start + begin : start + end]), dtype=torch.bfloat16)
    with safe_open(path, framework="pt") as f:
        assert torch.equal(rows.reshape(3, 2), f.get_slice("b")[3:6])
    assert layout["a"][2] == [3]
