"""GRPOJob.spec.data: the train and validation splits and how their rows are read
(docs/data.md), and the rule every path of the spec follows: a file on the pods' volumes
or a hub id, never a URL."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator

from ..contract import S3_BUCKET_PATTERN, S3_URI_PATTERN
from ..trainer_config import (
    MAX_FRAMES,
    MAX_IMAGES_PER_PROMPT,
    MAX_VIDEOS_PER_PROMPT,
    BadRows,
    OverlongPrompts,
    PromptLengths,
)
from .base import ApiModel, cel_rule
from .trainer import spec_setting, template_problem

# The trainer reads files from the pods' volumes, fetches hub ids, and fetches s3://
# objects with spec.checkpoint.store's endpoint and keys; any other URL would fail only
# inside the trainer. The schema (CEL) and the models refuse it with the same test.
_DATA_URL = (
    "of URLs only s3:// is read (with checkpoint.store's endpoint and keys; gs:// through "
    "GCS's S3 interoperability as s3://): or copy the files onto a PersistentVolumeClaim and "
    "give their path there, or name a hub id"
)
# An s3:// data file: a parquet or JSON(L) object, not a prefix.
_S3_FILE = rf"^s3://{S3_BUCKET_PATTERN}/.*[^/]$"


def _local_hub_or_s3(value: str) -> str:
    if value.startswith("s3://"):
        if not re.match(_S3_FILE, value):
            raise ValueError(f"{value!r}: an s3:// data entry names one object, "
                             "s3://bucket/path/file.parquet (or .jsonl)")
        return value
    if "://" in value:
        raise ValueError(_DATA_URL)
    return value


# The CEL side of both checks below (the models say which form of s3:// each takes).
_NO_URL_BUT_S3 = "!self.contains('://') || self.startsWith('s3://')"
DataFile = Annotated[
    str,
    AfterValidator(_local_hub_or_s3),
    Field(max_length=4096, json_schema_extra={
        "x-kubernetes-validations": [cel_rule(_NO_URL_BUT_S3, _DATA_URL)]}),
]


# The model: a hub id, a path on a volume, or an s3:// prefix holding a Hugging Face
# layout (fetched like an s3:// data file, with checkpoint.store's settings).
_MODEL_URL = (
    "of URLs only s3://bucket/prefix/ is read (with checkpoint.store's endpoint and keys): "
    "or copy the model onto a PersistentVolumeClaim (model.claimName mounts it at /models), "
    "or name a hub id"
)


def _local_hub_or_s3_prefix(value: str) -> str:
    if value.startswith("s3://") and not re.match(S3_URI_PATTERN, value):
        raise ValueError(f"{value!r} is not s3://bucket/prefix/ (a bucket's name: 3-63 "
                         "lowercase letters, digits, dots and hyphens)")
    if "://" in value and not value.startswith("s3://"):
        raise ValueError(_MODEL_URL)
    return value


ModelPath = Annotated[
    str,
    AfterValidator(_local_hub_or_s3_prefix),
    Field(max_length=4096, json_schema_extra={
        "x-kubernetes-validations": [cel_rule(_NO_URL_BUT_S3, _MODEL_URL)]}),
]


def is_s3(value: str | None) -> bool:
    return value is not None and value.startswith("s3://")


class DataSpec(ApiModel):
    """Training data in the EasyR1 column layout (images / problem / answer)."""

    train: DataFile = Field(
        min_length=1,
        description="Train split: a parquet/jsonl path, a hub dataset owner/name@split "
        "(fetched like the model; parquet files in the Hugging Face / EasyR1 layout), or an "
        "s3://bucket/key object (fetched with checkpoint.store's endpoint and keys).",
    )
    val: DataFile | None = Field(
        None,
        description=(
            "Validation split, same forms and columns as train; scored with the job's reward "
            "every training.valIntervalSteps steps (greedy, one response per prompt)."
        ),
    )
    image_key: str = Field("images", min_length=1, description="Column holding the images.")
    prompt_key: str = Field("problem", min_length=1, description="Column holding the prompt.")
    answer_key: str = Field("answer", min_length=1, description="Column holding the answer.")
    max_prompt_length: int = Field(
        2048, ge=16, le=131072, description="Max prompt tokens, image tokens included."
    )
    max_response_length: int = Field(
        2048, ge=16, le=131072, description="Max generated tokens per response."
    )
    max_pixels: int = Field(
        1003520,
        ge=3136,
        description="Each image is resized once, to at most this many pixels (sides multiples "
        "of the model's patch x merge), and the same image goes to vLLM and to the update.",
    )
    max_images_per_prompt: int = Field(
        1,
        ge=1,
        le=MAX_IMAGES_PER_PROMPT,
        description="The most images one prompt of the data may have (its images column), "
        f"at most {MAX_IMAGES_PER_PROMPT}. The memory plan counts this many images at "
        "maxPixels per prompt (within maxPromptLength); a row with more is dropped or refused "
        "when the data is loaded (overlongPrompts). vLLM's image limit is the most a loaded "
        "row has.",
    )
    overlong_prompts: OverlongPrompts = Field(
        "drop",
        description="A prompt longer than maxPromptLength (image tokens included, each image "
        "at its resized size), or with more images than maxImagesPerPrompt, counted when the "
        "data is loaded: drop leaves it out (as EasyR1's filter_overlong_prompts), fail ends "
        "the attempt with ConfigError. Either way the log names the file, the row, both "
        "lengths (or the image count and its limit) and this field.",
    )
    video_key: str = Field("videos", min_length=1, description=(
        "Column holding the videos (EasyR1's layout): each a video file's path (relative to "
        "the data file) or a list of frame images."))
    max_videos_per_prompt: int = Field(
        0, ge=0, le=MAX_VIDEOS_PER_PROMPT,
        description=f"The most videos one prompt may have, at most {MAX_VIDEOS_PER_PROMPT}; "
        "0 (the default): the data has no videos, and a row with one is dropped or refused "
        "(overlongPrompts). The memory plan counts this many videos of maxFrames frames at "
        "videoMaxPixels per prompt (within maxPromptLength).")
    video_fps: float = Field(2.0, gt=0, le=60, description=(
        "Frames sampled per second of a video file (a list of frames is taken as it is, "
        "up to maxFrames)."))
    max_frames: int = Field(32, ge=2, le=MAX_FRAMES, description=(
        "The most frames taken from one video (an even number is used: Qwen's temporal "
        "patch is two frames)."))
    video_max_pixels: int = Field(100352, ge=3136, description=(
        "Each video frame is resized once to at most this many pixels, the same frames for "
        "vLLM and the update."))
    bad_rows: BadRows = Field("fail", description=(
        "A row that cannot be read (a missing or corrupt image or video file, an empty "
        "prompt, no answer): fail ends the attempt naming the file, the row and what is "
        "wrong (at load for what the load sees: missing files, unreadable headers, empty "
        "fields; when the row is drawn for what only decoding finds); skip leaves it out, "
        "counted in the trainer's metrics (data/bad_rows) and the log, and checks every "
        "image fully at load."))
    prompt_template: str | None = spec_setting(
        "data.promptTemplate",
        "The prompt template: plain, math or r1v (builtin), or the absolute path of a Jinja2 "
        "file in the pods (e.g. from a ConfigMap in spec.pods.*.volumes) that renders "
        "{{ content }}, the row's prompt. Unset: math for reward.type math, r1v for r1v, "
        "plain otherwise.")
    prompt_lengths: PromptLengths = Field("eager", description=(
        "eager: every prompt's length is counted once at load, across the head's CPUs, "
        "and kept on the checkpoint volume, so a restart starts at once; lazy: each prompt "
        "is counted when its batch is drawn (dropped or refused by overlongPrompts, the same "
        "decision on every attempt), for data too large to count up front."))
    rows: int | None = Field(None, ge=1, description=(
        "About how many rows the train split has, for sizing the head pod (its index of "
        "the rows: file, row and length, about 40 bytes each); unset: 1,000,000 assumed "
        "(10,000 for a CPU job)."))
    workers: int | None = Field(
        None,
        ge=0,
        le=64,
        description=(
            "Deprecated, ignored: the trainer starts no data-loader processes (prompts and "
            "images are encoded on the ranks that generate them), so nothing is planned for "
            "them. Accepted so existing jobs still parse; the webhook warns when it is set."
        ),
    )

    @field_validator("prompt_template")
    @classmethod
    def _template_is_found(cls, fmt: str | None) -> str | None:
        problem = template_problem(fmt)
        if problem:
            raise ValueError(problem)
        return fmt
