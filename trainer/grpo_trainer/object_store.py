"""The S3 edge of ``checkpoint.store``: one ``ObjectStore`` per process, over obstore.

obstore (Rust's object_store) was chosen by ``bench/bench_object_store.py``
(docs/benchmarks.md, "Object storage"): the fastest both ways, multipart uploads, the AWS
credential chain (keys from the environment, IRSA's web identity, instance metadata) and
typed errors. Any S3-compatible endpoint works (AWS, MinIO, Ceph RGW, GCS's interop, the
testbed's versitygw). Keys are never logged: errors name the Secret they came from.

Errors come in two kinds: ``StoreRefused`` (the keys or the bucket are wrong: retrying
cannot help; a ConfigError, exit 2) and ``StoreUnavailable`` (the store is down or slow:
the caller retries with backoff until its deadline).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from grpo_api.trainer_config import ObjectStoreConfig

from .config_error import ConfigError

if TYPE_CHECKING:
    from obstore.store import ClientConfig

log = logging.getLogger(__name__)
T = TypeVar("T")
# One request's own retries stay short: the uploader's loop owns the long wait, so it can
# say what it is waiting for and give up at the deadline.
_REQUEST_RETRY_S = 15.0
# S3's error codes for credentials it will not take (a retry cannot help).
_REFUSALS = ("403 Forbidden", "401 Unauthorized", "AccessDenied", "InvalidAccessKeyId",
             "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken")


@dataclass(frozen=True)
class StoreLocation:
    bucket: str
    prefix: str  # no leading or trailing "/"; "" for the bucket's root

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def parse_uri(uri: str) -> StoreLocation:
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    return StoreLocation(bucket, prefix.strip("/"))


class StoreUnavailable(RuntimeError):
    """The store did not answer, or answered with a server error: worth retrying."""


class UploadFailed(RuntimeError):
    """The store stayed unavailable past ``checkpoint.store.upload_deadline_s``."""


# Waits between tries while the store is down: 1, 2, 4, ... capped here.
BACKOFF_CAP_S = 30.0


def backoff_s(tries: int) -> float:
    return float(min(BACKOFF_CAP_S, 2 ** max(0, tries - 1)))


def retrying(what: str, fn: Callable[[], T], deadline_s: float, *, since: float | None = None,
             sleep: Callable[[float], None] = time.sleep,
             on_error: Callable[[StoreUnavailable], None] | None = None) -> T:
    """``fn()``, tried again with backoff while the store is unavailable; ``UploadFailed``
    once ``deadline_s`` have passed since ``since`` (default: this call). A refusal
    (``StoreRefused``) is never retried."""
    t0 = time.monotonic() if since is None else since
    failures = 0
    while True:
        try:
            return fn()
        except StoreUnavailable as exc:
            failures += 1
            if on_error is not None:
                on_error(exc)
            waited = time.monotonic() - t0
            if waited > deadline_s:
                raise UploadFailed(
                    f"{what}: the store did not take it in {waited:.0f} s "
                    f"(checkpoint.store.upload_deadline_s {deadline_s:.0f}): {exc}") from exc
            pause = backoff_s(failures)
            log.warning("%s failed (try %d, %.0f s so far), again in %.0f s: %s", what,
                        failures, waited, pause, exc)
            sleep(pause)


class StoreRefused(ConfigError):
    """The store refused the credentials, or the bucket does not exist: a retry cannot
    help; the message names where the keys came from."""

    def __init__(self, cfg: ObjectStoreConfig, what: str, detail: str) -> None:
        keys = (f"the keys in Secret {cfg.keys_secret!r}" if cfg.keys_secret
                else "the credentials of the environment (AWS_ACCESS_KEY_ID, or the pod's "
                     "identity)")
        super().__init__(
            "checkpoint.store",
            f"{cfg.uri} ({cfg.endpoint or 'AWS S3'}) {what}: {detail}. Check {keys}, the "
            "bucket's name and the endpoint; no checkpoint was lost (the local copy stays "
            "until it is uploaded)",
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


class ObjectStore:
    """Named objects under ``checkpoint.store.uri``; names are relative to its prefix."""

    def __init__(self, cfg: ObjectStoreConfig) -> None:
        from obstore.store import S3Store

        self.cfg = cfg
        self.location = parse_uri(cfg.uri)
        options: ClientConfig = {"connect_timeout": timedelta(seconds=5),
                                   "timeout": timedelta(minutes=10)}
        if cfg.endpoint and cfg.endpoint.startswith("http://"):
            options["allow_http"] = True
        kwargs: dict[str, Any] = {}
        if cfg.endpoint:
            kwargs["endpoint"] = cfg.endpoint
        if cfg.region:
            kwargs["region"] = cfg.region
        self._store = S3Store(
            self.location.bucket,
            prefix=self.location.prefix or None,
            virtual_hosted_style_request=not cfg.path_style,
            client_options=options,
            retry_config={"max_retries": 4, "retry_timeout": timedelta(seconds=_REQUEST_RETRY_S),
                          "backoff": {"init_backoff": timedelta(milliseconds=200),
                                      "max_backoff": timedelta(seconds=5), "base": 2}},
            **kwargs,
        )

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

        try:
            return fn()
        except (PermissionDeniedError, UnauthenticatedError) as exc:
            raise StoreRefused(self.cfg, f"refused to {what}", _first_line(exc)) from exc
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise StoreRefused(self.cfg, f"has no bucket {self.location.bucket!r}",
                                   _first_line(exc)) from exc
            raise
        except OSError as exc:
            raise StoreUnavailable(f"{what} at {self.location}: {_first_line(exc)}") from exc
        except Exception as exc:  # obstore's GenericError: connection refused, 5xx, timeouts
            text = str(exc)
            if "NoSuchBucket" in text:
                raise StoreRefused(self.cfg, f"has no bucket {self.location.bucket!r}",
                                   _first_line(exc)) from exc
            # A listing refused comes back generic, its S3 code in the body.
            if any(code in text for code in _REFUSALS):
                raise StoreRefused(self.cfg, f"refused to {what}", _first_line(exc)) from exc
            raise StoreUnavailable(f"{what} at {self.location}: {_first_line(exc)}") from exc

    def put_file(self, name: str, path: Path) -> None:
        import obstore

        self._call(f"upload {name}", lambda: obstore.put(self._store, name, path))

    def put_bytes(self, name: str, data: bytes) -> None:
        import obstore

        self._call(f"upload {name}",
                   lambda: obstore.put(self._store, name, data, use_multipart=False))

    def get_bytes(self, name: str) -> bytes | None:
        """The object's bytes, or None when there is none."""
        import obstore

        try:
            return self._call(f"read {name}",
                              lambda: bytes(obstore.get(self._store, name).bytes()))
        except FileNotFoundError:
            return None

    def download(self, name: str, dst: Path) -> int:
        """Copy the object to ``dst`` (through a temporary name, renamed when whole and
        fsynced); its size."""
        import obstore

        tmp = dst.with_name(f".{dst.name}.part-{os.getpid()}")
        dst.parent.mkdir(parents=True, exist_ok=True)

        def fetch() -> int:
            size = 0
            with open(tmp, "wb") as f:
                for chunk in obstore.get(self._store, name).stream(min_chunk_size=8 << 20):
                    f.write(chunk)
                    size += len(chunk)
                f.flush()
                os.fsync(f.fileno())
            return size

        try:
            size = self._call(f"download {name}", fetch)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(dst)
        return size

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """Every object under ``prefix`` (relative to the store's) -> its size."""
        import obstore

        def listing() -> dict[str, int]:
            out: dict[str, int] = {}
            for batch in obstore.list(self._store, prefix=prefix or None):
                for meta in batch:
                    out[str(meta["path"])] = int(meta["size"])
            return out

        return self._call(f"list {prefix or 'the prefix'}", listing)

    def delete(self, names: list[str]) -> None:
        import obstore

        if names:
            self._call(f"delete {len(names)} objects",
                       lambda: obstore.delete(self._store, names))
