"""The real node's network, kept inside namespaces the testbed creates.

Traffic rule of the machines this runs on: pod addresses live only inside network
namespaces the testbed creates, and nothing is sent to an address outside them and the
loopback range. So:

- the node is a network namespace (``grpo-node-<i>``) joined to the host by one veth
  pair on a /30: ``10.250.<i>.1`` on the host side, where only the testbed's own servers
  (the API server, a locally run operator's webhook) listen, and ``10.250.<i>.2`` as the
  node's InternalIP, where the API server reaches the kubelet (logs, exec);
- the CNI bridge and every pod's namespace sit behind the node namespace
  (``10.245.<i>.0/24``), which forwards between pods and the host side of the veth;
- the node namespace has no default route, and the host routes only the pod range to
  the node: no path leads anywhere else.

Only ``ip`` is used (iproute2); everything is undone by :meth:`NodeNetwork.delete`.
A namespace whose owner process has died (a SIGKILLed test run) is removed the next
time a node network is created.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("grpo_testbed.node")

PREFIX = "grpo-node-"
MAX_NODES = 32  # concurrently running testbeds with a real node, on one machine
OWNERS = Path("/run/grpo-testbed")


@dataclass(frozen=True)
class NodeNetwork:
    """The addresses of one real node (index ``i``); pure, see :func:`plan`."""

    index: int

    @property
    def netns(self) -> str:
        return f"{PREFIX}{self.index}"

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"

    @property
    def host_if(self) -> str:
        return f"grpoh{self.index}"

    @property
    def node_if(self) -> str:
        return "eth0"

    @property
    def host_ip(self) -> str:
        """The host side of the veth: where the testbed's servers listen for the node."""
        return f"10.250.{self.index}.1"

    @property
    def node_ip(self) -> str:
        """The node's InternalIP (kubelet, kube-proxy, the cluster DNS server)."""
        return f"10.250.{self.index}.2"

    @property
    def pod_cidr(self) -> str:
        return f"10.245.{self.index}.0/24"

    @property
    def bridge(self) -> str:
        return "cni0"

    def nsenter(self) -> list[str]:
        """argv prefix that runs a program in the node's network namespace only: the
        kubelet, containerd and runc must share the host's mount namespace (volume mounts),
        which ``ip netns exec`` would not."""
        return ["nsenter", f"--net={self.netns_path}", "--"]

    # ---- lifecycle -------------------------------------------------------------

    def create(self) -> None:
        owner = OWNERS / self.netns
        _ip("netns", "add", self.netns)  # fails if the index is taken: the caller retries
        try:
            OWNERS.mkdir(parents=True, exist_ok=True)
            owner.write_text(str(os.getpid()))
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.node_if,
                "netns", self.netns)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            n = ["-n", self.netns]
            _ip(*n, "link", "set", "lo", "up")
            _ip(*n, "addr", "add", f"{self.node_ip}/30", "dev", self.node_if)
            _ip(*n, "link", "set", self.node_if, "up")
            _ip("route", "add", self.pod_cidr, "via", self.node_ip, "dev", self.host_if)
            _run([*self.nsenter(), "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        except BaseException:
            self.delete()
            raise

    def delete(self) -> None:
        # The veth pair and the route go with the namespace; CNI's bridge lives inside it.
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)
        (OWNERS / self.netns).unlink(missing_ok=True)


def allocate() -> NodeNetwork:
    """Create the first free node network, after removing ones whose owner has died."""
    remove_orphans()
    last: Exception | None = None
    for i in range(MAX_NODES):
        net = NodeNetwork(i)
        if Path(net.netns_path).exists():
            continue
        try:
            net.create()
            log.info("node network %s: host %s, node %s, pods %s", net.netns, net.host_ip,
                     net.node_ip, net.pod_cidr)
            return net
        except subprocess.CalledProcessError as e:
            last = e
    raise RuntimeError(f"no free node network among {MAX_NODES} (last error: {last})")


def remove_orphans() -> None:
    if not OWNERS.is_dir():
        return
    for owner in OWNERS.glob(f"{PREFIX}*"):
        try:
            pid = int(owner.read_text())
        except ValueError:
            pid = 0
        if pid and Path(f"/proc/{pid}").exists():
            continue
        net = NodeNetwork(int(owner.name.removeprefix(PREFIX)))
        log.info("removing %s, left by process %d", net.netns, pid)
        net.delete()


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv, proc.stdout, proc.stderr)
