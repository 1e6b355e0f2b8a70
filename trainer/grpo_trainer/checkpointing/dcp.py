"""The driver's checkpointer: step directories, manifest, tracker, resume, retention.

Workers write the DCP shards and their own RNG/scheduler file (``rank.py``); the
driver writes the trainer state and the resolved config, then, once every rank's
files are durable, the manifest (the step's complete marker) and last the
tracker. On start it resumes from the newest complete, committed checkpoint,
checking every file's size (here) and digest (on the ranks, in parallel) first;
a damaged checkpoint is named in the log and skipped for the one before it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from grpo_api.trainer_config import Config

from ..algorithm.seeds import rollout_seed
from ..object_store import ObjectStore
from ..rank_api import RankApi, RankGroup
from . import fence
from .files import atomic_write, digest_file, file_size, remove_step_dir, write_durable
from .store_mirror import StoreMirror
from .tracker import (
    CONFIG,
    FENCE,
    FORMAT,
    MANIFEST,
    TRACKER,
    TRAINER_STATE,
    FileEntry,
    Manifest,
    Tracker,
    balance,
    build_manifest,
    digest_problems,
    from_wire,
    is_due,
    parse_manifest,
    parse_step_dir,
    parse_tracker,
    plan_retention,
    plan_startup,
    size_problems,
    step_dir_name,
    to_wire,
)

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    step: int
    path: Path
    driver_files: dict[str, bytes]  # written at commit: nothing but a snapshot blocks
    started: float


def read_tracker(root: Path) -> Tracker | None:
    try:
        text = (root / TRACKER).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    tracker = parse_tracker(text)
    if tracker is None:
        log.warning("checkpoint tracker %s is unreadable; ignoring it", root / TRACKER)
    return tracker


def read_manifest(step_dir: Path) -> Manifest | None:
    try:
        return parse_manifest((step_dir / MANIFEST).read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None


def scan(root: Path) -> dict[int, bool]:
    """Step directories under ``root`` -> whether each has a complete marker."""
    if not root.is_dir():
        return {}
    out: dict[int, bool] = {}
    for p in root.iterdir():
        step = parse_step_dir(p.name)
        if step is not None and p.is_dir():
            out[step] = (p / MANIFEST).is_file()
    return out


def committed_step(root: Path) -> int | None:
    """What a start would resume from, unverified: the tracker's step, else (no
    tracker: the first save died before committing, or files were copied by hand)
    the newest directory with a complete marker."""
    tracker = read_tracker(root)
    if tracker is not None:
        return tracker.step
    return max((s for s, ok in scan(root).items() if ok), default=None)


def check_sizes(step_dir: Path, stored: dict[str, int] | None = None
                ) -> tuple[Manifest | None, list[str]]:
    """The manifest and the cheap problems (missing files, wrong sizes, no DCP metadata),
    of the files in ``step_dir`` or, with checkpoint.store, of the ``stored`` objects."""
    manifest = read_manifest(step_dir)
    if manifest is None:
        return None, [f"{MANIFEST} is missing or unreadable"]
    sizes = {name: (file_size(step_dir / name) if stored is None else stored.get(name))
             for name in manifest.files}
    return manifest, size_problems(manifest, sizes)


def upload_wire(state: str, step: int, tries: int, waited_s: float,
                error: str | None) -> dict[str, object]:
    """status.progress.checkpointUpload (grpo_api.job.status.CheckpointUploadProgress)."""
    return {"state": state, "step": step, "tries": tries,
            "waitedSeconds": round(waited_s, 1), "message": error[:1024] if error else None}


class DCPCheckpointer:
    """``Checkpointer`` with torch.distributed.checkpoint under ``checkpoint.dir``."""

    def __init__(self, cfg: Config, *, resume: bool = True) -> None:
        assert cfg.checkpoint.dir is not None
        self.cfg = cfg
        self.root = Path(cfg.checkpoint.dir)
        self.interval = cfg.checkpoint.interval_steps
        self.keep = cfg.checkpoint.keep
        self.async_save = cfg.checkpoint.async_save
        self.resume = resume
        self.attempt = cfg.trainer.attempt
        self.job_uid = cfg.trainer.job_uid
        # Slot for driver-side algorithm state (a reward normaliser, an adaptive KL
        # controller): saved in trainer_state.json and handed back on resume.
        self.algorithm_state: dict[str, Any] = {}
        self._latest: int | None = None
        self._latest_known = False
        self._pending: _Pending | None = None
        self.last_save: dict[str, float] = {}
        self._upload: dict[str, object] | None = None  # upload_status()
        self.last_restore: dict[str, float] = {}
        # checkpoint.store: the local dir mirrors the store's small files (store_mirror.py).
        store = cfg.checkpoint.store
        self.mirror = StoreMirror(ObjectStore(store), self.root) if store else None

    # -- Checkpointer protocol -------------------------------------------------
    def latest_step(self) -> int | None:
        if not self._latest_known:
            # Before restore (a failure while starting): what the next attempt would load.
            if not self.resume:
                return None
            return self.mirror.committed_step() if self.mirror else committed_step(self.root)
        return self._latest

    def restore(self, group: RankGroup, loader: Any) -> int:
        if self.mirror is not None:
            self.mirror.pull()
        # Before anything here is read or removed.
        fence.claim(self.root, self.attempt, self.job_uid)
        if self.mirror is not None:
            self.mirror.push([FENCE])
        plan = plan_startup(scan(self.root), self._tracker_step())
        for step, why in plan.remove:
            self._remove_step(step, why)
        if not self.resume:
            self._latest_known = True
            log.info("not resuming (--no-resume): starting from step 0; %s", self.root)
            return 0
        for step in plan.candidates:
            # A checkpoint that cannot load under these settings (CheckpointIncompatible)
            # raises here: no older one is tried, which would silently lose steps, and
            # until a load succeeded latest_step() still names the committed checkpoint,
            # kept for the attempt that can load it (the termination message says so).
            loaded = self._try_load(step, group, loader)
            if loaded:
                self._latest = step
                self._latest_known = True
                return step
        self._latest_known = True
        if plan.candidates:
            log.error("no loadable checkpoint in %s: starting from step 0", self.root)
        else:
            log.info("no checkpoint in %s: starting from step 0", self.root)
        return 0

    def maybe_save(self, step: int, group: RankGroup, loader: Any, *, final: bool) -> None:
        self._poll(group, wait=False)
        if not is_due(step, self.interval, final):
            return
        self._poll(group, wait=True)
        self._fence(f"saving checkpoint step {step}")
        t0 = time.perf_counter()
        path = self.root / step_dir_name(step)
        if path.exists():  # an abandoned or skipped (corrupt) save of this step
            remove_step_dir(path)
        path.mkdir(parents=True)
        files = self._driver_files(step, loader, group.world_size)
        blocked = group.call(RankApi.save_checkpoint, common=[str(path), self.async_save])
        self._pending = _Pending(step, path, files, t0)
        self.last_save = {
            "step": float(step),
            "blocked_s": time.perf_counter() - t0,
            "rank_blocked_s": max(float(b["blocked_s"]) for b in blocked),
        }
        # With a store, a sync save has its files on the pods' disks by now and uploads
        # them in the background: the step waits for neither (the next save does).
        if final or not (self.async_save or self.mirror is not None):
            self._poll(group, wait=True)

    def save_now(self, step: int, group: RankGroup, loader: Any) -> bool:
        self._poll(group, wait=True)
        if step == 0 or self._latest == step:
            return False
        self.maybe_save(step, group, loader, final=True)  # final: due now, and waited for
        return True

    def save_seconds(self) -> float | None:
        return self.last_save.get("save_s")

    def upload_status(self) -> dict[str, object] | None:
        return self._upload

    def wait(self, group: RankGroup) -> None:
        """Block until the save in flight (if any) is on disk and committed."""
        self._poll(group, wait=True)

    # -- internals ---------------------------------------------------------------
    def _fence(self, action: str) -> None:
        if self.mirror is not None:
            self.mirror.pull_fence()
        fence.check(self.root, self.attempt, action, self.job_uid)

    def _remove_step(self, step: int, why: str) -> None:
        path = self.root / step_dir_name(step)
        if why.startswith("retention"):
            log.info("%s: removing %s", why, path)
        else:
            log.warning("removing checkpoint directory %s: %s", path, why)
        remove_step_dir(path)
        if self.mirror is not None:
            self.mirror.remove_step(step_dir_name(step))

    def _tracker_step(self) -> int | None:
        tracker = read_tracker(self.root)
        return tracker.step if tracker else None

    def _driver_files(self, step: int, loader: Any, world: int) -> dict[str, bytes]:
        seed = self.cfg.rollout.seed
        state = {
            "format": FORMAT,
            "step": step,
            "epoch": loader.epoch,
            "loader": loader.state_dict(),
            "world_size": world,
            "rollout": {
                "seed": seed,
                # What step+1's ranks will sample with (a pure function of these).
                "next_step_seeds": [rollout_seed(seed, step + 1, r) for r in range(world)],
            },
            "algorithm": self.algorithm_state,
            "saved_at": datetime.now(UTC).isoformat(),
        }
        config = yaml.safe_dump(self.cfg.model_dump(mode="json"), sort_keys=False)
        return {
            TRAINER_STATE: json.dumps(state, indent=1).encode(),
            CONFIG: config.encode(),
        }

    def _poll(self, group: RankGroup, *, wait: bool) -> None:
        """Commit the save in flight once every rank has it on disk."""
        pending = self._pending
        if pending is None:
            return
        try:
            results = group.call(RankApi.finish_checkpoint, common=[wait])
        except Exception:
            # A newer attempt's start-up removes incomplete step directories, this one's
            # in-flight save among them: its write then fails because it was superseded.
            self._fence(f"committing checkpoint step {pending.step}")
            raise
        done = [r for r in results if r is not None and "files" in r]
        if len(done) < len(results):
            self._note_upload(pending.step,
                              [r["uploading"] for r in results if r and "uploading" in r])
            return
        # Before the driver's own files: a newer attempt may have removed the directory.
        self._fence(f"committing checkpoint step {pending.step}")
        files = {k: write_durable(pending.path / k, v) for k, v in pending.driver_files.items()}
        for r in done:
            files.update({k: from_wire(v) for k, v in r["files"].items()})
        self._commit(pending, files, len(done))
        self._pending = None
        uploads = [r["upload"] for r in done if "upload" in r]
        if uploads and self.mirror is not None:
            n_files = sum(len(r["files"]) for r in done)
            tries = sum(int(u["tries"]) for u in uploads)
            self._upload = upload_wire("Uploaded", pending.step, tries,
                                       max(float(u["seconds"]) for u in uploads), None)
            log.info("checkpoint step %d is in the store %s: the ranks' %d files up in %.1f s "
                     "(%d tries%s)", pending.step, self.mirror.store.location, n_files,
                     max(u["seconds"] for u in uploads), tries,
                     "; the store failed some and they were retried" if tries > n_files else "")

    def _note_upload(self, step: int, statuses: list[dict[str, Any]]) -> None:
        """The ranks' uploads that the store keeps waiting (checkpoint.store): reported
        (the CheckpointUpload condition), and logged when one has been retried."""
        if not statuses:
            return
        worst = max(statuses, key=lambda u: (u["tries"], u["waited_s"]))
        self._upload = upload_wire("Retrying" if worst["error"] else "Uploading", step,
                                   sum(int(u["tries"]) for u in statuses),
                                   float(worst["waited_s"]), worst["error"])
        if worst["error"]:
            log.warning("checkpoint %s: upload to the store retried (%d tries, %.0f s): %s",
                        worst["uploading"], worst["tries"], worst["waited_s"], worst["error"])

    def _commit(self, pending: _Pending, files: dict[str, FileEntry], world: int) -> None:
        self._fence(f"committing checkpoint step {pending.step}")
        created = datetime.now(UTC).isoformat()
        manifest = build_manifest(pending.step, world, created, files)
        atomic_write(pending.path / MANIFEST, manifest.model_dump_json(indent=1).encode())
        step_dir = step_dir_name(pending.step)
        if self.mirror is not None:  # every rank's files are up: the driver's, then the marker
            self.mirror.push([f"{step_dir}/{n}" for n in (*pending.driver_files, MANIFEST)])
        tracker = Tracker(step=pending.step, dir=step_dir)
        atomic_write(self.root / TRACKER, tracker.model_dump_json().encode())
        if self.mirror is not None:
            self.mirror.push([TRACKER])
        self._latest = pending.step
        self._latest_known = True
        elapsed = time.perf_counter() - pending.started
        total = sum(f.size for f in files.values())
        self.last_save["save_s"] = elapsed
        log.info(
            "checkpoint step %d committed: %s (%.1f MB in %.2f s, %.0f MB/s)",
            pending.step,
            pending.path,
            total / 1e6,
            elapsed,
            total / 1e6 / max(elapsed, 1e-9),
        )
        for step in plan_retention(scan(self.root), pending.step, self.keep):
            self._remove_step(step, f"retention (keep {self.keep})")

    def _try_load(self, step: int, group: RankGroup, loader: Any) -> bool:
        t0 = time.perf_counter()
        path = self.root / step_dir_name(step)
        stored = self.mirror.sizes(path.name) if self.mirror is not None else None
        manifest, problems = check_sizes(path, stored)
        state: dict[str, Any] = {}
        if manifest is not None and not problems:
            # The driver's own small files first: the trainer state must be sound.
            small = {k: v for k, v in manifest.entries().items() if k in (TRAINER_STATE, CONFIG)}
            problems = digest_problems(
                small, {k: digest_file(path / k, manifest.algorithm) for k in small}
            )
        if manifest is not None and not problems:
            state = json.loads((path / TRAINER_STATE).read_text())
            if state.get("step") != step:
                problems = [f"{TRAINER_STATE} says step {state.get('step')}"]
        if problems or manifest is None:
            self._report_bad(path, problems)
            return False
        world = group.world_size
        big = {k: v for k, v in manifest.entries().items() if k not in (TRAINER_STATE, CONFIG)}
        if self.mirror is None:
            shares = [{k: to_wire(v) for k, v in part.items()} for part in balance(big, world)]
        else:  # each rank fetches, and checks, what it reads (rank_store.py)
            shares = [{k: to_wire(v) for k, v in big.items()}] * world
        results = group.call(RankApi.load_checkpoint, shares, common=[str(path)])
        if results[0]["bad"]:
            self._report_bad(path, results[0]["bad"])
            return False
        loader.load_state_dict(state["loader"])
        self.algorithm_state = dict(state.get("algorithm") or {})
        saved_seed = state.get("rollout", {}).get("seed")
        if saved_seed is not None and saved_seed != self.cfg.rollout.seed:
            log.warning(
                "rollout.seed is %s but the checkpoint was trained with %s: rollouts from "
                "here on differ from the original run",
                self.cfg.rollout.seed,
                saved_seed,
            )
        reshard = (
            ""
            if manifest.world_size == world
            else f", resharded {manifest.world_size} -> {world} ranks"
        )
        self.last_restore = {
            "step": float(step),
            "verify_s": max(float(r["verify_s"]) for r in results),
            "load_s": max(float(r["load_s"]) for r in results),
            "total_s": time.perf_counter() - t0,
            "bytes": float(sum(e.size for e in manifest.entries().values())),
            # Tensors read straight into place vs through torch.load (reader.py).
            "direct_items": float(sum(r.get("direct_items", 0) for r in results)),
            "stock_items": float(sum(r.get("stock_items", 0) for r in results)),
        }
        r = self.last_restore
        log.info(
            "resumed from checkpoint step %d (%s, epoch %d%s; rng %s; tensors %s; %.1f MB: "
            "%s check %.2f s, load %.2f s, total %.2f s)",
            step,
            path,
            int(state.get("epoch", 0)),
            reshard,
            results[0]["rng"],
            results[0].get("layout", "as saved"),
            r["bytes"] / 1e6,
            manifest.algorithm,
            r["verify_s"],
            r["load_s"],
            r["total_s"],
        )
        return True

    @staticmethod
    def _report_bad(path: Path, problems: list[str]) -> None:
        log.error(
            "checkpoint %s is corrupt or incomplete, skipping it: %s",
            path,
            "; ".join(problems) or "unknown",
        )
