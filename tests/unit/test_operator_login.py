"""Kopf's credentials and the operator's client come from one place (kube_api.py): the
kubeconfig it is given, else the pod's service account."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import kopf
import pytest
import yaml

from grpo_operator import kube, main
from grpo_operator.kube_api import ConfigError, Credentials, from_kubeconfig, in_cluster

pytestmark = pytest.mark.unit


def _kubeconfig(path: Path, user: dict[str, object], cluster: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "other", "context": {"cluster": "x", "user": "x"}},
                     {"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443",
                                                 **cluster}}],
        "users": [{"name": "u", "user": user}],
    }))
    return path


def test_a_kubeconfig_with_files_relative_to_it(tmp_path: Path) -> None:
    creds = from_kubeconfig(_kubeconfig(
        tmp_path / "kc", {"client-certificate": "pki/admin.crt", "client-key": "/abs/admin.key"},
        {"certificate-authority": "pki/ca.crt"}))
    assert creds == Credentials("https://10.0.0.1:6443", ca_path=str(tmp_path / "pki/ca.crt"),
                                cert_path=str(tmp_path / "pki/admin.crt"),
                                key_path="/abs/admin.key")


def test_inline_data_is_written_to_private_files(tmp_path: Path) -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n"
    creds = from_kubeconfig(_kubeconfig(
        tmp_path / "kc", {"token": "tok"},
        {"certificate-authority-data": base64.b64encode(pem).decode()}))
    assert creds.token == "tok" and creds.ca_path is not None
    ca = Path(creds.ca_path)
    assert ca.read_bytes() == pem and ca.stat().st_mode & 0o777 == 0o600


def test_the_private_files_go_when_the_process_ends(tmp_path: Path) -> None:
    """A client key written from a kubeconfig's inline data does not stay in /tmp after
    the operator's process ends (as tests and benches end it: a normal exit)."""
    kc = _kubeconfig(tmp_path / "kc", {"client-key-data": base64.b64encode(b"key").decode(),
                                       "client-certificate-data": "Y2VydA=="}, {})
    code = ("import sys; from pathlib import Path; from grpo_operator.kube_api import "
            f"from_kubeconfig; c = from_kubeconfig(Path({str(kc)!r})); "
            "print(c.key_path); assert Path(c.key_path).read_bytes() == b'key'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    key = Path(proc.stdout.strip())
    assert key.name == "client-key" and not key.parent.exists()


@pytest.mark.parametrize("plugin", ["exec", "auth-provider"])
def test_a_credential_plugin_is_refused_naming_the_field(tmp_path: Path, plugin: str) -> None:
    path = _kubeconfig(tmp_path / "kc", {plugin: {"command": "aws"}}, {})
    with pytest.raises(ConfigError, match=rf"users\[u\]\.user\.{plugin} is not supported"):
        from_kubeconfig(path)


def test_in_cluster_reads_the_service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    creds = in_cluster()
    assert creds.server == "https://[fd00::1]:443"
    assert creds.token_path == "/var/run/secrets/kubernetes.io/serviceaccount/token"


def test_login_hands_kopf_the_token_file_as_read_now(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """A service account's token is a file that rotates: Kopf gets the bare token read at
    login (it logs in again when the API server refuses the old one)."""
    (tmp_path / "token").write_text("tok-123\n")
    creds = Credentials("https://10.0.0.1:443", ca_path="/ca.crt",
                        token_path=str(tmp_path / "token"))
    monkeypatch.setattr(kube, "load_config", lambda kubeconfig=None: creds)
    info = main.operator_login(memo=kopf.Memo())
    assert (info.scheme, info.token, info.server, info.ca_path) == (
        "Bearer", "tok-123", "https://10.0.0.1:443", "/ca.crt")


def test_the_operators_process_never_imports_the_official_client() -> None:
    """Kopf imports it (to log in through it) when it can: ~26 MiB for a client the
    operator does not use. `python -m grpo_operator --help` runs the process's start."""
    probe = ("import runpy, sys; sys.argv = ['grpo-operator', '--help']\n"
             "try:\n    runpy.run_module('grpo_operator', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('kopf' in sys.modules, sys.modules.get('kubernetes', 'absent'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.splitlines()[-1]
    assert out == "True None"
