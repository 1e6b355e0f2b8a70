"""Hub repos and s3:// data files a spec names, where they land on the job's volume, and
the init container's arguments (pure). The fetch itself is grpo_trainer.hub_fetch, run on
the head pod (on every pod of a job without a claim)."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_api.contract import hub_local_dir, is_hub_id, s3_local_path
from grpo_api.job import GRPOJobSpec
from grpo_api.job.data import is_s3

from .names import JobRef, checkpoint_dir


@dataclass(frozen=True)
class HubFetch:
    """What the trainer reads (local paths) and what the init container fetches."""

    model_path: str
    train: str
    val: str | None
    args: list[str] = field(default_factory=list)  # empty: nothing to fetch


def store_args(spec: GRPOJobSpec) -> list[str]:
    """checkpoint.store's settings as the fetch's and the reader's arguments (the keys come
    from the environment: store_env)."""
    store = spec.checkpoint.store
    assert store is not None
    return [*(["--s3-endpoint", store.endpoint] if store.endpoint else []),
            *(["--s3-region", store.region] if store.region else []),
            *(["--s3-path-style"] if store.path_style else []),
            *(["--s3-keys-secret", store.keys_secret] if store.keys_secret else [])]


def hub_root(job: JobRef) -> str:
    return f"{checkpoint_dir(job)}/hub"


def hub_fetch(spec: GRPOJobSpec, job: JobRef) -> HubFetch:
    root, args = hub_root(job), []
    model = spec.model.path
    objects: list[str] = []
    if is_s3(model):
        objects += ["--s3-model", model]
        model = s3_local_path(root, model.rstrip("/"))
    elif spec.model.claim_name is None and is_hub_id(model):
        rev = f"@{spec.model.revision}" if spec.model.revision else ""
        args += ["--model", f"{model}{rev}"]
        model = hub_local_dir(root, "model", model)
    data: list[str | None] = []
    for entry in (spec.data.train, spec.data.val):
        if is_s3(entry):
            assert entry is not None
            objects += ["--s3", entry]
            entry = s3_local_path(root, entry)
        elif entry is not None and is_hub_id(entry):
            repo, _, split = entry.partition("@")
            args += ["--dataset", repo]
            entry = f"{hub_local_dir(root, 'dataset', repo)}@{split or 'train'}"
        data.append(entry)
    if objects:  # the spec's rule: s3:// data and models come with checkpoint.store
        args += [*objects, *store_args(spec)]
    if args:
        args = ["python", "-m", "grpo_trainer.hub_fetch", "--root", root, *args]
    return HubFetch(model, str(data[0]), data[1], args)
