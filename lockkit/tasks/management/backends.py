"""The backend a ``lockkit.tasks`` management command works on, named by its ``--backend`` option."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import CommandError
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend

from lockkit.tasks.backend import DatabaseBackend


def lockkit_backend(name: str) -> DatabaseBackend:
    """The ``lockkit.tasks.DatabaseBackend`` that ``settings.TASKS[name]`` configures.

    Raises:
        CommandError: ``name`` is not an alias of ``settings.TASKS`` (the message lists them), its backend cannot
            be built, or it is another kind of backend.
    """
    aliases = list(getattr(settings, "TASKS", {}) or {})
    if name not in aliases:
        raise CommandError(
            f"--backend {name!r} is not an alias of settings.TASKS ({', '.join(map(repr, aliases)) or 'none'})"
        )
    try:
        backend = task_backends[name]
    except InvalidTaskBackend as error:
        raise CommandError(f"--backend {name!r}: {error}") from error
    if not isinstance(backend, DatabaseBackend):
        raise CommandError(
            f"--backend {name!r} is {type(backend).__module__}.{type(backend).__qualname__}, "
            f"not lockkit.tasks.DatabaseBackend"
        )
    return backend
