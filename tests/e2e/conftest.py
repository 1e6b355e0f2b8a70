"""The e2e tier's real-node testbed, one per module that uses it.

Not one per session: a testbed holds the node's shared image store while it runs, and a
tiny-job module's own testbed (its own fault switch) would then import the 7 GB trainer
image into a private store: minutes, and 21 GB of disk (a full run failed on it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from grpo_testbed.faults import EnvInjection
from grpo_testbed.images import OPERATOR
from grpo_testbed.launcher import Testbed, running_testbed

# test_real_node.py checks that the fault switch reaches pods with these labels only.
SWITCH = EnvInjection({"testbed.grpo.dev/switch": "on"}, {"GRPO_FAULT_INJECT": "host_oom@step=3"})


@pytest.fixture(scope="module")
def real_tb() -> Iterator[Testbed]:
    """Control plane, KubeRay, kwok GPU nodes and the real node (the operator's image
    imported); the untainted fake CPU node is left out, so CPU pods really run."""
    with running_testbed(real_node=True, node_images=(OPERATOR.tag,),
                         injections=(SWITCH,)) as t:
        yield t
