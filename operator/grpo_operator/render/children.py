"""Render a job's children (pure): a function of (spec, plan, job, attempt) only."""

from __future__ import annotations

from functools import cache, partial
from typing import Any

import jinja2
import yaml

from grpo_api.contract import (
    API_GROUP,
    API_VERSION,
    ATTEMPT_LABEL,
    CHECKPOINT_MOUNT,
    CONFIG_PATH,
    DEFAULT_TRAINER_IMAGE,
    IMAGE_UID,
    JOB_LABEL,
    JOB_UID_LABEL,
    KIND,
    KUEUE_QUEUE_LABEL,
    MODEL_MOUNT,
    PLURAL,
    RANK0_GROUP,
    RANK0_NODE_LABEL,
    RAY_VERSION,
    ROLE_LABEL,
    STORE_KEY_ENV,
    TERMINATION_LOG,
    CheckpointRetention,
    Env,
    Role,
)
from grpo_api.job import GRPOJobSpec

from ..planner import Plan, termination_grace_s
from ..planner.resources import ray_node_labels
from ..planner.save_time import prestop_timeout_s
from ..planner.staging import pod_staging_gib
from . import names
from .collective_debug import collective_debug_env
from .hub import hub_fetch
from .names import JobRef
from .network_policy import JobNetworkPolicy
from .pod_settings import avoiding, merged
from .security import container_security_context, pod_security_context
from .trainer_config import METRICS_PORT, METRICS_PORT_NAME, trainer_config

# Ray wants many open files. The containers run as non-root with every capability
# dropped, so they cannot raise the hard limit: 65536 where the node's hard limit allows
# it, else up to that hard limit (render/security.py).
OPEN_FILES = "ulimit -n 65536 2>/dev/null || ulimit -n hard; "
# The head runs Ray's head without --block (KubeRay always adds it), then the driver
# in the foreground: the container's exit code is the trainer's (docs/architecture.md).
HEAD_COMMAND = (
    f"{OPEN_FILES}${{KUBERAY_GEN_RAY_START_CMD// --block/}} && "
    f"exec python -m grpo_trainer --config {CONFIG_PATH}"
)
WORKER_COMMAND = f"{OPEN_FILES}exec $KUBERAY_GEN_RAY_START_CMD"
# A worker's preStop hook: its `ray start --block` gets SIGTERM (and takes the node's
# ranks down) only once the driver is done with them (grpo_trainer.liveness.prestop).
PRESTOP_COMMAND = "exec python -m grpo_trainer.liveness.prestop --timeout {timeout}"


def kept_output(logs_dir: str) -> str:
    """The Ray container's output also to `<logs_dir>/<pod name>.log` on the checkpoint
    claim, so an ended attempt's logs outlive its pods (the driver's log holds its ranks'
    lines too: Ray sends them to the driver). A claim that cannot take it costs the copy,
    never the run; the container's log and its exit code are as before (the trainer is
    exec'd, tee only reads its output)."""
    return (f'if mkdir -p "{logs_dir}" 2>/dev/null; then '
            f'exec > >(tee -a "{logs_dir}/$HOSTNAME.log") 2>&1; fi; ')


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("grpo_operator", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # YAML, not HTML; values go through tojson
    )


def render_template(name: str, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects one template makes of `ctx` (empty documents dropped). libyaml's safe
    loader, not PyYAML's pure-Python one: the same objects, and parsing the rendered
    YAML was 95% of an admission's CPU time (docs/benchmarks.md)."""
    text = _env().get_template(name).render(ctx)
    return [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]


def identity_env(job: JobRef, attempt: int) -> dict[str, str]:
    """The job's identity, as the env of its Ray containers: the one channel it reaches
    the trainer by (grpo_api.job.trainer.IDENTITY_ENV says which config path each sets)."""
    return {
        Env.JOB_NAME.value: job.name,
        Env.JOB_NAMESPACE.value: job.namespace,
        Env.JOB_UID.value: job.uid,
        Env.ATTEMPT.value: str(attempt),
        Env.CHECKPOINT_DIR.value: names.checkpoint_dir(job),
    }


def job_env(plan: Plan, job: JobRef, attempt: int) -> dict[str, str]:
    """Everything injected into the Ray containers: the plan's env plus identity."""
    return {**plan.env, **identity_env(job, attempt)}


# What the head's hub-fetch step reads of the identity: where it reports its progress.
HUB_FETCH_ENV = (Env.JOB_NAME.value, Env.JOB_NAMESPACE.value)


def logging_env(spec: GRPOJobSpec) -> list[dict[str, Any]]:
    """spec.logging's secret, for the head pod's containers (the driver logs there)."""
    wandb = spec.logging.wandb
    if wandb is None or wandb.api_key_secret is None:
        return []
    ref = {"name": wandb.api_key_secret, "key": wandb.api_key_key}
    return [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": ref}}]


def store_env(spec: GRPOJobSpec) -> list[dict[str, Any]]:
    """spec.checkpoint.store's keys, for every Ray container (every rank uploads its own
    files): references to the Secret, so the keys are in no object the operator writes."""
    store = spec.checkpoint.store
    if store is None or store.keys_secret is None:
        return []
    return [{"name": key, "valueFrom": {"secretKeyRef": {"name": store.keys_secret,
                                                         "key": key}}}
            for key in STORE_KEY_ENV]


def render_children(
    spec: GRPOJobSpec, plan: Plan, job: JobRef, attempt: int, default_image: str = "",
    debug_collectives: bool = False, measured_save_s: float | None = None,
    pod_uid: int | None = IMAGE_UID, network_policy: JobNetworkPolicy | None = None,
    avoid_nodes: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """ConfigMap, PVC (unless the spec names one), trainer RBAC, the NetworkPolicy of the
    job's pods (with `network_policy`, the platform's) and the RayCluster;
    `debug_collectives`: the attempt after a Hang, with the collective debug env;
    `measured_save_s`: status.progress.saveSeconds, which sizes the SIGTERM grace;
    `pod_uid`: the Ray pods' UID, GID and fsGroup (None: the platform assigns them);
    `avoid_nodes`: nodes the Ray pods prefer not to land on (the node lost by the
    attempt before)."""
    ctx = _context(spec, plan, job, attempt, default_image, debug_collectives,
                   measured_save_s, pod_uid, avoid_nodes)
    config = trainer_config(spec, plan, job)
    ctx["config_yaml"] = yaml.dump(config, Dumper=yaml.CSafeDumper, sort_keys=False)
    ctx["network_policy"] = network_policy
    files = ["configmap.yaml.j2", "rbac.yaml.j2", "raycluster.yaml.j2"]
    if spec.checkpoint.size is not None:  # the claim the operator makes
        files.insert(1, "pvc.yaml.j2")
    if network_policy is not None:  # before the pods it guards
        files.insert(-1, "networkpolicy.yaml.j2")
    return [d for f in files for d in render_template(f, ctx)]


def render_ray_cluster(spec: GRPOJobSpec, plan: Plan, job: JobRef, attempt: int,
                       default_image: str = "", pod_uid: int | None = IMAGE_UID
                       ) -> dict[str, Any]:
    """The RayCluster alone, as render_children makes it: admission checks its pods
    against the namespace's rules without rendering the job's other children."""
    ctx = _context(spec, plan, job, attempt, default_image, False, None, pod_uid)
    (cluster,) = render_template("raycluster.yaml.j2", ctx)
    return cluster


def _context(spec: GRPOJobSpec, plan: Plan, job: JobRef, attempt: int, default_image: str,
             debug_collectives: bool, measured_save_s: float | None,
             pod_uid: int | None, avoid_nodes: tuple[str, ...] = ()) -> dict[str, Any]:
    """What the templates read; the ConfigMap's `config_yaml` is added by its caller."""
    claim = names.job_claim(job, spec.checkpoint)  # None: each pod's own disk
    head = merged(spec.pods, "head")
    head["env"] = [*head["env"], *logging_env(spec), *store_env(spec)]
    workers = merged(spec.pods, "workers")
    workers["env"] = [*workers["env"], *store_env(spec)]
    for pod in (head, workers):
        pod["affinity"] = avoiding(pod.get("affinity"), avoid_nodes)
    env = job_env(plan, job, attempt)
    grace_s = termination_grace_s(plan, measured_save_s)
    keep = kept_output(names.attempt_logs_dir(job, attempt))  # every Ray container's output
    if debug_collectives:
        user_env = {str(e.get("name")) for e in [*head["env"], *workers["env"]]}
        env |= collective_debug_env(job, attempt, user_env)
    return {
        "job": job,
        "spec": spec,
        "attempt": attempt,
        "job_label": JOB_LABEL,
        "job_uid_label": JOB_UID_LABEL,
        "claim_owned": spec.checkpoint.effective_retention is CheckpointRetention.DELETE,
        "attempt_label": ATTEMPT_LABEL,
        "role_label": ROLE_LABEL,
        "queue_label": KUEUE_QUEUE_LABEL,
        "roles": {r.name.lower(): r.value for r in Role},
        "metrics_port": {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT,
                         "protocol": "TCP"},
        "api_version": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "group": API_GROUP,
        "plural": PLURAL,
        "names": {
            "config_map": names.config_map(job, attempt),
            "claim": claim,
            "account": names.trainer_account(job),
            "ray_cluster": names.ray_cluster(job, attempt),
            "network_policy": names.network_policy(job),
        },
        "multi_pod": plan.pods > 1,
        "image": spec.image or default_image or DEFAULT_TRAINER_IMAGE,
        "ray_version": RAY_VERSION,
        "ray_start_params": {"head": plan.head_ray_start_params,
                             "worker": plan.ray_start_params,
                             "rollout": plan.rollout_ray_start_params},
        "head": plan.head,
        "worker": plan.worker,
        "rank0": plan.rank0,
        "rank0_group": RANK0_GROUP,
        "rank0_label": RANK0_NODE_LABEL,
        "rollout": plan.rollout,
        # A disaggregated job's Ray node labels per worker group (its side).
        "ray_labels": {"head": ray_node_labels(plan.geometry, head=True),
                       "worker": ray_node_labels(plan.geometry),
                       "rank0": ray_node_labels(plan.geometry) | {RANK0_NODE_LABEL: "true"},
                       "rollout": ray_node_labels(plan.geometry, rollout=True)},
        "head_command": keep + HEAD_COMMAND,
        "worker_command": keep + WORKER_COMMAND,
        "env": env,
        "hub_fetch_env": {k: env[k] for k in HUB_FETCH_ENV},
        "termination_log": TERMINATION_LOG,
        "grace_s": grace_s,
        "prestop_command": PRESTOP_COMMAND.format(timeout=prestop_timeout_s(grace_s)),
        "checkpoint_mount": CHECKPOINT_MOUNT,
        # No claim: each pod's own disk, requested (planner/staging.py).
        "staging": {} if claim else pod_staging_gib(plan),
        "model_claim": spec.model.claim_name,
        "model_mount": MODEL_MOUNT,
        "config_dir": CONFIG_PATH.rsplit("/", 1)[0],
        # spec.pods, merged per role; conflicts with the above are refused before this.
        "extra": {"head": head, "worker": workers},
        "hub_args": hub_fetch(spec, job).args,
        "hub": spec.hub,
        "container_security_context": container_security_context,
        "pod_security_context": partial(pod_security_context, uid=pod_uid),
    }
