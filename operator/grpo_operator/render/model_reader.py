"""The pod that reads a job's model config.json inside the cluster (pure).

It runs `python -m grpo_api.model_config` from the job's trainer image, so it sees what
the Ray pods will see: the model claim mounted read-only at /models, or the hub with the
token of the job's Secret (which the operator itself never reads). Its termination
message carries the shape fields (grpo_api.model_config.ReaderReport).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from grpo_api.contract import (
    API_GROUP,
    API_VERSION,
    DEFAULT_TRAINER_IMAGE,
    IMAGE_UID,
    JOB_LABEL,
    KIND,
    MODEL_MOUNT,
    TERMINATION_LOG,
)
from grpo_api.job import GRPOJobSpec
from grpo_api.job.data import is_s3

from . import names
from .children import render_template, store_env
from .hub import store_args
from .names import JobRef
from .pod_settings import merged
from .security import container_security_context, pod_security_context

COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "model-config"
READER_MODULE = "grpo_api.model_config"
# An s3:// model: its config.json fetched with checkpoint.store's settings, then read alike.
STORE_READER_MODULE = "grpo_trainer.store_fetch"
# Python, pydantic and a JSON file: far below this.
READER_MEMORY = "256Mi"


def reader_command(spec: GRPOJobSpec, hub_url: str | None) -> list[str]:
    if is_s3(spec.model.path):
        return ["python", "-m", STORE_READER_MODULE, "--config-of", spec.model.path,
                *store_args(spec)]
    where = ["--url", hub_url] if hub_url else ["--path", spec.model.path]
    return ["python", "-m", READER_MODULE, *where]


def render_model_reader(spec: GRPOJobSpec, job: JobRef, hub_url: str | None,
                        default_image: str = "", pod_uid: int | None = IMAGE_UID
                        ) -> dict[str, Any]:
    """The reader pod: with `hub_url`, a GET of that URL with the job's hub token; else
    the directory spec.model.path on spec.model.claimName. `pod_uid`: its UID, GID and
    fsGroup, as the Ray pods' (None: the platform assigns them)."""
    x = merged(spec.pods, "head")  # scheduled as the head, which will mount the same
    env: list[dict[str, Any]] = []
    if hub_url and spec.hub.token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": spec.hub.token_secret, "key": spec.hub.token_key}}})
    env += [*x["env"], *store_env(spec)]  # an s3:// model is read with the store's keys
    ctx: dict[str, Any] = {
        "job": job,
        "name": names.model_reader(job),
        "job_label": JOB_LABEL,
        "component_label": COMPONENT_LABEL,
        "component": COMPONENT,
        "api_version": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "x": x,
        "env": env,
        "image": spec.image or default_image or DEFAULT_TRAINER_IMAGE,
        "command": reader_command(spec, hub_url),
        "termination_log": TERMINATION_LOG,
        "memory": READER_MEMORY,
        "claim": None if hub_url else spec.model.claim_name,
        "model_mount": MODEL_MOUNT,
        "container_security_context": container_security_context,
        "pod_security_context": partial(pod_security_context, uid=pod_uid),
    }
    (pod,) = render_template("model-reader.yaml.j2", ctx)
    return pod
