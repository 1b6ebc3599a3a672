"""``manage.py lockkit_locks``: who waits for whose locks, as a tree; optionally cancel or terminate a blocker."""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, NotSupportedError, connections

from lockkit import inspection
from lockkit.backends.waits import LockWait, Session

# How much of a query the tree shows: enough for a Django SELECT ... FOR UPDATE with its columns.
_QUERY_CHARS = 600


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(text)
    return value


def _describe(session: Session, what: str) -> str:
    """One session as a line: who it is, what it does about the lock, then its query (the long part) last."""
    parts = [f"pid {session.pid}"]
    if session.application_name:
        parts.append(f"[{session.application_name}]")
    if session.state:
        parts.append(f"({session.state})")
    parts.append(what)
    if session.transaction_seconds is not None:
        parts.append(f"— in transaction for {session.transaction_seconds:.1f}s")
    text = " ".join(parts)
    query = " ".join((session.query or "").split())
    return f"{text}: {query[:_QUERY_CHARS]}" if query else text


def _wait_line(wait: LockWait) -> str:
    waited = f" for {wait.waited_seconds:.1f}s" if wait.waited_seconds is not None else ""
    lock = " ".join(part for part in (wait.mode, wait.lock_kind, "lock") if part)
    target = f" on {wait.target}" if wait.target else ""
    return _describe(wait.waiting, f"waits{waited} for {lock}{target}")


def tree_lines(waits: list[LockWait]) -> list[tuple[int, str]]:
    """The tree as (depth, text) lines: each root blocker, then each waiter under the session it waits behind."""
    children: dict[int, list[LockWait]] = {}
    for wait in waits:
        parent = wait.chain[-2] if len(wait.chain) > 1 else None
        if parent is not None:
            children.setdefault(parent, []).append(wait)
    lines: list[tuple[int, str]] = []

    def walk(pid: int, depth: int, seen: frozenset[int]) -> None:
        for wait in children.get(pid, []):
            lines.append((depth, _wait_line(wait)))
            if wait.waiting.pid not in seen:
                walk(wait.waiting.pid, depth + 1, seen | {wait.waiting.pid})

    for root in inspection.roots(waits):
        lines.append((0, _describe(root, "holds the lock")))
        walk(root.pid, 1, frozenset({root.pid}))
    return lines


class Command(BaseCommand):
    """The ``lockkit_locks`` management command."""

    help = (
        "Show which database sessions wait for which others' locks, as a tree (root blockers first), with their "
        "queries and how long they have waited; optionally cancel or terminate a session of this database."
    )
    requires_system_checks = ()  # an incident tool must run even where a check would fail

    def add_arguments(self, parser: CommandParser) -> None:
        """Add ``--database``, ``--watch``, ``--count``, ``--json``, ``--cancel`` and ``--terminate``."""
        parser.add_argument(
            "--database", default=DEFAULT_DB_ALIAS, metavar="ALIAS", help="The database alias."
        )
        parser.add_argument(
            "--watch",
            type=_positive_float,
            metavar="SECONDS",
            help="Print again every SECONDS seconds until interrupted (Ctrl-C).",
        )
        parser.add_argument(
            "--count", type=int, metavar="N", help="With --watch: stop after N reports (default: never)."
        )
        parser.add_argument(
            "--json", action="store_true", help="Print the waits as JSON (one document per report)."
        )
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--cancel", type=int, metavar="PID", help="Cancel the statement of session PID.")
        group.add_argument(
            "--terminate", type=int, metavar="PID", help="Terminate session PID (its locks are released)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Print the report (once, or every ``--watch`` seconds), or signal one session."""
        alias = options["database"]
        if alias not in connections.settings:
            raise CommandError(f"unknown database alias: {alias}")
        pid = options["cancel"] if options["cancel"] is not None else options["terminate"]
        if pid is not None:
            action = inspection.cancel if options["cancel"] is not None else inspection.terminate
            try:
                done = action(pid, using=alias)
            except (ValueError, NotSupportedError) as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(str(done))
            return
        count = options["count"]
        if count is not None and count < 1:
            raise CommandError("--count must be at least 1")
        reports = 0
        try:
            while True:
                self._report(alias, as_json=options["json"])
                reports += 1
                if options["watch"] is None or (count is not None and reports >= count):
                    return
                time.sleep(options["watch"])
        except KeyboardInterrupt:
            return

    def _report(self, alias: str, *, as_json: bool) -> None:
        try:
            waits = inspection.blocking(alias)
        except NotSupportedError as exc:
            raise CommandError(str(exc)) from exc
        if as_json:
            self.stdout.write(json.dumps([wait.as_dict() for wait in waits]))
            return
        header = f"{alias}: {len(waits)} session(s) waiting for a lock"
        lines = tree_lines(waits)
        try:
            from rich.console import Console
            from rich.text import Text
            from rich.tree import Tree
        except ImportError:  # rich is optional: plain indentation then
            self.stdout.write("\n".join([header, *("    " * depth + text for depth, text in lines)]))
            return
        # Text, not str: a query's "[...]" must never be read as rich markup.
        tree = Tree(Text(header))
        stack: list[Tree] = [tree]
        for depth, text in lines:
            del stack[depth + 1 :]
            stack.append(stack[depth].add(Text(text)))
        # Wide and unwrapped: one line per session (a terminal wraps long lines itself).
        console = Console(file=self.stdout, width=_QUERY_CHARS + 200, soft_wrap=True, highlight=False)  # type: ignore[arg-type]
        console.print(tree)
