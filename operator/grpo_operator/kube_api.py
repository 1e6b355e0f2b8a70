"""The operator's own Kubernetes REST client: JSON in, JSON out, over one urllib3 pool.

Why not the official client: Kopf talks to the API server with its own aiohttp client,
and ours made a handful of calls per reconcile, yet importing the official package cost
about 26 MiB of the operator's RSS (its hundreds of model classes) and each call went
through pydantic's call validation and model (de)serialization: 11% of the operator's
Python CPU at 200 new jobs, under the GIL the webhooks wait for (docs/benchmarks.md,
"The scale curve"). What this needs is small: credentials from a kubeconfig or the pod's
service account, and GET/POST/PATCH/DELETE of JSON.

Credentials: the kubeconfig's current context (a CA, a client certificate and key, or a
bearer token or token file; inline ``*-data`` fields are written once to a private
directory, as ssl loads certificates from files), else in-cluster (the service
account's token, re-read every minute: projected tokens rotate). An ``exec`` or
``auth-provider`` user is refused with the field named: the operator runs in-cluster,
and a kubeconfig for it needs a certificate or a token.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import shutil
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import urllib3
import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0
# A pool per client: Kopf's handlers run on 32 threads, the webhooks on 16 more.
POOL_SIZE = 48
CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 10.0, 30.0
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"  # custom resources take no other object patch
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"  # built-in kinds


class ApiError(Exception):
    """The API server answered with an error status: ``status``, ``reason`` and its
    ``body`` (a Status object's JSON, whose ``message`` says why)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason, self.body = status, reason, body


# What a request raises when the API server cannot be reached at all (refused, timed out,
# TLS failed), after urllib3's retries.
Unreachable = urllib3.exceptions.HTTPError


class ConfigError(ValueError):
    """No usable credentials; the message names the file and field."""


@dataclass(frozen=True)
class Credentials:
    """How to reach and authenticate to the API server (also handed to Kopf's login)."""

    server: str  # https://host:port[/prefix]
    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    token: str | None = None
    token_path: str | None = None  # re-read: a service account's projected token rotates
    insecure: bool = False

    def current_token(self) -> str | None:
        """The bearer token as of now: the token file's contents, else the static token."""
        if self.token_path is None:
            return self.token
        return Path(self.token_path).read_text().strip()


def load_credentials(kubeconfig: str | None = None) -> Credentials:
    """``kubeconfig`` (or $KUBECONFIG) when given, else the pod's service account, else
    ~/.kube/config. A kubeconfig named on purpose wins over the service account (the
    official client's in-cluster-first order ignored a --kubeconfig given in a pod)."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        return from_kubeconfig(Path(path.split(os.pathsep)[0]))
    if in_cluster_available():
        return in_cluster()
    default = Path.home() / ".kube" / "config"
    if default.exists():
        return from_kubeconfig(default)
    raise ConfigError("no Kubernetes credentials: not in a pod with a service account, no "
                      "--kubeconfig, $KUBECONFIG or ~/.kube/config")


def in_cluster_available() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (
        SERVICE_ACCOUNT / "token").exists()


def in_cluster() -> Credentials:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get(
        "KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return Credentials(server=f"https://{host}:{port}", ca_path=str(SERVICE_ACCOUNT / "ca.crt"),
                       token_path=str(SERVICE_ACCOUNT / "token"))


def from_kubeconfig(path: Path) -> Credentials:
    """The current context's cluster and user in the kubeconfig at ``path``."""
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"kubeconfig {path}: cannot read it ({exc})") from None
    name = doc.get("current-context")
    context = _named(doc, "contexts", name, path).get("context") or {}
    cluster = _named(doc, "clusters", context.get("cluster"), path).get("cluster") or {}
    user = _named(doc, "users", context.get("user"), path).get("user") or {}
    for unsupported in ("exec", "auth-provider"):
        if unsupported in user:
            raise ConfigError(
                f"kubeconfig {path}: users[{context.get('user')}].user.{unsupported} is not "
                "supported by the operator's client; give it a user with a client "
                "certificate or a token (in a cluster it uses its service account)")
    if not cluster.get("server"):
        raise ConfigError(f"kubeconfig {path}: clusters[{context.get('cluster')}] has no "
                          "server")
    base = path.parent
    token_file = user.get("tokenFile")
    return Credentials(
        server=str(cluster["server"]),
        ca_path=_file(base, cluster, "certificate-authority"),
        cert_path=_file(base, user, "client-certificate"),
        key_path=_file(base, user, "client-key"),
        token=user.get("token"),
        token_path=str(base / token_file) if token_file else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
    )


def _named(doc: dict[str, Any], section: str, name: Any, path: Path) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if entry.get("name") == name:
            return dict(entry)
    raise ConfigError(f"kubeconfig {path}: no {section} entry named {name!r} "
                      "(current-context names it)")


_data_dir: Path | None = None
_data_lock = threading.Lock()


def _file(base: Path, section: dict[str, Any], field: str) -> str | None:
    """The path of ``field``, relative to the kubeconfig's folder, or its inline
    ``field-data`` written to a private file (ssl reads certificates from files)."""
    if section.get(field):
        return str(base / str(section[field]))
    data = section.get(f"{field}-data")
    if not data:
        return None
    global _data_dir
    with _data_lock:
        if _data_dir is None:
            _data_dir = Path(tempfile.mkdtemp(prefix="grpo-operator-kube-"))
            # A client key must not outlive the process (a SIGKILL still leaves it: 0600).
            atexit.register(shutil.rmtree, _data_dir, True)
        target = _data_dir / field
        target.write_bytes(base64.b64decode(data))
        target.chmod(0o600)
    return str(target)


class KubeClient:
    """JSON requests to one API server; thread-safe (one connection pool)."""

    def __init__(self, creds: Credentials, pool_size: int = POOL_SIZE) -> None:
        self.creds = creds
        url = urlsplit(creds.server)
        if url.scheme != "https" or not url.hostname:
            raise ConfigError(f"the API server {creds.server!r} is not an https:// URL")
        self._prefix = url.path.rstrip("/")
        context = ssl.create_default_context(cafile=creds.ca_path)
        if creds.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if creds.cert_path and creds.key_path:
            context.load_cert_chain(creds.cert_path, creds.key_path)
        self._pool = urllib3.HTTPSConnectionPool(
            url.hostname, url.port or 443, maxsize=pool_size, block=False,
            ssl_context=context, retries=False,
            timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S))
        self._token: tuple[str | None, float] = (creds.token, 0.0)
        self._token_lock = threading.Lock()

    def bearer(self) -> str | None:
        """The token to send: the kubeconfig's, or the token file's, re-read a minute on."""
        if self.creds.token_path is None:
            return self.creds.token
        token, read_at = self._token
        if token is None or time.monotonic() - read_at > TOKEN_REREAD_SECONDS:
            with self._token_lock:
                token = self.creds.current_token()
                self._token = (token, time.monotonic())
        return token

    def request(self, method: str, path: str, body: Any = None,
                query: dict[str, str] | None = None, content_type: str = JSON,
                parse: bool = True) -> Any:
        """``method`` on ``path`` (``/api/v1/...``); the answer's JSON (None with
        ``parse=False``, for writes whose answer nobody reads). ApiError on an error
        status; Unreachable (urllib3's errors) when the server cannot be reached."""
        url = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": JSON}
        token = self.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        payload = None
        if body is not None:
            headers["Content-Type"] = content_type
            payload = json.dumps(body).encode()
        response = self._pool.urlopen(method, url, body=payload, headers=headers)
        data = response.data
        if response.status >= 400:
            raise ApiError(response.status, response.reason or "",
                           data.decode(errors="replace"))
        return json.loads(data) if parse and data else None
