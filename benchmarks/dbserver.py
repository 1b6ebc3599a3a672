"""Where the benchmarks find PostgreSQL: a URL, or an embedded throwaway server (``lockkit_harness.embedded``).

Also turns the URL into what libpq tools (pgbench) need, so that pgbench reaches the very same server and database.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import dj_database_url

from lockkit_harness.embedded import start_embedded


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
        url = start_embedded()
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
