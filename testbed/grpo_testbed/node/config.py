"""The real node's configuration files, rendered from its network and paths (pure).

Each setting that differs from a stock node says why: most come from this machine's
sandbox (cgroup v1, no raising of resource limits, no lowering of oom_score_adj, no
registry) and were found by trying.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .network import NodeNetwork

CLUSTER_DOMAIN = "cluster.local"
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")  # Debian's containernetworking-plugins
RUNC = "/usr/sbin/runc"
KUBELET_PORT = 10250


@dataclass(frozen=True)
class NodePaths:
    root: Path  # this node's files (removed with the testbed)
    store: Path  # containerd's image store: kept across runs when it can be (see store.py)

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def running_tasks(self) -> Path:
        """One entry per container that containerd runs for the kubelet (by its id)."""
        return self.containerd_state / "io.containerd.runtime.v2.task" / "k8s.io"

    @property
    def registry_hosts(self) -> Path:
        """containerd's registry ``config_path``: ``<host:port>/hosts.toml`` per registry."""
        return self.root / "certs.d"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def resolv_conf(self) -> Path:
        return self.root / "resolv.conf"

    @property
    def corefile(self) -> Path:
        return self.root / "Corefile"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy.yaml"


def containerd_toml(paths: NodePaths, sandbox_image: str) -> str:
    """containerd 2 (config version 3) with the CRI plugin, state under ``paths``."""
    c = paths.root / "containerd"
    bins = ", ".join(f"'{d}'" for d in CNI_BIN_DIRS)
    return f"""version = 3
root = '{paths.store}'
state = '{paths.containerd_state}'

[grpc]
  address = '{paths.containerd_socket}'

[ttrpc]
  address = '{c / "containerd.sock.ttrpc"}'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    # No registry outside the testbed is reachable: pods name images imported with
    # `ctr images import`, or pushed to the testbed's own registry (registry.py).
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{sandbox_image}'
    # One hosts.toml per registry (:func:`hosts_toml`). Set even with none: unset,
    # containerd reads the machine's /etc/containerd/certs.d and /etc/docker/certs.d.
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '{paths.registry_hosts}'

  [plugins.'io.containerd.cri.v1.runtime']
    # The sandbox refuses lowering oom_score_adj; without this runc fails with
    # "can't get final child's PID from pipe: EOF".
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    enable_cdi = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '{RUNC}'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [{bins}]
      conf_dir = '{paths.cni_conf_dir}'

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
"""


def hosts_toml(registry: str) -> str:
    """containerd's hosts.toml for a plain-HTTP registry at ``registry`` (``host:port``),
    written to ``<config_path>/<host:port>/hosts.toml`` (containerd v2.2.0 docs/hosts.md).

    Without it containerd speaks HTTPS to any host but localhost (the testbed's registry
    is on the node's veth, not on the node's loopback) and the pull fails with "http:
    server gave HTTP response to HTTPS client". The ``[host]`` entry is tried first and
    may only pull and resolve: the node never pushes. containerd appends ``server`` as a
    last host with every capability, the same registry: a tag it does not have is asked
    for twice, and both answer "not found".
    """
    if "/" in registry or "://" in registry or ":" not in registry:
        raise ValueError(f"a registry is host:port, e.g. 10.250.0.1:5000; got {registry!r}")
    url = f"http://{registry}"
    return f"""server = "{url}"

[host."{url}"]
  capabilities = ["pull", "resolve"]
"""


def write_registry_hosts(paths: NodePaths, registries: tuple[str, ...]) -> None:
    """A hosts.toml per registry under containerd's ``config_path``. containerd reads them
    at each pull (no restart): a registry started after the node can be added."""
    paths.registry_hosts.mkdir(parents=True, exist_ok=True)
    for registry in registries:
        d = paths.registry_hosts / registry  # "host:port" is a valid directory name on Unix
        d.mkdir(exist_ok=True)
        (d / "hosts.toml").write_text(hosts_toml(registry))


def cni_conflist(net: NodeNetwork) -> dict[str, Any]:
    """A bridge inside the node's namespace; the bridge is the pods' gateway, and nothing
    is masqueraded (pod traffic never leaves the testbed's namespaces)."""
    return {
        "cniVersion": "1.0.0",
        "name": "grpo-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": net.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": "",  # filled by :func:`write_node_config`
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


@dataclass(frozen=True)
class Allocatable:
    """What the node keeps back from the machine (the scheduler sees the rest)."""

    # No CPU kept back: on a 2-core machine a Ray head (1 CPU) and one worker (1 CPU)
    # must fit side by side, as on two real nodes.
    system_reserved_cpu: str = "0"
    system_reserved_memory: str = "1Gi"
    max_pods: int = 16


def kubelet_config(net: NodeNetwork, paths: NodePaths, ca_cert: Path,
                   healthz_port: int, alloc: Allocatable) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": net.node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "podLogsDir": str(paths.pod_logs),
        # cgroup v1 and no systemd here.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        # The API server authenticates with the testbed's admin client certificate.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDNS": [net.node_ip],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(paths.resolv_conf),  # not the host's: pods resolve cluster names only
        "systemReserved": {"cpu": alloc.system_reserved_cpu,
                           "memory": alloc.system_reserved_memory},
        "maxPods": alloc.max_pods,
        # A shared development disk is often fuller than a node's: evict on memory only.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "registerNode": True,
        "nodeStatusReportFrequency": "10s",
        "shutdownGracePeriod": "0s",
    }


def corefile(net: NodeNetwork, kubeconfig: Path) -> str:
    """CoreDNS on the node's address: cluster names from the API server, nothing else
    (no upstream: the machine's resolvers are outside the testbed's namespaces)."""
    return f""".:53 {{
    bind {net.node_ip}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""


def kube_proxy_config(net: NodeNetwork, kubeconfig: Path, node_name: str,
                      ports: tuple[int, int]) -> dict[str, Any]:
    healthz, metrics = ports
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "bindAddress": net.node_ip,
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        "metricsBindAddress": f"127.0.0.1:{metrics}",
        "clusterCIDR": net.pod_cidr,
        # Pods on one bridge reaching each other through a Service: masquerading makes the
        # reply come back through the node's netfilter, bridge-netfilter or not.
        "iptables": {"masqueradeAll": True},
        # nf_conntrack_max is global (read-only from a namespace): leave it alone.
        "conntrack": {"maxPerCore": 0, "min": 0},
    }


def write_node_config(net: NodeNetwork, paths: NodePaths, *, ca_cert: Path,
                      kubeconfig: Path, node_name: str, sandbox_image: str,
                      ports: tuple[int, int, int], alloc: Allocatable,
                      registries: tuple[str, ...] = ()) -> None:
    """Every file the node's programs read."""
    for d in (paths.cni_conf_dir, paths.kubelet_root, paths.pod_logs,
              paths.containerd_socket.parent):
        d.mkdir(parents=True, exist_ok=True)
    paths.containerd_config.write_text(containerd_toml(paths, sandbox_image))
    write_registry_hosts(paths, registries)
    cni = cni_conflist(net)
    cni["plugins"][0]["ipam"]["dataDir"] = str(paths.root / "cni" / "ipam")
    (paths.cni_conf_dir / "10-grpo-pods.conflist").write_text(json.dumps(cni, indent=1))
    kubelet_healthz, proxy_healthz, proxy_metrics = ports
    paths.kubelet_config.write_text(yaml.safe_dump(
        kubelet_config(net, paths, ca_cert, kubelet_healthz, alloc)))
    paths.resolv_conf.write_text("")  # kubelet adds the cluster DNS server and search list
    paths.corefile.write_text(corefile(net, kubeconfig))
    paths.kube_proxy_config.write_text(yaml.safe_dump(
        kube_proxy_config(net, kubeconfig, node_name, (proxy_healthz, proxy_metrics))))
