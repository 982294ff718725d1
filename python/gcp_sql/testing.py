"""Test and benchmark helpers, kept out of ``gcp_sql``'s main API.

    from gcp_sql.testing import null_server
    with null_server("pubsub") as server:          # server.addr == '127.0.0.1:PORT'
        sink = gcp_sql.pubsub_sink(schema, topic="projects/p/topics/t", emulator_host=server.addr)
        ...
        print(server.totals())                      # {'requests': ..., 'records': ..., ...}

A null server is the crate's ``gcp-sql serve-null``: it acknowledges every Publish,
MutateRows or CreateTask request and counts what it received, on a free loopback port, served
by this package's own runtime (python/bench/null_servers.py uses it).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from . import _native

__all__ = ["NullServer", "null_server"]


class NullServer:
    """A running null server: ``addr`` (``127.0.0.1:PORT``), ``service``, ``totals()``."""

    def __init__(self, native: _native.NullServer) -> None:
        self._native = native

    @property
    def addr(self) -> str:
        return self._native.addr

    @property
    def service(self) -> str:
        return self._native.service

    def totals(self) -> dict[str, int]:
        """What it received so far: requests, records, record_bytes, request_bytes."""
        return dict(self._native.totals())

    def stop(self) -> None:
        self._native.stop()


@contextlib.contextmanager
def null_server(service: str, latency_ms: int = 0) -> Iterator[NullServer]:
    """Runs a null server while the block runs, for ``service``
    (``pubsub``, ``pubsub-subscribe``, ``cloud-tasks``, ``bigtable`` or ``bigtable-read``); each
    request is answered after ``latency_ms`` milliseconds (``pubsub-subscribe`` serves its
    default backlog of 100,000 messages of 200 bytes to every subscription asked for, and
    ``bigtable-read`` the same 100,000 rows from every table)."""
    server = NullServer(_native.start_null_server(service, latency_ms))
    try:
        yield server
    finally:
        server.stop()
