"""``manage.py lockkit_capabilities [--database ALIAS ...]``: per database, what lockkit can do there."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from lockkit.capabilities import capabilities, format_table


class Command(BaseCommand):
    """``manage.py lockkit_capabilities [--database ALIAS ...]``: what lockkit can do on each alias."""

    help = (
        "Print, per database alias, what lockkit can do there (row locks, NOWAIT, SKIP LOCKED, of, no_key, "
        "lock "
        "and statement timeouts) and the settings its correctness depends on."
    )
    requires_system_checks = ()  # the report must print even where a check would fail

    def add_arguments(self, parser: CommandParser) -> None:
        """Add ``--database`` (repeatable)."""
        parser.add_argument(
            "--database",
            action="append",
            dest="databases",
            metavar="ALIAS",
            help="A database alias to report on (repeatable; default: every configured alias).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Print the report for each alias asked for (every alias by default).

        Raises:
            CommandError: an alias is not in ``settings.DATABASES``.
        """
        aliases = options["databases"] or list(connections)
        unknown = [alias for alias in aliases if alias not in connections.settings]
        if unknown:
            raise CommandError(f"unknown database alias(es): {', '.join(unknown)}")
        tables = [format_table(capabilities(alias)) for alias in aliases]
        self.stdout.write("\n\n".join(tables))
