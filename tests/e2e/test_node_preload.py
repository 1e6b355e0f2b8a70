"""`grpo-testbed node-images` fills the real node's image store with containerd alone
(hack/setup.sh runs it beside the Go build), so a first demo or test run starts its node
without the trainer image's import. Here into a store of the test's own, with the small
operator image: imported once, found by image ID the second time, and left alone while a
running node holds the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_testbed.images import OPERATOR
from grpo_testbed.node.images import SANDBOX_TAG
from grpo_testbed.node.preload import preload_store
from grpo_testbed.node.store import acquire_store

pytestmark = pytest.mark.e2e


def test_preload_imports_once_then_finds_the_images(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = preload_store((OPERATOR.tag,), shared=store)
    assert first is not None
    assert set(first) == {SANDBOX_TAG, OPERATOR.tag}
    assert first[OPERATOR.tag] > 0, "a fresh store must import the operator image"
    assert (store / "io.containerd.content.v1.content" / "blobs").is_dir()

    again = preload_store((OPERATOR.tag,), shared=store)
    assert again == {SANDBOX_TAG: 0.0, OPERATOR.tag: 0.0}, \
        "images already in the store (same podman image ID) must not be imported again"


def test_preload_leaves_a_store_a_running_node_holds(tmp_path: Path) -> None:
    store = tmp_path / "store"
    held = acquire_store(tmp_path / "node", shared=store)
    try:
        assert held.shared
        assert preload_store((OPERATOR.tag,), shared=store) is None
        assert not (store / "io.containerd.content.v1.content").exists()
    finally:
        held.release()
