"""Fill the shared image store before any node runs: containerd alone, no kubelet, no
network namespace, no control plane.

Only containerd and ctr are needed, so ``hack/setup.sh`` runs this beside the rest of the
Go build, as soon as the images are built: the first ``make demo`` or ``make test`` then
starts its node with the 7.5 GB trainer image already in the store instead of importing
it on the job's critical path (about 100-160 s on 2 cores).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..processes import spawn, wait_until
from ..versions import binary
from .images import ensure_sandbox_image, import_image
from .store import acquire_store

log = logging.getLogger("grpo_testbed.node")


def import_containerd_toml(store: Path, state: Path, socket: Path) -> str:
    """The store and snapshotter the node uses (config.containerd_toml); nothing else: no
    CRI runtime is asked for, so none of its settings matter here."""
    return f"""version = 3
root = '{store}'
state = '{state}'

[grpc]
  address = '{socket}'
"""


def preload_store(tags: Sequence[str], shared: Path | None = None) -> dict[str, float] | None:
    """Import the sandbox image and ``tags`` into the shared store (``shared``: the
    testbed cache's unless given); seconds per image (0 for one already there). None
    when a running testbed holds the store: its node imports what it needs itself, and
    nothing is waited for."""
    with tempfile.TemporaryDirectory(prefix="grpo-preload-") as tmp:
        work = Path(tmp)
        store = acquire_store(work, shared)
        if not store.shared:
            store.release()
            return None
        try:
            socket = work / "containerd.sock"
            config = work / "containerd.toml"
            config.write_text(import_containerd_toml(store.path, work / "state", socket))
            containerd = spawn("containerd", [str(binary("containerd")), "--config",
                                              str(config), "--log-level", "warn"], work / "logs")
            try:
                wait_until("containerd socket", socket.exists, 30, [containerd])
                spent: dict[str, float] = {}
                for tag in (ensure_sandbox_image(), *tags):
                    spent[tag] = import_image(binary("ctr"), socket, tag, work)
                return spent
            finally:
                containerd.stop()
        finally:
            store.release()
