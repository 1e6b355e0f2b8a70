"""Pinned versions of every testbed component: the one place they are named.

Each component is built from the Go module proxy with ``go build`` into
``~/.cache/grpo-operator/bin/<component>-<version>/`` and reused when present.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
# The issue asks for KubeRay v1.7.0, but the Go module proxy answers 403 for the
# ray-operator@v1.7.0 zip (as for v1.7.1 and v1.7.0-rc.0); v1.6.1 is the newest
# version it serves. See docs/testbed.md.
KUBERAY_VERSION = "v1.6.1"
HELM_VERSION = "v3.21.4"
# The real node (grpo_testbed.node): kubelet >= 1.36 needs containerd 2.x (Debian ships 1.6);
# runc and the CNI plugins are Debian's (hack/setup.sh installs them).
CONTAINERD_VERSION = "v2.2.0"
COREDNS_VERSION = "v1.14.7"
# The proxy serves kueue v0.16.1, v0.16.2 and v0.15.0-v0.15.2 (many others answer 403).
KUEUE_VERSION = "v0.16.2"
# The testbed's image registry (registry.py): CNCF distribution's `registry`. The proxy
# serves v3.0.0, v3.1.1 and v3.1.2.
DISTRIBUTION_VERSION = "v3.1.2"
# The Prometheus Operator's CRDs (PodMonitor, ServiceMonitor): the chart's monitors apply
# against their real schemas. The proxy serves v0.94.1 (v0.95.x and v0.90.0 answer 403).
PROMETHEUS_OPERATOR_VERSION = "v0.94.1"
# The testbed's S3 server (s3_server.py): Versity's S3 gateway over a POSIX directory, a
# server sites run in production (not a mock). Chosen over SeaweedFS for its build: 138 s
# cold on 2 cores against ~420 s (docs/benchmarks.md). The proxy serves v1.8.0.
VERSITYGW_VERSION = "v1.8.0"


@dataclass(frozen=True)
class Component:
    """One Go program (or set of programs from one module) the testbed needs."""

    name: str
    module: str
    version: str
    packages: tuple[str, ...]  # import paths of the main packages to build
    binaries: tuple[str, ...]  # output names, same order as packages
    ldflags: tuple[str, ...] = field(default=())
    # Upstream go.mod replaces local staging dirs; map them to published versions.
    staging_version: str | None = None
    # Data files kept beside the binaries, copied from the pinned module's source:
    # (glob inside the module, sub-directory of the bin dir).
    data: tuple[tuple[str, str], ...] = field(default=())
    tags: tuple[str, ...] = field(default=())  # go build -tags

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


def _k8s_ldflags() -> tuple[str, ...]:
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={KUBERNETES_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return tuple(flags)


K8S_STAGING_VERSION = "v0." + KUBERNETES_VERSION.lstrip("v").split(".", 1)[1]

COMPONENTS: tuple[Component, ...] = (
    Component(
        name="kubernetes",
        module="k8s.io/kubernetes",
        version=KUBERNETES_VERSION,
        packages=tuple(
            f"k8s.io/kubernetes/cmd/{c}"
            for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
        ),
        binaries=("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
        ldflags=_k8s_ldflags(),
        staging_version=K8S_STAGING_VERSION,
    ),
    Component(
        # Same module and version as above, its own directory: adding the node's programs
        # does not rebuild the control plane's.
        name="kubelet",
        module="k8s.io/kubernetes",
        version=KUBERNETES_VERSION,
        packages=("k8s.io/kubernetes/cmd/kubelet", "k8s.io/kubernetes/cmd/kube-proxy"),
        binaries=("kubelet", "kube-proxy"),
        ldflags=_k8s_ldflags(),
        staging_version=K8S_STAGING_VERSION,
    ),
    Component(
        name="containerd",
        module="github.com/containerd/containerd/v2",
        version=CONTAINERD_VERSION,
        packages=tuple(
            f"github.com/containerd/containerd/v2/cmd/{c}"
            for c in ("containerd", "containerd-shim-runc-v2", "ctr")
        ),
        binaries=("containerd", "containerd-shim-runc-v2", "ctr"),
        ldflags=(f"-X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}",),
        tags=("no_btrfs",),  # no btrfs headers needed; CGO is off
    ),
    Component(
        name="coredns",
        module="github.com/coredns/coredns",
        version=COREDNS_VERSION,
        packages=("github.com/coredns/coredns",),
        binaries=("coredns",),
    ),
    Component(
        name="kueue",
        module="sigs.k8s.io/kueue",
        version=KUEUE_VERSION,
        packages=("sigs.k8s.io/kueue/cmd/kueue",),
        binaries=("kueue",),
        data=(
            ("config/components/crd/bases/*.yaml", "crds"),
            ("config/components/webhook/manifests.yaml", "webhook"),
        ),
    ),
    Component(
        name="etcd",
        module="go.etcd.io/etcd/server/v3",
        version=ETCD_VERSION,
        packages=("go.etcd.io/etcd/server/v3",),
        binaries=("etcd",),
    ),
    Component(
        name="kwok",
        module="sigs.k8s.io/kwok",
        version=KWOK_VERSION,
        packages=("sigs.k8s.io/kwok/cmd/kwok",),
        binaries=("kwok",),
        ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION}",),
        # kwok's standalone binary loads no stages; these are upstream's own.
        data=(
            ("kustomize/stage/node/fast/node-initialize.yaml", "stages"),
            ("kustomize/stage/node/heartbeat/node-heartbeat.yaml", "stages"),
            ("kustomize/stage/pod/fast/pod-ready.yaml", "stages"),
            ("kustomize/stage/pod/fast/pod-complete.yaml", "stages"),
            ("kustomize/stage/pod/fast/pod-delete.yaml", "stages"),
            # PVC provisioning and binding, plus the default StorageClass that uses it.
            ("kustomize/stage/volume/fast/p*.yaml", "stages"),
            ("kustomize/stage/volume/fast/storage-class.yaml", "stages"),
        ),
    ),
    Component(
        name="kuberay",
        module="github.com/ray-project/kuberay/ray-operator",
        version=KUBERAY_VERSION,
        packages=("github.com/ray-project/kuberay/ray-operator",),
        binaries=("kuberay-operator",),
        data=(("config/crd/bases/*.yaml", "crds"),),
    ),
    Component(
        # cmd/registry as upstream ships it (every storage driver compiled in); the testbed
        # configures the filesystem driver only.
        name="registry",
        module="github.com/distribution/distribution/v3",
        version=DISTRIBUTION_VERSION,
        packages=("github.com/distribution/distribution/v3/cmd/registry",),
        binaries=("registry",),
        # Upstream's Makefile stamps the version the same way (else "v3.1.2+unknown").
        ldflags=("-X github.com/distribution/distribution/v3/version.version="
                 f"{DISTRIBUTION_VERSION}",),
    ),
    Component(
        # Data only: the two CRDs the chart's PodMonitor and ServiceMonitor need (the
        # operator itself, and Prometheus, are not run: docs/testbed.md).
        name="prometheus-crds",
        module="github.com/prometheus-operator/prometheus-operator",
        version=PROMETHEUS_OPERATOR_VERSION,
        packages=(),
        binaries=(),
        data=tuple((f"example/prometheus-operator-crd/monitoring.coreos.com_{kind}.yaml",
                    "crds") for kind in ("podmonitors", "servicemonitors")),
    ),
    Component(
        name="versitygw",
        module="github.com/versity/versitygw",
        version=VERSITYGW_VERSION,
        packages=("github.com/versity/versitygw/cmd/versitygw",),
        binaries=("versitygw",),
        # Upstream's Makefile stamps these (else it reports "Version git").
        ldflags=(f"-X main.Version={VERSITYGW_VERSION}", "-X main.Build=proxy"),
    ),
    Component(
        name="helm",
        module="helm.sh/helm/v3",
        version=HELM_VERSION,
        packages=("helm.sh/helm/v3/cmd/helm",),
        binaries=("helm",),
        ldflags=(f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",),
    ),
)


def cache_root() -> Path:
    """Root of the testbed cache; GRPO_TESTBED_CACHE overrides it."""
    env = os.environ.get("GRPO_TESTBED_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "grpo-operator"


def bin_dir(component: Component) -> Path:
    return cache_root() / "bin" / component.key


def component(name: str) -> Component:
    for c in COMPONENTS:
        if c.name == name:
            return c
    raise KeyError(name)


def binary(name: str) -> Path:
    """Path of a built binary by its output name, e.g. ``binary("kubectl")``."""
    for c in COMPONENTS:
        if name in c.binaries:
            return bin_dir(c) / name
    raise KeyError(name)
