"""The transport NCCL chose, read from its INIT/NET log lines (grpo_trainer.cluster.nccl_log).

The lines are NCCL's own formats (its sources: init.cc "Using network %s", net_ib.cc,
net_socket.cc, transport.cc's "Channel %02d/%1d : %d[%d] -> %d[%d] via %s"), as users
posted them from real runs: NVIDIA/nccl#226 and #676 (sockets), NVIDIA/nccl#952 and
aws-ofi-nccl#24 (IB, the OFI plugin's channels), NVIDIA/nccl#1597 (EFA on H200)."""

from __future__ import annotations

import pytest

from grpo_trainer.cluster.nccl_log import (
    EFA,
    IB,
    SOCKET,
    Transport,
    combine,
    parse_transport,
    summary,
)

pytestmark = pytest.mark.unit

SOCKETS = """\
ip-172-31-12-21:45361:45361 [0] NCCL INFO Bootstrap : Using ens3:172.31.12.21<0>
ip-172-31-12-21:45361:45361 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).
ip-172-31-12-21:45361:45361 [0] NCCL INFO NET/IB : No device found.
ip-172-31-12-21:45361:45361 [0] NCCL INFO NET/Socket : Using [0]ens3:172.31.12.21<0>
ip-172-31-12-21:45361:45361 [0] NCCL INFO Using network Socket
NCCL version 2.29.7+cuda13.0
ip-172-31-12-21:45361:45402 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
ip-172-31-12-21:45361:45402 [7] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/Socket/0
"""

INFINIBAND = """\
dgx-03:924:924 [5] NCCL INFO Bootstrap : Using ibp12s0:10.149.0.32<0>
dgx-03:924:1152 [5] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.
dgx-03:924:1152 [5] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB ; OOB ibp12s0:10.1.0.3<0>
dgx-03:924:1152 [5] NCCL INFO Using network IB
dgx-03:924:1152 [5] NCCL INFO NVLS multicast support is available on dev 5 (NVLS_NCHANNELS 16)
dgx-03:924:1160 [5] NCCL INFO Channel 00/0 : 5[5] -> 6[6] via P2P/CUMEM/read
dgx-03:924:1160 [5] NCCL INFO Channel 02/0 : 13[5] -> 5[5] [receive] via NET/IB/1/GDRDMA
dgx-03:924:1160 [5] NCCL INFO Connected NVLS tree
"""

EFA_LOG = """\
8h200-2:6831:6840 [0] NCCL INFO NET/OFI Selected Provider is efa (found 16 nics)
8h200-2:6831:6840 [0] NCCL INFO NET/OFI NIC group 7 device #0 0000:a3:00.0
8h200-2:6831:6840 [0] NCCL INFO Using network Libfabric
[1,7]<stdout>:ip-172-32-38-1:21471:22316 [7] NCCL INFO Ring 00 : 7 -> 8 via NET/AWS Libfabric/0
8h200-2:6831:6840 [0] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA
"""

# NCCL_NET=IB on a node without the verbs stack: net.cc's ncclNetInit finds no network
# of that name and fails communicator init (WARN, so logged at NCCL_DEBUG=WARN too).
MISSING = """\
gpu-1:77:77 [0] NCCL INFO NET/IB : No device found.
gpu-1:77:77 [0] NCCL WARN Error: network IB not found.
"""


def test_sockets_between_nodes_and_the_reason_ib_was_passed_over() -> None:
    t = parse_transport(SOCKETS.splitlines())
    assert t.network == SOCKET and t.inter_node
    assert t.intra_node == ("P2P/CUMEM",)
    assert "NET/IB : No device found." in t.causes
    assert "NET/Plugin : No plugin found (libnccl-net.so)." in t.causes
    assert "Using network Socket" not in t.causes and not any("NET/Socket" in c for c in t.causes)
    assert "NET/IB : No device found." in summary(t) and summary(t).startswith(
        "NCCL network Socket between nodes; inside a node P2P/CUMEM")


def test_infiniband_with_nvls_inside_the_node() -> None:
    t = parse_transport(INFINIBAND.splitlines())
    assert (t.network, t.inter_node) == (IB, True)
    assert t.intra_node == ("P2P/CUMEM", "NVLS")
    assert len(t.lines) == 8


def test_efa_through_the_ofi_plugin_under_either_of_its_names() -> None:
    t = parse_transport(EFA_LOG.splitlines())
    assert (t.network, t.inter_node) == (EFA, True)
    # Before the first channel, "Using network" alone tells which network NCCL took.
    only_init = parse_transport(EFA_LOG.splitlines()[:3])
    assert (only_init.network, only_init.inter_node) == (EFA, False)


def test_a_missing_network_is_named_in_the_causes() -> None:
    t = parse_transport(MISSING.splitlines())
    assert t.network is None
    assert t.causes == ("NET/IB : No device found.", "Error: network IB not found.")


def test_one_rank_over_sockets_makes_the_job_socket() -> None:
    ib, sock = parse_transport(INFINIBAND.splitlines()), parse_transport(SOCKETS.splitlines())
    single = Transport(IB)  # a rank whose peers are all on its node: no NET channel
    assert combine([ib, single]).network == IB
    both = combine([ib, sock, single])
    assert both.network == SOCKET and both.inter_node
    assert both.intra_node == ("P2P/CUMEM", "NVLS")
    assert combine([]).network is None
    assert both.to_dict()["network"] == SOCKET


def test_text_that_is_not_ncclS_is_ignored() -> None:
    assert parse_transport(["Using network IB", "INFO Using network Socket"]) == Transport(None)
