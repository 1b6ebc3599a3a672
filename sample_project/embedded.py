"""A throwaway PostgreSQL for a process tree: started with ``pgserver`` when no database URL is configured.

The one place the repository starts an embedded server: the demo, the test suite (lockkit_tests/dbserver.py) and
the benchmarks (benchmarks/dbserver.py) all come here.

``pgserver`` is a PyPI package that ships PostgreSQL binaries, so the demo runs on a machine with Python only.
The server's URL is written to the environment variable the caller names, so child processes reuse the same
server.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import warnings
from urllib.parse import quote


def database_url(env_var: str) -> str:
    """Return ``os.environ[env_var]``, or start an embedded PostgreSQL, export its URL there and return it.

    The server and its data directory are removed when the process that started it exits.
    """
    url = os.environ.get(env_var, "").strip()
    if url:
        return url
    url = start_embedded()
    os.environ[env_var] = url
    return url


def start_embedded() -> str:
    """Start an embedded PostgreSQL and return its URL; it is stopped when the process that started it exits."""
    # pgserver asks platformdirs for a runtime directory; without XDG_RUNTIME_DIR it warns and uses /tmp, harmlessly.
    warnings.filterwarnings("ignore", category=UserWarning, module="platformdirs")
    from pgserver import get_server  # type: ignore[attr-defined]  # not re-exported in its __all__

    data_dir = tempfile.mkdtemp(prefix="lockkit-pg-")
    server = get_server(data_dir, cleanup_mode="stop")
    socket_dir = server.get_uri().split("host=", 1)[1]
    owner = os.getpid()

    def _cleanup() -> None:
        if os.getpid() == owner:  # a forked child inherits atexit hooks; only the starter stops the server
            server.cleanup()
            shutil.rmtree(data_dir, ignore_errors=True)

    atexit.register(_cleanup)
    return f"postgres://postgres@{quote(socket_dir, safe='')}/postgres"
