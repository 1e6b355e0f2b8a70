"""Thin edge: the GPU Nodes' shapes (node_shapes.py), read at most once a minute.

Reconcile and admission plan with them; both ask on every decision, so one list serves
many. Where the operator may not list Nodes (a namespaced install with the chart's
readNodes off) the answer is None and the catalog's figures are used, named as assumed;
that is logged once, not on every decision.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from kubernetes.client.exceptions import ApiException

from grpo_api.catalog import GpuType

from . import kube
from .node_shapes import NodeShape, node_shapes

log = logging.getLogger(__name__)

TTL_S = 60.0  # a Node added or resized reaches the next attempt planned after this

_lock = threading.Lock()
_cached: tuple[float, dict[str, NodeShape] | None] | None = None
_refused_logged = False


def shapes(catalog: Mapping[str, GpuType],
           clock: Callable[[], float] = time.monotonic) -> dict[str, NodeShape] | None:
    """The GPU types' Node shapes; None when Nodes cannot be read."""
    global _cached, _refused_logged
    now = clock()
    with _lock:
        if _cached is not None and _cached[0] > now:
            return _cached[1]
    try:
        found: dict[str, NodeShape] | None = node_shapes(kube.list_gpu_nodes(), catalog)
    except Exception as exc:  # RBAC, or no API server: plan with the catalog, never wait
        found = None
        if not _refused_logged:
            _refused_logged = True
            why = kube.api_message(exc) if isinstance(exc, ApiException) else repr(exc)
            log.warning("cannot list Nodes (%s): plans use the GPU catalog's node RAM and "
                        "CPUs, named as assumed in status.plan.nodeSource", why)
    with _lock:
        _cached = (now + TTL_S, found)
    return found


def forget() -> None:
    """Empty the cache (tests)."""
    global _cached
    with _lock:
        _cached = None
