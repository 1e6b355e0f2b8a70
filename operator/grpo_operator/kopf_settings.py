"""How the operator runs Kopf: names, posting, timeouts, and what it watches and holds.

Applied once at start-up (main.operator_startup), before Kopf opens any watch stream.
"""

from __future__ import annotations

import logging

import kopf

from grpo_api.contract import API_GROUP, JOB_LABEL

# How long an idle object worker, and the last event (the whole parsed body) it holds,
# lives. At 200 jobs Kopf's held bodies were the operator's largest live allocation
# (docs/benchmarks.md, "The pod's memory"): 1 s, not Kopf's 5.
WORKER_IDLE_S = 1.0

# Kinds the operator watches only for its own children: the API server filters by label
# (server-side), so other pods and clusters (KubeRay's own RayJobs, every other workload
# on a shared cluster) are never sent, parsed or held. Handlers keep their client-side
# `labels=` filter too.
# Kopf's selector keys: (version, plural) for the core group, (group, version, plural).
CHILD_KINDS: tuple[tuple[str, ...], ...] = (("v1", "pods"), ("ray.io", "v1", "rayclusters"))


def apply_settings(settings: kopf.OperatorSettings, peering_lifetime_s: int) -> None:
    """Our settings over Kopf's defaults (pure: only ``settings`` changes)."""
    # Our own names on objects, and nothing written into status but our fields.
    settings.persistence.finalizer = f"{API_GROUP}/operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-spec")
    # Only warnings become Events on the job. At INFO, Kopf posts every "Handler/Timer
    # succeeded" line: the restart timer alone (every 0.25 s during a backoff) flooded
    # the API server. The operator's own Events (Running, Restarting, ...) are explicit.
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 32
    settings.watching.server_timeout = 300  # re-list regularly; survives API restarts
    settings.networking.error_backoffs = [1, 2, 5, 10]
    # Kopf waits 5 minutes on one API request by default, and its start-up discovery
    # is such requests: one lost answer left an operator silent for minutes. The API
    # server ends its own non-watch requests at 60 s, so 30 s only cuts a dead one
    # short; a timed-out request is retried after the backoffs above.
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10  # watch streams too (Kopf falls back to it)
    settings.peering.lifetime = peering_lifetime_s
    settings.queueing.idle_timeout = WORKER_IDLE_S
    for kind in CHILD_KINDS:
        # The label's existence: every child carries it (render/), whatever its job.
        settings.watching.label_selectors[kind] = JOB_LABEL  # type: ignore[index]
