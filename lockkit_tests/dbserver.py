"""Where the test suite finds its PostgreSQL: a URL from the environment, or an embedded throwaway server.

The embedded server (``pgserver``, a PyPI package that ships PostgreSQL; started by ``sample_project.embedded``)
lets the README's test command run on a machine with no database server at all. Its URL is written back to the
environment so that worker processes reuse it.
"""

from __future__ import annotations

import os
import sys

from sample_project import embedded

DATABASE_URL_ENV = "LOCKKIT_TEST_DATABASE_URL"


def database_url() -> str:
    """Return the test PostgreSQL URL, starting an embedded server for this process tree when none is configured."""
    if not os.environ.get(DATABASE_URL_ENV, "").strip() and "mypy" in sys.modules:
        # mypy's Django plugin imports the settings to read the models and then leaves with os._exit(), which would
        # strand a server started here; it never connects, so a placeholder URL serves.
        return "postgres://postgres@localhost/lockkit_typecheck"
    return embedded.database_url(DATABASE_URL_ENV)
