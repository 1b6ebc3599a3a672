"""Job claims: ``SKIP LOCKED`` claiming in short transactions, leases on the database clock, fencing tokens.

Import from here (``from lockkit.claims import claim_next``) once Django's app registry is ready (in models,
views, management commands, tasks): defining the ``Claimable`` model mixin needs it. Every function has an
awaitable twin named as Django's (``aclaim_next``, ``acomplete``...). See docs/claims.md.

Each module names its public names once, in its ``__all__``; this package is their union.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockkit.claims import api, ending, fencing, heartbeats, mixin, value
from lockkit.claims.api import *  # noqa: F403 - each module's __all__ is its share of the public names
from lockkit.claims.ending import *  # noqa: F403
from lockkit.claims.fencing import *  # noqa: F403
from lockkit.claims.heartbeats import *  # noqa: F403
from lockkit.claims.mixin import *  # noqa: F403
from lockkit.claims.value import *  # noqa: F403

# mypy reads a literal __all__ only (a computed one would hide the names above from `from lockkit.claims import *`);
# it takes the public names from the star imports instead.
if not TYPE_CHECKING:
    __all__ = sorted(
        {*api.__all__, *ending.__all__, *fencing.__all__, *heartbeats.__all__, *mixin.__all__, *value.__all__}
    )
