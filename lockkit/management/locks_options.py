"""``manage.py lockkit_locks``'s filters and presets: which waits a report shows, and named sets of options.

Presets come from ``settings.LOCKKIT["LOCKS_PRESETS"]`` (like django-pglock's ``PGLOCK_CONFIGS``): a dict of name
to a dict of the command's options; options given on the command line win over the preset's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from lockkit import conf
from lockkit.backends.waits import LockWait, Session

#: The options a preset may set, with the types each accepts.
PRESET_OPTIONS: dict[str, tuple[type, ...]] = {
    "database": (str,),
    "pids": (list, tuple),
    "blocking": (bool,),
    "min_wait": (int, float),
    "expanded": (bool,),
    "json": (bool,),
}


def preset(name: str | None) -> dict[str, Any]:
    """Return the options of preset ``name`` (``{}`` for ``None``), checked.

    Raises:
        ValueError: no such preset, or it sets an unknown option or a value of the wrong type.
    """
    if name is None:
        return {}
    presets = conf.setting("LOCKS_PRESETS", {})
    if not isinstance(presets, dict) or name not in presets:
        known = ", ".join(sorted(presets)) if isinstance(presets, dict) else ""
        raise ValueError(
            f"no preset {name!r} in settings.LOCKKIT['LOCKS_PRESETS'] (known: {known or 'none'})"
        )
    options = presets[name]
    if not isinstance(options, dict):
        raise ValueError(f"preset {name!r} must be a dict of options, not {type(options).__name__}")
    for key, value in options.items():
        if key not in PRESET_OPTIONS:
            raise ValueError(
                f"preset {name!r} sets unknown option {key!r} (known: {', '.join(sorted(PRESET_OPTIONS))})"
            )
        types = PRESET_OPTIONS[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise ValueError(f"preset {name!r}: {key!r} must be {' or '.join(t.__name__ for t in types)}")
    if "min_wait" in options:
        options = {**options, "min_wait": min_wait(options["min_wait"])}
    if "pids" in options:
        options = {**options, "pids": [_pid(value) for value in options["pids"]]}
    return dict(options)


def _pid(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"a preset's pids must be positive ints, got {value!r}")
    return value


def min_wait(value: object) -> float:
    """Check a minimum wait in seconds: a finite number, zero or more.

    Raises:
        ValueError: not a finite number at least 0.
    """
    number = math.nan
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            number = float(value)
        except ValueError:  # text that is no number
            number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"the minimum wait must be a finite number of seconds, at least 0, got {value!r}")
    return number


@dataclass(frozen=True)
class Filters:
    """What a report keeps.

    Attributes:
        pids: Keep the chains these sessions are part of (waiting or blocking); empty: all.
        min_wait: Keep the chains in which some session has waited at least this many seconds; ``None``: all.
    """

    pids: frozenset[int] = frozenset()
    min_wait: float | None = None

    def apply(self, waits: list[LockWait]) -> list[LockWait]:
        """Keep the waits that match, with every wait on their chains (so each tree stays whole)."""
        matching = [wait for wait in waits if self._matches(wait)]
        on_chains = {pid for wait in matching for pid in wait.chain or (wait.waiting.pid,)}
        return [wait for wait in waits if wait in matching or wait.waiting.pid in on_chains]

    def _matches(self, wait: LockWait) -> bool:
        if self.pids and not self.pids & {*wait.chain, wait.waiting.pid, *wait.blocking_pids}:
            return False
        if self.min_wait is not None:
            return wait.waited_seconds is not None and wait.waited_seconds >= self.min_wait
        return True


@dataclass(frozen=True)
class Blocker:
    """A session others wait for, for ``--blocking``: who waits behind it, directly or further down.

    Attributes:
        session: The blocking session.
        blocked_pids: The sessions waiting behind it, directly or behind another waiter.
        longest_wait: The longest of their waits, in seconds, or ``None`` when the server does not say.
    """

    session: Session
    blocked_pids: tuple[int, ...]
    longest_wait: float | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "session": asdict(self.session),
            "blocked_pids": list(self.blocked_pids),
            "longest_wait_seconds": self.longest_wait,
        }


def blockers(waits: list[LockWait]) -> list[Blocker]:
    """The sessions that block others (root blockers and the waiters queued ahead of others), most blocking first."""
    found: dict[int, Session] = {}
    behind: dict[int, set[int]] = {}
    longest: dict[int, float] = {}
    for wait in waits:
        for session in wait.blocking:
            found.setdefault(session.pid, session)
        # Everyone up the chain is waited for by this waiter, transitively.
        for pid in wait.chain[:-1] or wait.blocking_pids:
            behind.setdefault(pid, set()).add(wait.waiting.pid)
            if wait.waited_seconds is not None:
                longest[pid] = max(longest.get(pid, 0.0), wait.waited_seconds)
    for wait in waits:
        if wait.waiting.pid in behind:
            found[wait.waiting.pid] = wait.waiting
    result = [
        Blocker(found[pid], tuple(sorted(behind[pid])), longest.get(pid)) for pid in behind if pid in found
    ]
    return sorted(result, key=lambda b: (-len(b.blocked_pids), b.session.pid))


__all__ = ["PRESET_OPTIONS", "Blocker", "Filters", "blockers", "min_wait", "preset"]
