"""spec.pods: what a cluster needs on the Ray pods besides what the operator sets.

The fields KubeRay and Kubeflow users set on a pod template (env and envFrom, volumes and
mounts, scheduling, identity, labels, securityContext), under `common` (head and workers),
`head` and `workers`. The operator owns the rest of the pod (GPU/CPU/memory resources, the
planner's env, its volumes and mounts, the GPU node selector): a setting that would
change one of those is refused with the field named (`conflicts` in
render/pod_settings.py), never silently overridden. The Kubernetes types are modelled
field by field where people write them by hand; `affinity` and volume sources are passed
to the pod as written (their schemas are Kubernetes' own and large).
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, JsonValue, model_validator

from .base import DNS_LABEL_PATTERN, SUBDOMAIN_PATTERN, ApiModel

_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"  # what the API server accepts for env names
_OPEN: dict[str, JsonValue] = {"x-kubernetes-preserve-unknown-fields": True}
# Pod fields a user might reach for that the operator owns, and what to do instead.
_OWNED = {
    "resources": "GPU, CPU and memory are the planner's: set spec.resources / spec.memory",
    "image": "set spec.image",
    "command": "the operator runs Ray and the trainer",
    "args": "the operator runs Ray and the trainer",
    "containers": "the Ray container is the operator's; use env, volumeMounts, or "
                  "initContainers for a step before it",
}


def _exactly_one(model: ApiModel, *fields: str) -> None:
    """Kubernetes' "exactly one of" rule for source objects, with the wire names."""
    if sum(getattr(model, f) is not None for f in fields) != 1:
        names = [model.model_fields[f].alias or f for f in fields]
        raise ValueError(f"set exactly one of {', '.join(names)}")


class KeyRef(ApiModel):
    """A key of a Secret or ConfigMap."""

    name: str = Field(pattern=SUBDOMAIN_PATTERN, description="Secret or ConfigMap name.")
    key: str = Field(min_length=1, description="Key in it.")
    optional: bool | None = Field(None, description="true: a missing object or key is fine.")


class FieldRef(ApiModel):
    """A field of the pod (downward API)."""

    field_path: str = Field(min_length=1, description="e.g. metadata.name, status.podIP.")


class EnvVarSource(ApiModel):
    """Where an env value comes from: exactly one of the three."""

    secret_key_ref: KeyRef | None = Field(None, description="A key of a Secret (HF_TOKEN).")
    config_map_key_ref: KeyRef | None = Field(None, description="A key of a ConfigMap.")
    field_ref: FieldRef | None = Field(None, description="A field of the pod.")

    @model_validator(mode="after")
    def _one(self) -> Self:
        _exactly_one(self, "secret_key_ref", "config_map_key_ref", "field_ref")
        return self


class EnvVar(ApiModel):
    """One environment variable of the Ray container."""

    name: str = Field(pattern=_ENV_NAME, description="Variable name.")
    value: str | None = Field(None, description="Literal value.")
    value_from: EnvVarSource | None = Field(None, description="Value from a Secret, etc.")

    @model_validator(mode="after")
    def _value_or_from(self) -> Self:
        if self.value is not None and self.value_from is not None:
            raise ValueError("set value or valueFrom, not both")
        return self


class NameRef(ApiModel):
    """A reference by name."""

    name: str = Field(pattern=SUBDOMAIN_PATTERN, description="Object name.")


class EnvFromSource(ApiModel):
    """Every key of a Secret or ConfigMap as env (exactly one of the two)."""

    secret_ref: NameRef | None = Field(None, description="A Secret.")
    config_map_ref: NameRef | None = Field(None, description="A ConfigMap.")
    prefix: str | None = Field(None, description="Prepended to every variable name.")

    @model_validator(mode="after")
    def _one(self) -> Self:
        _exactly_one(self, "secret_ref", "config_map_ref")
        return self


class Volume(ApiModel):
    """A pod volume: a name and one volume source, as in a Pod (e.g. persistentVolumeClaim,
    secret, configMap, csi, emptyDir, nfs); the source is passed through as written."""

    model_config = ApiModel.model_config | {"extra": "allow", "json_schema_extra": _OPEN}

    name: str = Field(pattern=DNS_LABEL_PATTERN, description="Volume name, unique in the pod.")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        sources = list(self.model_extra or {})
        if len(sources) != 1:
            raise ValueError(f"volume {self.name!r}: set exactly one volume source "
                             f"(persistentVolumeClaim, secret, configMap, csi, ...), "
                             f"got {sources or 'none'}")
        return self


class VolumeMount(ApiModel):
    """Where a volume appears in the Ray container."""

    name: str = Field(
        pattern=DNS_LABEL_PATTERN, description="A volume of this pod (spec.pods.*.volumes)."
    )
    mount_path: str = Field(pattern=r"^/", description="Absolute path in the container.")
    sub_path: str | None = Field(None, description="Sub-path of the volume to mount.")
    read_only: bool | None = Field(None, description="Mount read-only.")


class Toleration(ApiModel):
    """A toleration added to the operator's (which tolerate nvidia.com/gpu on GPU pods)."""

    key: str | None = Field(None, description="Taint key; unset with Exists: every taint.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal.")
    value: str | None = Field(None, description="Taint value (Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect; unset: all.")
    toleration_seconds: int | None = Field(None, ge=0, description="For NoExecute only.")


class SeccompProfile(ApiModel):
    """The pod's seccomp profile."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(
        description="Profile type.")
    localhost_profile: str | None = Field(None, description="Path, for type Localhost.")


class PodSecurityContext(ApiModel):
    """Pod-level security settings."""

    run_as_user: int | None = Field(None, ge=0, description="UID of the containers.")
    run_as_group: int | None = Field(None, ge=0, description="GID of the containers.")
    run_as_non_root: bool | None = Field(None, description="Refuse to run as UID 0.")
    fs_group: int | None = Field(None, ge=0, description="Group owning mounted volumes.")
    seccomp_profile: SeccompProfile | None = Field(None, description="Seccomp profile.")


class InitContainer(ApiModel):
    """A step run to completion before the Ray container starts (after the operator's hub
    fetch), e.g. building or copying the model and data onto the checkpoint volume. It
    gets the Ray container's env, volume mounts (the checkpoint volume read-write at
    /checkpoints), resources and securityContext; a failure ends the attempt with its
    message. It runs again at every attempt, so make it keep what an earlier one built."""

    name: str = Field(pattern=DNS_LABEL_PATTERN, max_length=63,
                      description="Container name, unique in the pod (not hub-fetch, "
                      "ray-head or ray-worker: the operator's).")
    image: str | None = Field(
        None, min_length=1,
        description="Image; unset: the job's trainer image (spec.image or the operator's "
        "default), which has grpo-train (e.g. `grpo-train make-tiny`).")
    command: list[str] = Field(
        min_length=1,
        description="Command, exec form (no shell); $(VAR) expands the container's env, "
        "e.g. $(GRPO_CHECKPOINT_DIR), the job's directory on the checkpoint volume.",
        json_schema_extra={"items": {"type": "string", "description": "A word."}})
    args: list[str] | None = Field(
        None, description="Arguments to the command.",
        json_schema_extra={"items": {"type": "string", "description": "A word."}})
    env: list[EnvVar] | None = Field(
        None, description="Env added to the Ray container's (not the operator's names).")


class PodSettings(ApiModel):
    """Settings added to the Ray pods; the operator's own cannot be overridden (refused
    with the field named)."""

    labels: dict[str, str] | None = Field(
        None, description="Pod labels (not grpo.dev/ or ray.io/ keys).")
    annotations: dict[str, str] | None = Field(
        None, description="Pod annotations (not grpo.dev/ or ray.io/ keys).")
    env: list[EnvVar] | None = Field(
        None,
        description="Env of the Ray container, e.g. HF_TOKEN from a Secret; not the "
        "operator's (GRPO_*, the planner's).")
    env_from: list[EnvFromSource] | None = Field(
        None, description="Every key of a Secret or ConfigMap as env.")
    volumes: list[Volume] | None = Field(
        None, description="Pod volumes (not checkpoints, config, dshm, models).")
    volume_mounts: list[VolumeMount] | None = Field(
        None, description="Mounts in the Ray container (not the operator's "
        "paths /checkpoints, /etc/grpo, /dev/shm, /models).")
    tolerations: list[Toleration] | None = Field(
        None, description="Added to the operator's tolerations.")
    node_selector: dict[str, str] | None = Field(
        None,
        description="Added to the operator's (which selects the GPU type on workers).")
    affinity: dict[str, Any] | None = Field(
        None, json_schema_extra=_OPEN, description="Pod affinity, as in a Pod spec.")
    topology_spread_constraints: list[dict[str, Any]] | None = Field(
        None, json_schema_extra={"items": {"type": "object", **_OPEN, "description": (
            "One constraint: maxSkew, topologyKey, whenUnsatisfiable, labelSelector, ...")}},
        description="Topology spread constraints, as in a Pod spec (select the job's pods "
        "with its labels, e.g. grpo.dev/job: <name> and grpo.dev/role: worker).")
    priority_class_name: str | None = Field(
        None, pattern=SUBDOMAIN_PATTERN, description="PriorityClass of the pods.")
    scheduler_name: str | None = Field(
        None, pattern=SUBDOMAIN_PATTERN, max_length=253,
        description="The scheduler that places the pods (e.g. a gang scheduler such as "
        "Volcano or the scheduler-plugins' coscheduling); unset: the default scheduler.")
    image_pull_secrets: list[NameRef] | None = Field(
        None, description="Secrets for pulling the trainer image.")
    service_account_name: str | None = Field(
        None, pattern=SUBDOMAIN_PATTERN,
        description="ServiceAccount of the pods (cloud identity); on the head it is also "
        "granted the trainer's right to report progress.")
    init_containers: list[InitContainer] | None = Field(
        None, description="Steps run in order before the Ray container, each to completion "
        "(after the operator's hub fetch), with its env, mounts, resources and "
        "securityContext; e.g. build the model and data onto the checkpoint volume.")
    security_context: PodSecurityContext = Field(  # the API server defaults it to {}
        default_factory=lambda: PodSecurityContext.model_validate({}),
        description="Pod-level securityContext.")

    @model_validator(mode="before")
    @classmethod
    def _owned_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, why in _OWNED.items():
                if key in data:
                    raise ValueError(f"{key}: the operator owns it ({why})")
        return data


class PodsSpec(ApiModel):
    """Pod settings: `common` applies to head and workers, then `head` / `workers` add to
    it (lists appended, maps merged, a role's scalar wins)."""

    common: PodSettings = Field(
        default_factory=lambda: PodSettings.model_validate({}),
        description="Settings for every Ray pod.")
    head: PodSettings = Field(
        default_factory=lambda: PodSettings.model_validate({}),
        description="Settings for the head pod only.")
    workers: PodSettings = Field(
        default_factory=lambda: PodSettings.model_validate({}),
        description="Settings for the worker pods only.")
