"""Shared data and markers for the peer suite: the rows Django's select_for_update tests start from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.db import connections

from lockkit.backends import Backend, backend_for
from lockkit_tests.models import PeerCity, PeerCountry, PeerEUCountry, PeerPerson, PeerProfile

pytestmark = pytest.mark.contention


@dataclass
class World:
    """Two countries (one of them an EU country, three tables deep), two cities, a person and a profile."""

    alias: str
    country: PeerCountry
    eu_country: PeerEUCountry
    city1: PeerCity
    city2: PeerCity
    person: PeerPerson
    profile: PeerProfile


def make_world(alias: str) -> World:
    country = PeerCountry.objects.using(alias).create(name="Belgium", code="BE")
    eu_country = PeerEUCountry.objects.using(alias).create(name="France", code="FR", joined=1957)
    city1 = PeerCity.objects.using(alias).create(name="Liberchies", country=country)
    city2 = PeerCity.objects.using(alias).create(name="Samois-sur-Seine", country=eu_country)
    person = PeerPerson.objects.using(alias).create(name="Reinhardt", born=city1, died=city2)
    profile = PeerProfile.objects.using(alias).create(person=person)
    return World(alias, country, eu_country, city1, city2, person, profile)


@pytest.fixture
def pending_mysql_backend(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """Mark the running test ``xfail(strict=True)`` on MariaDB while lockkit has no MariaDB backend (issue 5).

    Strict: once the backend lands, the test passes, the xfail turns into a failure, and the mark must go.
    """

    def mark(alias: str, why: str) -> None:
        connection = connections[alias]
        if connection.vendor == "mysql" and type(backend_for(connection)) is Backend:
            reason = f"needs lockkit's MariaDB backend (issue 5): {why}"
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))

    return mark
