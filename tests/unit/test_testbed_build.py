"""The throwaway-module recipe that makes k8s.io/kubernetes buildable."""

from __future__ import annotations

from grpo_testbed.build import replace_lines
from grpo_testbed.versions import K8S_STAGING_VERSION, KUBERNETES_VERSION

UPSTREAM = """module k8s.io/kubernetes

require (
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go // keep in step
\tgithub.com/foo/bar v1.2.0 => github.com/fork/bar v1.2.1
)

replace go.etcd.io/etcd/api/v3 => ../api
"""


def test_staging_replaces_become_published_versions_and_local_ones_drop() -> None:
    assert replace_lines(UPSTREAM, "v0.36.3") == [
        "k8s.io/api => k8s.io/api v0.36.3",
        "k8s.io/client-go => k8s.io/client-go v0.36.3",
        "github.com/foo/bar v1.2.0 => github.com/fork/bar v1.2.1",
    ]


def test_without_staging_version_local_replaces_are_dropped() -> None:
    assert replace_lines(UPSTREAM, None) == [
        "github.com/foo/bar v1.2.0 => github.com/fork/bar v1.2.1"
    ]


def test_staging_version_follows_the_kubernetes_pin() -> None:
    major_minor_patch = KUBERNETES_VERSION.lstrip("v").split(".")
    assert f"v0.{major_minor_patch[1]}.{major_minor_patch[2]}" == K8S_STAGING_VERSION
