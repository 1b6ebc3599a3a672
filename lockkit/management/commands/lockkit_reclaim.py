"""``manage.py lockkit_reclaim app_label.Model``: hand expired claims back (once, or every N seconds)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.apps import apps
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, models

logger = logging.getLogger("lockkit.claims.reaper")


class Command(BaseCommand):
    """``manage.py lockkit_reclaim app_label.Model [--every SECONDS] [--max-attempts N --exhausted-set f=v ...]``.

    Each pass runs ``lockkit.claims.reclaim_expired``: rows whose lease expired by the database clock are
    unclaimed and get ``--set`` values; with ``--max-attempts``, rows claimed that many times or more get the
    ``--exhausted-set`` values instead. Each pass logs (logger ``lockkit.claims.reaper``) and prints the primary
    keys it handed back and those it marked exhausted. See docs/claims.md, "The reaper".
    """

    help = (
        "Hand back the rows of a Claimable model whose claim's lease expired (lockkit.claims.reclaim_expired): "
        "one pass, or one every --every seconds until stopped (SIGTERM/SIGINT)."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Create the command; ``stopping`` ends an ``--every`` loop (set by SIGTERM/SIGINT)."""
        super().__init__(*args, **kwargs)
        self.stopping = threading.Event()

    def add_arguments(self, parser: CommandParser) -> None:
        """Add the model label and the options."""
        parser.add_argument("model", metavar="app_label.Model", help="The Claimable model, e.g. jobs.Job.")
        parser.add_argument(
            "--every",
            type=float,
            metavar="SECONDS",
            help="Run a pass every SECONDS until stopped (default: one pass, then exit).",
        )
        parser.add_argument(
            "--max-attempts",
            type=int,
            metavar="N",
            help="Rows claimed N times or more get --exhausted-set instead of being handed back.",
        )
        parser.add_argument(
            "--exhausted-set",
            action="append",
            default=[],
            metavar="FIELD=VALUE",
            help="A field to write on exhausted rows (repeatable; required with --max-attempts).",
        )
        parser.add_argument(
            "--set",
            action="append",
            default=[],
            dest="back_set",
            metavar="FIELD=VALUE",
            help="A field to write on rows handed back (repeatable), e.g. --set state=pending.",
        )
        parser.add_argument("--database", metavar="ALIAS", help="The database alias (default: the router's).")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run one pass, or passes every ``--every`` seconds until SIGTERM/SIGINT.

        Raises:
            CommandError: an unknown or non-Claimable model, a bad option value, ``--max-attempts`` without
                ``--exhausted-set`` (or the reverse).
        """
        from lockkit.claims import Claimable

        model = _model(options["model"])
        if not issubclass(model, Claimable):
            raise CommandError(f"{options['model']} does not use the lockkit.claims.Claimable mixin")
        back = _assignments(model, options["back_set"], "--set")
        exhausted = _assignments(model, options["exhausted_set"], "--exhausted-set")
        max_attempts: int | None = options["max_attempts"]
        if (max_attempts is None) != (not exhausted):
            raise CommandError("--max-attempts and --exhausted-set must be given together")
        if max_attempts is not None and max_attempts < 1:
            raise CommandError(f"--max-attempts must be at least 1, got {max_attempts}")
        every: float | None = options["every"]
        if every is not None and not every > 0:
            raise CommandError(f"--every must be a positive number of seconds, got {every}")
        using: str | None = options["database"]

        try:  # the first pass also checks the values against their columns (before any SQL)
            self.reap(model, back, max_attempts, exhausted, using)
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if every is None:
            return
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: self.stopping.set())
        while not self.stopping.wait(every):
            try:
                self.reap(model, back, max_attempts, exhausted, using)
            except DatabaseError as failure:  # a restart or failover: try again at the next pass
                logger.warning("reclaim pass on %s failed: %s", model._meta.label, failure)
                self.stderr.write(f"reclaim pass failed: {failure}")

    def reap(
        self,
        model: type[models.Model],
        back: dict[str, Any],
        max_attempts: int | None,
        exhausted: dict[str, Any],
        using: str | None,
    ) -> tuple[list[Any], list[Any]]:
        """One pass: first the exhausted rows, then the rest; log and print each list of primary keys."""
        from lockkit.claims.api import reclaim_expired_pks

        queryset = model._default_manager.all()
        label = model._meta.label
        exhausted_pks: list[Any] = []
        if max_attempts is not None:
            exhausted_pks = reclaim_expired_pks(
                queryset.filter(attempts__gte=max_attempts), set=exhausted, using=using
            )
        handed_back = reclaim_expired_pks(queryset, set=back, using=using)
        for verb, pks in (("handed back", handed_back), ("exhausted", exhausted_pks)):
            if pks:
                logger.info("%s: %s %d expired claim(s): pk %s", label, verb, len(pks), _listing(pks))
                self.stdout.write(f"{label}: {verb} {len(pks)} expired claim(s): pk {_listing(pks)}")
        if not handed_back and not exhausted_pks:
            logger.debug("%s: no expired claims", label)
            self.stdout.write(f"{label}: no expired claims")
        return handed_back, exhausted_pks


def _model(label: str) -> type[models.Model]:
    try:
        return apps.get_model(label)
    except (LookupError, ValueError) as exc:
        raise CommandError(f"unknown model {label!r} (expected app_label.Model): {exc}") from None


def _assignments(model: type[models.Model], pairs: list[str], option: str) -> dict[str, Any]:
    """``field=value`` pairs as field values, converted by each field's ``to_python`` (``null`` for ``None``)."""
    values: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise CommandError(f"{option} takes FIELD=VALUE, got {pair!r}")
        try:
            field = model._meta.get_field(name)
        except Exception:
            raise CommandError(f"{option}: {model._meta.label} has no field {name!r}") from None
        if not isinstance(field, models.Field):
            raise CommandError(f"{option}: {model._meta.label}.{name} is not a column that can be set")
        raw: Any = None if text == "null" and field.null else text
        try:
            values[name] = field.to_python(raw)
        except ValidationError as exc:
            raise CommandError(f"{option} {name}: {'; '.join(exc.messages)}") from None
    return values


def _listing(pks: list[Any], shown: int = 50) -> str:
    text = ", ".join(str(pk) for pk in pks[:shown])
    return text if len(pks) <= shown else f"{text}, ... ({len(pks) - shown} more)"
