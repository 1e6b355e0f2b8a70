"""The resolved trainer config (the per-attempt ConfigMap) from spec + plan.

Every path it sets is declared, with its source, in grpo_api.job.trainer.SOURCES; the
job's identity (checkpoint.dir, trainer.job_name, .job_namespace, .job_uid, .attempt)
is not in it: it reaches the trainer once, as the Ray containers' env (children.py).
Validated with the trainer's own schema (`grpo_api.trainer_config`, which the trainer
loads its file into, with that env over it), so a job the trainer would reject with
exit 2 is caught here; the webhook renders it too (reconcile.planning.planned), so such
a job is refused at apply.
"""

from __future__ import annotations

from typing import Any

from grpo_api.contract import RANK0_NODE_LABEL
from grpo_api.job import GRPOJobSpec
from grpo_api.job.lora import ALL_LINEAR, LoraSpec
from grpo_api.job.recovery import CheckpointSpec
from grpo_api.job.reward import RewardSpec
from grpo_api.job.store import ObjectStoreSpec
from grpo_api.job.tracking import LoggingSpec
from grpo_api.job.trainer import PLANNED, passed_settings
from grpo_api.trainer_config import MIN_PIXELS, Config

from ..planner import Plan
from ..planner.head import length_workers
from ..planner.peaks import planned_peaks
from .hub import hub_fetch
from .names import JobRef, checkpoint_dir, store_prefix

METRICS_PORT = 9100  # the trainer's Prometheus /metrics on the head pod
# The head container's port of that name: the chart's PodMonitor scrapes it by name. Not
# KubeRay's `metrics` (Ray's own exporter, 8080), which KubeRay adds when it is missing.
METRICS_PORT_NAME = "trainer-metrics"


def lora_config(lora: LoraSpec) -> dict[str, Any]:
    """spec.lora as the trainer config's actor.lora (grpo_api.trainer_config.LoraConfig);
    rendered only for a LoRA job (absent: full fine-tuning)."""
    return {
        "rank": lora.rank,
        "alpha": lora.alpha,
        "target_modules": ALL_LINEAR if lora.all_linear else list(lora.target_modules),
        "exclude_modules": lora.exclude_modules or None,  # "": exclude nothing
    }


def rank_cpus(plan: Plan) -> float:
    """Ray CPUs each rank actor reserves: the CPUs of the pod its ranks share (Ray's
    num-cpus there is the pod's CPU limit) over the ranks placed on it. A fixed 1 CPU per
    rank left a 2-rank worker pod of 1 CPU with a placement group pending forever."""
    pod = plan.worker or plan.head  # no worker pods (cpu, nodes 0): the head runs the ranks
    return round(pod.cpus / plan.geometry.ranks_per_node, 3)


def metrics_config(logging: LoggingSpec, job: JobRef) -> dict[str, Any]:
    """spec.logging as the trainer config's metrics section. The job's uid keys its wandb
    and MLflow runs, so every attempt logs to the same run, and a job created again under
    the same name starts a new one; the sinks write their files beside the checkpoints."""
    out: dict[str, Any] = {"prometheus_port": METRICS_PORT, "progress_bar": "off"}
    home = checkpoint_dir(job)
    if logging.tensorboard:
        out["tensorboard_dir"] = f"{home}/tensorboard"
    if (wandb := logging.wandb) is not None:
        out["wandb"] = {"project": wandb.project, "entity": wandb.entity,
                        "run_id": job.uid or None, "run_name": job.name, "dir": home}
    if (mlflow := logging.mlflow) is not None:
        out["mlflow"] = {"tracking_uri": mlflow.tracking_uri,
                         "experiment": mlflow.experiment or f"{job.namespace}/{job.name}",
                         "run_key": job.uid or None, "run_name": job.name}
    return out


def disaggregated_config(plan: Plan) -> dict[str, Any]:
    """A disaggregated job's rollout section additions: the placement, the staleness
    bound and the rollout side's engines (the trainer places them on the Ray nodes
    labelled with the rollout side); {} for a colocated job, whose config leaves the
    trainer's defaults (colocated) as before."""
    side, rb, pod = plan.geometry.rollout, plan.budget.rollout_side, plan.rollout
    if side is None or rb is None or pod is None:
        return {}
    return {
        "placement": "disaggregated",
        "max_staleness": side.max_staleness,
        "disaggregated": {
            "nodes": side.nodes,
            "engines_per_node": rb.engines_per_node,
            "gpus_per_engine": rb.tensor_parallel if side.is_gpu else 0,
            # The rollout pod's CPUs (Ray's num-cpus there) over its engines.
            "cpus_per_engine": round(pod.cpus / rb.engines_per_node, 3),
        },
    }


def trainer_config(spec: GRPOJobSpec, plan: Plan, job: JobRef) -> dict[str, Any]:
    s, g = plan.settings, plan.geometry
    tr, alg = spec.training, spec.algorithm
    samples = tr.rollout_batch_size * s.rollout_n
    local = hub_fetch(spec, job)  # hub ids -> where the head's init container put them
    cfg: dict[str, Any] = {
        "model": {"path": local.model_path},
        "data": {
            "train_files": [local.train],
            "val_files": [local.val] if local.val else [],
            "prompt_key": spec.data.prompt_key,
            "answer_key": spec.data.answer_key,
            "image_key": spec.data.image_key,
            "format_prompt": "math" if spec.reward.type == "math" else "r1v"
            if spec.reward.type == "r1v" else "plain",
            "max_prompt_length": spec.data.max_prompt_length,
            "seed": tr.seed,
            "image_max_pixels": spec.data.max_pixels,
            "image_min_pixels": min(spec.data.max_pixels, MIN_PIXELS),
            "overlong_prompts": spec.data.overlong_prompts,
            "max_images_per_prompt": spec.data.max_images_per_prompt,
            "video_key": spec.data.video_key,
            "max_videos_per_prompt": spec.data.max_videos_per_prompt,
            "video_fps": spec.data.video_fps,
            "max_frames": spec.data.max_frames,
            "video_max_pixels": spec.data.video_max_pixels,
            "video_min_pixels": min(spec.data.video_max_pixels, MIN_PIXELS),
            "bad_rows": spec.data.bad_rows,
            "prompt_lengths": spec.data.prompt_lengths,
            # The length pass in the head's CPUs, which the plan sized it for (planner/head.py).
            "length_workers": length_workers(g),
        },
        "rollout": {
            "engine": g.rollout_engine,
            "temperature": alg.temperature,
            "top_p": alg.top_p,
            "max_new_tokens": spec.data.max_response_length,
            "seed": tr.seed,
            **disaggregated_config(plan),
        },
        "algorithm": {
            "clip_ratio_low": alg.clip_ratio_low,
            "clip_ratio_high": alg.clip_ratio_high,
            "kl_coef": alg.kl_coef,
        },
        "actor": {
            "lr": tr.learning_rate,
            "weight_decay": tr.weight_decay,
            "max_grad_norm": tr.max_grad_norm,
            # globalBatchSize responses per optimizer update, as in the spec.
            "mini_batch_size": min(tr.global_batch_size, samples),
            "dtype": "bfloat16" if g.is_gpu else "float32",
            **({"lora": lora_config(spec.lora)} if spec.lora is not None else {}),
        },
        "resources": {
            "num_workers": g.world_size,
            # One placement group per worker pod; nodes 0 (cpu): the head runs the ranks.
            "nodes": max(1, g.nodes),
            "ranks_per_node": g.ranks_per_node,
            "ranks_on_head": g.nodes == 0,
            # Rank 0's node has a pod of its own (its group's Ray node label).
            **({"rank0_node_labels": {RANK0_NODE_LABEL: "true"}} if plan.rank0 else {}),
            "gpus_per_worker": 1 if g.is_gpu else 0,
            "cpus_per_worker": rank_cpus(plan),
            "ray_address": "auto",  # the head container started Ray just before
        },
        "reward": reward_config(spec.reward),
        "checkpoint": {
            "interval_steps": spec.checkpoint.interval_steps,
            "keep": spec.checkpoint.keep,
            "async_save": spec.checkpoint.async_save,
            "export": True,  # the final model to <dir>/export: status.export says where
            **({"store": store_config(spec.checkpoint, spec.checkpoint.store, job)}
               if spec.checkpoint.store is not None else {}),
        },
        "metrics": metrics_config(spec.logging, job) | {
            "planned_peaks": planned_peaks(plan).to_wire()},
        "trainer": {
            # maxSteps wins when set; else the trainer runs `epochs` passes over the train
            # split (only it knows how many prompts the split has).
            **({"total_steps": tr.max_steps} if tr.max_steps else {}),
            "epochs": tr.epochs,
            "rollout_batch_size": tr.rollout_batch_size,
            "seed": tr.seed,
            "val_interval_steps": tr.val_interval_steps,
            "stall_timeout_s": spec.recovery.stall_timeout_seconds,
        },
    }
    for source in PLANNED:  # the planned settings, by their trainer paths
        assert source.knob is not None
        section, key = source.path.split(".")
        cfg[section][key] = source.knob.trainer_value(plan.knob_value(source.knob))
    for path, value in passed_settings(spec).items():  # passed on as they are
        section, key = path.split(".")
        cfg[section][key] = value
    if not g.is_gpu:  # no GPU memory to share with vLLM; a fixed, valid fraction
        cfg["rollout"]["gpu_memory_utilization"] = 0.5
    # Raises with the field named; handlers report it. The job's directory reaches the
    # trainer as env (identity_env), over this file: checked here as the trainer sees it.
    Config.model_validate(cfg | {"checkpoint": cfg["checkpoint"] | {"dir": checkpoint_dir(job)}})
    return cfg


def store_config(checkpoint: CheckpointSpec, store: ObjectStoreSpec,
                 job: JobRef) -> dict[str, Any]:
    """spec.checkpoint.store as the trainer's checkpoint.store: the job's own prefix,
    <uri>/<namespace>/<job>, as its directory on a claim. The keys stay a Secret's name."""
    return {"uri": store_prefix(job, store.uri),
            "endpoint": store.endpoint, "region": store.region,
            "path_style": store.path_style, "keys_secret": store.keys_secret,
            "upload_deadline_s": float(store.upload_deadline_seconds),
            # No claim: each pod's own disk, which goes with the pod.
            "keep_attempts": not checkpoint.has_claim}


def reward_config(reward: RewardSpec) -> dict[str, Any]:
    """spec.reward as the trainer's reward section (the judge's token stays an env var's
    name: its value never enters the config)."""
    out: dict[str, Any] = {"type": reward.type, "format_weight": reward.format_weight}
    if reward.function:
        out["function"] = reward.function
    if reward.batch:
        out["batch"] = True
    if reward.kwargs:
        out["kwargs"] = reward.kwargs
    if reward.http is not None:
        h = reward.http
        out["http"] = {"url": h.url, "timeout_s": h.timeout_seconds, "retries": h.retries,
                       "concurrency": h.concurrency, "send_images": h.send_images,
                       **({"token_env": h.token_env} if h.token_env else {})}
    return out
