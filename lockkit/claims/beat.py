"""``heartbeat_every(claim)``: renew a claim's lease from a background thread while the worker works on the job.

Also the background thread both heartbeats run (``BeatThread``): ``heartbeat_every`` here and ``worker_heartbeat``
(all of a worker's claims, ``workerbeat``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType

from django.db import DatabaseError, connections

from lockkit.claims import inputs
from lockkit.claims.api import heartbeat
from lockkit.claims.value import Claim
from lockkit.errors import StaleClaim
from lockkit.validation import duration

logger = logging.getLogger("lockkit.claims")


class BeatThread:
    """A daemon thread calling ``beat()`` every ``every`` seconds until ``stop()`` or until ``beat()`` returns False.

    A ``DatabaseError`` from a beat is passed to ``on_failure`` and the thread's connection to ``alias`` is closed,
    so the next beat runs on a fresh one (a dropped connection, a lock timeout: the leases still have time). Any
    other exception is passed to ``on_crash`` and ends the thread (the owner must learn that nobody renews its
    leases any more). The thread closes its connections when it ends. See
    https://docs.djangoproject.com/en/stable/ref/databases/#connection-management.
    """

    def __init__(
        self,
        beat: Callable[[], bool],
        *,
        every: float,
        alias: str,
        name: str,
        first_at_once: bool,
        on_failure: Callable[[DatabaseError], None],
        on_crash: Callable[[BaseException], None],
    ) -> None:
        """Prepare the thread (``start()`` starts it)."""
        self._beat = beat
        self._every = every
        self._alias = alias
        self._first_at_once = first_at_once
        self._on_failure = on_failure
        self._on_crash = on_crash
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    def start(self, owner: str) -> None:
        """Start the thread.

        Raises:
            RuntimeError: it was already started (``owner`` names the object, for the message).
        """
        if self._started:
            raise RuntimeError(f"a {owner} object can be entered once; make a new one")
        self._started = True
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop the thread, waiting up to ``timeout`` seconds for a beat in flight; whether it ended."""
        self._stop.set()
        if not self._started:
            return True
        self._thread.join(timeout=timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            if self._first_at_once and not self._once():
                return
            while not self._stop.wait(self._every):
                if not self._once():
                    return
        except BaseException as unexpected:
            self._on_crash(unexpected)
            raise
        finally:
            connections.close_all()

    def _once(self) -> bool:
        try:
            return self._beat()
        except DatabaseError as failure:
            self._on_failure(failure)
            connections[self._alias].close()
            return True


#: The default interval, as a fraction of the lease: two renewals may fail before the lease runs out.
DEFAULT_FRACTION = 1 / 3


class heartbeat_every:  # a context manager named like a function, as Django's atomic
    """Context manager that renews a claim's lease in a background thread until the block ends.

    The thread calls ``lockkit.claims.heartbeat(claim)`` every ``interval`` seconds, on its own database
    connection (closed when the thread ends: none is left behind). A renewal that fails with a database error
    (a lost connection, a lock timeout) is logged and tried again at the next beat, on a fresh connection; one
    that finds the claim stale (``StaleClaim``: the job was reclaimed, perhaps by another worker) sets ``lost``
    and stops. Check ``lost`` between steps to stop early; leaving the block when the claim was lost raises
    ``StaleClaim`` (unless the block already raised). See
    https://docs.djangoproject.com/en/stable/ref/databases/#connection-management.

    ``with heartbeat_every(claim) as beat: ...`` then ``beat.claim`` is the latest renewed claim.

    Args:
        claim: The claim to keep.
        interval: Seconds (``int``/``float``) or a ``timedelta`` between renewals; default a third of the lease.
            Must be shorter than the lease.
        lease: The lease each renewal sets, in seconds or a ``timedelta``; default the claim's ``lease``.

    Attributes:
        lost (threading.Event): Set once a renewal found the claim stale (or the thread failed unexpectedly).
        interval (float): Seconds between renewals.
        lease (float): Seconds each renewal sets.
        error (BaseException | None): The last renewal failure, if any.

    Raises:
        TypeError, ValueError: a bad ``claim``, ``interval`` or ``lease`` (``interval`` not shorter than the
            lease), when constructed.
        StaleClaim: on leaving the block, when the claim was lost.
        RuntimeError: the same object entered twice.
    """

    def __init__(
        self,
        claim: Claim,
        interval: float | timedelta | None = None,
        *,
        lease: float | timedelta | None = None,
    ) -> None:
        """Check the arguments; nothing runs until the block is entered."""
        held = inputs.claim(claim)
        self.lease = held.lease if lease is None else inputs.lease(lease)
        self.interval = self.lease * DEFAULT_FRACTION if interval is None else duration(interval, "interval")
        if self.interval >= self.lease:
            raise ValueError(
                f"interval must be shorter than the lease ({self.lease:g}s), got {self.interval:g}s"
            )
        self.lost = threading.Event()
        self.error: BaseException | None = None
        self._claim = held
        self._thread = BeatThread(
            self._renew,
            every=self.interval,
            alias=held.alias,
            name=f"lockkit-heartbeat-{held.pk}",
            first_at_once=False,
            on_failure=self._failed,
            on_crash=self._crashed,
        )

    @property
    def claim(self) -> Claim:
        """The claim as last renewed (its ``lease_expires_at`` is the latest the database recorded)."""
        return self._claim

    def __enter__(self) -> heartbeat_every:
        """Start the renewing thread.

        Raises:
            RuntimeError: this object was already entered.
        """
        self._thread.start("heartbeat_every")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the thread (waiting for a renewal in flight), then raise ``StaleClaim`` if the claim was lost."""
        # A renewal in flight is bounded by the lock timeout; give it that long and then some.
        self._thread.stop(timeout=self.lease + 30)
        if self.lost.is_set() and exc_type is None:
            held = self._claim
            raise StaleClaim(
                f"{held.model.__name__} claim pk={held.pk!r} token={held.token} was lost while the block ran: "
                f"{self.error}",
                alias=held.alias,
                claims=(held,),
            ) from self.error

    def _renew(self) -> bool:
        """One renewal; ``False`` (stop beating) once the claim is found stale."""
        try:
            self._claim = heartbeat(self._claim, lease=self.lease)
        except StaleClaim as stale:
            self.error = stale
            self.lost.set()
            logger.warning("heartbeat: claim lost: %s", stale)
            return False
        return True

    def _failed(self, failure: DatabaseError) -> None:
        self.error = failure
        logger.warning(
            "heartbeat of %s pk=%r failed, retrying: %s", self._claim.alias, self._claim.pk, failure
        )

    def _crashed(self, unexpected: BaseException) -> None:
        self.error = unexpected
        self.lost.set()
