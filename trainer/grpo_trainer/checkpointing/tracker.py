"""Checkpoint directory layout, tracker, manifest and retention: pure logic, no I/O.

::

    <dir>/latest                   tracker {"step": N, "dir": "step-N"}, replaced last
    <dir>/attempt                  fence {"attempt": A}: the newest attempt that claimed <dir>
    <dir>/step-<N>/                one directory per saved step
        .metadata, __<r>_<i>.distcp   DCP: model + optimizer, sharded, reshardable
        rank-<r>.pt                rank r's RNG streams and LR scheduler
        trainer_state.json         step, epoch, loader position, rollout seeds, algorithm slot
        config.yaml                the resolved config
        manifest.json              the complete marker, written last: size + digest of each file
    <dir>/export/                  the final model (checkpoint.export), Hugging Face layout,
        export.json                its step, written before the directory is swapped in

The tracker is the commit point: a step directory is complete when its manifest
exists, and committed when the tracker names it or an older step. A crash at any
instant leaves the tracker naming the previous complete checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

TRACKER = "latest"
FENCE = "attempt"
MANIFEST = "manifest.json"
DCP_METADATA = ".metadata"
TRAINER_STATE = "trainer_state.json"
CONFIG = "config.yaml"
EXPORT_DIR = "export"
EXPORT_MARKER = "export.json"
FORMAT = 2  # 1: sha256 digests; 2: the manifest names its digest algorithm
# New saves: xxh3-128 (xxhash), ~10x sha256's speed, so verifying a checkpoint runs at
# the disk's speed. It guards against corruption (flipped bits, torn or swapped files),
# not against someone forging a file; sha256 manifests of older saves still verify.
HashAlgorithm = Literal["xxh3_128", "sha256"]
HASH_ALGORITHM: HashAlgorithm = "xxh3_128"

_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class FileEntry:
    size: int
    digest: str  # hex, of ``algorithm``
    algorithm: HashAlgorithm = HASH_ALGORITHM


def to_wire(entry: FileEntry) -> list[int | str]:
    """A FileEntry as plain values for the ranks' RPC: [size, digest, algorithm]."""
    return [entry.size, entry.digest, entry.algorithm]


def from_wire(value: Sequence[Any]) -> FileEntry:
    algorithm = str(value[2])
    if algorithm not in get_args(HashAlgorithm):
        raise ValueError(f"unknown checkpoint digest algorithm {algorithm!r}")
    return FileEntry(int(value[0]), str(value[1]), cast(HashAlgorithm, algorithm))


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ManifestFile(_Model):
    # Format 1 manifests call the digest "sha256"; they are read as they are.
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    size: int
    digest: str = Field(validation_alias=AliasChoices("digest", "sha256"))


class Manifest(_Model):
    format: int = FORMAT
    # Absent in format 1 manifests, which were all sha256.
    algorithm: HashAlgorithm = "sha256"
    step: int
    world_size: int
    created_at: str
    files: dict[str, ManifestFile]

    def entries(self) -> dict[str, FileEntry]:
        return {k: FileEntry(v.size, v.digest, self.algorithm) for k, v in self.files.items()}


class Tracker(_Model):
    step: int
    dir: str


class Fence(_Model):
    attempt: int
    # The job whose attempt this is (GRPO_JOB_UID); absent in fences of older trainers
    # and of runs outside a GRPOJob.
    job_uid: str | None = None


def step_dir_name(step: int) -> str:
    return f"step-{step}"


def parse_step_dir(name: str) -> int | None:
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def rank_file(rank: int) -> str:
    return f"rank-{rank}.pt"


def parse_manifest(text: str) -> Manifest | None:
    try:
        return Manifest.model_validate_json(text)
    except ValidationError:
        return None


def parse_tracker(text: str) -> Tracker | None:
    try:
        t = Tracker.model_validate_json(text)
    except ValidationError:
        return None
    return t if parse_step_dir(t.dir) == t.step else None


def parse_fence(text: str) -> Fence | None:
    try:
        return Fence.model_validate_json(text)
    except ValidationError:
        return None


def superseded_by(mine: int, recorded: int | None) -> int | None:
    """The newer attempt that owns the directory, or None when attempt ``mine`` may write.

    The same attempt number again is a restart of that attempt (a replacement head pod),
    so it keeps the directory; only a strictly newer attempt fences it out.
    """
    return recorded if recorded is not None and recorded > mine else None


def taken_over_by(mine: str | None, recorded: Fence | None) -> str | None:
    """The uid of another job that holds the directory, or None.

    A job deleted with its claim kept and created again under the same name has a new
    uid and starts at attempt 0 on the directory its earlier incarnation fenced at some
    attempt N: attempt numbers of two jobs do not compare, so the directory goes to the
    job that claimed it last (the operator starts a new job only once the earlier job's
    pods are gone), and a driver of the earlier job that still runs is fenced out.
    """
    if recorded is None or not mine or not recorded.job_uid or recorded.job_uid == mine:
        return None
    return recorded.job_uid


def build_manifest(
    step: int, world_size: int, created_at: str, files: Mapping[str, FileEntry]
) -> Manifest:
    algorithms = {v.algorithm for v in files.values()} or {HASH_ALGORITHM}
    if len(algorithms) != 1:  # one save hashes every file alike; anything else is a bug
        raise ValueError(f"files hashed with different algorithms: {sorted(algorithms)}")
    return Manifest(
        algorithm=algorithms.pop(),
        step=step,
        world_size=world_size,
        created_at=created_at,
        files={k: ManifestFile(size=v.size, digest=v.digest) for k, v in sorted(files.items())},
    )


def is_due(step: int, interval: int, final: bool) -> bool:
    """Every ``interval`` steps (0: never on an interval) and always at the end."""
    return final or (interval > 0 and step % interval == 0)


def size_problems(manifest: Manifest, sizes: Mapping[str, int | None]) -> list[str]:
    """Cheap checks against what is on disk: every file present, at its recorded size.

    ``sizes`` maps each manifest file name to its size on disk (None: missing).
    """
    problems: list[str] = []
    if DCP_METADATA not in manifest.files:
        problems.append(f"no DCP metadata ({DCP_METADATA}) in the manifest")
    for name, entry in sorted(manifest.files.items()):
        got = sizes.get(name)
        if got is None:
            problems.append(f"{name} is missing")
        elif got != entry.size:
            problems.append(f"{name} is {got} bytes, the manifest says {entry.size}")
    return problems


def digest_problems(
    expected: Mapping[str, FileEntry], actual: Mapping[str, FileEntry]
) -> list[str]:
    problems = []
    for name, want in sorted(expected.items()):
        got = actual.get(name)
        if got is None:
            problems.append(f"{name} is missing")
        elif got.size != want.size:
            problems.append(f"{name} is {got.size} bytes, the manifest says {want.size}")
        elif got.digest != want.digest or got.algorithm != want.algorithm:
            problems.append(
                f"{name} has {got.algorithm} {got.digest[:12]}..., "
                f"expected {want.algorithm} {want.digest[:12]}..."
            )
    return problems


def balance(entries: Mapping[str, FileEntry], parts: int) -> list[dict[str, FileEntry]]:
    """Split files over ``parts`` ranks by size (largest first to the least loaded)."""
    out: list[dict[str, FileEntry]] = [{} for _ in range(parts)]
    load = [0] * parts
    for name, entry in sorted(entries.items(), key=lambda kv: (-kv[1].size, kv[0])):
        i = min(range(parts), key=lambda j: (load[j], j))
        out[i][name] = entry
        load[i] += entry.size
    return out


@dataclass(frozen=True)
class StartupPlan:
    """What a starting trainer does with the step directories it finds."""

    candidates: list[int]  # complete and committed, newest first: try in this order
    remove: list[tuple[int, str]] = field(default_factory=list)  # (step, why)


def plan_startup(complete: Mapping[int, bool], tracker_step: int | None) -> StartupPlan:
    """``complete`` maps each step directory to whether its manifest exists.

    Without a manifest a directory is a save that never finished: removed. With a
    tracker, complete directories newer than it were never committed (the crash
    came between manifest and tracker): removed too, so they cannot shadow the
    timeline the tracker names. Without a tracker every complete directory counts.
    """
    remove: list[tuple[int, str]] = []
    candidates: list[int] = []
    for step in sorted(complete, reverse=True):
        if not complete[step]:
            remove.append((step, "incomplete (no manifest): a save that never finished"))
        elif tracker_step is not None and step > tracker_step:
            remove.append((step, f"never committed (the tracker names step {tracker_step})"))
        else:
            candidates.append(step)
    return StartupPlan(candidates, remove)


def plan_retention(present: Mapping[int, bool], latest: int, keep: int) -> list[int]:
    """Steps to delete once ``latest`` is committed, keeping the newest ``keep``.

    ``present`` maps step directories to completeness. Never deletes ``latest``;
    deletes every directory newer than it (an abandoned timeline: a run restarted
    without resume, or a corrupt checkpoint that was skipped) and incomplete
    leftovers older than it.
    """
    keep = max(1, keep)
    kept = [s for s in sorted(present, reverse=True) if s <= latest and present[s]]
    if latest not in kept:
        kept.insert(0, latest)
    survivors = set(kept[:keep]) | {latest}
    return sorted(s for s in present if s not in survivors)


def newest_first(steps: Iterable[int]) -> Sequence[int]:
    return sorted(steps, reverse=True)
