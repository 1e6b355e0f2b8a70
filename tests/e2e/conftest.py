"""The e2e tier's real-node testbed: one per session, shared by the modules that use it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from grpo_testbed.images import OPERATOR
from grpo_testbed.launcher import Testbed, running_testbed


@pytest.fixture(scope="session")
def real_tb() -> Iterator[Testbed]:
    """Control plane, KubeRay, kwok GPU nodes and the real node (the operator's image
    imported); the untainted fake CPU node is left out, so CPU pods really run."""
    with running_testbed(real_node=True, node_images=(OPERATOR.tag,)) as t:
        yield t
