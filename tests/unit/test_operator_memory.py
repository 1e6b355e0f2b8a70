"""The operator's memory diagnostics and its smaller TLS read buffers (ssl_buffers.py,
heap_report.py; docs/benchmarks.md, "The operator's memory")."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import sys
import tracemalloc
from asyncio import sslproto

import pytest

from grpo_operator import heap_report
from grpo_operator.ssl_buffers import READ_BUFFER_BYTES, shrink_tls_read_buffers

pytestmark = pytest.mark.unit


def test_each_tls_connection_reads_into_a_small_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    # CPython 3.11's Lib/asyncio/sslproto.py: a class attribute, read when a connection
    # is made (its _ssl_buffer) and on every read; 256 KiB as shipped.
    monkeypatch.setattr(sslproto.SSLProtocol, "max_size", 256 * 1024)
    shrink_tls_read_buffers()
    assert sslproto.SSLProtocol.max_size == READ_BUFFER_BYTES == 32 * 1024
    loop = asyncio.new_event_loop()
    try:
        proto = sslproto.SSLProtocol(loop, asyncio.Protocol(), ssl.create_default_context(),
                                     loop.create_future())
        assert len(proto.get_buffer(0)) == READ_BUFFER_BYTES  # the buffer each read fills
    finally:
        loop.close()


def test_the_heap_report_is_off_without_tracemalloc() -> None:
    assert not tracemalloc.is_tracing()
    assert heap_report.install() is False


def test_sigusr2_logs_the_live_allocations_by_file(caplog: pytest.LogCaptureFixture) -> None:
    before = signal.getsignal(signal.SIGUSR2)
    tracemalloc.start()
    try:
        assert heap_report.install() is True
        kept = [bytearray(1 << 20)]  # a MiB allocated here, alive when the report runs
        with caplog.at_level(logging.WARNING, logger="grpo_operator"):
            os.kill(os.getpid(), signal.SIGUSR2)
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("heap:")]
        assert "MiB traced" in lines[0]
        assert any(__file__ in line for line in lines[1:]), lines
        del kept
    finally:
        tracemalloc.stop()
        signal.signal(signal.SIGUSR2, before)


def test_with_frames_traced_it_also_names_the_largest_call_paths(
        caplog: pytest.LogCaptureFixture) -> None:
    before = signal.getsignal(signal.SIGUSR2)
    tracemalloc.start(8)  # PYTHONTRACEMALLOC=8
    try:
        assert heap_report.install() is True
        kept = [bytearray(16 << 20)]  # the largest live allocation, made on this line
        line = sys._getframe().f_lineno - 1
        with caplog.at_level(logging.WARNING, logger="grpo_operator"):
            os.kill(os.getpid(), signal.SIGUSR2)
        paths = [r.getMessage() for r in caplog.records
                 if r.getMessage().startswith("heap: path of")]
        assert 0 < len(paths) <= heap_report.TOP_PATHS
        assert f"test_operator_memory.py:{line}" in paths[0].split(": ", 2)[2], paths[0]
        del kept
    finally:
        tracemalloc.stop()
        signal.signal(signal.SIGUSR2, before)
