"""Keys of kept compilations without the time zone, for what lockkit built and marked ``zoneless`` only.

Reading the current time zone (asgiref's ``Local``) cost the tasks worker about 6 % of its instructions per task; a
caller's expression or queryset may compile differently per time zone (``ExtractHour``, ``__date``) and keeps its
time zone in the key (``test_hx_cache.py`` claims with one under four zones).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F, Value
from django.db.models.functions import Concat, TruncDate
from django.utils import timezone

from lockkit.claims.sql import claims_sql_for, zoneless
from lockkit.claims.sql.base import CLOCK, identical
from lockkit.claims.sql.memo import PerQueryset
from lockkit_tests.models import Job

ZONES = ("UTC", "Asia/Tokyo", "America/New_York")


def _keys(values: dict[str, object]) -> set[object]:
    keys = set()
    for zone in ZONES:
        with timezone.override(zone):
            keys.add(identical(values))
    return keys


@pytest.mark.django_db
def test_lockkit_s_own_assignments_have_one_key_in_every_time_zone() -> None:
    statements = claims_sql_for(Job, "default")
    values = statements.claim_assignments("w", 30, {"state": "running", "result": None})
    assert len(_keys(values)) == 1
    assert len(_keys({"claimed_at": CLOCK, "lease_expires_at": statements.lease_end(12.5)})) == 1


def test_a_caller_s_expression_keeps_the_time_zone_in_its_key() -> None:
    # Unmarked: the same object under three zones gives three keys (TruncDate compiles against the current zone).
    day = TruncDate(F("claimed_at"))
    assert len(_keys({"result": day})) == 3
    # Marked parts do not mark the whole: lockkit's clock beside a caller's expression still keys by zone.
    assert len(_keys({"claimed_at": CLOCK, "result": Concat(F("name"), Value("!"))})) == 3


def test_a_marked_expression_is_keyed_by_itself() -> None:
    first = zoneless(Concat(F("name"), Value("a")))
    second = zoneless(Concat(F("name"), Value("a")))
    assert len(_keys({"result": first})) == 1
    assert identical({"result": first}) != identical({"result": second})


def test_a_marked_queryset_s_select_is_compiled_once_in_every_time_zone() -> None:
    memo: PerQueryset[str] = PerQueryset()
    compiled: list[str] = []

    def compile_here() -> str:
        zone = timezone.get_current_timezone_name()
        compiled.append(zone)
        return zone

    marked = Job.objects.filter(lease_expires_at__lte=CLOCK)
    memo.zoneless(marked)
    caller = Job.objects.filter(claimed_at__date=timezone.now().date() - timedelta(days=1))
    for zone in ZONES:
        with timezone.override(zone):
            assert memo.get(marked, "k", compile_here) == "UTC"
            assert memo.get(caller, "k", compile_here) == zone
    assert compiled == ["UTC", "UTC", "Asia/Tokyo", "America/New_York"]


def test_plain_values_keep_their_type_and_value_in_the_key() -> None:
    key = identical({"result": None, "state": "x"})
    assert isinstance(key, tuple)
    assert key[1:] == (("result", type(None), None), ("state", str, "x"))
    assert identical({"result": 1}) != identical({"result": True})
