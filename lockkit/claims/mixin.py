"""``Claimable``: the abstract model mixin whose fields record who holds a job's claim, until when, how often.

Defining a model needs Django's app registry, so this module (and ``lockkit.claims``) is imported lazily.
"""

from __future__ import annotations

from django.db import models

from lockkit.claims.sql.table import CLAIM_FIELDS, WORKER_MAX_LENGTH

__all__ = ["CLAIM_FIELDS", "Claimable"]


class Claimable(models.Model):
    """Abstract mixin for a model whose rows are jobs that workers claim (see ``lockkit.claims``).

    The job's own state (pending, running, done...) stays a field of yours; ``claim``/``claim_next`` select
    rows with your queryset and write your ``set=`` values along with these fields. A row is claimed exactly
    when ``lease_expires_at`` is not ``NULL``.

    Attributes:
        claimed_by (str): The worker of the latest claim ("" until the first claim); kept after the claim
            ends.
        claim_token (int): A bigint incremented by every claim and never decreased: the fencing token that
            every later write by the claim's worker must present.
        claimed_at (datetime | None): When the latest claim was made, by the database clock.
        lease_expires_at (datetime | None): When the current claim's lease ends, by the database clock;
            ``NULL`` when the row is not claimed. Indexed, for ``reclaim_expired``.
        attempts (int): How many times the row has been claimed.
    """

    claimed_by = models.CharField(max_length=WORKER_MAX_LENGTH, blank=True, default="")
    claim_token = models.BigIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    attempts = models.PositiveIntegerField(default=0)

    class Meta:
        """Abstract: the fields are added to each concrete job model's own table."""

        abstract = True
