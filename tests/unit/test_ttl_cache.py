"""The operator's cache of API reads (ttl_cache.py): one read serves a burst, a read
older than its time is made again, a failed read is not kept."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from grpo_operator.ttl_cache import TtlCache

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_value_is_read_once_within_its_time_and_again_after_it() -> None:
    clock, reads = Clock(), []
    cache: TtlCache[str, int] = TtlCache(5.0, clock)

    def load(ns: str) -> int:
        reads.append(ns)
        return len(reads)

    assert cache.get("a", lambda: load("a")) == 1
    clock.now += 4.9
    assert cache.get("a", lambda: load("a")) == 1  # the same answer, no read
    assert cache.get("b", lambda: load("b")) == 2  # each key its own
    clock.now += 0.2
    assert cache.get("a", lambda: load("a")) == 3
    assert reads == ["a", "b", "a"]


def test_a_failed_read_reaches_the_caller_and_is_not_kept() -> None:
    cache: TtlCache[str, int] = TtlCache(5.0, Clock())

    def refuse() -> int:
        raise RuntimeError("API server away")

    with pytest.raises(RuntimeError, match="away"):
        cache.get("a", refuse)
    assert cache.get("a", lambda: 7) == 7


def test_a_burst_of_readers_makes_one_read() -> None:
    cache: TtlCache[str, int] = TtlCache(60.0)
    reads = 0

    def slow_read() -> int:
        nonlocal reads
        reads += 1
        time.sleep(0.2)  # the API read the others arrive during
        return 42

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: cache.get("ns", slow_read), range(16)))
    assert answers == [42] * 16 and reads == 1


def test_forget_makes_the_next_get_read_again() -> None:
    cache: TtlCache[str, int] = TtlCache(60.0, Clock())
    assert cache.get("a", lambda: 1) == 1
    cache.forget()
    assert cache.get("a", lambda: 2) == 2


def test_expired_keys_are_dropped_as_new_ones_are_read() -> None:
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(5.0, clock)
    cache.get("gone", lambda: 1)
    clock.now += 6
    cache.get("new", lambda: 2)
    assert set(cache._values) == {"new"} and not cache._loading
