"""The operator's configuration: one immutable object, built once from `grpo-operator`'s
flags and handed to every handler through Kopf's memo (no module globals)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from grpo_api.catalog import GPU_CATALOG, GpuType
from grpo_api.contract import DEFAULT_TRAINER_IMAGE, IMAGE_UID

from .cert_watch import CHECK_INTERVAL_S as CERT_CHECK_INTERVAL_S
from .hub_endpoints import NO_HUB_ENDPOINTS
from .job_defaults import NO_JOB_DEFAULTS, JobDefaults
from .peering import PEERING_LIFETIME_S
from .render.network_policy import JobNetworkPolicy
from .watch_health import DEFAULT_STALE_AFTER_S as WATCH_STALE_AFTER_S

# After the trainer's own stall deadline, it still captures every rank's stacks (up to
# 70 s when a rank's node does not answer), lets the loop stop or exits by force (60 s),
# and the kubelet reports the container's end; reports are rate-limited (10 s) and the
# pod's clock may differ from ours. Five minutes covers that with room: the trainer's
# verdict, which names the rank and frame, comes first whenever the driver can give it.
HANG_GRACE_S = 300.0

# Start-up waits this long for API discovery to list what the operator watches
# (discovery.py), then exits with the reason and Kubernetes starts it again.
DISCOVERY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class WebhookConfig:
    """The admission webhook server (on only when `port` is set)."""

    port: int = 0
    host: str | None = None  # name the API server uses (managed configurations)
    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    manage: str | None = None  # webhook configuration name the operator keeps itself
    cert_check_seconds: float = CERT_CHECK_INTERVAL_S  # a renewed cert restarts us


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the operator is told at start; the pure core reads `default_image`,
    `trainer_pod_uid`, `catalog`, `claim_retry_seconds`, `pod_create_deadline_seconds`
    and `hang_grace_seconds`, the edges the rest."""

    default_image: str = DEFAULT_TRAINER_IMAGE  # for jobs that do not set spec.image
    # UID, GID and fsGroup of the pods made from the trainer image (--trainer-pod-uid);
    # None leaves them for the platform to assign (OpenShift's restricted-v2 SCC refuses
    # a fixed UID outside the namespace's range). render/security.py.
    trainer_pod_uid: int | None = IMAGE_UID
    # The effective GPU catalog: built-in, with --gpu-catalog (the chart's gpuCatalog)
    # merged over it; read-only, like the rest of the configuration.
    catalog: Mapping[str, GpuType] = field(
        default_factory=lambda: MappingProxyType(dict(GPU_CATALOG)))
    kubeconfig: str | None = None
    bind: str = "0.0.0.0"
    metrics_port: int = 8080
    webhook: WebhookConfig = WebhookConfig()
    claim_retry_seconds: float = 15.0  # a missing checkpoint claim is looked for again
    # The next attempt waits, at most this long past its backoff, for the pods of earlier
    # attempts to be gone (two drivers of one job never overlap); a pod stuck Terminating
    # on a lost node cannot hold a restart longer (the trainer's checkpoint fence still
    # keeps an older driver from committing).
    previous_attempt_grace_seconds: float = 120.0
    # A Ray pod the API server keeps refusing (admission, quota) fails the attempt after
    # this long (--pod-create-deadline); until then the job shows the refusal.
    pod_create_deadline_seconds: float = 300.0
    # A Running attempt silent past its progress deadline plus this is ended as Hang
    # (--hang-grace; reconcile/progress_deadline.py says why 300 s).
    hang_grace_seconds: float = HANG_GRACE_S
    discovery_timeout_seconds: float = DISCOVERY_TIMEOUT_S  # --discovery-timeout
    # /healthz fails when a watched kind has had no live stream this long (watch_health.py)
    watch_stale_after_seconds: float = WATCH_STALE_AFTER_S  # --watch-stale-after
    # GET a hub model's config.json from the public hub for jobs that name no
    # spec.hub.endpoint (--no-read-public-hub: a cluster that cannot or must not reach it;
    # those jobs plan from the known table, as jobs of a private repo's mirror never do).
    read_public_hub: bool = True
    # The hubs a job may name in spec.hub.endpoint, by name (--hub-endpoints; the chart's
    # hubEndpoints): no other is read (reconcile/hub_endpoint.py).
    hub_endpoints: Mapping[str, str] = field(default_factory=lambda: NO_HUB_ENDPOINTS)
    # What every job inherits where it sets nothing (--job-defaults; the chart's
    # jobDefaults; job_defaults.py).
    job_defaults: JobDefaults = field(default_factory=lambda: NO_JOB_DEFAULTS)
    # A NetworkPolicy for each job's Ray pods (--job-network-policy; the chart's
    # jobNetworkPolicy); None: none (render/network_policy.py).
    job_network_policy: JobNetworkPolicy | None = None
    # A standby replica of the peering takes over this long after the active one's last
    # keep-alive (--peering-lifetime; peering.py).
    peering_lifetime_seconds: int = PEERING_LIFETIME_S


MEMO_KEY = "config"


def from_memo(memo: Any) -> OperatorConfig:
    """The configuration `main` put in Kopf's memo (defaults when run without it)."""
    config = memo.get(MEMO_KEY) if memo is not None else None
    return config if isinstance(config, OperatorConfig) else OperatorConfig()
