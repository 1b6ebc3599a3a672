"""The backend a ``lockkit.tasks`` management command works on, named by its ``--backend`` option."""

from __future__ import annotations

from django.core.management.base import CommandError

from lockkit.tasks.backend import DatabaseBackend, backend_named


def lockkit_backend(name: str) -> DatabaseBackend:
    """The ``lockkit.tasks.DatabaseBackend`` that ``settings.TASKS[name]`` configures.

    Raises:
        CommandError: ``name`` is not an alias of ``settings.TASKS`` (the message lists them), its backend cannot
            be built, or it is another kind of backend.
    """
    try:
        return backend_named(name, f"--backend {name!r}")
    except ValueError as error:
        raise CommandError(str(error)) from error
