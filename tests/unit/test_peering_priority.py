"""Exactly one replica of a peering reconciles, and a newcomer never takes over
(peering.py): the priorities each replica derives, checked against Kopf's own rule."""

from __future__ import annotations

import asyncio
import datetime
import random

import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.configs.configuration import OperatorSettings
from kopf._core.engines import peering as kopf_peering

from grpo_operator.peering import SALT_RANGE, replica_priority

pytestmark = pytest.mark.unit


def paused_by_kopf(own: str, priorities: dict[str, int]) -> bool:
    """Kopf's own verdict for replica `own` given the live peers' priorities."""
    settings = OperatorSettings()
    settings.peering.name = "grpo"
    settings.peering.priority = priorities[own]
    now = datetime.datetime.now(datetime.UTC).isoformat()
    event = {"type": "MODIFIED", "object": {
        "metadata": {"name": "grpo"},
        "status": {ident: {"priority": p, "lifetime": 60, "lastseen": now}
                   for ident, p in priorities.items()}}}

    async def verdict() -> bool:
        toggle = aiotoggles.Toggle(True)  # Kopf starts a mandatory peering paused
        woken = asyncio.Event()  # as a next event would: no wait for the peers' deadlines
        woken.set()
        await kopf_peering.process_peering_event(
            raw_event=event, namespace=None, resource=None, identity=own,  # type: ignore[arg-type]
            settings=settings, autoclean=False, conflicts_found=toggle, stream_pressure=woken)
        return toggle.is_on()

    return asyncio.run(verdict())


def test_kopf_pauses_every_replica_of_equal_priority() -> None:
    """Why a fixed --priority cannot run two replicas: nobody would reconcile."""
    assert paused_by_kopf("a", {"a": 0, "b": 0}) and paused_by_kopf("b", {"a": 0, "b": 0})


def test_the_oldest_replica_alone_runs_even_when_started_in_the_same_millisecond() -> None:
    t = 1_790_000_000.123
    rng = random.Random(7)
    salts = rng.sample(range(SALT_RANGE), 3)
    prios = {"old": replica_priority(t, salts[0]),
             "twin": replica_priority(t, salts[1]),  # same ms: the salt decides
             "new": replica_priority(t + 30, salts[2])}
    running = [r for r in prios if not paused_by_kopf(r, prios)]
    assert len(running) == 1
    assert running[0] in {"old", "twin"}
    assert prios["new"] < min(prios["old"], prios["twin"])  # a newcomer never preempts


def test_a_hand_run_operator_outranks_the_deployed_replicas() -> None:
    deployed = replica_priority(1_790_000_000.0, SALT_RANGE - 1)
    assert deployed < 0 < 666  # Kopf's default priority and `kopf run --dev`'s
    assert abs(replica_priority(4_102_444_800.0, SALT_RANGE - 1)) < 2**63  # year 2100


def test_a_salt_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="salt must be in"):
        replica_priority(1.0, SALT_RANGE)
