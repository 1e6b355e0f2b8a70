"""The network between worker nodes (pure): what the devices a job's workers request
(spec.resources.devices) need from NCCL and the container, and a warning when a
multi-node job on a GPU type with a fabric requests none of its devices.

Sources for the env:
- NCCL's environment variable reference (docs.nvidia.com/deeplearning/nccl, "Environment
  Variables"): NCCL_IB_DISABLE=1 makes NCCL fall back to IP sockets, so 0 is set
  explicitly (base images and site configs sometimes disable IB); NCCL_NET_GDR_LEVEL and
  NCCL_P2P_LEVEL are picked from the topology when unset, and NCCL_SOCKET_IFNAME /
  NCCL_IB_HCA depend on the node's NIC names, so those are left to spec.pods env.
- aws-ofi-nccl's "Environment Variables" wiki (FI_PROVIDER selects the libfabric
  provider the plugin uses) and libfabric's fi_efa(7) (FI_EFA_USE_DEVICE_RDMA=1: use the
  EFA device's RDMA read, GPUDirect RDMA on p4d/p5); AWS's EKS user guide "Manage EFA
  devices" for the vpc.amazonaws.com/efa resource. NCCL_PROTO stays NCCL's default.
- RDMA memory registration pins pages (ibv_reg_mr), which RLIMIT_MEMLOCK caps unless the
  process has CAP_IPC_LOCK: the RDMA device plugins' examples add IPC_LOCK.
- NCCL_NET names the one network NCCL may use. NCCL's net.cc (ncclNetInit) skips every
  network whose name differs (strcasecmp) and, when none is left, fails communicator
  init with `NCCL WARN Error: network IB not found.` (WARN: logged at the operator's
  NCCL_DEBUG=WARN). Unset, NCCL tries the plugin, then IB, then sockets, and says it fell
  back only at INFO (`NET/IB : No device found.`, then `Using network Socket`): a
  fabric job without its verbs stack would train over TCP unnoticed. The aws-ofi-nccl
  plugin answers to "AWS Libfabric" in every version (1.11 and earlier were named so;
  later ones keep accepting that NCCL_NET, per the plugin's own source).
- The GPU trainer image carries rdma-core (IB) but no aws-ofi-nccl, which neither Debian
  nor PyPI packages: a job that requests EFA devices must name an image of its own with
  the plugin (spec.image); on the project's image it is refused (`image_problem`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_api.catalog import EFA, FABRIC_DEVICE_PREFIXES, INFINIBAND, device_fabric
from grpo_api.contract import DEFAULT_TRAINER_IMAGE

from .types import Decision, Geometry

IPC_LOCK = "IPC_LOCK"

FABRIC_ENV: dict[str, dict[str, str]] = {
    INFINIBAND: {"NCCL_IB_DISABLE": "0"},
    EFA: {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"},
}
# NCCL's name of each fabric's network (NCCL_NET): with it set, a missing transport fails
# the first collective naming it instead of falling back to sockets.
NCCL_NET = {INFINIBAND: "IB", EFA: "AWS Libfabric"}
# Fabrics the project's trainer image serves: rdma-core is in it, aws-ofi-nccl is not.
IMAGE_FABRICS = (INFINIBAND,)
# The project's trainer image, by repository path under whatever registry it was pushed
# to (the chart's global.imageRegistry prefixes it; the testbed's build is localhost/).
PROJECT_IMAGE_PATH = DEFAULT_TRAINER_IMAGE.rsplit(":", 1)[0].split("/", 1)[1]
FABRIC_WORDS = {INFINIBAND: "InfiniBand/RoCE (RDMA verbs)", EFA: "AWS EFA (libfabric)"}


@dataclass(frozen=True)
class Network:
    fabrics: tuple[str, ...]  # the fabrics whose devices the workers request
    env: dict[str, str] = field(default_factory=dict)
    capabilities: tuple[str, ...] = ()
    decision: Decision | None = None


def _devices(devices: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(devices.items()))


def _example(fabric: str) -> str:
    return {INFINIBAND: "{rdma/ib: 1}", EFA: "{vpc.amazonaws.com/efa: 32}"}.get(
        fabric, FABRIC_DEVICE_PREFIXES[fabric][0])


def plan_network(geo: Geometry) -> Network:
    """Env, capabilities and the reason for the job's inter-node network."""
    fabrics = tuple(sorted({f for f in map(device_fabric, geo.devices) if f}))
    if not geo.is_gpu:  # gloo over TCP; the devices are only rendered
        why = "cpu job: ranks talk gloo over TCP; the devices are requested as given"
        return Network((), decision=Decision("network", _devices(geo.devices), "spec", why)
                       if geo.devices else None)
    if fabrics:
        env: dict[str, str] = {}
        for f in fabrics:
            env |= FABRIC_ENV[f]
        if len(fabrics) == 1:  # both at once: NCCL picks, there is no one name to insist on
            env["NCCL_NET"] = NCCL_NET[fabrics[0]]
        yours = sorted(k for k in env if k in geo.user_env)
        env = {k: v for k, v in env.items() if k not in geo.user_env}
        why = (
            f"workers request {_devices(geo.devices)}: NCCL between nodes over "
            + " and ".join(FABRIC_WORDS[f] for f in fabrics)
            + (f" ({', '.join(f'{k}={v}' for k, v in env.items())})" if env else "")
            + (f"; {', '.join(yours)} as spec.pods sets" if yours else "")
            + "; IPC_LOCK for RDMA memory registration; NCCL_SOCKET_IFNAME, NCCL_IB_HCA "
            "and NCCL_NET_GDR_LEVEL are NCCL's choice unless spec.pods.workers.env sets them"
            + ("; NCCL_NET: a missing transport fails the first collective instead of "
               "falling back to TCP sockets" if "NCCL_NET" in env else "")
        )
        if geo.fabric and geo.fabric not in fabrics:
            why += f" (the GPU catalog says {geo.fabric} for {geo.gpu})"
        return Network(fabrics, env, (IPC_LOCK,), Decision(
            "network", " + ".join(fabrics), "spec", why))
    if geo.devices:
        why = (
            f"workers request {_devices(geo.devices)}, no known fabric (rdma/*, "
            "vpc.amazonaws.com/efa): requested as given, no NCCL env or capability added"
        )
        return Network((), decision=Decision("network", _devices(geo.devices), "spec", why))
    if geo.nodes > 1 and geo.fabric:
        why = (
            f"WARNING: {geo.nodes} worker nodes of {geo.gpu}, whose nodes have {geo.fabric} "
            f"(GPU catalog), but resources.devices requests none of its devices: NCCL falls "
            "back to TCP sockets between nodes, many times slower for FSDP's all-gathers "
            f"and reduce-scatters; request them, e.g. resources.devices: {_example(geo.fabric)}"
        )
        return Network((), decision=Decision("network", "TCP sockets", "catalog", why))
    if geo.nodes > 1:
        why = (
            f"{geo.nodes} worker nodes, no fabric in the GPU catalog for {geo.gpu} and none "
            "requested (resources.devices): NCCL uses TCP sockets between nodes"
        )
        return Network((), decision=Decision("network", "TCP sockets", "auto", why))
    return Network(())


def is_project_image(image: str | None) -> bool:
    """Whether a job runs the project's trainer image (unset: the operator's default,
    which the chart points at the project's image unless told otherwise)."""
    if not image:
        return True
    repo = image.split("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]
    return repo == PROJECT_IMAGE_PATH or repo.endswith("/" + PROJECT_IMAGE_PATH)


def image_problem(fabrics: tuple[str, ...], image: str | None) -> str | None:
    """Why the job's image cannot use a fabric its workers request, or None.

    Only what is known: the project's image serves IMAGE_FABRICS. Any other image is
    the user's (one built FROM ours with the EFA installer, say) and is taken at its
    word; NCCL_NET then makes a missing plugin fail the first collective by name."""
    missing = [f for f in fabrics if f not in IMAGE_FABRICS]
    if not missing or not is_project_image(image):
        return None
    shown = image or f"the operator's default trainer image ({DEFAULT_TRAINER_IMAGE})"
    return (
        f"spec.resources.devices: the workers request {' and '.join(missing)} devices, but "
        f"{shown} cannot use them: NCCL reaches EFA only through the aws-ofi-nccl plugin "
        "(libnccl-net.so) and libfabric, which the trainer image does not carry (neither "
        "Debian nor PyPI packages the plugin), so NCCL would fall back to TCP sockets. Build "
        "an image FROM the trainer image with AWS's EFA installer (libfabric and "
        "aws-ofi-nccl, matching the image's NCCL) and set spec.image to it; the operator "
        f"then sets NCCL_NET={NCCL_NET[EFA]!r}, so a missing plugin fails the first "
        "collective by name. Or drop the EFA devices to run over TCP"
    )
