"""Fetch hub models and datasets onto the job's volume, once per job, before any rank runs.

The operator runs this as an init container of the head pod (`python -m
grpo_trainer.hub_fetch`) when `spec.model.path` or `spec.data.train/val` name hub repos
(or s3:// data files: store_fetch.py, `--s3`);
the trainer then reads only local files. Per repo, files go to
`<root>/<models|datasets>/<owner>/<name>/` (root: the job's directory on its checkpoint
volume, shared by every pod of every attempt):
- a file already there with the hub's size is kept, a partial one (`<file>.part`) resumes
  with an HTTP range request where it stopped, so a crashed fetch goes on and a later
  attempt re-downloads nothing; a complete repo has a marker (`.grpo-fetched`, holding
  the commit) and costs no hub request at all. (huggingface_hub's own downloads restart
  a file from zero in a new process, hence this small downloader; huggingface_hub still
  reads the repo's file list, sizes and commit);
- HF_TOKEN (from the Secret the job names) and HF_ENDPOINT (a mirror) come from the env;
- progress (bytes done of bytes total, the current file) is reported to the job's
  `status.progress.fetch`, where the operator shows it as the `HubFetch` condition; a
  failure is reported there too, and the exit code is 1 (the operator retries the attempt).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from grpo_api.contract import (
    TERMINATION_LOG,
    TERMINATION_MESSAGE_MAX_BYTES,
    hub_local_dir,
)

log = logging.getLogger("grpo_trainer.hub_fetch")
MARKER = ".grpo-fetched"
CHUNK = 1 << 20  # written (and resumable) a MiB at a time
Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class HubRepo:
    kind: str  # "model" | "dataset"
    repo_id: str  # owner/name
    revision: str | None = None

    @property
    def folder(self) -> str:
        return "models" if self.kind == "model" else "datasets"

    def local_dir(self, root: Path) -> Path:
        return Path(self.local_dir_str(str(root)))

    def local_dir_str(self, root: str) -> str:
        """The same as a string (the layout the operator renders: contract.hub_local_dir)."""
        return hub_local_dir(root, self.kind, self.repo_id)


def fetch(repo: HubRepo, root: Path, report: Progress = lambda _: None,
          endpoint: str | None = None, token: str | None = None) -> Path:
    """Download `repo` under `root` unless it is there; returns its local directory."""
    from huggingface_hub import HfApi, hf_hub_url

    dest = repo.local_dir(root)
    if (dest / MARKER).is_file():
        log.info("%s %s: already on the volume (%s)", repo.kind, repo.repo_id, dest)
        return dest
    api = HfApi(endpoint=endpoint, token=token)
    info_of = api.model_info if repo.kind == "model" else api.dataset_info
    info = info_of(repo.repo_id, revision=repo.revision, files_metadata=True)
    files = [(s.rfilename, int(s.size or 0)) for s in info.siblings or []]
    total = sum(size for _, size in files)
    done = 0
    for name, size in files:
        path = dest / name
        if not (path.is_file() and path.stat().st_size == size):
            url = hf_hub_url(repo.repo_id, name, repo_type=repo.kind, revision=info.sha,
                             endpoint=endpoint)

            def fetching(n: int, name: str = name, before: int = done) -> None:
                report({"repo": repo.repo_id, "file": name, "bytesDone": before + n,
                        "bytesTotal": total, "state": "Fetching"})

            _download(url, path, size, token, fetching)
        done += size
    report({"repo": repo.repo_id, "file": "", "bytesDone": done, "bytesTotal": total,
            "state": "Fetched"})
    (dest / MARKER).write_text(str(info.sha))
    return dest


def _download(url: str, path: Path, size: int, token: str | None,
              progress: Callable[[int], None]) -> None:
    """`url` to `path` through `<path>.part`, resuming a part left by a killed process."""
    part = path.with_name(path.name + ".part")
    path.parent.mkdir(parents=True, exist_ok=True)
    start = part.stat().st_size if part.exists() else 0
    if start > size:
        start = 0
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if start:
        headers["Range"] = f"bytes={start}-"
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=120) as response:
        resumed = start and response.status == 206  # else the server sent it whole
        with open(part, "ab" if resumed else "wb") as out:
            got = start if resumed else 0
            while chunk := response.read(CHUNK):
                out.write(chunk)
                got += len(chunk)
                progress(got)
    if part.stat().st_size != size:
        raise OSError(f"{path.name}: got {part.stat().st_size} of {size} bytes")
    part.replace(path)


def _reporter() -> Progress:
    """status.progress.fetch of the job when in its pod (same rights as the trainer's
    progress reports), else the log."""
    ns, name = os.environ.get("GRPO_JOB_NAMESPACE"), os.environ.get("GRPO_JOB_NAME")
    last = [float("-inf")]

    def due(p: dict[str, Any]) -> bool:  # progress every 2 s; Fetched and Failed always
        if p["state"] == "Fetching" and time.monotonic() - last[0] < 2:
            return False
        last[0] = time.monotonic()
        return True

    if not (ns and name and os.environ.get("KUBERNETES_SERVICE_HOST")):
        return lambda p: log.info("fetch %s", p) if due(p) else None
    from kubernetes import client, config

    from grpo_api.contract import API_GROUP, API_VERSION, PLURAL, PROGRESS_FIELD_MANAGER

    config.load_incluster_config()
    api = client.CustomObjectsApi()

    def report(p: dict[str, Any]) -> None:
        if not due(p):
            return
        try:
            api.patch_namespaced_custom_object_status(
                API_GROUP, API_VERSION, ns, PLURAL, name,
                {"status": {"progress": {"fetch": p}}}, field_manager=PROGRESS_FIELD_MANAGER)
        except Exception as err:  # reporting must never stop the fetch
            log.warning("fetch progress report failed: %s", err)

    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpo_trainer.hub_fetch")
    ap.add_argument("--root", required=True, type=Path, help="the job's directory")
    ap.add_argument("--model", action="append", default=[], help="owner/name[@revision]")
    ap.add_argument("--dataset", action="append", default=[], help="owner/name[@split]")
    ap.add_argument("--s3", action="append", default=[], help="s3://bucket/key of a data file")
    ap.add_argument("--s3-model", action="append", default=[], help="s3://bucket/prefix/")
    ap.add_argument("--s3-endpoint", help="checkpoint.store.endpoint")
    ap.add_argument("--s3-region", help="checkpoint.store.region")
    ap.add_argument("--s3-path-style", action="store_true", help="checkpoint.store.path_style")
    ap.add_argument("--s3-keys-secret", help="the Secret the keys came from (for errors)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = _reporter()
    repos = [HubRepo("model", *m.split("@", 1)) if "@" in m else HubRepo("model", m)
             for m in args.model]
    repos += [HubRepo("dataset", d.split("@", 1)[0]) for d in args.dataset]
    endpoint, token = os.environ.get("HF_ENDPOINT") or None, os.environ.get("HF_TOKEN") or None
    # (what, which: the repo or URI the fetch reports under, the fetch)
    jobs: list[tuple[str, str, Callable[[], object]]] = [
        (repo.kind, repo.repo_id, partial(fetch, repo, args.root, report, endpoint, token))
        for repo in repos]
    if args.s3 or args.s3_model:
        from grpo_api.trainer_config import ObjectStoreConfig

        from .store_fetch import fetch_object, fetch_prefix

        store = ObjectStoreConfig(uri=[*args.s3, *args.s3_model][0], endpoint=args.s3_endpoint,
                                  region=args.s3_region, path_style=args.s3_path_style,
                                  keys_secret=args.s3_keys_secret)
        jobs += [("model", uri, partial(fetch_prefix, uri, args.root, store, report))
                 for uri in args.s3_model]
        jobs += [("data", uri, partial(fetch_object, uri, args.root, store, report))
                 for uri in args.s3]
    for what, which, run in jobs:
        try:
            run()
        except Exception as err:
            message = f"{what} {which}: {type(err).__name__}: {err}"
            report({"repo": which, "file": "", "bytesDone": 0, "bytesTotal": 0,
                    "state": "Failed", "message": message[:1000]})
            with contextlib.suppress(OSError):  # the pod's reason, as kubectl shows it
                Path(TERMINATION_LOG).write_text(message[:TERMINATION_MESSAGE_MAX_BYTES])
            log.error("fetch failed: %s", message)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
