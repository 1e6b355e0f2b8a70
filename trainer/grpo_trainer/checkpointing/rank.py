"""One rank's side of a checkpoint: DCP shards, RNG streams, LR scheduler.

Works on a rank's ``RankState`` (every method is collective over the ranks). The model
and optimizer go through ``torch.distributed.checkpoint`` with DTensor state
dicts from ``get_state_dict``, so a checkpoint saved by W ranks loads on any
other number of ranks. Each file's digest (xxh3-128) is computed while it is
written and returned to the driver, which writes the manifest.

Async saves stage a CPU copy of the state (the only part that blocks training)
and write it from DCP's background thread over a separate gloo group, so the
writer's collectives never interleave with the training step's.
"""

from __future__ import annotations

import io
import logging
import random
import time
from collections.abc import Generator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from ..errors import CheckpointIncompatible
from ..model.rank_state import RankState
from ..object_store import ObjectStore
from .compat import incompatible_message
from .convert import CrossLoad, finish, prepare, saved_entries
from .files import HashingWriter, write_durable
from .rank_store import RankUpload, agree, fetch, plan_files
from .reader import DirectReader
from .tracker import (
    DCP_METADATA,
    FileEntry,
    from_wire,
    parse_step_dir,
    rank_file,
    to_wire,
)
from .verification import Verification

log = logging.getLogger(__name__)


class HashingFileSystem(FileSystem):
    """DCP's file system with a digest of every file it writes, keyed by file name."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, FileEntry] = {}

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Generator[Any, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        p = Path(path)
        with p.open(mode) as raw:
            writer = HashingWriter(cast(BinaryIO, raw))
            yield writer
        self.digests[p.name] = writer.entry()  # dict writes are atomic under the GIL

    def rename(self, path: Any, new_path: Any) -> None:
        super().rename(path, new_path)
        entry = self.digests.pop(Path(path).name, None)
        if entry is not None:
            self.digests[Path(new_path).name] = entry


def _writer(path: str, threads: int) -> tuple[FileSystemWriter, HashingFileSystem]:
    # ``threads`` files per rank, written (and hashed) in parallel.
    writer = FileSystemWriter(path, sync_files=True, thread_count=threads)
    fs = HashingFileSystem()
    writer.fs = fs
    return writer, fs


class CachedStager:
    """DCP ``AsyncStager`` that copies into one CPU buffer kept across saves.

    A fresh CPU copy per save spends most of its time faulting in new pages; the
    cached one is a plain copy. Costs one host copy of this rank's model and
    optimizer shard for as long as async saves are on (pinned when CUDA is there,
    which DCP's own cached stager requires even without a GPU). Safe to reuse:
    a rank never starts a save before the previous one finished.
    """

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        # Private helpers, but the ones DCP's stagers use themselves.
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        if self._cache is not None:
            try:
                return dict(_copy_state_dict(state_dict, self._cache))
            except (KeyError, RuntimeError, ValueError):  # the layout changed: rebuild
                self._cache = None
        self._cache = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
        return dict(_copy_state_dict(state_dict, self._cache))

    def synchronize_staging(self) -> None:
        return None

    def close(self) -> None:
        return None


def _rng_state(cuda: Any = torch.cuda) -> dict[str, Any]:
    """Every RNG stream of this rank. CUDA's: this rank's own device only. A rank sees
    every GPU of its node (Ray's NOSET mode, devices.py), so ``get_rng_state_all`` saved
    one state per visible GPU, and a resume on a node with fewer GPUs raised IndexError."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
        "cuda": cuda.get_rng_state() if cuda.is_available() else None,
    }
    return state


def _set_rng_state(state: dict[str, Any], cuda: Any = torch.cuda) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    saved = state.get("cuda")
    if saved is None or not cuda.is_available():
        return
    if isinstance(saved, list | tuple):  # written before: one state per visible GPU
        device = cuda.current_device()
        if device >= len(saved):
            log.warning("the checkpoint has no CUDA RNG state for device %d (%d saved): "
                        "this rank's CUDA stream starts afresh", device, len(saved))
            return
        saved = saved[device]
    cuda.set_rng_state(saved)


class CheckpointWriteError(RuntimeError):
    """A save that failed on some rank. torch's ``CheckpointException`` derives from
    ``BaseException``, so it would slip past every ``except Exception`` (the driver's
    superseded check among them): it is re-raised as this."""


def _as_error(err: BaseException) -> BaseException:
    if isinstance(err, Exception | KeyboardInterrupt | SystemExit):
        return err
    error = CheckpointWriteError(f"checkpoint write failed: {err}")
    error.__cause__ = err
    return error


class RankCheckpointer:
    """Saves and loads ``state``'s actor, optimizer, scheduler, and this process's RNG."""

    def __init__(self, state: RankState) -> None:
        self.state = state
        # I/O and hashing threads: the CPUs this rank was given, within reason.
        self.threads = max(1, min(8, int(state.cfg.resources.cpus_per_worker)))
        self._group: Any = None
        self._pending: Future[FileEntry] | None = None
        self._fs: HashingFileSystem | None = None
        self._result: dict[str, Any] | None = None
        self._stager: CachedStager | None = None
        self._t0 = 0.0
        self._save_path = ""
        store_cfg = state.cfg.checkpoint.store
        self._store: ObjectStore | None = ObjectStore(store_cfg) if store_cfg else None
        self._upload: RankUpload | None = None

    def _pg(self) -> Any:
        # Collective: every rank reaches its first save/load together.
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from ..lora.checkpoint import state_dict_options

        opts = state_dict_options(self.state.cfg.actor.lora)  # LoRA: adapters only
        msd, osd = get_state_dict(self.state.actor, self.state.optimizer, options=opts)
        return msd, osd

    # -- save ------------------------------------------------------------------
    def save(self, path: str, async_save: bool) -> dict[str, Any]:
        """Start (async) or do (sync) this rank's part of the save of step dir ``path``.

        Returns the time training was blocked; the file digests come from ``finish``.
        Async: only the snapshot (state dicts staged to CPU, RNG and scheduler state
        serialised) happens here; every write and fsync happens in the background.
        """
        import torch.distributed.checkpoint as dcp

        self.finish(wait=True)  # one save in flight per rank
        t0 = time.perf_counter()
        self._t0 = t0
        pg = self._pg()
        buf = io.BytesIO()
        world = self.state.world
        torch.save(
            {
                "rank": world.rank,
                "world_size": world.size,
                "rng": _rng_state(),
                "scheduler": self.state.scheduler.state_dict(),
            },
            buf,
        )
        extra_path = Path(path) / rank_file(world.rank)
        extra = buf.getvalue()
        msd, osd = self._state()
        writer, self._fs = _writer(path, self.threads)
        self._result = None
        state = {"model": msd, "optim": osd}
        done: Future[FileEntry] = Future()
        if async_save:
            if self._stager is None:
                self._stager = CachedStager()
            res = dcp.async_save(
                state, storage_writer=writer, process_group=pg, async_stager=self._stager
            )
            upload = res if isinstance(res, Future) else res.upload_completion

            def then_extra(f: Future[Any]) -> None:  # runs on DCP's writer thread
                try:
                    f.result()
                    done.set_result(write_durable(extra_path, extra))
                except BaseException as err:  # handed to finish(), which re-raises
                    done.set_exception(_as_error(err))

            upload.add_done_callback(then_extra)
        else:
            try:
                dcp.save(state, storage_writer=writer, process_group=pg)
            except BaseException as err:
                raise _as_error(err) from err
            done.set_result(write_durable(extra_path, extra))
        self._pending = done
        self._save_path = path
        self._upload = None
        if not async_save and self._store is not None:
            self.finish(wait=False)  # the upload starts now, in the background
        return {"blocked_s": time.perf_counter() - t0}

    def finish(self, wait: bool) -> dict[str, Any] | None:
        """This rank's file digests once its save is on disk (and, with checkpoint.store,
        in the store); None while it is not (or none), ``{"uploading": ...}`` while its
        upload is retried."""
        if self._result is not None or self._pending is None:
            return self._result
        if not wait and not self._pending.done():
            return None
        try:
            extra = self._pending.result()  # re-raises a failed background write
            assert self._fs is not None
            files = {rank_file(self.state.world.rank): extra, **self._fs.digests}
            if self._store is not None:
                if self._upload is None:
                    self._upload = RankUpload(self._store, Path(self._save_path), files)
                if not self._upload.poll(wait):  # re-raises a failed upload
                    return {"uploading": self._upload.status()}
        except BaseException:
            # Reported once, to the driver that asked: this rank's next save or load
            # (a newer attempt's, on a reused worker) must not fail with an old error.
            self._pending = None
            self._upload = None
            raise
        self._result = {
            "files": {k: to_wire(v) for k, v in files.items()},
            "save_s": time.perf_counter() - self._t0,
            **({"upload": {"bytes": self._upload.bytes, "seconds": self._upload.seconds,
                           "tries": self._upload.tries}} if self._upload else {}),
        }
        return self._result

    # -- load ------------------------------------------------------------------
    def _incompatible(self, root: Path, problems: tuple[str, ...]) -> str:
        actor = self.state.cfg.actor
        settings = f"actor.precision {actor.precision}" + (", LoRA" if actor.lora else "")
        return incompatible_message(parse_step_dir(root.name), str(root), problems, settings)

    def _rng_file(self, verify: dict[str, list[Any]]) -> str:
        own = rank_file(self.state.world.rank)
        return own if own in verify else rank_file(0)

    def _prepare(self, metadata: Any, root: Path) -> CrossLoad:
        """What to read, and into what (saved under another rung's settings: precision)."""
        msd, osd = self._state()
        load = prepare({"model": msd, "optim": osd}, saved_entries(metadata))
        if load.plan.problems:  # every rank alike: the same metadata, the same keys
            raise CheckpointIncompatible(self._incompatible(root, load.plan.problems))
        return load

    def load(self, path: str, verify: dict[str, list[Any]]) -> dict[str, Any]:
        """Check this rank's share of the files and, if every rank agrees, load.

        ``verify`` maps file names to [size, digest, algorithm] from the manifest.
        The digests are computed by a pool of threads (files in parallel), and the
        reader's gate holds every write into the model or optimizer until every
        rank's verdict is in. Returns ``{"bad": [...]}`` naming every bad
        file any rank found (nothing loaded), or ``{"bad": [], "rng": ...}``.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        self.finish(wait=True)
        pg = self._pg()
        root = Path(path)
        t0 = time.perf_counter()
        reader = DirectReader(path, before_read=lambda: check.gate())
        load: CrossLoad | None = None
        if self._store is None:
            check = Verification(root, verify, self.threads, pg)
            # Verified before DCP plans, not beside it: planning is pure Python and holds
            # the GIL, and the hashing threads, which need it between every chunk, then
            # queued behind it (measured: the check took 2-4x a raw read instead of ~1x).
            if check.wait():
                return {"bad": check.wait()}
        else:
            # From the store, only what this rank reads: the metadata and RNG files, then
            # the shards its load plan names; each checked against the manifest.
            first = {DCP_METADATA, self._rng_file(verify)} & verify.keys()
            sizes = {k: from_wire(v).size for k, v in verify.items()}
            problems = agree(fetch(self._store, root, first, sizes), pg)
            if problems:
                return {"bad": problems}
            metadata = reader.read_metadata()
            load = self._prepare(metadata, root)  # alike on every rank: the same metadata
            wanted = first | (plan_files(load.targets, metadata) & verify.keys())
            problems = fetch(self._store, root, wanted, sizes)
            check = Verification(root, {k: verify[k] for k in wanted}, self.threads, pg,
                                  problems)
            if check.wait():
                return {"bad": check.wait()}
        try:
            if load is None:
                load = self._prepare(reader.read_metadata(), root)
            dcp.load(load.targets, storage_reader=reader, process_group=pg)
        except BaseException:  # DCP's CheckpointException is a BaseException
            # The gate's refusal would come back wrapped by DCP: name the files.
            if check.wait():
                return {"bad": check.wait()}
            raise
        from ..lora.checkpoint import state_dict_options

        st = self.state
        state = finish(load)
        set_state_dict(
            st.actor,
            st.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=state_dict_options(st.cfg.actor.lora),
        )
        st.optimizer_state_to(st.optimizer_home)
        t_verify = check.finished - t0

        own = root / rank_file(st.world.rank)
        src = own if own.exists() else root / rank_file(0)
        extra = torch.load(src, weights_only=True)
        st.scheduler.load_state_dict(extra["scheduler"])
        rng = "restored"
        if src == own and extra["world_size"] == st.world.size:
            _set_rng_state(extra["rng"])
        else:
            # Resharded: rank r's streams belonged to a different shard of the
            # work; rollouts do not depend on them (seeded by step and rank).
            rng = f"not restored (saved by {extra['world_size']} ranks)"
        return {
            "bad": [],
            "rng": rng,
            "layout": load.plan.summary(),
            "verify_s": t_verify,
            "load_s": time.perf_counter() - t0 - t_verify,
            "direct_items": reader.direct_items,
            "stock_items": reader.stock_items,
        }
