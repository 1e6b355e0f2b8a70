"""Start watching only once API discovery lists every kind the operator must watch.

Kopf reads API discovery (`/api`, `/apis`, then each group version) once, when it
starts, and afterwards only when a CustomResourceDefinition changes. kube-apiserver
lists a CRD's group in `/apis` only after it has registered an APIService for it and
marked it Available (its crdregistration and autoregister controllers, then the
aggregator), which happens asynchronously, after the CRD reports Established. An
operator started in that window never learns that GRPOJobs exist: Kopf logs
"Unresolved resources cannot be served", starts no watch stream for them, and no CRD
event comes later to make it look again. So `operator_startup` waits here first, and
Kopf's one scan then finds everything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from grpo_api.contract import API_GROUP, API_VERSION, PLURAL

from .config import DISCOVERY_TIMEOUT_S
from .kube import RAY_GROUP, RAY_PLURAL, RAY_VERSION_API
from .watch_health import resource_name

log = logging.getLogger("grpo_operator")

_LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class Watched:
    group: str  # "" for the core API
    version: str
    plural: str

    @property
    def name(self) -> str:
        return resource_name(self.plural, self.group)

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


# What the handlers watch and cannot work without (Kueue's Workloads are optional).
REQUIRED: tuple[Watched, ...] = (
    Watched(API_GROUP, API_VERSION, PLURAL),
    Watched("", "v1", "pods"),
    Watched(RAY_GROUP, RAY_VERSION_API, RAY_PLURAL),
)

# What discovery says: the group versions `/apis` lists, and the plurals each of those
# group versions serves (absent: not read yet, or not served).
GroupVersions = Collection[str]
ServedPlurals = Mapping[str, Collection[str]]


def unserved(required: Collection[Watched], group_versions: GroupVersions,
             plurals: ServedPlurals) -> list[Watched]:
    """The required kinds that discovery does not list where Kopf looks for them. The
    core API (`/api/v1`) is served by every API server and not read."""
    return [w for w in required if w.group and (
        w.group_version not in group_versions or w.plural not in plurals.get(w.group_version, ()))]


def fix_for(missing: Collection[Watched]) -> str:
    """What to do about kinds that stay unserved: which CRD provides each."""
    hints = {API_GROUP: "the GRPOJob CRD (installed by the chart; or kubectl apply -f "
                        "crds/grpojob.yaml)",
             RAY_GROUP: "KubeRay's CRDs (install the KubeRay operator)"}
    return "; ".join(f"{w.name} needs {hints.get(w.group, 'its CRD')}" for w in missing)


class DiscoveryTimeout(RuntimeError):
    pass


Reader = Callable[[Collection[str]], tuple[GroupVersions, ServedPlurals]]


async def wait_until_served(read: Reader, required: Collection[Watched] = REQUIRED,
                            timeout_s: float = DISCOVERY_TIMEOUT_S, poll_s: float = 0.5) -> float:
    """Poll discovery (`read`, a blocking call, in a thread) until every required kind is
    listed; returns the seconds waited. Raises DiscoveryTimeout naming what is missing."""
    t0 = time.monotonic()
    last_log = t0
    wanted = sorted({w.group_version for w in required if w.group})
    while True:
        group_versions, plurals = await asyncio.to_thread(read, wanted)
        missing = unserved(required, group_versions, plurals)
        waited = time.monotonic() - t0
        if not missing:
            if waited > poll_s:
                log.info("API discovery lists %s after %.1f s",
                         ", ".join(w.name for w in required), waited)
            return waited
        names = ", ".join(w.name for w in missing)
        if waited >= timeout_s:
            raise DiscoveryTimeout(
                f"the API server's discovery still does not list {names} after {waited:.0f} s:"
                f" {fix_for(missing)}")
        if time.monotonic() - last_log >= _LOG_EVERY_S or waited < poll_s:
            log.info("waiting for API discovery to list %s (%.0f s so far)", names, waited)
            last_log = time.monotonic()
        await asyncio.sleep(poll_s)
