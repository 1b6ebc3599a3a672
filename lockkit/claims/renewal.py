"""``heartbeat_worker()``: renew every claim one worker holds, in one statement, and say which it still holds.

One renewal per beat for a worker holding many claims (a batch claimed at once, tasks waiting their turn), instead
of one ``heartbeat()`` per claim. See docs/claims.md.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from lockkit.aio import awaitable
from lockkit.claims import inputs, runner
from lockkit.claims.sql import claims_sql_for
from lockkit.errors import ConnectionLost
from lockkit.scopes.options import FROM_SETTINGS
from lockkit.validation import Duration


def heartbeat_worker(
    model_or_queryset: Any,
    *,
    worker: str,
    lease: Duration,
    using: str | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> dict[Any, int]:
    """Renew, in one statement, the lease of every unexpired claim ``worker`` holds on rows of the queryset.

    Every row still claimed by ``worker`` (``claimed_by``, compared exactly) whose lease has not expired by the
    database clock gets ``lease_expires_at = <clock> + lease``; its token is unchanged, so the worker's ``Claim``
    objects stay valid. A claim whose row is not in the result is lost: its lease expired (it may be reclaimed,
    or already claimed again by another worker or by ``claim_next(expired=True)``), it was completed or
    released, or its row was deleted. An expired claim is never renewed here (``heartbeat()`` of that one
    claim still renews it while nobody has taken the row). On PostgreSQL one ``UPDATE`` (one round trip, as one
    message with its opening and ``COMMIT``); on MariaDB/MySQL and SQLite one short transaction that locks the
    claims in primary-key order and renews them. Rows being written by another session (a ``complete()`` in
    flight, a ``fenced()`` block) are waited for, within the lock timeout, never skipped: a claim is never
    reported lost because its worker was finishing it. See
    https://www.postgresql.org/docs/current/sql-update.html.

    Safe to repeat: a renewal whose reply was lost is sent again on a fresh connection (it only moves the
    leases again).

    Args:
        model_or_queryset: The rows to look at (a queryset, manager or model class of a ``Claimable`` model),
            e.g. ``Job.objects.filter(queue="emails")``.
        worker: The worker name the claims were made for.
        lease: The new lease in seconds (``int``/``float``) or a ``timedelta``, counted on the database clock.
        using: The database alias; default the queryset's bound database, else ``router.db_for_write(model)``.
        lock_timeout: Seconds (or a ``timedelta``) a row lock may be waited for; default
            ``settings.LOCKKIT["LOCK_TIMEOUT"]``; ``None`` leaves the connection's own setting.

    Returns:
        ``{pk: claim_token}`` of the claims renewed, i.e. still held by ``worker``.

    Raises:
        TypeError, ValueError: a wrong type, an empty or unstorable worker name, a non-positive lease, a sliced,
            distinct or ``select_for_update()`` queryset; before any SQL runs.
        AliasMismatch: ``using`` differs from the database the queryset is bound to.
        django.db.NotSupportedError: the database is not PostgreSQL, MariaDB 10.6+/MySQL 8 or SQLite 3.35+.
        LockTimeout: a claimed row stayed locked by another session past the lock timeout (nothing renewed).
        ConnectionLost: the database stayed unreachable for the retry policy's ``reconnect_within``.
    """
    return renew_held(model_or_queryset, worker=worker, lease=lease, using=using, lock_timeout=lock_timeout)[
        0
    ]


aheartbeat_worker = awaitable(heartbeat_worker)


def renew_held(
    model_or_queryset: Any,
    *,
    worker: str,
    lease: Duration,
    using: str | None = None,
    lock_timeout: Duration | None = FROM_SETTINGS,
) -> tuple[dict[Any, int], Any]:
    """``heartbeat_worker()``, also returning the database clock the renewal ran at (``None``: no row can match).

    Raises:
        As ``heartbeat_worker()``.
    """
    candidates = inputs.queryset(model_or_queryset, "model_or_queryset")
    model = inputs.claimable_model(candidates.model, "model_or_queryset")
    name = inputs.worker(worker)
    seconds = inputs.lease(lease)
    alias = inputs.alias_for(using, candidates)
    statements = claims_sql_for(model, alias)
    held: QuerySet[Any] = candidates.using(alias).filter(
        claimed_by=name, lease_expires_at__gt=statements.now()
    )
    values = {"lease_expires_at": statements.lease_end(seconds)}

    def work() -> tuple[list[Any], Any]:
        return statements.renew_worker(held, name, values)

    def resolve(message: Any, lost: ConnectionLost) -> tuple[list[Any], Any]:
        # Renewing again is harmless: once the lost session has ended, the same statement says what is held.
        runner.await_session_end(alias, message, lost)
        return runner.in_one_message(alias, lock_timeout, work)

    rows, clock = runner.in_one_message(alias, lock_timeout, work, resolve)
    return {row["pk"]: int(row["claim_token"]) for row in rows}, clock
