"""The testbed's image registry, its pure parts: containerd's hosts.toml and config_path,
the registry's own configuration, and the references podman pushes to."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from grpo_testbed import registry
from grpo_testbed.node.config import NodePaths, containerd_toml, hosts_toml, write_registry_hosts
from grpo_testbed.registry import (
    push_argv,
    registry_config,
    registry_env,
    repository,
    tag_of,
    take_kept_store,
)
from grpo_testbed.versions import DISTRIBUTION_VERSION, binary, component

pytestmark = pytest.mark.unit

REGISTRY = "10.250.3.1:40123"


def test_hosts_toml_sends_the_node_to_the_registry_over_plain_http_to_pull_only() -> None:
    doc = tomllib.loads(hosts_toml(REGISTRY))
    assert doc["server"] == f"http://{REGISTRY}"
    assert doc["host"] == {f"http://{REGISTRY}": {"capabilities": ["pull", "resolve"]}}


@pytest.mark.parametrize("bad", ["http://10.250.3.1:5000", "10.250.3.1", "10.250.3.1:5000/x"])
def test_hosts_toml_wants_host_and_port_only(bad: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        hosts_toml(bad)


def test_each_registry_gets_a_directory_named_host_colon_port(tmp_path: Path) -> None:
    paths = NodePaths(tmp_path / "node", tmp_path / "store")
    write_registry_hosts(paths, (REGISTRY, "127.0.0.1:5000"))
    assert sorted(p.relative_to(paths.registry_hosts).as_posix()
                  for p in paths.registry_hosts.rglob("hosts.toml")) == [
        f"{REGISTRY}/hosts.toml", "127.0.0.1:5000/hosts.toml"]
    assert (paths.registry_hosts / REGISTRY / "hosts.toml").read_text() == hosts_toml(REGISTRY)


def test_containerd_reads_registries_from_the_nodes_own_directory_only(tmp_path: Path) -> None:
    """config_path is always set: unset, containerd would read the machine's certs.d."""
    paths = NodePaths(tmp_path / "node", tmp_path / "store")
    doc = tomllib.loads(containerd_toml(paths, "localhost/grpo-sandbox:1"))
    images = doc["plugins"]["io.containerd.cri.v1.images"]
    assert images["registry"] == {"config_path": str(paths.registry_hosts)}
    assert images["pinned_images"]["sandbox"] == "localhost/grpo-sandbox:1"


def test_the_registry_serves_plain_http_on_its_address_from_the_testbeds_store(
        tmp_path: Path) -> None:
    cfg = registry_config(REGISTRY, tmp_path / "data")
    assert cfg["version"] == 0.1
    assert cfg["http"]["addr"] == REGISTRY
    assert "tls" not in cfg["http"] and "debug" not in cfg["http"]  # no second port
    assert cfg["storage"]["filesystem"] == {"rootdirectory": str(tmp_path / "data")}
    assert set(cfg["storage"]) == {"filesystem", "maintenance"}  # one driver
    assert cfg["log"]["accesslog"] == {"disabled": False}  # the e2e test reads it
    assert len(cfg["http"]["secret"]) == 32
    assert yaml.safe_load(yaml.safe_dump(cfg)) == cfg
    assert registry_env()["OTEL_TRACES_EXPORTER"] == "none"  # no traces to localhost:4318


@pytest.mark.parametrize(("ref", "repo", "tag"), [
    ("localhost/grpo-operator/operator:0.1.0", "grpo-operator/operator", "0.1.0"),
    ("localhost/grpo-operator/trainer:0.1.0-cpu", "grpo-operator/trainer", "0.1.0-cpu"),
    ("10.250.0.1:5000/grpo-operator/operator:1", "grpo-operator/operator", "1"),
    ("localhost:5000/operator", "operator", "latest"),
    ("ghcr.io/grpo-operator/operator@sha256:" + "0" * 64, "grpo-operator/operator", "latest"),
    ("grpo-operator/operator:2", "grpo-operator/operator", "2"),  # no host: kept whole
])
def test_a_local_image_keeps_its_path_and_tag_in_the_registry(ref: str, repo: str,
                                                             tag: str) -> None:
    assert repository(ref) == repo
    assert tag_of(ref) == tag


def test_podman_pushes_over_plain_http_and_writes_the_digest(tmp_path: Path) -> None:
    argv = push_argv("localhost/grpo-operator/operator:0.1.0",
                     f"{REGISTRY}/grpo-operator/operator:0.1.0", tmp_path / "d", "zstd")
    assert argv[:2] == ["podman", "push"]
    assert "--tls-verify=false" in argv
    assert argv[argv.index("--compression-format") + 1] == "zstd"
    assert argv[argv.index("--digestfile") + 1] == str(tmp_path / "d")
    assert argv[-2:] == ["localhost/grpo-operator/operator:0.1.0",
                         f"docker://{REGISTRY}/grpo-operator/operator:0.1.0"]


def test_the_registry_is_a_pinned_component_stamped_with_its_version() -> None:
    c = component("registry")
    assert c.module == "github.com/distribution/distribution/v3"
    assert c.version == DISTRIBUTION_VERSION
    assert c.packages == ("github.com/distribution/distribution/v3/cmd/registry",)
    assert any(f"version.version={DISTRIBUTION_VERSION}" in flag for flag in c.ldflags)
    assert binary("registry").parent.name == f"registry-{DISTRIBUTION_VERSION}"


def test_a_kept_store_is_served_by_one_registry_at_a_time(tmp_path: Path) -> None:
    first = take_kept_store(tmp_path / "kept")
    assert first is not None
    # A second testbed meanwhile gets None: it serves a store of its own.
    assert take_kept_store(tmp_path / "kept") is None
    first.close()
    again = take_kept_store(tmp_path / "kept")
    assert again is not None
    again.close()


def test_a_kept_store_past_its_limit_is_emptied_and_one_within_it_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = tmp_path / "kept" / "data" / "docker" / "registry" / "v2" / "blobs" / "x" / "data"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"x" * 2048)
    monkeypatch.setattr(registry, "KEPT_STORE_LIMIT_BYTES", 4096)
    lock = take_kept_store(tmp_path / "kept")
    assert lock is not None and blob.exists()
    lock.close()
    monkeypatch.setattr(registry, "KEPT_STORE_LIMIT_BYTES", 1024)
    lock = take_kept_store(tmp_path / "kept")
    assert lock is not None and not blob.exists()
    lock.close()
