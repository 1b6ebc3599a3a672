"""Entry points for worker processes started with the ``spawn`` method by the claims tests.

Imported by a fresh interpreter before Django is set up, so only the function bodies import Django and models.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection


def setup_django(database_names: dict[str, str]) -> None:
    """Set Django up in a child process, on the parent's test databases (whose NAME the parent switched)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lockkit_tests.settings")
    import django
    from django.conf import settings

    django.setup()
    for alias, name in database_names.items():
        settings.DATABASES[alias]["NAME"] = name


def claim_then_hang(database_names: dict[str, str], pipe: Connection, lease: float) -> None:
    """Claim one pending job, send the ``Claim`` to the parent, then wait (at most 120 s) to be killed."""
    setup_django(database_names)
    from lockkit.claims import claim_next
    from lockkit_tests.models import Job

    claims = claim_next(
        Job.objects.filter(state="pending"), worker="doomed", lease=lease, set={"state": "running"}
    )
    pipe.send(claims)
    pipe.poll(120)  # the parent kills this process with SIGKILL long before
