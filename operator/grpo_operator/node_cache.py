"""Thin edge: the GPU Nodes' shapes (node_shapes.py), read at most once a minute.

Reconcile and admission plan with them; both ask on every decision, so one list serves
many. Where the operator may not list Nodes (a namespaced install with the chart's
readNodes off) the answer is None and the catalog's figures are used, named as assumed;
that is logged once, not on every decision.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from grpo_api.catalog import GpuType

from . import kube
from .node_shapes import NodeShape, node_shapes
from .ttl_cache import TtlCache

log = logging.getLogger(__name__)

TTL_S = 60.0  # a Node added or resized reaches the next attempt planned after this

_cache: TtlCache[None, dict[str, NodeShape] | None] = TtlCache(TTL_S)
_refused_logged = False


def _read(catalog: Mapping[str, GpuType]) -> dict[str, NodeShape] | None:
    global _refused_logged
    try:
        return node_shapes(kube.list_gpu_nodes(), catalog)
    except Exception as exc:  # RBAC, or no API server: plan with the catalog, never wait
        if not _refused_logged:
            _refused_logged = True
            why = kube.failure_message(exc)
            log.warning("cannot list Nodes (%s): plans use the GPU catalog's node RAM and "
                        "CPUs, named as assumed in status.plan.nodeSource", why)
        return None


def shapes(catalog: Mapping[str, GpuType]) -> dict[str, NodeShape] | None:
    """The GPU types' Node shapes; None when Nodes cannot be read."""
    return _cache.get(None, lambda: _read(catalog))


def forget() -> None:
    """Empty the cache (tests)."""
    _cache.forget()
