"""s3:// data files and models onto the job's volume before any rank runs (the hub-fetch
init container's ``--s3`` and ``--s3-model``; spec.data.train/val as ``s3://bucket/key``,
spec.model.path as ``s3://bucket/prefix/``), and a model's config.json for the operator's
plan (the model-config reader pod: ``python -m grpo_trainer.store_fetch``).

Each object lands at ``<root>/s3/<bucket>/<key>`` (contract.s3_local_path, the path the
operator hands the trainer) through a temporary name, renamed when whole; one already
there at the store's size costs a listing and nothing more, so a later attempt, or each
pod of a job without a claim, fetches only what it lacks. The store's endpoint, region
and keys are checkpoint.store's (the keys from the environment, as the ranks get them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_api.contract import s3_local_path
from grpo_api.trainer_config import ObjectStoreConfig

from .object_store import ObjectStore, parse_uri

log = logging.getLogger("grpo_trainer.store_fetch")
Progress = Callable[[dict[str, Any]], None]


def _bucket(uri: str, store: ObjectStoreConfig) -> tuple[ObjectStore, str]:
    """The store at ``uri``'s bucket (checkpoint.store's settings otherwise), and the key."""
    where = parse_uri(uri)
    return ObjectStore(store.model_copy(update={"uri": f"s3://{where.bucket}"})), where.prefix


def fetch_object(uri: str, root: Path, store: ObjectStoreConfig,
                 report: Progress = lambda _: None) -> Path:
    """Download the object ``uri`` under ``root`` unless it is there whole; its path."""
    dest = Path(s3_local_path(str(root), uri))
    bucket, key = _bucket(uri, store)
    # A listing of the object's folder: obstore lists by path segments, not by prefix.
    size = bucket.sizes(key.rpartition("/")[0]).get(key)
    if size is None:
        raise FileNotFoundError(f"{uri}: no such object in the store "
                                f"({store.endpoint or 'AWS S3'})")
    progress = {"repo": uri, "file": key, "bytesTotal": size}
    if dest.is_file() and dest.stat().st_size == size:
        log.info("%s: already on the volume (%s)", uri, dest)
    else:
        report({**progress, "bytesDone": 0, "state": "Fetching"})
        bucket.download(key, dest)
    report({**progress, "file": "", "bytesDone": size, "state": "Fetched"})
    return dest


MARKER = ".grpo-fetched"  # a model prefix fetched whole: later attempts ask nothing


def fetch_prefix(uri: str, root: Path, store: ObjectStoreConfig,
                 report: Progress = lambda _: None) -> Path:
    """Download every object under the prefix ``uri`` (a model's Hugging Face layout) to
    its local directory, each kept when there at the store's size; that directory."""
    bucket, prefix = _bucket(uri, store)
    dest = Path(s3_local_path(str(root), uri.rstrip("/")))
    if (dest / MARKER).is_file():
        log.info("%s: already on the volume (%s)", uri, dest)
        return dest
    objects = bucket.sizes(prefix)
    if not objects:
        raise FileNotFoundError(f"{uri}: no object under this prefix in the store "
                                f"({store.endpoint or 'AWS S3'})")
    total, done = sum(objects.values()), 0
    for name, size in sorted(objects.items()):
        path = dest / name.removeprefix(prefix).lstrip("/")
        if not (path.is_file() and path.stat().st_size == size):
            report({"repo": uri, "file": path.name, "bytesDone": done, "bytesTotal": total,
                    "state": "Fetching"})
            bucket.download(name, path)
        done += size
    report({"repo": uri, "file": "", "bytesDone": done, "bytesTotal": total,
            "state": "Fetched"})
    (dest / MARKER).write_text(uri)
    return dest


def main(argv: list[str] | None = None) -> int:
    """The model-config reader pod for an s3:// model: its config.json fetched and read
    as for a model on a claim; exit 0 with the shape fields, 2 when config.json is missing
    or bad or the keys are refused, 1 when the store did not answer (the operator retries)."""
    import argparse
    import os
    import tempfile

    from grpo_api.contract import TERMINATION_LOG, Env
    from grpo_api.model_config import ConfigUnavailable, ReaderReport, read_dir, shape_fields

    from .object_store import StoreRefused, StoreUnavailable

    ap = argparse.ArgumentParser(prog="python -m grpo_trainer.store_fetch")
    ap.add_argument("--config-of", required=True, help="s3://bucket/prefix/ of the model")
    ap.add_argument("--s3-endpoint")
    ap.add_argument("--s3-region")
    ap.add_argument("--s3-path-style", action="store_true")
    ap.add_argument("--s3-keys-secret")
    ap.add_argument("--out", default=os.environ.get(Env.TERMINATION_LOG.value, TERMINATION_LOG))
    args = ap.parse_args(argv)
    store = ObjectStoreConfig(uri=args.config_of, endpoint=args.s3_endpoint,
                              region=args.s3_region, path_style=args.s3_path_style,
                              keys_secret=args.s3_keys_secret)
    bucket, prefix = _bucket(args.config_of, store)
    where = f"{args.config_of.rstrip('/')}/config.json"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            bucket.download(f"{prefix.rstrip('/')}/config.json", Path(tmp) / "config.json")
            report, code = ReaderReport(config=shape_fields(read_dir(tmp))), 0
        except FileNotFoundError:
            report, code = ReaderReport(error=f"{where}: no such object in the store"), 2
        except ConfigUnavailable as err:
            report, code = ReaderReport(error=f"{where}: {err}", retry=err.retry), 2
        except StoreRefused as err:
            report, code = ReaderReport(error=f"{where}: {err}"), 2
        except StoreUnavailable as err:
            report, code = ReaderReport(error=f"{where}: {err}", retry=True), 1
    message = report.to_message()
    Path(args.out).write_text(message)
    print(message)
    return code


if __name__ == "__main__":
    import sys

    sys.exit(main())
