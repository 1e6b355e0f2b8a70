"""Smaller read buffers for the operator's TLS connections.

asyncio gives every TLS connection a read buffer of ``SSLProtocol.max_size`` bytes, 256 KiB
(CPython 3.11, Lib/asyncio/sslproto.py: ``max_size``, allocated in ``__init__`` as
``_ssl_buffer``). The operator holds one per connection: Kopf's client pool to the API
server (aiohttp, no connection limit: a burst of 200 new jobs opened about a hundred) and
the API server's connections to the admission webhook. At 200 jobs tracemalloc found
28 MiB of the operator's 121 MiB of Python allocations in these buffers
(docs/benchmarks.md, "The operator's memory"). Reads loop until the TLS object is
drained (``_do_read__copied``, ``_do_read__buffered``), so a smaller buffer costs more
read calls on a large response, never data. The API server's list and watch responses
the operator reads are tens of KiB per object.
"""

from __future__ import annotations

from asyncio import sslproto

READ_BUFFER_BYTES = 32 * 1024


def shrink_tls_read_buffers() -> None:
    """Set asyncio's per-connection TLS read buffer to ``READ_BUFFER_BYTES``: call before
    the first connection (connections made before keep their buffer)."""
    sslproto.SSLProtocol.max_size = READ_BUFFER_BYTES
