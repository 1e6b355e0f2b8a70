"""An OCI image registry inside the testbed: CNCF distribution (``cmd/registry``, pinned in
versions.py), so the path a platform team takes ("build the images, push them to your
registry, install the chart with that registry") runs for real: podman pushes to it on
the host and the real node's containerd pulls from it.

Where it listens: containerd runs in the node's network namespace (node/network.py), where
127.0.0.1 is the node's own loopback, not the host's. So with a real node the registry
listens where the API server does, on the host side of the node's veth
(``10.250.<i>.1``), which both the host (podman) and the node (containerd) reach; without
one, on 127.0.0.1. Never anywhere else: the testbed's servers listen only on loopback
and on the addresses of the namespaces it creates.

Plain HTTP (a throwaway store, on an address of the testbed's own): containerd is
told so by a hosts.toml per registry (node/config.py), podman by ``--tls-verify=false``.
Blobs live under the testbed's work dir (filesystem driver) and go with it, or, for the
quickstart walkthrough, in a store kept between runs (``kept_store``): podman remembers,
per registry ``host:port``, which compressed layers it already sent, so a push to the same
address over the same store sends only what changed (the 7.95 GB trainer image: see
docs/benchmarks.md, "The testbed's image registry").
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from .images import podman_env
from .processes import Managed, Spawn, free_ports, wait_until
from .versions import binary

log = logging.getLogger("grpo_testbed.registry")

# podman push's layer compression, by measurement (docs/benchmarks.md, "The testbed's
# image registry"): the operator image (344 MB), each push to a fresh registry, on this
# 2-core machine: at load 1.5, zstd 2.6-3.6 s and gzip 3.1-3.7 s (3 runs each); at load
# 3-6, zstd 3.8-5.1 s and gzip 5.1-6.1 s (after a first gzip push of 11 s). zstd was the
# faster of every pair and sends 84 MB to gzip's 101 MB, so zstd. The node's side barely
# differs: pulling and unpacking it all into an empty containerd store took 14.6-16.5 s
# (zstd) and 16.6 s (gzip), two runs each. No uncompressed push to time: podman 4.3 has
# no "none" format ("cannot find compressor") and buildah's --disable-compression still
# pushed gzip layers to the registry.
PUSH_COMPRESSION = "zstd"
PUSH_TIMEOUT_S = 900.0  # the 7 GB trainer image, gzip, on two busy cores
# A kept store is served on this port where it is free, so that podman's memory of what
# the registry holds (keyed by host:port) finds it again at the next run; elsewhere on a
# free port, which only costs the full push.
KEPT_STORE_PORT = 5055
# Past this a kept store is emptied before use: each rebuilt trainer image leaves its old
# layers behind (a few GB each), and nothing else collects them.
KEPT_STORE_LIMIT_BYTES = 20 << 30


class RegistryError(RuntimeError):
    pass


def registry_config(addr: str, root: Path) -> dict[str, Any]:
    """distribution's configuration (version 0.1) for the testbed: ``addr`` is
    ``host:port``, blobs go under ``root`` (filesystem driver)."""
    return {
        "version": 0.1,
        # Access log on (every request with the client's address: the e2e test reads
        # which blobs the node fetched); the rest at info.
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {
            "filesystem": {"rootdirectory": str(root)},
            # A throwaway store: no purge of stale uploads while a test runs.
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {
            "addr": addr,
            # Signs upload state between requests; one instance, so any value that is
            # fixed for its life (without it the registry logs a warning and makes one).
            "secret": os.urandom(16).hex(),
            "headers": {"X-Content-Type-Options": ["nosniff"]},
            # No `debug` section: no pprof or metrics server on another port.
        },
        # The filesystem is checked by every push anyway; the periodic check only logs.
        "health": {"storagedriver": {"enabled": False}},
    }


def registry_env() -> dict[str, str]:
    """The registry's environment: OpenTelemetry's default exporter would post traces to
    https://localhost:4318 (distribution's docs, "Disable traces export")."""
    return {**os.environ, "OTEL_TRACES_EXPORTER": "none"}


def repository(local_tag: str) -> str:
    """The repository path of a local image without its registry host and tag:
    ``localhost/grpo-operator/operator:0.1.0`` -> ``grpo-operator/operator``. The first
    component is a host when it holds a "." or ":" or is "localhost", the rule of
    Docker's and containerd's reference parsers."""
    name = local_tag.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return rest
    return name


def tag_of(local_tag: str) -> str:
    last = local_tag.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else "latest"


def push_argv(local_tag: str, destination: str, digestfile: Path,
              compression: str = PUSH_COMPRESSION) -> list[str]:
    """podman push of ``local_tag`` to ``destination`` (``host:port/path:tag``)."""
    return ["podman", "push", "--quiet",
            # Plain HTTP: podman tries HTTPS first and, with this, falls back to HTTP.
            "--tls-verify=false",
            "--compression-format", compression,
            "--digestfile", str(digestfile),
            local_tag, f"docker://{destination}"]


def push_image(local_tag: str, registry: str, compression: str = PUSH_COMPRESSION) -> str:
    """Push a local (podman) image to ``registry`` (``host:port``, e.g.
    ``Testbed.registry``) under its repository path and tag; returns the pushed
    reference by digest, ``<registry>/<path>@sha256:...``.

    ``compression`` applies to layers the registry lacks: podman 4.3 (no
    --force-compression) reuses a layer the registry already holds in another
    compression (seen: a gzip push after a zstd one to the same registry took 0.2 s and
    pushed the zstd manifest)."""
    repo = f"{registry}/{repository(local_tag)}"
    with tempfile.TemporaryDirectory(prefix="grpo-push-") as tmp:
        digestfile = Path(tmp) / "digest"
        argv = push_argv(local_tag, f"{repo}:{tag_of(local_tag)}", digestfile, compression)
        t0 = time.monotonic()
        try:
            done = subprocess.run(argv, env=podman_env(), capture_output=True, text=True,
                                  timeout=PUSH_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise RegistryError(
                f"podman push {local_tag} to {registry} took over {PUSH_TIMEOUT_S:.0f} s; "
                "is the machine swamped (see `uptime`)? Run it again when it is quieter"
            ) from exc
        if done.returncode != 0:
            hint = ("build it first: `grpo-testbed images`"
                    if "image not known" in done.stderr else
                    f"is the testbed that serves {registry} running (`Testbed.registry`)?")
            raise RegistryError(f"podman push {local_tag} to {registry} failed "
                                f"({done.returncode}): {done.stderr.strip()[-2000:]}\n{hint}")
        digest = digestfile.read_text().strip()
    log.info("pushed %s to %s@%s in %.1f s (%s)", local_tag, repo, digest,
             time.monotonic() - t0, compression)
    return f"{repo}@{digest}"


@dataclass
class Registry:
    """A running registry: ``address`` is ``host:port``, its process one of the
    testbed's (stopped with it)."""

    address: str
    root: Path
    proc: Managed
    # The kept store's lock (one registry serves it at a time), released by ``close``.
    lock: IO[bytes] | None = None

    def close(self) -> None:
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def get(self, path: str, accept: str = "") -> bytes:
        """A GET of the registry's API (``/v2/...``), as a client would send it."""
        req = urllib.request.Request(self.url + path,
                                     headers={"Accept": accept} if accept else {})
        # No proxy, whatever the environment says: the registry is on this machine.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=10) as resp:
            body: bytes = resp.read()
            return body

    def access_log(self) -> list[str]:
        """The registry's request lines so far, client address first (Apache's combined
        format); its own messages, in the same log, start with ``time=``."""
        return [line for line in self.proc.log_path.read_text(errors="replace").splitlines()
                if " /v2/" in line and not line.startswith("time=")]


def store_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def take_kept_store(root: Path) -> IO[bytes] | None:
    """Lock the kept store at ``root`` for this registry, emptied first if it has grown past
    ``KEPT_STORE_LIMIT_BYTES``; None when another registry is serving it."""
    root.mkdir(parents=True, exist_ok=True)
    lock = (root / ".lock").open("wb")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    data = root / "data"
    if data.is_dir() and store_bytes(data) > KEPT_STORE_LIMIT_BYTES:
        log.info("the kept registry store %s is over %d GiB: emptied", data,
                 KEPT_STORE_LIMIT_BYTES >> 30)
        shutil.rmtree(data)
    return lock


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def start_registry(host: str, workdir: Path, spawn: Spawn,
                   kept_store: Path | None = None) -> Registry:
    """Start the registry on ``host`` with its store under ``workdir``, or in
    ``kept_store`` (a directory kept between runs, on ``KEPT_STORE_PORT`` where that is
    free) when no other registry is serving it; ``spawn(name, argv, env)`` is the
    testbed's (its processes stop with it)."""
    lock = take_kept_store(kept_store) if kept_store is not None else None
    if lock is not None and not port_free(host, KEPT_STORE_PORT):
        lock.close()
        lock = None
    if lock is not None and kept_store is not None:
        port, root = KEPT_STORE_PORT, kept_store / "data"
    else:
        (port,) = free_ports(1)
        root = workdir / "data"
    with contextlib.ExitStack() as undo:  # the kept store's lock, unless the registry is up
        if lock is not None:
            undo.callback(lock.close)
        workdir.mkdir(parents=True, exist_ok=True)
        address = f"{host}:{port}"
        root.mkdir(parents=True, exist_ok=True)
        config = workdir / "config.yml"
        config.write_text(yaml.safe_dump(registry_config(address, root)))
        config.chmod(0o600)  # it holds the upload-signing secret
        proc = spawn("registry", [str(binary("registry")), "serve", str(config)],
                     registry_env())
        reg = Registry(address, root, proc, lock)
        # /v2/ answers 200 once the API is served (the distribution spec's version check).
        wait_until(f"registry on {address}", lambda: reg.get("/v2/") is not None, 30, [proc])
        undo.pop_all()
    log.info("registry on %s, store %s", address, root)
    return reg
