"""A Ray node of a test cluster (``ray.cluster_utils.Cluster``) lost whole, as a machine
or a pod is: its raylet and every process it started (the ranks' and engines' actors)
SIGKILLed together. ``Cluster.remove_node`` kills only the node's own daemons; the
actors it started notice their raylet is gone and exit some time later, long enough, on
a busy machine, to finish a collective or a checkpoint the test meant to interrupt."""

from __future__ import annotations

import contextlib
from typing import Any


def kill_node(cluster: Any, node: Any) -> None:
    """Every worker process of ``node`` and then the node itself, at once."""
    import psutil
    from ray._private import ray_constants

    (raylet,) = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET]
    workers = psutil.Process(raylet.process.pid).children(recursive=True)
    for proc in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    cluster.remove_node(node, allow_graceful=False)
