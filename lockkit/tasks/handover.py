"""A task's success written with the worker's next claim: on PostgreSQL one message and one commit for both.

Used by a worker that runs one task at a time and claims one at a time (``--concurrency 1 --claim-batch 1``): the
success is held after the attempt, and the next claim carries its fenced completion
(``lockkit.claims.chaining``). What the completion came to is recorded as ``outcomes.py`` records any outcome. See
docs/tasks.md.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError
from django.tasks.base import Task

from lockkit.claims import Claim, Claimed
from lockkit.claims.api import NextClaims
from lockkit.claims.chaining import complete_then_claim_next
from lockkit.errors import ConnectionLost, StaleClaim
from lockkit.tasks.models import QueuedTask
from lockkit.tasks.outcomes import Outcomes

logger = logging.getLogger("lockkit.tasks.worker")

#: A success not written yet: the row, its claim, the values ``Outcomes.finish`` writes, the task.
Held = tuple[QueuedTask, Claim, dict[str, Any], "Task[..., Any] | None"]


class Handover:
    """Holds one success until the next claim, which writes it (``claim``), or until ``flush()``.

    Args:
        outcomes: Where outcomes are recorded; its successes are held here from now on.
    """

    def __init__(self, outcomes: Outcomes) -> None:
        """Take ``outcomes``' successes (no SQL)."""
        self.outcomes = outcomes
        self.held: Held | None = None
        self.stranded: list[Claimed[Any]] = []
        outcomes.hold = self._hold

    def _hold(
        self, row: QueuedTask, claim: Claim, values: dict[str, Any], task: Task[..., Any] | None
    ) -> None:
        self.flush()  # never two held (one task at a time: there is none)
        self.held = (row, claim, values, task)

    def claim(self, claims: NextClaims, limit: int) -> list[Claimed[Any]]:
        """``claims.claim(limit)`` (built with ``fetch=True``), carrying the held success's completion.

        Raises:
            django.db.DatabaseError: the claim failed (a refused message is tried once more without the success);
                the held success was written on its own first.
        """
        held, self.held = self.held, None
        if held is None:
            return claims.claim(limit)
        row, claim, values, task = held
        try:
            chained = complete_then_claim_next(claim, values, claims, limit)
        except ConnectionLost:
            # The connection went (the claim's outcome unknown): the success on its own, as always.
            self.outcomes.write(*held)
            raise
        except DatabaseError as refused:
            # The message was refused and rolled back: neither was written. The success is written on its own (a
            # value the database refuses fails the attempt there); the claim is made on its own, once: a claim
            # refused again is the caller's "claiming failed".
            logger.info(
                "worker %s: a claim carrying the outcome of task %s was refused: %s",
                claim.worker,
                row.pk,
                refused,
            )
            self.outcomes.write(*held)
            return claims.claim(limit)
        except BaseException:
            self.held = held  # flush() writes it
            raise
        # Claimed and committed: the worker takes them (stranded) even when recording the success raises (a
        # task_finished receiver's SystemExit), so that they go back rather than stay RUNNING, unrun.
        self.stranded = chained.claimed
        if chained.completed:
            self.outcomes.written(*held)
        elif isinstance(chained.error, StaleClaim):
            self.outcomes.dropped(row, chained.error)
        else:  # not sent with the claim, or its lost reply undecided: written (or found written) on its own
            self.outcomes.write(row, claim, values, task)
        self.stranded = []
        return chained.claimed

    def take_stranded(self) -> list[Claimed[Any]]:
        """The claims of the last ``claim()`` if it raised after they committed (recording the success), once."""
        stranded, self.stranded = self.stranded, []
        return stranded

    def flush(self) -> None:
        """Write the held success now, on its own (the worker stops, or waits for tasks)."""
        held, self.held = self.held, None
        if held is not None:
            self.outcomes.write(*held)
