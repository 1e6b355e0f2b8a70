"""Progress reports to the operator: ``GRPOJob.status.progress`` patched in-cluster.

Inside a Ray head pod the driver has the job's ServiceAccount (whose Role allows
``patch`` on its own ``grpojobs/status`` only), ``GRPO_JOB_NAME``/``GRPO_JOB_NAMESPACE``
from the operator, and the API server's address from the pod environment. Reports
are merge patches of ``status.progress`` under the ``grpo-trainer`` field manager, at
most every ``PROGRESS_MIN_INTERVAL_S``; a failed report is logged and never stops
training.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from grpo_api.contract import (
    API_GROUP,
    API_VERSION,
    PLURAL,
    PROGRESS_FIELD_MANAGER,
    PROGRESS_MIN_INTERVAL_S,
)
from grpo_api.trainer_config import Config

from .progress import JsonFileProgressReporter, NullProgressReporter, Progress, ProgressReporter

log = logging.getLogger(__name__)

SA_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


class KubernetesProgressReporter:
    def __init__(
        self,
        namespace: str,
        name: str,
        api: Any = None,
        min_interval_s: float = PROGRESS_MIN_INTERVAL_S,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.min_interval_s = min_interval_s
        self._api = api
        self._last = float("-inf")
        self._last_stage = float("-inf")  # its own limit: a stage never delays a step report

    def _client(self) -> Any:
        if self._api is None:
            from kubernetes import client, config  # slow to import: only when reporting

            config.load_incluster_config()
            self._api = client.CustomObjectsApi()
        return self._api

    def report(self, progress: Progress, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.min_interval_s:
            return
        self._last = now
        self._patch({"status": {"progress": progress.to_status()}})

    def stage_entered(self, stage: str) -> None:
        """Only stage and stageAt: the operator ends an attempt as Hang when neither a
        step nor a stage was reported for its deadline (a driver stuck itself)."""
        now = time.monotonic()
        if now - self._last_stage < self.min_interval_s:
            return
        self._last_stage = now
        at = datetime.now(UTC).isoformat()
        self._patch({"status": {"progress": {"stage": stage, "stageAt": at}}})

    def _patch(self, body: dict[str, Any]) -> None:
        try:
            self._client().patch_namespaced_custom_object_status(
                API_GROUP,
                API_VERSION,
                self.namespace,
                PLURAL,
                self.name,
                body,
                field_manager=PROGRESS_FIELD_MANAGER,
            )
        except Exception as err:  # the API server may be away; training goes on
            log.warning("progress report for %s/%s failed: %s", self.namespace, self.name, err)


def job_in_cluster(cfg: Config) -> tuple[str, str] | None:
    """(namespace, name) of the GRPOJob whose pod this is (an API server, a ServiceAccount
    token and the job's name in the config), or None outside one."""
    tr = cfg.trainer
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and SA_TOKEN.exists()
    if in_cluster and tr.job_namespace and tr.job_name:
        return tr.job_namespace, tr.job_name
    return None


def reporter_for(cfg: Config) -> ProgressReporter:
    """In a pod of a GRPOJob: the status reporter; else a progress file if configured."""
    if (job := job_in_cluster(cfg)) is not None:
        log.info("reporting progress to GRPOJob %s/%s", *job)
        return KubernetesProgressReporter(*job)
    if cfg.metrics.progress_file:
        return JsonFileProgressReporter(cfg.metrics.progress_file)
    return NullProgressReporter()
