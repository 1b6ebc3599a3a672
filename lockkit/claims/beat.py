"""``heartbeat_every(claim)``: renew a claim's lease from a background thread while the worker works on the job."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from types import TracebackType

from django.db import DatabaseError

from lockkit.claims import inputs
from lockkit.claims._beatthread import BeatThread
from lockkit.claims.api import heartbeat
from lockkit.claims.value import Claim
from lockkit.errors import StaleClaim
from lockkit.validation import duration

logger = logging.getLogger("lockkit.claims")

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
