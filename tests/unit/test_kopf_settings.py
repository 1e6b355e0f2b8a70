"""What the operator asks of Kopf (kopf_settings.py): its own children's kinds watched
through a server-side label selector, so a shared cluster's other pods and RayClusters
never reach it; an idle object worker lets its last body go within a second."""

from __future__ import annotations

import kopf
import pytest
from kopf._cogs.structs.references import Resource

from grpo_api.contract import API_GROUP, API_VERSION, JOB_LABEL, PLURAL
from grpo_operator.kopf_settings import WORKER_IDLE_S, apply_settings

pytestmark = pytest.mark.unit

PODS = Resource("", "v1", "pods", kind="Pod", namespaced=True)
RAY_CLUSTERS = Resource("ray.io", "v1", "rayclusters", kind="RayCluster", namespaced=True)
GRPOJOBS = Resource(API_GROUP, API_VERSION, PLURAL, kind="GRPOJob", namespaced=True)
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta1", "workloads", kind="Workload",
                     namespaced=True)
POD_METRICS = Resource("metrics.k8s.io", "v1beta1", "pods", kind="PodMetrics",
                       namespaced=True)


@pytest.fixture
def settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    apply_settings(settings, peering_lifetime_s=60)
    return settings


def test_pods_and_ray_clusters_are_watched_by_the_job_label_alone(
        settings: kopf.OperatorSettings) -> None:
    selectors = settings.watching.label_selectors
    assert list(selectors.collect(PODS)) == [JOB_LABEL]
    assert list(selectors.collect(RAY_CLUSTERS)) == [JOB_LABEL]


def test_jobs_workloads_and_other_groups_pods_are_not_filtered(
        settings: kopf.OperatorSettings) -> None:
    # A GRPOJob carries no job label; Kueue's Workloads are matched by their owner.
    for resource in (GRPOJOBS, WORKLOADS, POD_METRICS):
        assert list(settings.watching.label_selectors.collect(resource)) == []


def test_an_idle_worker_lets_its_body_go_sooner_than_kopfs_default(
        settings: kopf.OperatorSettings) -> None:
    assert settings.queueing.idle_timeout == WORKER_IDLE_S
    assert kopf.OperatorSettings().queueing.idle_timeout > WORKER_IDLE_S
    assert settings.persistence.finalizer == f"{API_GROUP}/operator"
    assert settings.peering.lifetime == 60
