"""Which transport NCCL chose, read from its own log lines (pure).

NCCL says which network it uses only in its log: at INFO, in the INIT and NET
subsystems (``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET``). A rank of the first attempt
runs with those and ``NCCL_DEBUG_FILE`` (rank_env.py), reads its file after its first
NCCL collective and hands ``parse_transport``'s verdict to the driver, which reports it
in ``status.progress.transport``; the operator turns a fabric job that got sockets into
the FabricFallback condition. The formats, from NCCL's sources (2.2x: ``init.cc``,
``net.cc``, ``transport.cc``, ``transport/net_ib.cc``, ``transport/net_socket.cc``,
``debug.cc``) and aws-ofi-nccl's, every line prefixed ``<host>:<pid>:<tid> [<dev>] NCCL
INFO`` (or ``WARN``):

    Using network IB | Using network Socket | Using network AWS Libfabric (Libfabric)
    NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>
    NET/IB : No device found.          NET/Socket : Using [0]eth0:10.0.0.1<0>
    NET/Plugin : No plugin found (libnccl-net.so).
    NET/OFI Selected Provider is efa (found 32 nics)
    Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA
    Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read       ... via SHM/direct/direct
    NVLS multicast support is available on dev 0 (NVLS_NCHANNELS 16)
    Connected NVLS tree                 Error: network IB not found.   (WARN)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# The part after "NCCL INFO " / "NCCL WARN " of a line NCCL wrote.
_LINE = re.compile(r"\bNCCL (INFO|WARN) (.*)$")
_USING_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_CHANNEL_VIA = re.compile(r"^Channel \d+/\d+ : .* via (\S+(?: Libfabric)?\S*)")
_OFI_PROVIDER = re.compile(r"^NET/OFI Selected [Pp]rovider is (\S+)")
# Lines that say why a network was not taken (the cause of a fallback).
_CAUSES = (
    "No device found", "Failed to open libibverbs", "libibverbs", "NET/Plugin",
    "No plugin found", "Could not find", "network ", "Unable to", "fi_getinfo",
)
# NCCL's name of a network, as its transport: sockets, or a fabric.
SOCKET = "Socket"
IB = "IB"
EFA = "EFA"
OFI = "OFI"  # libfabric with a provider other than efa (Slingshot's cxi, ...)


def network_of(name: str, provider: str | None = None) -> str:
    """NCCL's network name (``Using network X``, ``via NET/X/...``) as a transport."""
    key = name.strip().lower()
    if key == "socket":
        return SOCKET
    if key in ("ib", "ibext") or key.startswith("ibext"):
        return IB
    if "libfabric" in key or key == "ofi":
        return EFA if provider in (None, "efa") else f"{OFI}/{provider}"
    return name.strip()


@dataclass(frozen=True)
class Transport:
    """What one process's NCCL log says about the networks it uses."""

    network: str | None  # between nodes: IB, EFA, Socket, ... (None: no NET line seen)
    intra_node: tuple[str, ...] = ()  # NVLS, P2P/CUMEM, P2P/IPC, SHM, ... seen in use
    inter_node: bool = False  # a channel ran over the network (a peer on another node)
    causes: tuple[str, ...] = ()  # why a network was not taken, in NCCL's words
    lines: tuple[str, ...] = field(default=(), compare=False)  # the INIT/NET lines read

    def to_dict(self) -> dict[str, object]:
        return {"network": self.network, "intraNode": list(self.intra_node),
                "interNode": self.inter_node, "causes": list(self.causes)}


def nccl_messages(lines: Iterable[str]) -> list[tuple[str, str]]:
    """(level, message) of every NCCL line among ``lines`` (other text is skipped)."""
    out = []
    for line in lines:
        m = _LINE.search(line.rstrip("\n"))
        if m:
            out.append((m.group(1), m.group(2).strip()))
    return out


def _intra(kind: str) -> str | None:
    """A channel's transport inside a node, e.g. P2P/CUMEM/read -> P2P/CUMEM."""
    parts = kind.split("/")
    if parts[0] in ("P2P", "SHM"):
        return "/".join(parts[:2]) if parts[0] == "P2P" and len(parts) > 1 else parts[0]
    return None


def parse_transport(lines: Iterable[str]) -> Transport:
    """The networks one process's NCCL log shows: the network of its channels to other
    nodes when there are any (what the data really crossed), else the one NCCL chose at
    init; the transports inside the node; and why a network was passed over."""
    msgs = nccl_messages(lines)
    provider = next((m.group(1) for _, t in msgs if (m := _OFI_PROVIDER.match(t))), None)
    chosen: str | None = None
    via_net: str | None = None
    intra: list[str] = []
    causes: list[str] = []
    kept: list[str] = []
    for level, text in msgs:
        kept.append(f"NCCL {level} {text}")
        if m := _USING_NETWORK.match(text):
            chosen = network_of(m.group(1), provider)
        elif m := _CHANNEL_VIA.match(text):
            kind = m.group(1)
            if kind.startswith("NET/"):
                name = kind.removeprefix("NET/").split("/")[0]
                net = network_of(name, provider)
                # The worst wins: one channel over sockets makes the collective slow.
                via_net = net if via_net in (None, net) or net == SOCKET else via_net
            elif (t := _intra(kind)) and t not in intra:
                intra.append(t)
        elif ("Connected NVLS" in text or text.startswith("NVLS comm")) and "NVLS" not in intra:
            intra.append("NVLS")
        if (level == "WARN" or any(c in text for c in _CAUSES)) and text not in causes \
                and not text.startswith(("Using network", "NET/Socket : Using")):
            causes.append(text)
    return Transport(via_net or chosen, tuple(intra), via_net is not None, tuple(causes),
                     tuple(kept))


def combine(reports: Iterable[Transport]) -> Transport:
    """Every rank's transport as one: sockets if any rank crossed nodes over sockets
    (the slowest link sets a collective's pace), the inter-node network otherwise, the
    union of the transports inside nodes and of the causes."""
    items = list(reports)
    crossing = [r for r in items if r.inter_node]
    nets = [r.network for r in (crossing or items) if r.network]
    network = SOCKET if SOCKET in nets else (nets[0] if nets else None)
    intra = tuple(dict.fromkeys(t for r in items for t in r.intra_node))
    causes = tuple(dict.fromkeys(c for r in items for c in r.causes))
    return Transport(network, intra, bool(crossing), causes)


def summary(t: Transport) -> str:
    """One line for the log and the status message."""
    where = "between nodes" if t.inter_node else "(no peer on another node)"
    inside = f"; inside a node {', '.join(t.intra_node)}" if t.intra_node else ""
    why = f"; NCCL said: {' | '.join(t.causes[:4])}" if t.causes else ""
    return f"NCCL network {t.network or 'unknown'} {where}{inside}{why}"
