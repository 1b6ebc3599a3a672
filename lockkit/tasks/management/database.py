"""What a ``lockkit.tasks`` management command asks its database before it starts.

The tables there, and how a refusal of the alias's settings is said: one line, for ``lockkit_worker`` and
``lockkit_prune_tasks`` alike.
"""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import DatabaseError, connections

from lockkit.errorcodes.translate import translate
from lockkit.errors import DatabaseMisconfigured


def tables_present(alias: str, refused: str, advice: str) -> set[str]:
    """The names of the tables on ``alias``, lower-cased.

    Args:
        alias: The database alias.
        refused: What the command says first when the server refuses the alias's settings
            (``"lockkit_worker cannot start"``).
        advice: What it says last then (``"or create the database or role; not retried"``).

    Raises:
        CommandError: the server refused the alias's settings (a database or user it does not have, a wrong
            password): see ``refused_settings``.
        django.db.DatabaseError: the server could not be asked otherwise (the caller waits, or stops).
    """
    connection = connections[alias]
    try:
        with connection.cursor() as cursor:
            return {name.lower() for name in connection.introspection.table_names(cursor)}
    except DatabaseError as failure:
        error = translate(failure, alias=alias, nowait=False)
        if isinstance(error, DatabaseMisconfigured):
            raise refused_settings(error, alias, refused, advice) from failure
        raise


def refused_settings(error: DatabaseMisconfigured, alias: str, refused: str, advice: str) -> CommandError:
    """One line naming the alias, its database and user, and the server's own message (libpq's spans lines).

    ``refused`` opens it and ``advice`` follows ``Fix DATABASES[alias]`` (see ``tables_present``).
    """
    settings = connections[alias].settings_dict
    server = " ".join(str(error.__cause__ or error).split())
    return CommandError(
        f"{refused}: the server refused the settings of database alias {alias!r} (NAME {settings.get('NAME')!r}, "
        f"USER {settings.get('USER')!r}): {server}. Fix DATABASES[{alias!r}]{advice}"
    )
