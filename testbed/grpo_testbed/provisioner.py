"""A volume provisioner that works as a CSI external-provisioner does, for the testbed's
claims of ``STORAGE_CLASS``.

kwok's volume stages (``pvc-provision``, ``pv-bind``) do a provisioner's work and the
binder's in one serial queue: kwok v0.8.0 plays every stage of a kind other than Pod and
Node with one worker (``pkg/kwok/controllers/controller.go``, ``PlayStageParallelism: 1``),
four API writes a claim, so a burst of claims binds one after another at the API
server's pace. A real cluster splits the work: the external-provisioner (kubernetes-csi,
``--worker-threads`` default 100) creates each claim's PersistentVolume, pre-bound to the
claim through ``claimRef``, once kube-controller-manager's PV controller has named it the
claim's provisioner (annotation ``volume.kubernetes.io/storage-provisioner``); the PV
controller then binds the two (claim ``volumeName``, both phases ``Bound``). This module
is the first half; the testbed's kube-controller-manager is the second, for real. It also
deletes a ``Released`` volume of its own whose reclaim policy is Delete, as the
external-provisioner does.

The volumes are hostPath directories under the same root as kwok's
(``node/claims.py``), so the real node mounts them the same way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from .node.claims import PROVISIONER_ROOT

log = logging.getLogger("grpo_testbed.provisioner")

PROVISIONER = "testbed.grpo.dev/volume"
STORAGE_CLASS = "testbed-volume"
PROVISIONER_ANNOTATION = "volume.kubernetes.io/storage-provisioner"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
# Far fewer than the external-provisioner's 100: two cores here; a write takes a few ms.
WORKERS = 8


def storage_class(default: bool = False) -> dict[str, Any]:
    """The StorageClass whose claims this provisioner serves."""
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS, "annotations": annotations},
            "provisioner": PROVISIONER, "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate"}


def wants_volume(pvc: dict[str, Any]) -> bool:
    """A claim this provisioner must provision: its class, named ours by the PV
    controller, not bound, not going away."""
    meta, spec = pvc.get("metadata") or {}, pvc.get("spec") or {}
    return (spec.get("storageClassName") == STORAGE_CLASS
            and (meta.get("annotations") or {}).get(PROVISIONER_ANNOTATION) == PROVISIONER
            and not spec.get("volumeName") and not meta.get("deletionTimestamp")
            and (pvc.get("status") or {}).get("phase") != "Bound")


def volume_for(pvc: dict[str, Any]) -> dict[str, Any]:
    """The PersistentVolume for ``pvc``, pre-bound to it (the external-provisioner's
    shape: ``pvc-<uid>``, ``claimRef`` with the claim's uid, its size and access modes)."""
    meta, spec = pvc["metadata"], pvc["spec"]
    name = f"pvc-{meta['uid']}"
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "name": meta["name"], "namespace": meta["namespace"],
                         "uid": meta["uid"]},
            "hostPath": {"path": str(PROVISIONER_ROOT / name), "type": "DirectoryOrCreate"},
        },
    }


def released_volume_of_ours(pv: dict[str, Any]) -> bool:
    meta, spec = pv.get("metadata") or {}, pv.get("spec") or {}
    return ((meta.get("annotations") or {}).get(PROVISIONED_BY) == PROVISIONER
            and spec.get("persistentVolumeReclaimPolicy") == "Delete"
            and (pv.get("status") or {}).get("phase") == "Released"
            and not meta.get("deletionTimestamp"))


class VolumeProvisioner:
    """Watches claims and volumes (two threads) and writes on a pool of ``workers``."""

    def __init__(self, kubeconfig: Path, workers: int = WORKERS) -> None:
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="provision")
        self._stop = threading.Event()
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._watch, args=(kind,), daemon=True,
                                          name=f"provisioner-{kind}")
                         for kind in ("claims", "volumes")]

    def start(self) -> VolumeProvisioner:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _watch(self, kind: str) -> None:
        lister = (self.core.list_persistent_volume_claim_for_all_namespaces if kind == "claims"
                  else self.core.list_persistent_volume)
        while not self._stop.is_set():
            try:
                for event in watch.Watch().stream(lister, timeout_seconds=30):
                    if self._stop.is_set():
                        return
                    obj = self.api.sanitize_for_serialization(event["object"])
                    if event["type"] != "DELETED":
                        self._on(kind, obj)
            except Exception as exc:  # the API server restarting, a watch expiring
                if not self._stop.wait(1):
                    log.info("provisioner: %s watch ended (%s); watching again", kind, exc)

    def _on(self, kind: str, obj: dict[str, Any]) -> None:
        work: Callable[[str, dict[str, Any]], None]
        if kind == "claims" and wants_volume(obj):
            key = obj["metadata"]["uid"]
            work = self._provision
        elif kind == "volumes" and released_volume_of_ours(obj):
            key = obj["metadata"]["name"]
            work = self._delete
        else:
            return
        with self._lock:
            if key in self._pending:
                return
            self._pending.add(key)
        self.pool.submit(work, key, obj)

    def _done(self, key: str) -> None:
        with self._lock:
            self._pending.discard(key)

    def _provision(self, key: str, pvc: dict[str, Any]) -> None:
        try:
            self.core.create_persistent_volume(cast(Any, volume_for(pvc)))
        except ApiException as exc:
            if exc.status != 409:  # 409: made already (a repeated event)
                log.warning("provisioner: volume for %s/%s: %s", pvc["metadata"]["namespace"],
                            pvc["metadata"]["name"], exc.reason)
        finally:
            self._done(key)

    def _delete(self, key: str, pv: dict[str, Any]) -> None:
        try:
            self.core.delete_persistent_volume(pv["metadata"]["name"])
        except ApiException as exc:
            if exc.status != 404:
                log.warning("provisioner: deleting %s: %s", pv["metadata"]["name"], exc.reason)
        finally:
            self._done(key)
