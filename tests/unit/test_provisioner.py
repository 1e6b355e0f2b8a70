"""The testbed's volume provisioner, its pure parts: which claims it provisions and the
volume it writes (pre-bound, as an external-provisioner's), which volumes it deletes."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_testbed.node.claims import PROVISIONER_ROOT
from grpo_testbed.provisioner import (
    PROVISIONED_BY,
    PROVISIONER,
    PROVISIONER_ANNOTATION,
    STORAGE_CLASS,
    released_volume_of_ours,
    storage_class,
    volume_for,
    wants_volume,
)

pytestmark = pytest.mark.unit


def pvc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "metadata": {"name": "ckpt", "namespace": "ml", "uid": "u-1",
                     "annotations": {PROVISIONER_ANNOTATION: PROVISIONER}},
        "spec": {"storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteMany"],
                 "resources": {"requests": {"storage": "100Gi"}}},
        "status": {"phase": "Pending"}}
    for key, value in over.items():
        section, _, field = key.partition("__")
        doc[section][field] = value
    return doc


def test_a_claim_is_provisioned_once_the_pv_controller_names_this_provisioner() -> None:
    assert wants_volume(pvc())
    assert not wants_volume(pvc(metadata__annotations={}))  # the PV controller not yet
    assert not wants_volume(pvc(spec__storageClassName="kwok-volume"))
    assert not wants_volume(pvc(spec__volumeName="pvc-u-1"))
    assert not wants_volume(pvc(status__phase="Bound"))
    assert not wants_volume(pvc(metadata__deletionTimestamp="2026-12-03T00:00:00Z"))


def test_the_volume_is_pre_bound_to_its_claim_with_its_size_and_modes() -> None:
    pv = volume_for(pvc())
    assert pv["metadata"]["name"] == "pvc-u-1"
    assert pv["metadata"]["annotations"] == {PROVISIONED_BY: PROVISIONER}
    assert pv["spec"]["claimRef"] == {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                      "name": "ckpt", "namespace": "ml", "uid": "u-1"}
    assert pv["spec"]["capacity"] == {"storage": "100Gi"}
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pv["spec"]["storageClassName"] == STORAGE_CLASS
    # Where the real node's kubelet mounts kwok's volumes too (node/claims.py).
    assert pv["spec"]["hostPath"]["path"] == str(PROVISIONER_ROOT / "pvc-u-1")


def test_only_its_own_released_volumes_are_deleted() -> None:
    ours = {"metadata": {"name": "pvc-u-1", "annotations": {PROVISIONED_BY: PROVISIONER}},
            "spec": {"persistentVolumeReclaimPolicy": "Delete"}, "status": {"phase": "Released"}}
    assert released_volume_of_ours(ours)
    assert not released_volume_of_ours({**ours, "status": {"phase": "Bound"}})
    assert not released_volume_of_ours(
        {**ours, "spec": {"persistentVolumeReclaimPolicy": "Retain"}})
    assert not released_volume_of_ours(
        {**ours, "metadata": {"name": "x", "annotations": {PROVISIONED_BY: "other"}}})


def test_the_class_names_this_provisioner_and_binds_at_once() -> None:
    sc = storage_class()
    assert sc["provisioner"] == PROVISIONER and sc["volumeBindingMode"] == "Immediate"
    assert "storageclass.kubernetes.io/is-default-class" not in sc["metadata"]["annotations"]
    assert storage_class(default=True)["metadata"]["annotations"] == {
        "storageclass.kubernetes.io/is-default-class": "true"}
