"""The trainer's config schema: the pydantic models of its YAML file.

The operator renders the per-attempt config from spec and plan and validates it with
these models (so a job the trainer would refuse with exit 2 is caught before any pod
starts); the trainer loads the file into them (grpo_trainer.config, which adds the YAML
loading, ``--set`` and ``GRPO_*`` overrides, and the checks that need its filesystem).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from .contract import S3_URI_PATTERN, STALL_TIMEOUT_S


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


KLEstimator = Literal["k1", "k3", "low_var_kl"]
# actor.logprob_chunk_tokens' default: response tokens whose float32 logits the update
# holds at once (verl's fused cross-entropy chunks 512 too); the planner counts it.
LOGPROB_CHUNK_TOKENS = 512
# A builtin prompt template's name; data.format_prompt may also be a path to a Jinja2 file.
BUILTIN_FORMAT_PROMPTS = ("plain", "math", "r1v")
# What a prompt longer than data.max_prompt_length, or with more images than
# data.max_images_per_prompt, does (data.overlong_prompts), found when the data is loaded:
# "drop" leaves it out (EasyR1's filter_overlong_prompts), "fail" ends the run with a
# config error (grpo_trainer.data.limit_prompt_lengths, limit_images).
OverlongPrompts = Literal["drop", "fail"]
# The most images one prompt may have (docs/configuration.md): the bound of
# data.max_images_per_prompt and of spec.data.maxImagesPerPrompt, and the trainer's default
# (alone it has no plan to keep to). The trainer sizes vLLM's limit_mm_per_prompt from the
# data up to the setting; the planner, which never sees the data, counts the setting's
# images per prompt (within the prompt's length: image tokens count in max_prompt_length).
MAX_IMAGES_PER_PROMPT = 16
# The lower pixel bound of an image or a video frame (4 merged patches of Qwen's 28 px).
MIN_PIXELS = 4 * 28 * 28
# The most videos one prompt may have (data.max_videos_per_prompt, its default 0: a job
# opts in, as each video's frames cost maxFrames x its pixels in the vision tower).
MAX_VIDEOS_PER_PROMPT = 4
# The most frames sampled from one video (data.max_frames; qwen_vl_utils' VIDEO_MAX_FRAMES).
MAX_FRAMES = 768
# A row that cannot be read (a missing or corrupt image or video, an empty prompt, no
# answer): "fail" ends the run naming the file, the row and what is wrong (at load for what
# the load sees, at draw time for what only decoding finds), "skip" leaves it out and
# counts it (grpo_trainer.dataset).
BadRows = Literal["fail", "skip"]
# When prompt lengths are counted: "eager" once for the whole data at load, in parallel,
# kept on the checkpoint volume for the next start; "lazy" each prompt when its batch is
# drawn (grpo_trainer.dataset).
PromptLengths = Literal["eager", "lazy"]


class InitStrategy(StrEnum):
    """How weights reach the FSDP shards (docs/incidents.md #1)."""

    RANK0 = "rank0"  # rank 0 reads the checkpoint, the others start on the meta device
    SHARDED = "sharded"  # every rank reads only its own rows from the safetensors files
    NAIVE = "naive"  # every rank reads everything: benchmark baseline only


class ModelConfig(_Strict):
    path: str = Field(description="Hugging Face model directory (safetensors) or hub id")
    tokenizer_path: str | None = None
    trust_remote_code: bool = False
    attn_implementation: Literal["sdpa", "eager"] = Field(
        default="sdpa",
        description="the actor's attention (transformers); vLLM chooses its own kernels",
    )

    @field_validator("attn_implementation", mode="before")
    @classmethod
    def _no_flash_attention(cls, value: object) -> object:
        if isinstance(value, str) and value.startswith("flash_attention"):
            raise ValueError(
                f"{value} cannot take the 4-D attention masks the trainer builds (the "
                "update's shared-prefix packing, the hf engine's decode), so packing would "
                "silently stop and decoding break. Use sdpa (the default): on A100 and H100 "
                "PyTorch's scaled_dot_product_attention already runs FlashAttention-2 where "
                "there is no mask and its memory-efficient kernel where there is one"
            )
        return value


class DataConfig(_Strict):
    train_files: list[str] = Field(min_length=1)
    val_files: list[str] = Field(default_factory=list)
    prompt_key: str = "problem"
    answer_key: str = "answer"
    image_key: str = "images"
    # A builtin template name ("math", "r1v", "plain") or a path to a Jinja2 file.
    format_prompt: str = "plain"
    max_prompt_length: int = Field(default=512, gt=0)
    shuffle: bool = True
    seed: int = 1
    # Qwen's pixel bounds, to which each image is resized once (grpo_trainer.media.images);
    # neither set: the checkpoint processor's own.
    image_max_pixels: int = Field(default=512 * 28 * 28, gt=0)
    image_min_pixels: int = Field(default=MIN_PIXELS, gt=0)
    overlong_prompts: OverlongPrompts = "drop"
    # At most this many images a prompt (its images column; <image> markers only place
    # them): a row with more is dropped or refused (overlong_prompts). The driver lowers it
    # to the most any loaded row has, which is what the vLLM engines are sized for.
    max_images_per_prompt: int = Field(default=MAX_IMAGES_PER_PROMPT, ge=1,
                                       le=MAX_IMAGES_PER_PROMPT)
    video_key: str = "videos"
    # Videos: frames sampled at video_fps, at most max_frames (an even count: Qwen's
    # temporal patch is 2 frames), each resized within the video pixel bounds.
    max_videos_per_prompt: int = Field(default=0, ge=0, le=MAX_VIDEOS_PER_PROMPT)
    video_fps: float = Field(default=2.0, gt=0, le=60)
    max_frames: int = Field(default=32, ge=2, le=MAX_FRAMES)
    video_max_pixels: int = Field(default=128 * 28 * 28, gt=0)
    video_min_pixels: int = Field(default=MIN_PIXELS, gt=0)
    bad_rows: BadRows = "fail"
    prompt_lengths: PromptLengths = "eager"
    # Processes of the eager length pass; None: the CPUs this process may use.
    length_workers: int | None = Field(default=None, ge=1, le=256)

    @field_validator("train_files", "val_files", mode="before")
    @classmethod
    def _one_file_is_a_list_of_one(cls, value: object) -> object:
        # EasyR1's data.train_files is one string; a config written for it reads the same.
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _pixel_bounds_in_order(self) -> DataConfig:
        if self.image_min_pixels > self.image_max_pixels:
            raise ValueError(
                f"image_min_pixels {self.image_min_pixels} is more than image_max_pixels "
                f"{self.image_max_pixels}: every image is resized to between the two"
            )
        if self.video_min_pixels > self.video_max_pixels:
            raise ValueError(
                f"video_min_pixels {self.video_min_pixels} is more than video_max_pixels "
                f"{self.video_max_pixels}: every frame is resized to between the two"
            )
        return self


RolloutPlacement = Literal["colocated", "disaggregated"]

# A rollout engine apart (placement disaggregated) is one vLLM process: the engine's Ray
# actor has no torch.distributed for vLLM's external launcher, so at a larger TP vLLM
# 0.32 would start executor processes of its own (config/parallel.py: "mp"), whose
# collective_rpc pickles its arguments (v1/executor/multiproc_executor.py), and the
# weight push hands vLLM a stream of tensors (a generator) that only the in-process
# executor takes. vLLM's weight-transfer engines (distributed/weight_transfer/) are CUDA
# only (pynccl, CUDA IPC), so no CPU test could carry them. Refused, not half-supported.
ENGINE_APART_TENSOR_PARALLEL = 1


# Why, and what to do instead: the pydantic models', the trainer config's and the CRD's
# CEL rule's message alike.
ENGINE_APART_TP_ADVICE = (
    f"a rollout engine apart (placement disaggregated) runs vLLM at tensor parallel "
    f"{ENGINE_APART_TENSOR_PARALLEL} (one process; the weight push cannot reach the workers "
    f"of a larger one): set {ENGINE_APART_TENSOR_PARALLEL} or leave it unset, with rollout "
    "GPUs that hold the model, or set placement colocated (tensor parallel over the "
    "training GPUs)")


def engine_apart_tp_problem(field: str, tp: int | None) -> str | None:
    """What is wrong with tensor parallel ``tp`` for an engine apart, named as ``field``
    (the spec's or the trainer config's), or None."""
    if tp is None or tp == ENGINE_APART_TENSOR_PARALLEL:
        return None
    return f"{field}: {tp}; {ENGINE_APART_TP_ADVICE}"


class DisaggregatedRollout(_Strict):
    """rollout.placement disaggregated: the rollout engines' own Ray nodes (the Ray
    worker nodes labelled RAY_SIDE_LABEL=rollout), apart from the FSDP ranks'."""

    nodes: int = Field(default=1, ge=1, description="Ray nodes the rollout engines span")
    engines_per_node: int = Field(
        default=1, ge=1,
        description="rollout engines (Ray actors) on each rollout node; on GPUs, the node's "
        "GPUs (one each)")
    gpus_per_engine: float = Field(
        default=0, ge=0, description="GPUs of one engine: 1 on GPUs (an engine apart runs at "
        "tensor parallel 1: ENGINE_APART_TENSOR_PARALLEL), 0 on the host")
    cpus_per_engine: float = Field(default=1, gt=0)

    @property
    def engines(self) -> int:
        return self.nodes * self.engines_per_node


class RolloutConfig(_Strict):
    engine: Literal["hf", "vllm"] = "hf"
    placement: RolloutPlacement = Field(
        default="colocated",
        description="colocated: every rank generates, then trains; disaggregated: rollout "
        "engines on their own nodes generate while the ranks train")
    max_staleness: int = Field(
        default=1, ge=0,
        description="disaggregated only: how many policy versions a batch may lag the "
        "update that trains on it (0: synchronous, 1: one step ahead)")
    disaggregated: DisaggregatedRollout | None = Field(
        default=None, description="the rollout side; required with placement disaggregated")
    # hf engine: "native" is a lean KV-cached sampling loop, "generate" calls
    # transformers' generate (the reference; slower per token on CPUs).
    hf_sampler: Literal["native", "generate"] = "native"
    n: int = Field(default=8, ge=2, description="generations per prompt (the GRPO group)")
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_new_tokens: int = Field(default=256, gt=0)
    gpu_memory_utilization: float = Field(default=0.6, gt=0, lt=1)
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        description="vLLM: consecutive ranks that share one engine, sharded across them",
    )
    seed: int = 1
    # vLLM only: free weights + KV cache between rollouts so FSDP gets the GPU.
    enable_sleep_mode: bool = True


class AlgorithmConfig(_Strict):
    adv_estimator: Literal["grpo"] = "grpo"
    norm_adv_by_std: bool = True
    clip_ratio_low: float = Field(default=0.2, ge=0)
    clip_ratio_high: float = Field(default=0.3, ge=0)
    clip_ratio_dual: float | None = Field(default=3.0, gt=1)
    kl_coef: float = Field(default=0.0, ge=0)
    kl_estimator: KLEstimator = "low_var_kl"
    entropy_coef: float = Field(default=0.0, ge=0)
    # Off-policy samples (drawn by an older policy version, rollout.max_staleness >= 1):
    # the loss is weighted by pi_proximal / pi_behaviour per token, truncated at this cap
    # (truncated importance sampling, as verl's and AReaL's decoupled objectives).
    offpolicy_is_cap: float = Field(default=2.0, gt=1)


class LoraConfig(_Strict):
    """A LoRA adapter on the language model (PEFT's conventions: ``lora_alpha / r`` scales
    the update). Absent: full fine-tuning."""

    rank: int = Field(default=32, gt=0, description="adapter rank r")
    alpha: float = Field(default=64.0, gt=0, description="scale numerator: update x alpha/rank")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear", description="module names (suffixes) to adapt, or all-linear"
    )
    exclude_modules: str | None = Field(
        default=r".*visual.*", description="regex of module names never adapted (vision tower)"
    )


class ActorConfig(_Strict):
    lr: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=1e-2, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(default=0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    ppo_epochs: int = Field(default=1, ge=1)
    # Samples (not prompts) per optimizer step, over all ranks.
    mini_batch_size: int | None = Field(default=None, gt=0)
    # Samples per forward/backward on one rank (without micro_batch_tokens).
    micro_batch_size: int = Field(default=2, gt=0)
    # Tokens per forward/backward on one rank, padding included, in the update's layout
    # (shared-prefix rows x the widest): samples in order fill micro-batches up to it,
    # every rank running as many as the rank that needs the most. None: micro_batch_size.
    micro_batch_tokens: int | None = Field(default=None, gt=0)
    # Before the update, whole groups move between ranks (each keeps its count) so that
    # every rank's shared-prefix tokens are about equal: the step waits for the slowest.
    balance_ranks: bool = True
    dtype: Literal["bfloat16", "float32"] = Field(
        default="bfloat16", description="compute dtype; master weights stay float32"
    )
    # mixed: fp32 master weights, grads and Adam state (bf16 compute copies).
    # bf16: parameters, grads and optimizer state in bf16 with a compensated update.
    precision: Literal["mixed", "bf16"] = "mixed"
    lora: LoraConfig | None = None
    init_strategy: InitStrategy = InitStrategy.RANK0
    # False keeps each block's gathered parameters from forward to backward: one
    # all-gather per block per micro-batch instead of two, for one block of extra
    # memory each. Worth it where the collective is slow relative to compute (gloo).
    reshard_after_forward: bool = True
    # Update forward: each group's prompt once, its n responses attending to it through
    # a 4-D mask (same log-probs; P + sum(R) tokens instead of n*P + sum(R)). Text-only
    # batches with sdpa or eager attention; others take the plain padded layout.
    shared_prefix: bool = True
    # The packed rows' attention by segment (grpo_trainer.model.segment_attention): the
    # prompts causal on their own, each response against its prompt and itself, instead
    # of every token against the whole row under one dense [rows, 1, W, W] mask. The same
    # log-probs; sdpa models only (eager keeps the dense mask). False: the dense mask.
    segment_attention: bool = True
    # The update's log-probs: the LM head, log-softmax and entropy run on the response
    # positions only, this many tokens at a time, each chunk recomputed in backward: two
    # float32 [chunk, vocabulary] buffers at the peak (docs/memory-model.md, "Logits").
    # The operator leaves it at the default, which its planner counts.
    logprob_chunk_tokens: int = Field(default=LOGPROB_CHUNK_TOKENS, gt=0)
    offload_params: bool = False
    offload_optimizer: bool = False
    gradient_checkpointing: bool = False


class ResourcesConfig(_Strict):
    """Where the ranks run: ``nodes`` x ``ranks_per_node`` ranks, one Ray placement group
    per node (docs/trainer.md "Placement")."""

    num_workers: int = Field(
        default=1, ge=1, description="FSDP ranks (Ray actors): nodes x ranks_per_node"
    )
    nodes: int = Field(
        default=1, ge=1, description="Ray nodes the ranks span: one placement group (gang) each"
    )
    ranks_per_node: int | None = Field(
        default=None, ge=1, description="ranks on each node; unset: num_workers / nodes"
    )
    ranks_on_head: bool = Field(
        default=True,
        description="False: no rank is placed on the Ray head node (it runs only the driver)",
    )
    gang_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="seconds to wait for every node's ranks to be reserved, counted from when "
        "enough Ray nodes have joined (nodes not joined yet, their pods waiting for "
        "capacity, are waited for without a deadline), before giving up (WorkersMissing)",
    )
    rank0_node_labels: dict[str, str] | None = Field(
        default=None,
        description="Ray node labels the node of ranks 0.. (the first placement group) must "
        "carry: its pod asks for the host memory of rank 0's whole-model load, the others' "
        "less (the operator's rank0 worker group); unset: any node",
    )
    gpus_per_worker: float = Field(default=0, ge=0)
    fake_gpus: bool = Field(
        default=False,
        description="tests only: Ray's GPUs are placement tokens (a test cluster's fake "
        "GPUs) and the ranks train on the CPU over gloo; without it a rank given GPUs that "
        "finds no CUDA fails (exit 2)",
    )
    cpus_per_worker: float = Field(default=1, gt=0)
    collective_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="seconds a rank waits in one collective before failing; unset: 30 min, "
        "longer for big checkpoints (rank 0 loads them while the others wait)",
    )
    ray_address: str | None = Field(
        default=None, description="None: join a running cluster if any, else start a local one"
    )
    object_store_memory: int | None = Field(default=None, gt=0)

    @property
    def trains_on_cuda(self) -> bool:
        """Whether the ranks compute on CUDA devices (GPUs given, and not fake ones)."""
        return self.gpus_per_worker > 0 and not self.fake_gpus

    @property
    def node_ranks(self) -> int:
        """Ranks on each node (``ranks_per_node``, or the even split of ``num_workers``)."""
        return self.ranks_per_node or self.num_workers // self.nodes

    @model_validator(mode="after")
    def _layout_adds_up(self) -> ResourcesConfig:
        if self.ranks_per_node is None:
            if self.num_workers % self.nodes:
                raise ValueError(
                    f"resources.nodes ({self.nodes}) must divide resources.num_workers "
                    f"({self.num_workers}): every node runs the same number of ranks"
                )
        elif self.nodes * self.ranks_per_node != self.num_workers:
            raise ValueError(
                f"resources.num_workers ({self.num_workers}) must equal resources.nodes x "
                f"resources.ranks_per_node ({self.nodes} x {self.ranks_per_node})"
            )
        return self


# The reward's kinds (docs/rewards.md): builtin (math, r1v), the user's function in our
# contract, EasyR1's and verl's reward functions as they are written for those frameworks,
# or a judge behind an HTTP endpoint.
RewardType = Literal["math", "r1v", "function", "easyr1", "verl", "http"]
# reward.function: an importable ``module:callable`` or a file in the pods,
# ``/path/file.py:callable`` (EasyR1's and verl's way; a ConfigMap mounted on the head).
REWARD_FUNCTION_PATTERN = r"^([A-Za-z_][\w.]*|/[^:]*\.py):[A-Za-z_]\w*$"
# The kinds that call reward.function, and those of them that may take a whole step's
# responses in one call (reward.batch).
REWARD_FUNCTION_TYPES = ("function", "easyr1", "verl")
REWARD_BATCH_TYPES = ("function", "easyr1")
# A judge's defaults: each request's seconds, retries after the first, requests at once.
JUDGE_TIMEOUT_S = 30.0
JUDGE_RETRIES = 2
JUDGE_CONCURRENCY = 8
JUDGE_MAX_CONCURRENCY = 256


class JudgeConfig(_Strict):
    """A reward model behind an HTTP endpoint: one POST per response (docs/rewards.md)."""

    url: str = Field(pattern=r"^https?://[^\s]+$")
    timeout_s: float = Field(default=JUDGE_TIMEOUT_S, gt=0, le=3600)
    retries: int = Field(default=JUDGE_RETRIES, ge=0, le=10)
    concurrency: int = Field(default=JUDGE_CONCURRENCY, ge=1, le=JUDGE_MAX_CONCURRENCY)
    # Each row's images sent too (base64 of their files): for a judge that looks at them.
    send_images: bool = False
    # The name of an env var of the driver holding a bearer token (set from a Secret:
    # the token itself is never in the config).
    token_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class RewardConfig(_Strict):
    type: RewardType = "math"
    function: str | None = Field(
        default=None, pattern=REWARD_FUNCTION_PATTERN,
        description="'module:callable' or '/path/file.py:callable' for type function, "
        "easyr1 or verl")
    # function / easyr1: one call with every response of the step (a list) instead of one
    # call per response.
    batch: bool = False
    # Keyword arguments the function is called with (EasyR1's reward_function_kwargs,
    # verl's reward_kwargs).
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    format_weight: float = Field(default=0.1, ge=0, le=1)
    num_workers: int = Field(default=4, ge=1)
    timeout_s: float = Field(default=30.0, gt=0)
    http: JudgeConfig | None = None

    @model_validator(mode="after")
    def _settings_fit_type(self) -> RewardConfig:
        problem = reward_problem(self.type, self.function, self.batch, bool(self.kwargs),
                                 self.http is not None)
        if problem:
            raise ValueError(f"reward.{problem}")
        return self


def reward_problem(kind: str, function: str | None, batch: bool, kwargs: bool,
                   http: bool) -> str | None:
    """What is wrong with a reward section's settings for its type, or None; the message
    starts with the field's name (the trainer's and the spec's are the same words)."""
    if kind in REWARD_FUNCTION_TYPES and not function:
        return (f"function: required when type is {kind} (module:callable, or "
                "/path/file.py:callable)")
    if kind not in REWARD_FUNCTION_TYPES and function:
        return f"function: only for type function, easyr1 or verl, not {kind}"
    if batch and kind not in REWARD_BATCH_TYPES:
        return f"batch: only for type function or easyr1, not {kind}"
    if kwargs and kind not in REWARD_FUNCTION_TYPES:
        return f"kwargs: only for type function, easyr1 or verl, not {kind}"
    if kind == "http" and not http:
        return "http: required when type is http (the judge's url)"
    if http and kind != "http":
        return f"http: only for type http, not {kind}"
    return None


class ObjectStoreConfig(_Strict):
    """Checkpoints kept in an S3-compatible store: ``dir`` is then each pod's local staging
    directory, and a checkpoint is complete once its manifest, uploaded after every file
    it names, is in the store (grpo_trainer.object_store). The keys are never
    here: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from the environment (the operator
    mounts them from ``keys_secret``), else the pod's identity (IRSA's web identity, the
    instance's metadata)."""

    uri: str = Field(pattern=S3_URI_PATTERN,
                     description="s3://bucket/prefix under which step-<N>/ and latest live")
    endpoint: str | None = Field(default=None, pattern=r"^https?://",
                                 description="for a store other than AWS S3: MinIO, Ceph, GCS")
    region: str | None = None
    path_style: bool = Field(default=False, description="bucket in the path, not the host")
    # Named in the error when the store refuses the keys: where the user fixes them.
    keys_secret: str | None = None
    # The job fails when no checkpoint has completed for this long because its upload keeps
    # failing (the store down or refusing); training goes on until then.
    upload_deadline_s: float = Field(default=1800.0, gt=0)
    # ``dir`` is the pod's own disk (no claim): attempts/<n>/ (logs, events, stall stacks)
    # is copied to the store's attempts/<n>/ too (grpo_trainer.liveness.attempt_keeper).
    keep_attempts: bool = False


class CheckpointConfig(_Strict):
    dir: str | None = None
    # s3:// checkpoints: ``dir`` stages each pod's files before they are uploaded.
    store: ObjectStoreConfig | None = None

    @model_validator(mode="after")
    def _store_needs_a_dir(self) -> CheckpointConfig:
        if self.store is not None and not self.dir:
            raise ValueError(
                "checkpoint.store needs checkpoint.dir: the local directory each pod stages "
                "its files in before they go to the store")
        return self
    # 0: only at the end of training.
    interval_steps: int = Field(default=0, ge=0)
    keep: int = Field(default=2, ge=1)
    # Stage a CPU copy and write it in the background while training goes on; the
    # tracker still moves only once the whole save is on disk.
    async_save: bool = False
    # After the last step succeeded: the final model as a Hugging Face directory in
    # <dir>/export (safetensors + processor), written on rank 0's node. The operator
    # turns it on; local runs export with `grpo-train export` when they want to.
    export: bool = False


class WandbConfig(_Strict):
    """Weights & Biases: the driver logs each step's metrics to one run (WANDB_API_KEY,
    WANDB_MODE and WANDB_BASE_URL come from the environment, as wandb reads them)."""

    project: str = Field(min_length=1)
    entity: str | None = None
    run_id: str | None = Field(
        default=None, description="the same id in every attempt: they resume one run"
    )
    run_name: str | None = None
    dir: str | None = Field(default=None, description="where wandb writes (offline runs too)")


class MlflowConfig(_Strict):
    """MLflow: the driver logs each step's metrics to one run of `experiment`."""

    tracking_uri: str = Field(min_length=1)
    experiment: str = Field(min_length=1)
    run_key: str | None = Field(
        default=None, description="tagged on the run; an attempt with the same key resumes it"
    )
    run_name: str | None = None


class MetricsConfig(_Strict):
    jsonl: bool = True
    tensorboard_dir: str | None = None
    wandb: WandbConfig | None = None
    mlflow: MlflowConfig | None = None
    prometheus_port: int | None = Field(default=None, ge=0, le=65535)
    progress_bar: Literal["auto", "on", "off"] = "auto"
    progress_file: str | None = None
    # The plan's peaks as status.plan.peaks holds them (grpo_api.job.memory_peaks, which
    # this module cannot import: the job package imports it), parsed by the driver and
    # exported beside the measured ones as the grpo_plan_* gauges; unset where no plan is
    # (grpo-train run alone).
    planned_peaks: dict[str, JsonValue] | None = None


class WatchdogConfig(_Strict):
    """Memory watchdog (docs/trainer.md "Memory watchdog"): flags sustained growth of a
    process's host RSS or GPU memory, per step, as a metric, a log line and the job's
    status.progress.memoryGrowth."""

    enabled: bool = True
    window_steps: int = Field(default=20, ge=4, description="steps in the sliding window")
    warmup_steps: int = Field(default=5, ge=0, description="first steps not watched")
    threshold_mib_per_step: float = Field(
        default=2.0, gt=0, description="least-squares growth over the window that flags"
    )
    min_positive_fraction: float = Field(
        default=0.6, ge=0, le=1, description="share of step-to-step deltas that must be > 0"
    )


class TrainerConfig(_Strict):
    total_steps: int | None = Field(
        default=None, ge=1, description="stop after this many steps; unset: run `epochs`"
    )
    epochs: int = Field(default=1, ge=1, description="passes over the train split")
    rollout_batch_size: int = Field(default=8, gt=0, description="prompts per step")
    seed: int = 1
    job_name: str | None = None
    job_namespace: str | None = None
    # The job's uid: with it the attempt fence tells a job created again under the same
    # name (which adopts the directory) from an older attempt of this one.
    job_uid: str | None = None
    attempt: int = Field(default=0, ge=0)
    termination_log: str | None = None
    fault_inject: str | None = None
    # Validation on data.val_files (greedy, one response per prompt): every N steps and
    # after the last one; 0 disables it. As EasyR1's trainer.val_freq.
    val_interval_steps: int = Field(default=0, ge=0)
    # Also once before the first step of a fresh run (a baseline; not on a resume), as
    # EasyR1's trainer.val_before_train.
    val_before_train: bool = True
    # No step or stage ends for this long: every rank's stacks go to the log and to
    # <checkpoint.dir>/attempts/<n>/stalls/, and the run exits 6 (Hang). The effective
    # timeout grows with the measured step time (grpo_trainer.liveness.stall); 0: off.
    stall_timeout_s: float = Field(
        default=STALL_TIMEOUT_S, ge=0,
        description="seconds without progress before the run ends as a hang; 0: never",
    )

    def steps(self, prompts: int) -> int:
        """Steps to run over `prompts` train prompts: total_steps when set (it wins, as
        max_steps does in Hugging Face's Trainer), else epochs x whole batches per pass
        (the loader drops a pass's tail that does not fill a batch)."""
        if self.total_steps is not None:
            return self.total_steps
        return self.epochs * max(1, prompts // self.rollout_batch_size)


class Config(_Strict):
    model: ModelConfig
    data: DataConfig
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    actor: ActorConfig = ActorConfig()
    resources: ResourcesConfig = ResourcesConfig()
    reward: RewardConfig = RewardConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    metrics: MetricsConfig = MetricsConfig()
    watchdog: WatchdogConfig = WatchdogConfig()
    trainer: TrainerConfig = TrainerConfig()

    @property
    def samples_per_step(self) -> int:
        return self.trainer.rollout_batch_size * self.rollout.n

    @property
    def mini_batch_samples(self) -> int:
        return self.actor.mini_batch_size or self.samples_per_step

    @model_validator(mode="after")
    def _batch_sizes_divide(self) -> Config:
        world = self.resources.num_workers
        total = self.samples_per_step
        if self.trainer.rollout_batch_size % world:
            raise ValueError(
                f"trainer.rollout_batch_size ({self.trainer.rollout_batch_size}) must be "
                f"divisible by resources.num_workers ({world}) so each rank gets whole groups"
            )
        mini = self.mini_batch_samples
        if total % mini:
            raise ValueError(
                f"actor.mini_batch_size ({mini}) must divide "
                f"rollout_batch_size * rollout.n ({total})"
            )
        if mini % world:
            raise ValueError(
                f"actor.mini_batch_size ({mini}) must be divisible by "
                f"resources.num_workers ({world})"
            )
        if self.trainer.val_interval_steps and not self.data.val_files:
            raise ValueError(
                "trainer.val_interval_steps needs data.val_files (the held-out split to "
                "validate on)"
            )
        tp = self.rollout.tensor_parallel_size
        if tp > 1 and self.rollout.engine != "vllm":
            raise ValueError(
                f"rollout.tensor_parallel_size ({tp}) needs rollout.engine 'vllm'; "
                "the hf engine runs one model per rank"
            )
        dis = self.rollout.disaggregated
        if self.rollout.placement == "disaggregated" and dis is None:
            raise ValueError("rollout.placement 'disaggregated' needs rollout.disaggregated "
                             "(the rollout side's nodes and engines)")
        if dis is not None and self.trainer.rollout_batch_size % dis.engines:
            raise ValueError(
                f"trainer.rollout_batch_size ({self.trainer.rollout_batch_size}) must be "
                f"divisible by the rollout engines ({dis.engines}: rollout.disaggregated.nodes "
                "x engines_per_node) so each engine gets whole prompts")
        if dis is not None and (problem := engine_apart_tp_problem(
                "the trainer config's rollout.tensor_parallel_size", tp)):
            raise ValueError(problem)
        if self.rollout.placement == "colocated" and dis is not None:
            raise ValueError("rollout.disaggregated is set but rollout.placement is "
                             "'colocated': set placement 'disaggregated' or drop it")
        if dis is None and world % tp:
            raise ValueError(
                f"rollout.tensor_parallel_size ({tp}) must divide resources.num_workers "
                f"({world}): each engine spans whole groups of ranks"
            )
        tokens = self.actor.micro_batch_tokens
        longest = self.data.max_prompt_length + self.rollout.max_new_tokens
        if tokens is not None and tokens < longest:
            raise ValueError(
                f"actor.micro_batch_tokens ({tokens}) must hold one whole sample: "
                f"data.max_prompt_length + rollout.max_new_tokens ({longest})"
            )
        if tokens is None and (mini // world) % self.actor.micro_batch_size:
            raise ValueError(
                f"actor.micro_batch_size ({self.actor.micro_batch_size}) must divide the per-rank "
                f"mini-batch ({mini // world})"
            )
        return self
