"""The ``task_backends`` argument of the task metrics' installers, checked before anything is registered."""

from __future__ import annotations

from collections.abc import Iterable


def checked_task_backends(task_backends: object) -> tuple[str, ...]:
    """``task_backends`` as a tuple of aliases of ``lockkit.tasks.DatabaseBackend``s, checked without SQL.

    Each alias's backend is built (``django.tasks.task_backends[alias]``), which reads its ``OPTIONS``.

    Args:
        task_backends: Aliases of ``settings.TASKS`` (a list or another iterable of ``str``).

    Returns:
        The aliases, in the order given.

    Raises:
        TypeError: ``task_backends`` is a ``str`` (one alias, not a list of them) or not iterable, or holds
            something that is not a ``str``.
        ValueError: an alias is not one of ``settings.TASKS``, or its backend cannot be built or is not a
            ``lockkit.tasks.DatabaseBackend`` (or Django has no ``django.tasks``: before 6.0).
    """
    if isinstance(task_backends, str) or not isinstance(task_backends, Iterable):
        raise TypeError(
            f"task_backends must be a list of aliases of settings.TASKS (e.g. ['default']), got {task_backends!r}"
        )
    aliases = tuple(task_backends)
    if not all(isinstance(alias, str) for alias in aliases):
        raise TypeError(f"task_backends must hold aliases of settings.TASKS (str), got {list(aliases)!r}")
    if not aliases:
        return aliases
    try:
        from lockkit.tasks.backend import backend_named
    except ImportError as missing:  # Django < 6, or lockkit.tasks not importable
        raise ValueError(f"task_backends needs lockkit.tasks (Django 6): {missing}") from missing
    for alias in aliases:
        backend_named(alias, f"task_backends: {alias!r}")
    return aliases
