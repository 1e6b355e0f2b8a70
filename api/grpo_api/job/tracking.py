"""spec.logging: where the trainer's step metrics go besides its log and /metrics."""

from __future__ import annotations

from pydantic import Field

from .base import ApiModel

_SECRET_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class WandbSpec(ApiModel):
    """Weights & Biases: one run per job (its attempts resume it), named after the job."""

    project: str = Field(min_length=1, description="W&B project.")
    entity: str | None = Field(
        None, min_length=1, description="W&B entity (team or user); unset: the API key's.")
    api_key_secret: str | None = Field(
        None, pattern=_SECRET_NAME,
        description="Secret holding WANDB_API_KEY (in apiKeyKey), given to the head pod, "
        "where the driver logs. Unset: WANDB_* from spec.pods env (e.g. WANDB_MODE: "
        "offline writes the run to the checkpoint volume for `wandb sync`).")
    api_key_key: str = Field("apiKey", min_length=1, description="Key of apiKeySecret.")


class MlflowSpec(ApiModel):
    """MLflow: one run per job (its attempts resume it), named after the job."""

    tracking_uri: str = Field(
        min_length=1,
        description="Tracking URI, e.g. http://mlflow.mlflow:5000; credentials such as "
        "MLFLOW_TRACKING_TOKEN go in spec.pods.head env.")
    experiment: str | None = Field(
        None, min_length=1, description="Experiment; unset: <namespace>/<job name>.")


class LoggingSpec(ApiModel):
    """Metric sinks of the trainer's driver, each optional; a sink that fails is logged and
    dropped, never the job."""

    tensorboard: bool = Field(
        False, description="true: TensorBoard event files in <the job's checkpoint "
        "directory>/tensorboard on the checkpoint claim.")
    wandb: WandbSpec | None = Field(None, description="Log to Weights & Biases.")
    mlflow: MlflowSpec | None = Field(None, description="Log to MLflow.")
