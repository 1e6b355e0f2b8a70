"""Kopf's credentials come from the same config as the operator's client."""

from __future__ import annotations

import kopf
import pytest
from kubernetes import client

from grpo_operator import kube, main


@pytest.mark.parametrize("stored", ["bearer tok-123", "Bearer tok-123", "tok-123"])
def test_login_hands_kopf_the_bare_token(monkeypatch: pytest.MonkeyPatch, stored: str) -> None:
    """In a pod the client keeps "bearer <token>" (lower case): Kopf must not get that
    prefix too, or every request is 401 and the operator exits at startup."""
    cfg = client.Configuration()
    cfg.host = "https://10.0.0.1:443"
    cfg.api_key = {"BearerToken": stored}
    monkeypatch.setattr(kube, "load_config", lambda kubeconfig=None: None)
    monkeypatch.setattr(client.Configuration, "get_default_copy", staticmethod(lambda: cfg))
    info = main.operator_login(memo=kopf.Memo())
    assert (info.scheme, info.token, info.server) == ("Bearer", "tok-123", cfg.host)
