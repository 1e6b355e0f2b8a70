"""An S3 server for the testbed: Versity's S3 gateway (``versitygw``, pinned in versions.py)
serving a POSIX directory, so checkpoints, exports and logs go to object storage through
the same S3 API a user's AWS S3, MinIO or Ceph RGW answers.

It listens only on the address it is given (127.0.0.1, or the host side of a real node's
veth, as the registry does), with one root key pair made here: tests see the keys, the
product is handed them as a user would (a Secret). ``stop`` and ``start`` keep the data
and the port, so a fault test can take the store away mid-upload and bring it back; call
``start`` from a thread that outlives the server (the main one): the testbed's children die
with the thread that spawned them (PR_SET_PDEATHSIG), so one started from a ``Timer`` dies
at once.
"""

from __future__ import annotations

import logging
import os
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .processes import Managed, Spawn, free_ports, spawn, wait_until
from .versions import binary

log = logging.getLogger("grpo_testbed.s3")

REGION = "us-east-1"


@dataclass
class S3Server:
    """A running (or stopped) gateway; ``endpoint`` is ``http://host:port``."""

    host: str
    port: int
    root: Path
    access_key: str
    secret_key: str
    spawn: Spawn
    proc: Managed | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        # Keys by environment, not argv: a `ps` on the machine must not show them.
        return [str(binary("versitygw")), "--port", f"{self.host}:{self.port}",
                "--region", REGION, "posix", str(self.root)]

    def env(self) -> dict[str, str]:
        return {**os.environ, "ROOT_ACCESS_KEY_ID": self.access_key,
                "ROOT_SECRET_ACCESS_KEY": self.secret_key}

    def start(self) -> None:
        if self.proc is not None and self.proc.alive():
            return
        self.proc = self.spawn("versitygw", self.argv(), self.env())
        wait_until(f"S3 gateway on {self.endpoint}", self._answers, 30, [self.proc])

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def _answers(self) -> bool:
        # An unsigned request is refused (403) once the gateway serves: any HTTP answer will do.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            opener.open(self.endpoint + "/", timeout=2)
        except urllib.error.HTTPError:
            return True
        return True

    def make_bucket(self, name: str) -> str:
        """A bucket. The posix backend keeps each bucket as a top-level directory of its
        root, and in single-account mode (no IAM service) serves one made there as the root
        account's: no S3 client here (boto3 cannot live beside kubernetes 37, which pins
        python-dateutil 4, and obstore creates no buckets)."""
        (self.root / name).mkdir(exist_ok=True)
        return name


def start_s3_server(host: str, workdir: Path, spawn: Spawn) -> S3Server:
    """Start the gateway on ``host`` (a free port) serving ``workdir/data``;
    ``spawn(name, argv, env)`` is the caller's (its processes stop with it)."""
    root = workdir / "data"
    root.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    server = S3Server(host, port, root, access_key="grpo" + secrets.token_hex(6),
                      secret_key=secrets.token_urlsafe(24), spawn=spawn)
    server.start()
    log.info("S3 gateway on %s, data %s", server.endpoint, root)
    return server


def standalone_s3_server(workdir: Path, host: str = "127.0.0.1") -> S3Server:
    """The gateway outside a testbed (the trainer tier, the benchmarks), its log under
    ``workdir/logs``; the caller ends it with ``stop()``."""
    return start_s3_server(host, workdir,
                           lambda name, argv, env: spawn(name, argv, workdir / "logs", env))
