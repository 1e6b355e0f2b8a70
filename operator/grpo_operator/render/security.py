"""The Ray pods' security settings (pure): Pod Security `restricted` unless a user's
setting needs more.

`restricted` asks of every container: no privilege escalation, every capability
dropped (only NET_BIND_SERVICE may be added back), and of the pod: runAsNonRoot, a
seccomp profile of RuntimeDefault or Localhost, and no host namespaces, hostPath or
privileged containers. The operator's pods set all of it; the images' user
(`IMAGE_UID`) is numeric so the kubelet can verify runAsNonRoot without reading the
image. Nothing the Ray containers run needs root: `ulimit -n 65536` (children.py)
sets both limits to 65536, which needs no capability as long as the node's hard limit
is at least that (containerd and CRI-O give 1048576 or more); a lower hard limit makes
bash print an error and the command go on (`;`) with the node's limit.

Where the platform assigns the UID itself (OpenShift's restricted-v2 SCC takes it, the
GID and the fsGroup from the namespace's range and refuses any other), the operator is
told to leave them out (`--trainer-pod-uid=unset`, the chart's
`trainerPods.runAsUser: null`): runAsNonRoot stays, so the pods still pass
`restricted`, and the kubelet checks the assigned (or the image's numeric) user.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from grpo_api.contract import IMAGE_UID

# Capabilities Pod Security `baseline` allows a container to add; `restricted` allows
# only NET_BIND_SERVICE (https://kubernetes.io/docs/concepts/security/pod-security-standards/).
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})

# The pod-level fields set to the pods' UID (`uid` below); the checkpoint volume is
# writable by the trainer through fsGroup.
UID_FIELDS = ("runAsUser", "runAsGroup", "fsGroup")
POD_DEFAULTS: dict[str, Any] = {
    "runAsNonRoot": True,
    **dict.fromkeys(UID_FIELDS, IMAGE_UID),
    "seccompProfile": {"type": "RuntimeDefault"},
}


def container_security_context(add_capabilities: Iterable[str] = ()) -> dict[str, Any]:
    """Every Ray container's securityContext (the hub-fetch init container's too): no
    privilege escalation, every capability dropped, then `add_capabilities` added back.

    A capability a fabric needs (e.g. IPC_LOCK for RDMA memory registration) is put on
    the plan's pod resources and passed here. Adding one leaves `restricted`, and any
    outside `BASELINE_CAPABILITIES` leaves `baseline` too: such a job runs only in a
    namespace whose Pod Security level is `privileged` (the webhook says so at apply).
    """
    add = sorted({c.upper().removeprefix("CAP_") for c in add_capabilities})
    capabilities: dict[str, list[str]] = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = add
    return {"allowPrivilegeEscalation": False, "capabilities": capabilities}


def pod_security_context(user: Mapping[str, Any] | None = None,
                         uid: int | None = IMAGE_UID) -> dict[str, Any]:
    """The pod's securityContext: `POD_DEFAULTS`, with `uid` as runAsUser, runAsGroup and
    fsGroup (None: all three left for the platform to assign; runAsNonRoot stays), and
    what spec.pods' securityContext sets winning field by field (a cluster that assigns
    its own UID range, or a volume that needs another fsGroup). A user's `runAsUser: 0`
    drops the runAsNonRoot default, which would otherwise stop the kubelet from starting
    the container; such pods need a namespace whose Pod Security level is `baseline` or
    `privileged`."""
    defaults = {k: uid if k in UID_FIELDS else v for k, v in POD_DEFAULTS.items()
                if k not in UID_FIELDS or uid is not None}
    own = {k: v for k, v in (user or {}).items() if v is not None}
    out = {**defaults, **own}
    if own.get("runAsUser") == 0 and "runAsNonRoot" not in own:
        del out["runAsNonRoot"]
    return out
