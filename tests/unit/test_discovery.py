"""The start-up gate (discovery.py): the operator waits until API discovery lists every
kind it watches, because Kopf scans discovery only once."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import pytest

from grpo_operator.discovery import (
    REQUIRED,
    DiscoveryTimeout,
    GroupVersions,
    ServedPlurals,
    unserved,
    wait_until_served,
)

pytestmark = pytest.mark.unit

ALL = ({"grpo.dev/v1alpha1", "ray.io/v1", "apps/v1"},
       {"grpo.dev/v1alpha1": {"grpojobs", "grpojobs/status"}, "ray.io/v1": {"rayclusters"}})


def names(missing: Collection[object]) -> list[str]:
    return [w.name for w in missing]  # type: ignore[attr-defined]


def test_everything_listed_leaves_nothing_to_wait_for() -> None:
    assert unserved(REQUIRED, *ALL) == []


def test_a_group_that_apis_does_not_list_yet_is_unserved() -> None:
    """The window after a CRD is Established and before its APIService is Available."""
    groups, plurals = ALL
    assert names(unserved(REQUIRED, groups - {"grpo.dev/v1alpha1"}, plurals)) == [
        "grpojobs.grpo.dev"]


def test_a_group_version_without_the_plural_is_unserved() -> None:
    groups, plurals = ALL
    assert names(unserved(REQUIRED, groups, {**plurals, "ray.io/v1": {"rayjobs"}})) == [
        "rayclusters.ray.io"]


def test_the_core_api_is_never_read() -> None:
    """Pods are in /api/v1, which every API server serves."""
    assert "pods" not in names(unserved(REQUIRED, set(), {}))


class ScriptedDiscovery:
    """What a freshly installed CRD looks like to repeated discovery reads: absent, then
    listed. `asked` records what each read was asked for."""

    def __init__(self, absent_reads: int) -> None:
        self.absent_reads = absent_reads
        self.asked: list[list[str]] = []

    def __call__(self, wanted: Collection[str]) -> tuple[GroupVersions, ServedPlurals]:
        self.asked.append(list(wanted))
        if len(self.asked) <= self.absent_reads:
            groups, plurals = ALL
            return groups - {"grpo.dev/v1alpha1"}, plurals
        return ALL


def test_start_up_waits_until_the_crd_is_listed() -> None:
    read = ScriptedDiscovery(absent_reads=3)
    waited = asyncio.run(wait_until_served(read, timeout_s=10, poll_s=0.01))
    assert len(read.asked) == 4 and waited >= 0.03
    assert read.asked[0] == ["grpo.dev/v1alpha1", "ray.io/v1"]


def test_a_crd_that_never_appears_ends_the_start_naming_it_and_the_fix() -> None:
    read = ScriptedDiscovery(absent_reads=10**6)
    with pytest.raises(DiscoveryTimeout) as err:
        asyncio.run(wait_until_served(read, timeout_s=0.05, poll_s=0.01))
    assert "grpojobs.grpo.dev" in str(err.value)
    assert "kubectl apply -f crds/grpojob.yaml" in str(err.value)
