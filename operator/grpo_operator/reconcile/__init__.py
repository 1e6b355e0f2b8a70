"""Reconciling a GRPOJob (pure): `reconcile(job, observed, event, now, config)` returns
the one Action for an event (`action`). `observe` says what a handler reads for an
event; `core` decides. The steps record what they find as a `phases.Finding` and a
record (`attempts`: an attempt's life; `queue`: Kueue; `refusals`: refused pod creates;
`progress_deadline`; `model_config`: a new job's config.json, read once; `classify`: how
a pod ended; `claims`; `planning`: the spec parsed once, planned at most once), and
`status.derive_status` computes the status from those facts once, the phase and its
conditions by the one table in `phases`, which also holds the guards that read the
phase. The stored status is read once (`stored.read_status`) into the API's typed
model, and every step reads that."""

from __future__ import annotations

from .action import Action
from .core import reconcile
from .model_config import (
    HubAnswer,
    admission_input,
    admission_warning,
    hub_url,
    operator_reads_hub,
    to_read,
)
from .observe import (
    BackoffTimer,
    ClusterChanged,
    CreateFailed,
    Event,
    JobChanged,
    Observed,
    PodChanged,
    ProgressTimer,
    SpecChanged,
    cluster_needs_pods,
    cluster_needs_workload,
    pod_matters,
    pod_needs_cluster,
    pod_needs_pods,
    restart_due,
    restart_pending,
)
from .planning import JobPlan, Planner, Refused, backoff_seconds, planned
from .progress_deadline import PROGRESS_CHECK_INTERVAL_S, progress_watched
from .refusals import refusal_pending
from .stored import StoredStatus, read_status

__all__ = [
    "PROGRESS_CHECK_INTERVAL_S",
    "Action",
    "BackoffTimer",
    "ClusterChanged",
    "CreateFailed",
    "Event",
    "HubAnswer",
    "JobChanged",
    "JobPlan",
    "Observed",
    "Planner",
    "PodChanged",
    "ProgressTimer",
    "Refused",
    "SpecChanged",
    "StoredStatus",
    "admission_input",
    "admission_warning",
    "backoff_seconds",
    "cluster_needs_pods",
    "cluster_needs_workload",
    "hub_url",
    "operator_reads_hub",
    "planned",
    "pod_matters",
    "pod_needs_cluster",
    "pod_needs_pods",
    "progress_watched",
    "read_status",
    "reconcile",
    "refusal_pending",
    "restart_due",
    "restart_pending",
    "to_read",
]
