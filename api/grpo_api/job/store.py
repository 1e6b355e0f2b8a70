"""GRPOJob.spec.checkpoint.store: checkpoints kept in an S3-compatible object store.

The trainer's side is grpo_api.trainer_config.ObjectStoreConfig; the operator renders this
section into it (render/trainer_config.py), with the job's own prefix below ``uri``."""

from __future__ import annotations

from pydantic import Field

from ..contract import S3_URI_PATTERN, STORE_KEY_ENV
from .base import DNS_LABEL_PATTERN, ApiModel


class ObjectStoreSpec(ApiModel):
    """Where the checkpoints go instead of the claim: each rank uploads its own files in
    the background (the step waits for none of it), and a checkpoint counts once its
    manifest, uploaded last, names every file with its size and digest. The job's
    checkpoints live under ``<uri>/<namespace>/<job name>/``, as on a claim; deleting the
    job leaves them, and a job created again under the same name resumes from them."""

    uri: str = Field(
        pattern=S3_URI_PATTERN, max_length=1024,
        description="s3://bucket/prefix; the job's checkpoints and export go below "
        "<prefix>/<namespace>/<job name>/.",
    )
    endpoint: str | None = Field(
        None, pattern=r"^https?://[^\s]+$", max_length=1024,
        description="For a store other than AWS S3 (MinIO, Ceph RGW, SeaweedFS, GCS's "
        "https://storage.googleapis.com). Unset: AWS S3 of region.",
    )
    region: str | None = Field(
        None, pattern=r"^[a-z0-9-]{1,64}$",
        description="The bucket's region (AWS); most other stores take any value.",
    )
    path_style: bool = Field(
        False, description="true: the bucket in the path (MinIO, Ceph and most other "
        "stores want this); false: in the host name (AWS's virtual-hosted style).",
    )
    keys_secret: str | None = Field(
        None, pattern=DNS_LABEL_PATTERN,
        description="A Secret in the job's namespace holding the keys as "
        f"{' and '.join(STORE_KEY_ENV)}; the Ray pods get them as env, never in the job's "
        "ConfigMap, status or events. Unset: the pods' own identity (IRSA or workload "
        "identity through spec.pods' serviceAccountName, or the node's instance role).",
    )
    upload_deadline_seconds: int = Field(
        1800, ge=60, le=7 * 86400,
        description="The job fails when no checkpoint has completed for this long because "
        "uploads keep failing (the store down or refusing); training goes on until then.",
    )
