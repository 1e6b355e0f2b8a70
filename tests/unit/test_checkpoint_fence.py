"""Attempt fencing of the checkpoint directory: the decision, and claim/check on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_trainer.checkpointing.fence import AttemptSupersededError, check, claim, read_fence
from grpo_trainer.checkpointing.tracker import FENCE, parse_fence, superseded_by
from grpo_trainer.config_error import ConfigError
from grpo_trainer.errors import classify

pytestmark = pytest.mark.unit


def test_only_a_strictly_newer_attempt_fences_a_driver_out() -> None:
    assert superseded_by(3, None) is None  # nobody claimed the directory yet
    assert superseded_by(3, 2) is None  # an older attempt's directory: take it over
    assert superseded_by(3, 3) is None  # the same attempt restarted (a replacement head)
    assert superseded_by(3, 4) == 4
    assert parse_fence('{"attempt": 7}').attempt == 7  # type: ignore[union-attr]
    assert parse_fence("{") is None and parse_fence('{"attempt": "x"}') is None


def test_claim_records_the_attempt_and_refuses_an_older_one(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"  # created by the first claim
    claim(root, 0)
    assert json.loads((root / FENCE).read_text()) == {"attempt": 0}
    claim(root, 0)  # a restart of attempt 0
    claim(root, 2)
    assert read_fence(root) == 2
    with pytest.raises(AttemptSupersededError) as err:
        claim(root, 1)
    msg = str(err.value)
    assert msg.startswith("trainer.attempt: attempt 1 is superseded: attempt 2 has claimed")
    assert str(root) in msg and "GRPO_ATTEMPT to 2 or more" in msg
    assert read_fence(root) == 2  # the refused driver wrote nothing
    assert isinstance(err.value, ConfigError)
    assert (classify(err.value).code, classify(err.value).reason) == (2, "ConfigError")


def test_check_before_a_commit_sees_a_newer_claim(tmp_path: Path) -> None:
    claim(tmp_path, 1)
    check(tmp_path, 1, "committing checkpoint step 5")  # still ours
    claim(tmp_path, 2)  # attempt 2 starts while attempt 1 still runs
    with pytest.raises(AttemptSupersededError, match="not committing checkpoint step 5"):
        check(tmp_path, 1, "committing checkpoint step 5")


def test_an_unreadable_fence_counts_as_unclaimed(tmp_path: Path) -> None:
    (tmp_path / FENCE).write_text("garbage")
    assert read_fence(tmp_path) is None
    claim(tmp_path, 0)
    assert read_fence(tmp_path) == 0
