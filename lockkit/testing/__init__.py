"""Helpers for testing real lock contention: deterministic, fast, and unable to hang. Runner-neutral.

``hold_lock`` keeps rows locked from another session; ``wait_until_blocked`` returns once the database itself
reports a session waiting for that lock (``pg_blocking_pids()`` on PostgreSQL, the InnoDB lock-wait tables on
MariaDB/MySQL); ``in_thread`` and ``run_concurrently`` run contenders on their own connections and hand back
their results and exceptions; ``assert_single_alias`` fails when a query runs on another alias;
``LockWaitMonitor`` samples which sessions waited for a lock. Use them in transactional tests
(``TransactionTestCase``, ``pytest.mark.django_db(transaction=True)``): other sessions cannot see rows that a
``TestCase`` transaction wrote. pytest users get them as fixtures from ``lockkit.pytest_plugin``.
"""

from __future__ import annotations

from lockkit.testing.blocking import blocked_by, wait_until_blocked
from lockkit.testing.failures import ContentionTimeout, NothingLocked
from lockkit.testing.holding import Holder, hold_lock
from lockkit.testing.kit import ContentionKit
from lockkit.testing.monitor import LockWait, LockWaitMonitor, Sample
from lockkit.testing.querylog import AliasLog, assert_single_alias
from lockkit.testing.sessions import backend_pid
from lockkit.testing.threads import Outcome, ThreadCall, in_thread, run_concurrently

__all__ = [
    "AliasLog",
    "ContentionKit",
    "ContentionTimeout",
    "Holder",
    "LockWait",
    "LockWaitMonitor",
    "NothingLocked",
    "Outcome",
    "Sample",
    "ThreadCall",
    "assert_single_alias",
    "backend_pid",
    "blocked_by",
    "hold_lock",
    "in_thread",
    "run_concurrently",
    "wait_until_blocked",
]
