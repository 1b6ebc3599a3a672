"""The protocol messages one PostgreSQL connection sends, read from libpq's own trace (psycopg's ``pgconn.trace``).

A request is a simple ``Query`` or an extended-protocol ``Sync``: each is one round trip. See
https://www.psycopg.org/psycopg3/docs/api/pq.html#psycopg.pq.PGconn.trace.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from typing import Any

from django.db import connections


class Requests:
    """What a traced block sent: ``texts`` of its ``Query`` messages, ``count`` of its requests (round trips)."""

    def __init__(self) -> None:
        """Empty until the block ends."""
        self.texts: list[str] = []
        self.count = 0


@contextlib.contextmanager
def requests(alias: str = "default") -> Iterator[Requests]:
    """Trace the requests the alias's current driver connection sends during the block (connects first)."""
    connection = connections[alias]
    connection.ensure_connection()
    raw: Any = connection.connection
    found = Requests()
    with tempfile.TemporaryFile("w+") as log:
        raw.pgconn.trace(log.fileno())
        try:
            yield found
        finally:
            if not raw.closed:
                raw.pgconn.untrace()
            log.flush()
            log.seek(0)
            for line in log.read().splitlines():
                fields = line.split("\t")
                if len(fields) < 5 or fields[1] != "F":
                    continue
                kind, body = fields[3], fields[4].strip()
                if kind == "Query":
                    found.count += 1
                    found.texts.append(body.strip('"'))
                elif kind == "Sync":
                    found.count += 1
