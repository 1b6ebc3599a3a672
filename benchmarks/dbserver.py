"""Where the benchmarks find PostgreSQL: a URL, or an embedded throwaway server (``pgserver``) for quick runs.

Also turns the URL into what libpq tools (pgbench) need, so that pgbench reaches the very same server and database.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from urllib.parse import quote

import dj_database_url


@dataclass(frozen=True)
class Target:
    """One PostgreSQL database: its URL, and the libpq parameters of the same database for command-line tools."""

    url: str
    host: str
    port: str
    user: str
    dbname: str
    password: str
    embedded: bool

    def pg_args(self) -> list[str]:
        """``-h -p -U`` arguments plus the database name, for pgbench and psql."""
        args = ["-h", self.host, "-U", self.user]
        if self.port:
            args += ["-p", self.port]
        return [*args, self.dbname]

    def pg_env(self) -> dict[str, str]:
        """The environment for libpq tools (the password travels in ``PGPASSWORD``, never on the command line)."""
        env = dict(os.environ)
        if self.password:
            env["PGPASSWORD"] = self.password
        return env


def target(url: str | None) -> Target:
    """Return the database at ``url``, or start an embedded PostgreSQL for this process when ``url`` is empty."""
    embedded = not url
    if not url:
        url = _start_embedded()
    parsed = dj_database_url.parse(url)
    return Target(
        url=url,
        host=str(parsed.get("HOST") or "localhost"),
        port=str(parsed.get("PORT") or ""),
        user=str(parsed.get("USER") or "postgres"),
        dbname=str(parsed.get("NAME") or "postgres"),
        password=str(parsed.get("PASSWORD") or ""),
        embedded=embedded,
    )


def _start_embedded() -> str:
    import pgserver

    data_dir = tempfile.mkdtemp(prefix="lockkit-bench-pg-")
    server = pgserver.get_server(data_dir, cleanup_mode="stop")  # type: ignore[attr-defined]
    socket_dir = server.get_uri().split("host=", 1)[1]

    def _cleanup() -> None:
        server.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)

    atexit.register(_cleanup)
    return f"postgres://postgres@{quote(socket_dir, safe='')}/postgres"
