"""Where the test suite finds its PostgreSQL: a URL from the environment, or an embedded throwaway server.

The embedded server (``pgserver``, a PyPI package that ships PostgreSQL) lets the README's test command run on a
machine with no database server at all. Its URL is written back to the environment so that worker processes reuse it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import warnings
from urllib.parse import quote

DATABASE_URL_ENV = "LOCKKIT_TEST_DATABASE_URL"


def database_url() -> str:
    """Return the test PostgreSQL URL, starting an embedded server for this process tree when none is configured."""
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    if url:
        return url
    if "mypy" in sys.modules:
        # mypy's Django plugin imports the settings to read the models and then leaves with os._exit(), which would
        # strand a server started here; it never connects, so a placeholder URL serves.
        return "postgres://postgres@localhost/lockkit_typecheck"
    return _start_embedded()


def _start_embedded() -> str:
    # pgserver asks platformdirs for a runtime directory; without XDG_RUNTIME_DIR it warns and uses /tmp, harmlessly.
    warnings.filterwarnings("ignore", category=UserWarning, module="platformdirs")
    import pgserver

    data_dir = tempfile.mkdtemp(prefix="lockkit-pg-")
    server = pgserver.get_server(data_dir, cleanup_mode="stop")  # type: ignore[attr-defined]
    socket_dir = server.get_uri().split("host=", 1)[1]

    def _cleanup() -> None:
        server.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)

    atexit.register(_cleanup)
    url = f"postgres://postgres@{quote(socket_dir, safe='')}/postgres"
    os.environ[DATABASE_URL_ENV] = url
    return url
