"""With ``USE_TZ = False`` on MariaDB/MySQL, the database clock must read Django's wall clock (``TIME_ZONE``).

Django writes a task's times (``enqueued_at``, ``run_after``) as naive ``TIME_ZONE`` values, and on PostgreSQL it
sets the session's ``TimeZone`` to match. Its MySQL backend sets no session time zone, so ``NOW(6)``, which the claims,
leases and outcomes compare and write, reads the server's: a server in UTC with ``TIME_ZONE = "Asia/Tokyo"`` would
hold scheduled tasks and periodic ticks back nine hours, and ``lockkit_prune_tasks`` would take tasks that just ended
for nine hours old. The worker and the prune command ask first and refuse to start (found by a review).
"""

from __future__ import annotations

from django.conf import settings
from django.db import connections
from django.utils import timezone

#: Seconds the two clocks may differ by (a server whose clock drifts is another matter).
TOLERANCE = 60.0


def naive_clock_mismatch(alias: str) -> str | None:
    """Why the database clock of ``alias`` disagrees with Django's naive wall clock, or ``None`` when it agrees.

    Only MariaDB/MySQL with ``USE_TZ = False`` is asked (one ``SELECT``); elsewhere the answer is ``None`` at once.

    Args:
        alias: The database alias of the task table.

    Returns:
        A message for the user naming both clocks and the fixes, or ``None``.

    Raises:
        django.db.DatabaseError: the database could not be asked.
    """
    connection = connections[alias]
    if settings.USE_TZ or connection.vendor != "mysql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT NOW(6), @@session.time_zone")
        server_now, zone = cursor.fetchone()
    drift = abs((server_now - timezone.now()).total_seconds())
    if drift <= TOLERANCE:
        return None
    return (
        f"USE_TZ = False: Django writes the tasks' times as naive {settings.TIME_ZONE} time, but the clock of "
        f"database {alias!r} (NOW(), session time_zone {zone!r}) reads {server_now:%Y-%m-%d %H:%M:%S}, "
        f"{drift / 3600:.1f} h away: scheduled tasks and periodic ticks would wait that long and pruning would "
        f"take recent tasks for old. Set the server's time zone to {settings.TIME_ZONE} (default_time_zone, or "
        f"DATABASES[{alias!r}]['OPTIONS']['init_command'] = \"SET time_zone = '...'\"), or use USE_TZ = True"
    )
