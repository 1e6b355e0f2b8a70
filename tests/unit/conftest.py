"""The unit tier reaches no network: `grpo plan` reads no hub here (GRPO_PLAN_OFFLINE, its
--offline), so a plan of an example with a hub id is the known table's on every machine,
with internet or without. Tests of the hub read serve one on loopback and turn it on
(test_plan_reads_model.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _plan_reads_no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_PLAN_OFFLINE", "1")
