"""Kubeconfigs for tests and benches that run an operator's part without a cluster."""

from __future__ import annotations

import json
import socket
from pathlib import Path


def unreachable_kubeconfig(directory: Path) -> Path:
    """A kubeconfig in ``directory`` whose API server is a loopback port nothing listens
    on: every call is refused at once (the admission review then checks the spec alone)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = directory / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}",
                                               "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    return path
