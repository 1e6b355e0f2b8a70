"""The per-job NetworkPolicy a platform may turn on (the chart's jobNetworkPolicy, the
operator's --job-network-policy): pure settings and their parsing.

A Ray head serves its dashboard and Jobs API without authentication, and every Ray pod
listens on Ray's ports; in a shared cluster any pod could reach them. With the policy a
job's Ray pods accept traffic only from the same job's pods (and the peers the platform
lists, e.g. its Prometheus for Ray's metrics), and, when the platform lists egress rules,
send only to the job's pods, the cluster's DNS and those rules (the API server, the
object store, a hub mirror). Kubernetes enforces NetworkPolicy only through a network
plugin that implements it (Calico, Cilium, ...): elsewhere the object is inert.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobNetworkPolicy:
    """What every job's NetworkPolicy allows beyond the job's own pods."""

    # NetworkPolicyPeers that may reach the job's pods, besides the job's own pods.
    ingress_from: tuple[dict[str, Any], ...] = ()
    # NetworkPolicyEgressRules besides the job's own pods and DNS; None: egress is left
    # open (the policy restricts ingress only).
    egress: tuple[dict[str, Any], ...] | None = None


FLAG = "--job-network-policy"


def parse_job_network_policy(text: str) -> JobNetworkPolicy:
    """The flag's JSON object, {"ingressFrom": [peer, ...], "egress": [rule, ...] | null};
    ValueError naming the key and the fix."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{FLAG}: not JSON ({err}); give an object such as "
                         '{"ingressFrom": [], "egress": null}') from None
    if not isinstance(raw, dict):
        raise ValueError(f"{FLAG}: a JSON object is needed, got {type(raw).__name__}")
    unknown = sorted(set(raw) - {"ingressFrom", "egress"})
    if unknown:
        raise ValueError(f"{FLAG}: unknown keys {', '.join(unknown)}; the keys are "
                         "ingressFrom (NetworkPolicyPeers) and egress (NetworkPolicyEgressRules "
                         "or null)")
    ingress = raw.get("ingressFrom") or []
    egress = raw.get("egress")
    for key, items in (("ingressFrom", ingress), ("egress", egress or [])):
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ValueError(f"{FLAG}: {key} must be a list of objects (Kubernetes "
                             f"NetworkPolicy {'peers' if key == 'ingressFrom' else 'rules'})")
    return JobNetworkPolicy(tuple(ingress), None if egress is None else tuple(egress))
