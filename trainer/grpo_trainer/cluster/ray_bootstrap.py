"""Ray for the driver: join the cluster the pod is in (KubeRay's head), or start a small
local one for a run outside a cluster (tests, a laptop)."""

from __future__ import annotations

import os

from grpo_api.trainer_config import Config

from ..config_error import ConfigError

LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024


def init_ray(cfg: Config) -> bool:
    """Join a running cluster when there is one, else start a small local one.

    Returns True when this call started Ray (so the caller shuts it down).
    """
    import ray

    if ray.is_initialized():
        return False
    res = cfg.resources
    address = res.ray_address
    if address is None and (os.environ.get("RAY_ADDRESS") or _local_cluster_running()):
        address = "auto"
    if address and address != "local":
        ray.init(address=address, ignore_reinit_error=True)
        return True
    if res.nodes > 1:
        raise ConfigError(
            "resources.nodes",
            f"{res.nodes} nodes need a Ray cluster, but none is running here and a local Ray "
            "is one node: set resources.ray_address, or resources.nodes to 1",
        )
    # address="local": a Ray of our own; without it ray.init joins the cluster that
    # /tmp/ray/ray_current_cluster names (another run's) and refuses num_cpus.
    ray.init(
        address="local",
        num_cpus=max(2, int(res.num_workers * res.cpus_per_worker)),
        num_gpus=int(res.num_workers * res.gpus_per_worker) or None,
        object_store_memory=res.object_store_memory or LOCAL_OBJECT_STORE_BYTES,
        include_dashboard=False,
        ignore_reinit_error=True,
    )
    return True


def _local_cluster_running() -> bool:
    try:
        from ray._private.services import find_gcs_addresses

        return bool(find_gcs_addresses())
    except Exception:  # private API: absence just means "start our own"
        return False
