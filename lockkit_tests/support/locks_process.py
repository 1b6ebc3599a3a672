"""``manage.py lockkit_locks`` (or ``lockkit.inspection.terminate``) in a process of its own, as any database user.

``python -m lockkit_tests.support.locks_process ARGS...`` with the Django ``DATABASES["default"]`` entry as JSON in
``LOCKKIT_LOCKS_DATABASE``: the command runs as from a shell (``execute_from_command_line``: a ``CommandError``
prints one line to stderr and exits 1). ``terminate-function PID`` calls ``lockkit.inspection.terminate`` and prints
what it raised. Run by the tests with a pipe or a pseudo-terminal as stdin, and as a role they created.
"""

from __future__ import annotations

import json
import os
import sys

DATABASE_ENV = "LOCKKIT_LOCKS_DATABASE"
# The checkout: the process imports this lockkit, not an installed one.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(argv: list[str]) -> int:
    """Set Django up on the given database and run ``argv``; return the exit status."""
    import django
    from django.conf import settings

    settings.configure(
        DATABASES={"default": json.loads(os.environ[DATABASE_ENV])},
        INSTALLED_APPS=["lockkit"],
        USE_TZ=True,
    )
    django.setup()
    if argv[:1] == ["terminate-function"]:
        from lockkit import inspection

        try:
            print(inspection.terminate(int(argv[1])))
        except inspection.SignalNotPermitted as exc:
            print(f"SignalNotPermitted code={exc.code} pid={exc.pid} action={exc.action}: {exc}")
            return 3
        return 0
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *argv])
    return 0


def environment(database: dict[str, object]) -> dict[str, str]:
    """The environment for the process: this one's, with ``database`` as its ``default`` alias."""
    keep = {
        key: value
        for key, value in database.items()
        if key in ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")
    }
    return {**os.environ, DATABASE_ENV: json.dumps(keep), "PYTHONPATH": ROOT}


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
