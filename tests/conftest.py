"""Tier markers follow the directory a test lives in, so `-m unit` etc. always work."""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "trainer", "vllm", "cluster", "e2e", "images", "gpu")
_DIR_TIER = {"unit": "unit", "trainer": "trainer", "vllm": "vllm", "cluster": "cluster",
             "e2e": "e2e", "images": "images", "gpu": "gpu"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        own = {m.name for m in item.iter_markers() if m.name in TIERS}
        rel = Path(str(item.fspath)).relative_to(root)
        tier = _DIR_TIER.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if tier and tier not in own and "gpu" not in own:
            item.add_marker(getattr(pytest.mark, tier))
