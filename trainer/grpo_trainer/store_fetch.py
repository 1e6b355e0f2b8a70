"""s3:// data files onto the job's volume before any rank runs (the hub-fetch init
container's ``--s3``; spec.data.train/val as ``s3://bucket/key``).

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


def fetch_object(uri: str, root: Path, store: ObjectStoreConfig,
                 report: Progress = lambda _: None) -> Path:
    """Download the object ``uri`` under ``root`` unless it is there whole; its path."""
    where = parse_uri(uri)
    dest = Path(s3_local_path(str(root), uri))
    bucket = ObjectStore(store.model_copy(update={"uri": f"s3://{where.bucket}"}))
    # A listing of the object's folder: obstore lists by path segments, not by prefix.
    folder = where.prefix.rpartition("/")[0]
    size = bucket.sizes(folder).get(where.prefix)
    if size is None:
        raise FileNotFoundError(f"{uri}: no such object in the store "
                                f"({store.endpoint or 'AWS S3'})")
    progress = {"repo": uri, "file": where.prefix, "bytesTotal": size}
    if dest.is_file() and dest.stat().st_size == size:
        log.info("%s: already on the volume (%s)", uri, dest)
    else:
        report({**progress, "bytesDone": 0, "state": "Fetching"})
        bucket.download(where.prefix, dest)
    report({**progress, "file": "", "bytesDone": size, "state": "Fetched"})
    return dest
