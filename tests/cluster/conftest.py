"""The `testbed` fixture: one real control plane for the whole test session.

A missing prerequisite (Go, or a component that cannot be built) fails the tier with
a message; it never skips.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from grpo_testbed.build import BuildError
from grpo_testbed.launcher import Testbed, running_testbed


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    logging.getLogger("grpo_testbed").setLevel(logging.INFO)
    try:
        with running_testbed() as tb:
            yield tb
    except BuildError as exc:
        pytest.fail(f"the cluster tier needs the testbed, which could not be built: {exc}\n"
                    "Run `make testbed` (needs Go >= 1.26 and the Go module proxy).",
                    pytrace=False)


@pytest.fixture
def ns(testbed: Testbed) -> Iterator[str]:
    """A fresh namespace, deleted (with everything in it) after the test.

    Deleting matters: the fake GPU nodes are few, and a test's pods holding GPUs
    would starve the next test's pods.
    """
    name = testbed.namespace("t")
    yield name
    testbed.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", check=False)
