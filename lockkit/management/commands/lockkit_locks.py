"""``manage.py lockkit_locks``: who waits for whose locks, as a tree; optionally cancel or terminate a blocker.

Filters (sessions, minimum wait, blockers only), presets from ``settings.LOCKKIT["LOCKS_PRESETS"]``, and a
confirmation before a session is signalled (``--no-input`` skips it). Other sessions' text is escaped before it is
printed (``lockkit.management.text``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
import time
from typing import Any, Literal, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, NotSupportedError, connections

from lockkit import inspection
from lockkit.backends.waits import LockWait, Session
from lockkit.management import locks_options
from lockkit.management.text import printable

# How much of a query the tree shows: enough for a Django SELECT ... FOR UPDATE with its columns.
_QUERY_CHARS = 600


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(text)
    return value


def _min_wait(text: str) -> float:
    try:
        return locks_options.min_wait(text)
    except ValueError as exc:  # argparse shows an ArgumentTypeError's own message
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _describe(session: Session, what: str) -> str:
    """One session as a line: who it is, what it does about the lock, then its query (the long part) last.

    Every field another session controls (application name, state, query) is escaped (``printable``).
    """
    parts = [f"pid {session.pid}"]
    if session.application_name:
        parts.append(f"[{printable(session.application_name)}]")
    if session.state:
        parts.append(f"({printable(session.state)})")
    parts.append(what)
    if session.transaction_seconds is not None:
        parts.append(f"— in transaction for {session.transaction_seconds:.1f}s")
    text = " ".join(parts)
    # Escaped before it is shortened: an escape is never cut in half into a raw control character.
    query = printable(" ".join((session.query or "").split()))
    return f"{text}: {query[:_QUERY_CHARS]}" if query else text


def _lock_text(wait: LockWait) -> str:
    lock = " ".join(printable(part) for part in (wait.mode, wait.lock_kind, "lock") if part)
    return lock + (f" on {printable(wait.target)}" if wait.target else "")


def _wait_line(wait: LockWait) -> str:
    waited = f" for {wait.waited_seconds:.1f}s" if wait.waited_seconds is not None else ""
    return _describe(wait.waiting, f"waits{waited} for {_lock_text(wait)}")


def _fields(session: Session) -> list[tuple[str, str]]:
    """A session's fields for the expanded view: the whole query, its lines kept, every field escaped."""
    fields = [("pid", str(session.pid))]
    for name in ("application_name", "user", "state"):
        value = getattr(session, name)
        if value:
            fields.append((name, printable(str(value))))
    if session.transaction_seconds is not None:
        fields.append(("in transaction for", f"{session.transaction_seconds:.1f}s"))
    if session.query:
        fields.append(("query", printable(textwrap.dedent(session.query).strip(), keep_newlines=True)))
    return fields


def expanded_lines(waits: list[LockWait]) -> list[str]:
    """The expanded view (``--expanded``): one block per waiting session, then one per root blocker, a field a line."""
    lines: list[str] = []
    for wait in waits:
        lines.append("─" * 40)
        lines.extend(f"{name}: {value}" for name, value in _fields(wait.waiting))
        lines.append(f"waits for: {_lock_text(wait)}")
        if wait.waited_seconds is not None:
            lines.append(f"waited: {wait.waited_seconds:.1f}s")
        lines.append(f"blocked by: {', '.join(str(pid) for pid in wait.blocking_pids) or 'unknown'}")
        lines.append(f"chain: {' -> '.join(str(pid) for pid in wait.chain)}")
    for root in inspection.roots(waits):
        lines.append("─" * 40)
        lines.extend(f"{name}: {value}" for name, value in _fields(root))
        lines.append("holds the lock")
    return lines


def blocker_lines(found: list[locks_options.Blocker]) -> list[str]:
    """``--blocking``: each session others wait for, with how many wait behind it and the longest wait."""
    lines = []
    for blocker in found:
        longest = f", the longest for {blocker.longest_wait:.1f}s" if blocker.longest_wait is not None else ""
        count = len(blocker.blocked_pids)
        lines.append(_describe(blocker.session, f"blocks {count} session(s){longest}"))
    return lines


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


_YES = re.compile(r"^y(es)?$", re.IGNORECASE)


class Command(BaseCommand):
    """The ``lockkit_locks`` management command."""

    help = (
        "Show which database sessions wait for which others' locks, as a tree (root blockers first), with their "
        "queries and how long they have waited; optionally cancel or terminate a session of this database."
    )
    requires_system_checks = ()  # an incident tool must run even where a check would fail
    # call_command(..., stdin=...) answers the confirmation, as for Django's createsuperuser.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        """Add the filters, the views, ``--cancel``/``--terminate`` and ``--no-input``."""
        parser.add_argument(
            "pids",
            nargs="*",
            type=int,
            metavar="PID",
            help="Show only the chains these sessions are part of.",
        )
        parser.add_argument(
            "-d", "--database", metavar="ALIAS", help="The database alias (default: 'default')."
        )
        parser.add_argument(
            "--blocking",
            action="store_true",
            default=None,
            help="Show only the sessions that block others, with how many wait behind each.",
        )
        parser.add_argument(
            "--min-wait",
            "--wait-duration",
            dest="min_wait",
            type=_min_wait,
            metavar="SECONDS",
            help="Show only the chains in which a session has waited at least SECONDS seconds.",
        )
        parser.add_argument(
            "-e",
            "--expanded",
            action="store_true",
            default=None,
            help="One field a line, the whole query with its line breaks.",
        )
        parser.add_argument(
            "-p",
            "--preset",
            "-c",
            "--config",
            dest="preset",
            metavar="NAME",
            help="Options from settings.LOCKKIT['LOCKS_PRESETS'][NAME]; the command line's win.",
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
            "--json",
            action="store_true",
            default=None,
            help="Print the waits as JSON (one document per report).",
        )
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--cancel", type=int, metavar="PID", help="Cancel the statement of session PID.")
        group.add_argument(
            "--terminate", type=int, metavar="PID", help="Terminate session PID (its locks are released)."
        )
        parser.add_argument(
            "--no-input",
            "--noinput",
            "-y",
            "--yes",
            action="store_false",
            dest="interactive",
            help="Signal without asking for confirmation (needed when stdin is not a terminal; -y/--yes as in "
            "django-pglock).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Print the report (once, or every ``--watch`` seconds), or signal one session after confirmation."""
        try:
            chosen = locks_options.preset(options["preset"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        for key in locks_options.PRESET_OPTIONS:
            given = options.get(key)
            if given is not None and given != []:
                chosen[key] = given  # the command line wins
        alias = chosen.get("database") or DEFAULT_DB_ALIAS
        if alias not in connections.settings:
            raise CommandError(f"unknown database alias: {alias}")
        pid = options["cancel"] if options["cancel"] is not None else options["terminate"]
        if pid is not None:
            self._signal(alias, pid, terminate=options["cancel"] is None, options=options)
            return
        count = options["count"]
        if count is not None and count < 1:
            raise CommandError("--count must be at least 1")
        filters = locks_options.Filters(frozenset(chosen.get("pids", ())), chosen.get("min_wait"))
        reports = 0
        try:
            while True:
                self._report(alias, filters, chosen)
                reports += 1
                if options["watch"] is None or (count is not None and reports >= count):
                    return
                time.sleep(options["watch"])
        except KeyboardInterrupt:
            return

    def _signal(self, alias: str, pid: int, *, terminate: bool, options: dict[str, Any]) -> None:
        verb = "terminate" if terminate else "cancel the statement of"
        action: Literal["cancel", "terminate"] = "terminate" if terminate else "cancel"
        if options["interactive"]:
            stdin: TextIO | None = options.get("stdin")
            if stdin is None:
                if not sys.stdin.isatty():
                    raise CommandError(
                        f"refusing to {verb} session {pid} without confirmation: stdin is not a terminal; "
                        "pass --no-input to signal without asking; nothing was signalled"
                    )
                stdin = sys.stdin
            try:  # refused before the question, not after the answer
                inspection.check_signal(pid, using=alias, action=action)
            except (ValueError, NotSupportedError, inspection.SignalNotPermitted) as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(self._what_would_be_signalled(alias, pid, verb))
            self.stdout.write(f"{verb.capitalize()} session {pid}? [y/N] ", ending="")
            self.stdout.flush()
            answer = stdin.readline().strip()
            if not _YES.match(answer):
                raise CommandError("aborted: nothing was signalled")
        signal = inspection.terminate if terminate else inspection.cancel
        try:
            done = signal(pid, using=alias)
        except (ValueError, NotSupportedError, inspection.SignalNotPermitted) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(str(done))

    def _what_would_be_signalled(self, alias: str, pid: int, verb: str) -> str:
        """The session as the listing shows it, and who waits behind it, for the confirmation."""
        try:
            waits = inspection.blocking(alias)
        except NotSupportedError as exc:
            raise CommandError(str(exc)) from exc
        found = next((b for b in locks_options.blockers(waits) if b.session.pid == pid), None)
        waiting = next((w for w in waits if w.waiting.pid == pid), None)
        lines = [f"This will {verb} session {pid} on {alias!r}:"]
        if found is not None:
            lines.append("  " + blocker_lines([found])[0])
            lines.append(f"  sessions waiting behind it: {', '.join(str(p) for p in found.blocked_pids)}")
        elif waiting is not None:
            lines.append("  " + _wait_line(waiting))
        else:
            lines.append("  (it waits for no lock and blocks no session)")
        return "\n".join(lines)

    def _report(self, alias: str, filters: locks_options.Filters, chosen: dict[str, Any]) -> None:
        try:
            waits = filters.apply(inspection.blocking(alias))
        except NotSupportedError as exc:
            raise CommandError(str(exc)) from exc
        if chosen.get("blocking"):
            found = locks_options.blockers(waits)
            if chosen.get("json"):
                self.stdout.write(json.dumps([blocker.as_dict() for blocker in found]))
                return
            header = f"{alias}: {len(found)} session(s) blocking others"
            self.stdout.write("\n".join([header, *blocker_lines(found)]))
            return
        if chosen.get("json"):
            # json.dumps escapes every control character itself.
            self.stdout.write(json.dumps([wait.as_dict() for wait in waits]))
            return
        header = f"{alias}: {len(waits)} session(s) waiting for a lock"
        if chosen.get("expanded"):
            self.stdout.write("\n".join([header, *expanded_lines(waits)]))
            return
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
